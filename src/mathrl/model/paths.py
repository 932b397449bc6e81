"""Which model directory a config names: the cached tiny base model (built on first use) or `model.path`."""

from __future__ import annotations

import contextlib

from rich.console import Console

from typing import TYPE_CHECKING

from mathrl.config import Config

if TYPE_CHECKING:
    from mathrl.model.tiny import PretrainingText

TINY_BASE = "tiny-arith"  # model.path of the tiny model mathrl builds itself (model/tiny.py)


def resolve_model_path(cfg: Config, console: Console, *, pretraining_text: PretrainingText) -> str:
    """The model directory to load: the cached tiny base model (built now from `pretraining_text`,
    `tasks/arithmetic.py:base_pretraining_text(cfg.base)`, if missing) or `model.path`."""
    if cfg.model.path != TINY_BASE:
        return cfg.model.path
    from mathrl.model.tiny import base_model_dir, ensure_base_model, is_built
    from mathrl.track.console import BuildProgress

    out = base_model_dir(cfg.base)
    if is_built(out):
        console.print(f"using the cached tiny base model {out}")
        return str(out)
    with contextlib.ExitStack() as stack:
        bars = []

        def start(path) -> None:  # only the process that builds it shows a bar; the others wait (one line)
            console.print(f"[bold]building the tiny base model[/bold] (once; cached at {path})")
            bars.append(stack.enter_context(BuildProgress(console, total=cfg.base.steps)))

        path = ensure_base_model(cfg.base, pretraining_text=pretraining_text, on_build_start=start,
                                 progress=lambda *a: bars[0].update(*a),
                                 on_wait=lambda line: console.print(line, markup=False, highlight=False))
    return str(path)
