"""The rollout interface: what every engine takes and returns, and helpers shared by engines.

An engine turns prompt token ids into sampled continuations with the per-token logprobs of the
distribution it sampled from. The training loop, evaluation and `mathrl eval` depend only on the
`Engine` protocol below, so a new engine (SGLang, a remote server) is one new module plus a line in
`rollout/factory.py`:

    engine = build_engine(cfg, model=model, tokenizer=tokenizer, model_path=path)
    out = engine.generate(prompts, max_new_tokens=48, temperature=1.0, top_p=1.0, seed=step)
    ...  # the trainer updates its model
    engine.update_weights(model.state_dict().items())  # before the next generate
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Protocol, runtime_checkable

import torch

from mathrl.seeds import GENERATOR_MODULUS, derive_seed


@dataclass(kw_only=True)
class RolloutBatch:
    """Sampled continuations of N prompts: the one record of a step's token rows, from the engine to the
    loss. The step extends it with its own fields (`train/batching.py:Rows`, then `TrainBatch`), so each
    tensor keeps the name it got here; `select`, `to`, `tensors` and `context_mask` serve every record.

    prompt_ids:    [N, P] long, LEFT-padded with pad_token_id
    prompt_mask:   [N, P] long, 1 on real prompt tokens
    response_ids:  [N, T] long, RIGHT-padded with pad_token_id after the end
    response_mask: [N, T] float, 1 on sampled tokens (the EOS that ended a response included)
    rollout_logprobs: [N, T] float, log-prob of each sampled token under the sampling distribution
                   (temperature applied; with top_p = 1 this is exactly log_softmax(logits / T)),
                   0 where response_mask is 0. With top_p < 1 engines differ: TorchEngine reports the
                   distribution before the nucleus cut, VLLMEngine the one renormalised over it.
    truncated:     [N] bool, True if the response hit max_new_tokens without an EOS
    (Every engine fills both; they are None only on rows that no engine sampled: SFT's examples.)

    Episodes with tools (rollout/episodes.py) also fill, and single-turn responses leave None:
    observation_mask: [N, T] float, 1 on tool-observation tokens: in the context (the response span
                   holds model and observation tokens in order) but not sampled, so response_mask is
                   0 there, and so is every loss, normaliser, length and importance ratio
    tool_calls, tool_errors, tool_timeouts, tool_capped, turns: [N] long per-episode counts (calls run,
                   of them failed / timed out, calls past rollout.max_tool_calls, model turns)
    tool_seconds:  [N] float, seconds the episode's calls took
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    rollout_logprobs: torch.Tensor | None = None
    truncated: torch.Tensor | None = None
    observation_mask: torch.Tensor | None = None
    tool_calls: torch.Tensor | None = None
    tool_errors: torch.Tensor | None = None
    tool_timeouts: torch.Tensor | None = None
    tool_capped: torch.Tensor | None = None
    turns: torch.Tensor | None = None
    tool_seconds: torch.Tensor | None = None

    @property
    def context_mask(self) -> torch.Tensor:  # [N, T] 1 on every token of the response span, model or observation
        return self.response_mask if self.observation_mask is None else self.response_mask + self.observation_mask

    @property
    def response_lengths(self) -> torch.Tensor:  # [N] model tokens (observation tokens are not counted)
        return self.response_mask.sum(-1).long()

    @property
    def context_lengths(self) -> torch.Tensor:  # [N] model and observation tokens
        return self.context_mask.sum(-1).long()

    def __len__(self) -> int:
        return self.response_ids.shape[0]

    def tensors(self) -> dict[str, torch.Tensor | None]:
        """Every field by name: `Next(**rows.tensors(), more=...)` extends a record."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def select(self, rows: torch.Tensor | list[int]):
        """The rows `rows` (indices, in that order), of the record's own type."""
        rows = torch.as_tensor(rows, dtype=torch.long)
        return type(self)(**{k: None if x is None else x[rows] for k, x in self.tensors().items()})

    def to(self, device: torch.device | str):
        """The same rows with every tensor on `device` (the tensors themselves when already there)."""
        return type(self)(**{k: None if x is None else x.to(device) for k, x in self.tensors().items()})


@runtime_checkable
class Engine(Protocol):
    """A rollout engine: token ids in; ids, sampling logprobs and truncation flags out.

    Contract (tests/rollout/test_engine.py and tests/rollout/test_vllm_engine.py check it for each engine):
    - `generate` samples one continuation per prompt (repeat a prompt n times for n samples). The
      same seed, prompts and engine settings give the same samples; no global RNG is used.
      `first_row` (a multiple of `seed_block`) says that the prompts are rows first_row, ... of a
      larger call with the same seed: they are sampled as that call samples them, so several ranks
      can each generate a block of one call.
    - `update_weights` makes the engine sample from the given weights (Hugging Face parameter
      names, the full unsharded tensors or DTensors) from the next `generate` on; never via disk.
    - `sleep` may free memory (KV cache, weights) between generations; `generate` and
      `update_weights` wake the engine as needed, so callers never have to.
    - `close` releases the engine; it is not usable afterwards.
    """

    seed_block: int  # rows that share one random stream; a call's rows split at multiples of it sample alike

    def generate(
        self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float = 1.0, top_p: float = 1.0,
        seed: int, first_row: int = 0,
    ) -> RolloutBatch: ...

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None: ...

    def sleep(self) -> None: ...

    def wake_up(self) -> None: ...

    def close(self) -> None: ...


def row_seed(seed: int, row: int) -> int:
    """The sampling seed of row `row` of a call seeded with `seed`: a fixed function of both, so a row's
    sample does not depend on the other rows of the call (nor on how an engine batches them)."""
    return derive_seed(seed, row, modulus=GENERATOR_MODULUS)


def left_pad(sequences: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, max_len] ids left-padded with pad_id, and the [N, max_len] mask of real tokens."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, s in enumerate(sequences):
        if s:
            ids[i, width - len(s) :] = torch.tensor(s, dtype=torch.long)
            mask[i, width - len(s) :] = 1
    return ids, mask


def concat_rollouts(chunks: list[RolloutBatch], pad_id: int) -> RolloutBatch:
    """One RolloutBatch from several, re-padding prompts (left) and responses (right) to a common width."""
    if len(chunks) == 1:
        return chunks[0]
    p = max(c.prompt_ids.shape[1] for c in chunks)
    t = max(c.response_ids.shape[1] for c in chunks)

    def pad(x: torch.Tensor, width: int, value, left: bool) -> torch.Tensor:
        extra = width - x.shape[1]
        if extra == 0:
            return x
        filler = torch.full((x.shape[0], extra), value, dtype=x.dtype)
        return torch.cat([filler, x] if left else [x, filler], dim=1)

    episodes = {}
    if any(c.observation_mask is not None for c in chunks):  # a chunk without episode fields counts zeros
        episodes["observation_mask"] = torch.cat([
            pad(c.observation_mask if c.observation_mask is not None else torch.zeros_like(c.response_mask), t, 0.0, False)
            for c in chunks])
        for name in EPISODE_COUNTS:
            episodes[name] = torch.cat([getattr(c, name) if getattr(c, name) is not None else
                                        torch.zeros(len(c), dtype=torch.float32 if name == "tool_seconds" else torch.long)
                                        for c in chunks])
    return RolloutBatch(
        prompt_ids=torch.cat([pad(c.prompt_ids, p, pad_id, True) for c in chunks]),
        prompt_mask=torch.cat([pad(c.prompt_mask, p, 0, True) for c in chunks]),
        response_ids=torch.cat([pad(c.response_ids, t, pad_id, False) for c in chunks]),
        response_mask=torch.cat([pad(c.response_mask, t, 0.0, False) for c in chunks]),
        rollout_logprobs=torch.cat([pad(c.rollout_logprobs, t, 0.0, False) for c in chunks]),
        truncated=torch.cat([c.truncated for c in chunks]),
        **episodes,
    )


EPISODE_COUNTS = ("tool_calls", "tool_errors", "tool_timeouts", "tool_capped", "turns", "tool_seconds")
