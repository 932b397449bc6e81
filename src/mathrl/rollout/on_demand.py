"""An engine that exists only while it is used: the trainer's evaluation engine when generator processes do
all the sampling (train/generators/host.py). A vLLM engine built beside the generators' would hold its share of
the GPU for the whole run, and a generator's vLLM that shares that GPU could then not start.

    engine = OnDemandEngine(build=lambda: build_engine(cfg, ...), weights=trainer.engine_weights, release="close")
    engine.update_weights(...)     # nothing built: only remembers that the weights moved
    engine.generate(prompts, ...)  # builds the engine (or wakes it) and loads the current weights, then samples
    engine.sleep()                 # the training step begins: the engine is closed ("close") or slept ("sleep")

Every rank of a torchrun job calls the same methods in the same order (the evaluation is sharded), so the
collectives that gathering sharded weights needs happen on all ranks or on none.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Literal

import torch

from mathrl.rollout.base import Engine, RolloutBatch


class OnDemandEngine:
    """Builds its engine at the first `generate`, syncs the weights it missed before each `generate`, and
    releases it at `sleep` (release="close": closed, its memory freed, rebuilt next time; "sleep": the
    engine's own sleep, e.g. vLLM's sleep mode; "keep": left as it is)."""

    def __init__(self, build: Callable[[], Engine], weights: Callable[[], Iterable[tuple[str, torch.Tensor]]],
                 release: Literal["close", "sleep", "keep"] = "close"):
        self._build, self._weights, self.release = build, weights, release
        self.engine: Engine | None = None
        self.stale = False  # the weights moved since the engine last loaded them
        self.builds = 0

    @property
    def seed_block(self) -> int:
        return self._ready().seed_block

    def _ready(self) -> Engine:
        if self.engine is None:
            self.engine = self._build()
            self.builds += 1
            self.stale = True  # it loaded the starting weights from disk; the policy may have moved since
        if self.stale:
            self.engine.update_weights(self._weights())
            self.stale = False
        return self.engine

    def generate(self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float = 1.0, top_p: float = 1.0,
                 seed: int, first_row: int = 0) -> RolloutBatch:
        return self._ready().generate(prompts, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                      seed=seed, first_row=first_row)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.stale = True  # not consumed: the weights are read from `weights()` when the engine is next used

    def sleep(self) -> None:
        if self.engine is None or self.release == "keep":
            return
        if self.release == "sleep":
            self.engine.sleep()
            return
        self.close()

    def wake_up(self) -> None:
        if self.engine is not None:
            self.engine.wake_up()

    def close(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None:
            engine.close()
