"""Checkpoints that hold everything needed to continue a run exactly, written atomically, with the
modes of the process umask (`cache.umask_modes`: 0o644 files under umask 022).

    checkpoints/step_<N>/  config.json, model.safetensors, tokenizer files (a LoRA run: its peft adapter),
                           trainer_state.pt (optimizer, scheduler, RNG states), trainer_state.json (step,
                           controllers, data stream, config), critic/ (PPO), generator_versions.safetensors
                           (rollout.max_staleness >= 1); several ranks: optimizer/, critic_optimizer/ (DCP)

What each file holds: docs/guide.md, "The run directory". A checkpoint resumes at any world size. It is
written into `step_<N>.tmp-*` first, every file fsynced, then renamed in one `os.replace`, and the parent
directory fsynced: a checkpoint that was cut off (killed process, full disk) never carries the final name,
so `latest_checkpoint` can never pick it. Older checkpoints are pruned only after the new one is complete:
the last `keep_last` stay whole, and of the others every `keep_every`-th step keeps its weights
(`prune_checkpoints`).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from mathrl.cache import umask_modes
from mathrl.model.lora import is_lora, plain_weights, unwrap
from mathrl.run_dir import complete_checkpoints  # the layout of checkpoints/ is the run directory's
from mathrl.seeds import rng_state
from mathrl.train.dist import Ranks, barrier, broadcast_object, full_state_dict, is_sharded

FORMAT_VERSION = 1
VERSIONS_FILE = "generator_versions.safetensors"  # fixed-lag generation: the older versions the next steps sample from


class CheckpointError(RuntimeError):
    pass


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
    ranks: Ranks | None = None,
    extra_tensors: dict[str, dict[str, torch.Tensor]] | None = None,
) -> Path:
    """Write checkpoint `step` atomically and prune old ones. `state` is the JSON-able trainer state.
    A PPO critic goes to critic/ (safetensors), its optimizer and scheduler into trainer_state.pt.
    With several ranks (sharded models) every rank must call it: see `_save_sharded`. `extra_tensors`
    ({file name: {key: tensor}}, rank 0's) are written as safetensors files into the checkpoint too
    (e.g. train/generators/host.py's older policy versions)."""
    if ranks is not None and ranks.distributed:
        return _save_sharded(checkpoints_dir, step, model=model, tokenizer=tokenizer, optimizer=optimizer,
                             scheduler=scheduler, state=state, keep_last=keep_last, keep_every=keep_every,
                             critic=critic, critic_optimizer=critic_optimizer, critic_scheduler=critic_scheduler,
                             ranks=ranks, extra_tensors=extra_tensors)
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
        _write_extra(tmp, extra_tensors)
        umask_modes(tmp)  # readable as the umask allows, before the rename: the checkpoint stays atomic
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


# What a checkpoint kept by `keep_every` loses when it leaves the last `keep_last`: the state that only
# resuming needs (optimizer moments, twice the weights' size with AdamW; RNG and scheduler). Its model
# files and trainer_state.json stay, so `mathrl eval RUN` scores it and init_from_mode=restart starts
# from it; without trainer_state.pt it is no longer "complete", so resuming never picks it.
RESUME_ONLY = ("trainer_state.pt", "optimizer", "critic_optimizer")


def prune_checkpoints(checkpoints_dir: Path, *, keep_last: int, keep_every: int) -> None:
    """Keep the last `keep_last` complete checkpoints whole; of the older ones, keep the weights of those
    whose step is a multiple of `keep_every` (> 0) and delete the rest."""
    done = complete_checkpoints(checkpoints_dir)
    last = {step for step, _ in done[-max(keep_last, 1):]}
    for step, path in done:
        if step in last:
            continue
        if keep_every > 0 and step % keep_every == 0:
            for name in RESUME_ONLY:
                part = path / name
                if part.is_dir():
                    shutil.rmtree(part, ignore_errors=True)
                else:
                    part.unlink(missing_ok=True)
        else:
            shutil.rmtree(path, ignore_errors=True)
    for p in Path(checkpoints_dir).glob("step_*.tmp-*"):  # leftovers of writes that were killed
        shutil.rmtree(p, ignore_errors=True)


def load_trainer_state(checkpoint: Path, *, optimizers: dict[str, Any], controllers: dict[str, Any],
                       models: dict[str, Any] | None = None) -> dict[str, Any]:
    """Restore the optimizer/scheduler states (`optimizers`: name -> object, the keyword names of
    `save_checkpoint`) and controller states from `checkpoint`; returns trainer_state.json's content
    with the step as an int and the saved RNG states under "rng" (the caller decides whether to apply
    them: a resumed run does, a run continuing another one does not).

    `models` maps an optimizer's name to the model it steps ("optimizer" -> policy, "critic_optimizer"
    -> critic); it is needed when the checkpoint or this run is sharded, where optimizer states are
    matched by parameter name (`torch.distributed.checkpoint.state_dict`). The critic's optimizer is
    restored only when the checkpoint has one (a GRPO checkpoint continued with PPO gives the critic a
    fresh optimizer).
    """
    checkpoint = Path(checkpoint)
    models = models or {}
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    tensors = torch.load(checkpoint / "trainer_state.pt", weights_only=True)
    for name, obj in optimizers.items():
        model = models.get(name)
        if (checkpoint / name).is_dir():  # sharded (DCP), from a run with several ranks
            _load_sharded_optimizer(checkpoint / name, model, obj)
        elif name in tensors and name.endswith("optimizer") and model is not None and is_sharded(model):
            _load_full_optimizer(tensors[name], model, obj)  # a one-process checkpoint, spread over the ranks
        elif name in tensors:
            obj.load_state_dict(tensors[name])
        elif not name.startswith("critic_"):
            raise CheckpointError(f"checkpoint {checkpoint} has no {name} state (trainer_state.pt or {name}/)")
    for name, ctl in controllers.items():
        ctl.load_state_dict(state["controllers"][name])
    state["step"] = int(state["step"])
    state["rng"] = tensors["rng"]
    return state


# ---- several ranks: sharded optimizer states (torch.distributed.checkpoint), gathered model weights -------
def save_hf_model(model, tokenizer, out: Path, *, ranks: Ranks | None = None) -> None:
    """`model` as a plain Hugging Face directory (config, safetensors, tokenizer files if given). A
    sharded model is gathered first (a collective: every rank calls this) and rank 0 writes it."""
    out = Path(out)
    main = ranks is None or ranks.main
    weights = full_state_dict(model) if is_sharded(model) else None
    if weights and getattr(model.config, "tie_word_embeddings", False):  # the head is the embedding: save it once
        head = model.get_output_embeddings()
        weights.pop(next((f"{n}.weight" for n, m in model.named_modules() if m is head and n), ""), None)
    if main:
        out.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out, state_dict=weights, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(out)
        umask_modes(out)


def save_final_model(model, tokenizer, out: Path, *, ranks: Ranks | None = None) -> None:
    """A finished run's final/: a plain Hugging Face model that `mathrl eval` reads (with LoRA, the
    base with the adapters merged in) and, with LoRA, the adapter itself in final/adapter/ (peft's
    format). A collective for a sharded model: every rank calls it."""
    if not is_lora(model):
        save_hf_model(model, tokenizer, out, ranks=ranks)
        return
    state = full_state_dict(model) if is_sharded(model) else model.state_dict()
    if ranks is None or ranks.main:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        unwrap(model).save_pretrained(out, state_dict=plain_weights(model, state), safe_serialization=True)
        tokenizer.save_pretrained(out)
        model.save_pretrained(out / "adapter", state_dict=state, safe_serialization=True)
        umask_modes(out)


def _write_extra(directory: Path, extra_tensors: dict[str, dict[str, torch.Tensor]] | None) -> None:
    from safetensors.torch import save_file

    for name, tensors in (extra_tensors or {}).items():
        save_file(tensors, str(directory / name))


def _save_sharded(checkpoints_dir: Path, step: int, *, model, tokenizer, optimizer, scheduler, state, keep_last,
                  keep_every, critic, critic_optimizer, critic_scheduler, ranks: Ranks, extra_tensors=None) -> Path:
    """The several-ranks checkpoint: every rank writes its optimizer shards into rank 0's temporary
    directory, rank 0 the gathered weights and trainer state; rank 0 renames it once all are done."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    checkpoints_dir = Path(checkpoints_dir)
    final = checkpoints_dir / f"step_{step:06d}"
    tmp = None
    if ranks.main:
        checkpoints_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=final.name + ".tmp-", dir=checkpoints_dir))
    tmp = Path(broadcast_object(str(tmp) if tmp else None))
    try:
        save_hf_model(model, tokenizer, tmp, ranks=ranks)
        dcp.save({"optimizer": get_optimizer_state_dict(model, optimizer)}, checkpoint_id=tmp / "optimizer")
        if critic is not None:
            save_hf_model(critic, None, tmp / "critic", ranks=ranks)
            dcp.save({"optimizer": get_optimizer_state_dict(critic, critic_optimizer)},
                     checkpoint_id=tmp / "critic_optimizer")
        if ranks.main:
            tensors = {"scheduler": scheduler.state_dict(), "rng": rng_state()}
            if critic is not None:
                tensors["critic_scheduler"] = critic_scheduler.state_dict()
            torch.save(tensors, tmp / "trainer_state.pt")
            (tmp / "trainer_state.json").write_text(json.dumps(
                {"format": FORMAT_VERSION, "step": step, "world_size": ranks.world_size, **state}, indent=2))
            _write_extra(tmp, extra_tensors)
        barrier()  # every rank's shards are on disk
        if ranks.main:
            umask_modes(tmp)
            _fsync_tree(tmp)
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
            _fsync_dir(checkpoints_dir)
    except BaseException:
        if ranks.main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    if ranks.main:
        prune_checkpoints(checkpoints_dir, keep_last=keep_last, keep_every=keep_every)
    barrier()  # no rank runs ahead of the rename
    return final


def _load_sharded_optimizer(path: Path, model, optimizer) -> None:
    """Load a DCP optimizer directory into `optimizer` (sharded or not: DCP reshards by parameter name)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    if model is None:
        raise CheckpointError(f"{path} is a sharded optimizer state; loading it needs its model")
    target = {"optimizer": get_optimizer_state_dict(model, optimizer)}
    dcp.load(target, checkpoint_id=path)
    set_optimizer_state_dict(model, optimizer, target["optimizer"])


def _load_full_optimizer(saved: dict[str, Any], model, optimizer) -> None:
    """A one-process optimizer state (parameters numbered in model.parameters() order) into the
    optimizer of a sharded model: renamed to parameter names, then each rank keeps its shard."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    names = [name for name, p in model.named_parameters() if p.requires_grad]  # the optimizer's (LoRA: adapters only)
    by_name = {
        "state": {names[i]: v for i, v in saved["state"].items()},
        "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in saved["param_groups"]],
    }
    set_optimizer_state_dict(model, optimizer, by_name, options=StateDictOptions(full_state_dict=True))
