"""Checkpoints that hold everything needed to continue a run exactly, written atomically.

A checkpoint is a directory `checkpoints/step_<N>/`:
    config.json, model.safetensors, tokenizer files   the model, Hugging Face format (safetensors)
    trainer_state.pt     optimizer + scheduler state, RNG states (torch.load(weights_only=True) safe)
    trainer_state.json   step, controller and data-stream state, config, format version
    critic/              the PPO critic, when there is one (algo.adv.estimator: gae); its optimizer and
                         scheduler state are in trainer_state.pt

It is written into `step_<N>.tmp-*` first, every file fsynced, then renamed in one `os.replace`, and
the parent directory fsynced: a checkpoint that was cut off (killed process, full disk) never carries
the final name, so `latest_checkpoint` can never pick it. Older checkpoints are pruned only after the
new one is complete (keep the last `keep_last`, plus every `keep_every`-th step if set).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

FORMAT_VERSION = 1
_STEP_DIR = re.compile(r"^step_(\d+)$")


class CheckpointError(RuntimeError):
    pass


def rng_state() -> dict[str, Any]:
    """Python, NumPy and torch global RNG states as tensors/lists (loadable with weights_only=True)."""
    version, internal, gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    return {
        "python": {"version": version, "internal": list(internal), "gauss": gauss},
        "numpy": {"keys": torch.from_numpy(np_keys.astype(np.int64)), "pos": int(np_pos),
                  "has_gauss": int(np_has_gauss), "gauss": float(np_gauss)},
        "torch": torch.get_rng_state(),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    py = state["python"]
    random.setstate((py["version"], tuple(py["internal"]), py["gauss"]))
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(state["torch"])


def _fsync_tree(path: Path) -> None:
    for p in sorted(path.rglob("*")):
        if p.is_file():
            with p.open("rb") as f:
                os.fsync(f.fileno())
    _fsync_dir(path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(
    checkpoints_dir: Path,
    step: int,
    *,
    model,
    tokenizer,
    optimizer: torch.optim.Optimizer,
    scheduler,
    state: dict[str, Any],
    keep_last: int = 2,
    keep_every: int = 0,
    critic=None,
    critic_optimizer: torch.optim.Optimizer | None = None,
    critic_scheduler=None,
) -> Path:
    """Write checkpoint `step` atomically and prune old ones. `state` is the JSON-able trainer state.
    A PPO critic goes to critic/ (safetensors), its optimizer and scheduler into trainer_state.pt."""
    checkpoints_dir = Path(checkpoints_dir)
    checkpoints_dir.mkdir(parents=True, exist_ok=True)
    final = checkpoints_dir / f"step_{step:06d}"
    tmp = Path(tempfile.mkdtemp(prefix=final.name + ".tmp-", dir=checkpoints_dir))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        tensors = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "rng": rng_state()}
        if critic is not None:
            critic.save_pretrained(tmp / "critic", safe_serialization=True)
            tensors["critic_optimizer"] = critic_optimizer.state_dict()
            tensors["critic_scheduler"] = critic_scheduler.state_dict()
        torch.save(tensors, tmp / "trainer_state.pt")
        (tmp / "trainer_state.json").write_text(json.dumps({"format": FORMAT_VERSION, "step": step, **state}, indent=2))
        _fsync_tree(tmp)
        if final.exists():  # the same step saved again (e.g. after a resume): replace it
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(checkpoints_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # a failed write (disk full, ...) leaves the older checkpoints valid
        raise
    prune_checkpoints(checkpoints_dir, keep_last=keep_last, keep_every=keep_every)
    return final


def complete_checkpoints(checkpoints_dir: Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint, oldest first; temporary or partial ones are ignored."""
    out = []
    if not Path(checkpoints_dir).is_dir():
        return out
    for p in Path(checkpoints_dir).iterdir():
        m = _STEP_DIR.match(p.name)
        if m and (p / "trainer_state.json").exists() and (p / "trainer_state.pt").exists():
            out.append((int(m.group(1)), p))
    return sorted(out)


def latest_checkpoint(checkpoints_dir: Path) -> Path | None:
    done = complete_checkpoints(checkpoints_dir)
    return done[-1][1] if done else None


def prune_checkpoints(checkpoints_dir: Path, *, keep_last: int, keep_every: int) -> None:
    done = complete_checkpoints(checkpoints_dir)
    keep = {step for step, _ in done[-max(keep_last, 1):]}
    if keep_every > 0:
        keep |= {step for step, _ in done if step % keep_every == 0}
    for step, path in done:
        if step not in keep:
            shutil.rmtree(path, ignore_errors=True)
    for p in Path(checkpoints_dir).glob("step_*.tmp-*"):  # leftovers of writes that were killed
        shutil.rmtree(p, ignore_errors=True)


def load_trainer_state(checkpoint: Path, *, optimizers: dict[str, Any], controllers: dict[str, Any]) -> dict[str, Any]:
    """Restore the optimizer/scheduler states (`optimizers`: name -> object, the keyword names of
    `save_checkpoint`) and controller states from `checkpoint`; returns trainer_state.json's content
    with the step as an int and the saved RNG states under "rng" (the caller decides whether to apply
    them: a resumed run does, a run continuing another one does not).

    The critic's optimizer is restored only when the checkpoint has one (a GRPO checkpoint continued
    with PPO gives the critic a fresh optimizer).
    """
    checkpoint = Path(checkpoint)
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    tensors = torch.load(checkpoint / "trainer_state.pt", weights_only=True)
    for name, obj in optimizers.items():
        if name in tensors:
            obj.load_state_dict(tensors[name])
        elif not name.startswith("critic_"):
            raise CheckpointError(f"checkpoint {checkpoint} has no {name} state in trainer_state.pt")
    for name, ctl in controllers.items():
        ctl.load_state_dict(state["controllers"][name])
    state["step"] = int(state["step"])
    state["rng"] = tensors["rng"]
    return state

