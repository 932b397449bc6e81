"""What `mathrl eval` evaluates: its settings (`SweepSettings`), and TARGETs (model directories, run
directories, `tiny-arith`) resolved to the checkpoints they stand for, each with the config it is
evaluated with, their data read once before any model loads. evaluation/sweep.py runs the sweep.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from mathrl.config import Config, ConfigError, load_config, parse_override
from mathrl.model.paths import TINY_BASE
from mathrl.run_dir import RunDir

__all__ = ["Checkpoint", "SweepSettings", "TargetError", "resolve_targets", "run_checkpoints"]

# Overrides that would silently do nothing here: sampling settings come from the flags, the model from TARGET.
_FLAG_KEYS = {"eval.n": "--n", "eval.temperature": "--temperature", "eval.top_p": "--top-p",
              "eval.seed": "--seeds", "model.path": "a TARGET"}
_OVERRIDE = re.compile(r"^[A-Za-z_][\w.]*=")


class TargetError(ValueError):
    """A TARGET that is not a model directory, a run directory or tiny-arith."""


@dataclass
class SweepSettings:
    """What `mathrl eval` samples, and from which data. None means "from the target's config"."""

    n: int = 8  # samples per problem: pass@1 is their mean (avg@n); pass@k for k in default_ks(n)
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])  # sampling seeds: mean and std across them
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int | None = None  # default: eval.max_new_tokens, else rollout.max_new_tokens of the config
    limit: int | None = None  # problems per dataset; default: all rows of a file, data.eval_size arithmetic problems
    template: str | None = None  # default: data.template of the config
    data: list[str] | None = None  # "arith" (arith_decimal, arith_hard), .jsonl/.parquet files, hf:<name>[:<config>][@<split>]; default: data.eval
    device: str = "auto"  # auto = cuda when available, else cpu
    step: int | None = None  # neighbourhood averaging around this training step
    neighbours: int = 1  # checkpoints on each side of `step` that join its average

    def validate(self) -> None:
        errors = []
        if self.n < 1:
            errors.append(f"--n must be >= 1, got {self.n}")
        if not self.seeds:
            errors.append("--seeds needs at least one seed")
        elif len(set(self.seeds)) != len(self.seeds):
            errors.append(f"--seeds has duplicates {self.seeds}: a repeated seed repeats the same draws and shrinks the CI falsely")
        if not self.temperature >= 0:
            errors.append(f"--temperature must be >= 0 (0 is greedy decoding), got {self.temperature}")
        elif self.temperature == 0 and self.n > 1:
            errors.append(f"--temperature 0 is greedy decoding: all --n {self.n} samples of a problem would be the "
                          "same; add --n 1")
        if not 0 < self.top_p <= 1:
            errors.append(f"--top-p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            errors.append(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if self.limit is not None and self.limit < 1:
            errors.append(f"--limit must be >= 1, got {self.limit}")
        if self.neighbours < 0:
            errors.append(f"--neighbours must be >= 0, got {self.neighbours}")
        if errors:
            raise ConfigError("\n".join(errors))  # one line per problem


@dataclass
class Checkpoint:
    """One model to evaluate and the config it is evaluated with."""

    label: str  # "<run name>/step_000010", "<run name>/final", or the model directory as given
    path: str  # the Hugging Face model directory
    step: int | None  # training step from trainer_state.json; None for a plain model directory
    run: str | None  # the run directory it belongs to; None for a plain model directory
    cfg: Config = field(repr=False)  # run config.yaml (or defaults) <- overrides <- flags


# ----------------------------------------------------------------------------------------------------
# targets and overrides (cli.py parses the command line)
# ----------------------------------------------------------------------------------------------------
def split_args(args: Sequence[str]) -> tuple[list[str], list[str]]:
    """(targets, overrides): `key.path=value` words are overrides unless they name an existing path."""
    targets, overrides = [], []
    for a in args:
        (overrides if _OVERRIDE.match(a) and not Path(a).exists() else targets).append(a)
    return targets, overrides


# ----------------------------------------------------------------------------------------------------
# targets -> checkpoints
# ----------------------------------------------------------------------------------------------------
def check_overrides(overrides: Sequence[str]) -> None:
    for text in overrides:
        key, _ = parse_override(text)
        if key in _FLAG_KEYS:
            raise ConfigError(f"override {text!r} has no effect in `mathrl eval`; use {_FLAG_KEYS[key]} instead")


def eval_config(run_dir: Path | None, overrides: Sequence[str], settings: SweepSettings) -> Config:
    """The run's config.yaml (or the defaults) <- overrides <- the --template / --data flags, checked together
    (data.question_field counts with the --data file). The flags go in as JSON, which YAML reads as given."""
    flags = [*([f"data.template={json.dumps(settings.template)}"] if settings.template is not None else []),
             *([f"data.eval={json.dumps(list(settings.data))}"] if settings.data is not None else [])]
    return load_config(run_dir / "config.yaml" if run_dir else None, [*overrides, *flags], check_paths=False)


def run_checkpoints(run_dir: Path, cfg: Config) -> list[tuple[str, Path, int]]:
    """(label, path, step) of every checkpoint of a run, ordered by step.

    The step is trainer_state.json's "step"; without that file, the number in step_<N>, or
    train.steps for final/. Two directories with the same step (final/ and a step_<N> saved at the
    last step) are one checkpoint: the step_<N> one is kept.
    """
    # RunDir knows the layout; a checkpoint being written lives in step_<N>.tmp-* and is not listed
    found = [(f"{run_dir.name}/{name}", d, cfg.train.steps if step is None else int(step), final)
             for name, d, step, final in RunDir(run_dir).model_dirs()]
    found.sort(key=lambda x: (x[2], x[3]))
    out, seen = [], set()
    for label, d, step, _ in found:
        if step not in seen:
            seen.add(step)
            out.append((label, d, step))
    return out


def run_start(run_dir: Path, cfg: Config) -> tuple[Path | None, str]:
    """The model a run started from, its step 0, when it is on this machine: (directory, "") or
    (None, why it is not evaluated). That is the parent checkpoint of a `train.init_from` run, the cached
    tiny base model, or a local `model.path` directory; a hub id is never downloaded for it."""
    from mathrl.model.tiny import base_model_dir

    run = RunDir(run_dir)
    if run.parent_path.exists():
        parent = Path(json.loads(run.parent_path.read_text())["checkpoint"])
        return (parent, "") if (parent / "config.json").exists() else (None, f"its parent checkpoint {parent} is gone")
    if cfg.model.init == "random":
        return None, "model.init=random: its starting weights were never saved"
    if cfg.model.path == TINY_BASE:
        base = base_model_dir(cfg.base)
        if (base / "model.safetensors").exists():
            return base, ""
        return None, "the tiny base model is not in this machine's cache (`mathrl base` with the run's base.* settings builds it)"
    local = Path(cfg.model.path).expanduser()
    if (local / "config.json").exists():
        return local, ""
    return None, f"model.path={cfg.model.path} is not a local directory (give it as another TARGET to evaluate it)"


def _target_config(target: str, overrides: Sequence[str], settings: SweepSettings) -> Config:
    """The config a TARGET is evaluated with, found without building or loading anything; raises
    TargetError for a TARGET that is not a model directory, a run directory or tiny-arith."""
    path = Path(target).expanduser()
    if target == TINY_BASE and not path.exists():
        cfg = eval_config(None, overrides, settings)
        cfg.model.path = TINY_BASE
        return cfg
    if not path.exists():
        raise TargetError(f"target {target!r} does not exist; give a model directory, a run directory "
                          f"(with config.yaml) or {TINY_BASE}")
    if (path / "config.yaml").exists():
        return eval_config(path, overrides, settings)
    if (path / "config.json").exists():
        return eval_config(None, overrides, settings)
    raise TargetError(f"target {target!r} is neither a run directory (no config.yaml) nor a Hugging Face "
                      "model directory (no config.json)")


def resolve_targets(targets: Sequence[str], *, overrides: Sequence[str], settings: SweepSettings, console: Console) -> list[Checkpoint]:
    """Every checkpoint the TARGETs stand for, in the order given (a run's checkpoints by step).

    Every TARGET's config and data (`check_eval_data`) are checked before the first model is built: a
    wrong field map fails in seconds, not after the tiny base model has been pretrained."""
    check_overrides(overrides)
    configs = [_target_config(target, overrides, settings) for target in targets]
    checked = set()
    for cfg in configs:
        if repr(cfg.data) not in checked:  # targets with the same data settings read it once
            checked.add(repr(cfg.data))
            check_eval_data(cfg, limit=settings.limit)
    checkpoints: list[Checkpoint] = []
    for target, cfg in zip(targets, configs):
        path = Path(target).expanduser()
        if target == TINY_BASE and not path.exists():
            from mathrl.model.paths import resolve_model_path
            from mathrl.tasks.arithmetic import base_pretraining_text

            checkpoints.append(Checkpoint(TINY_BASE, resolve_model_path(cfg, console, pretraining_text=base_pretraining_text(cfg.base)), None, None, cfg))
        elif (path / "config.yaml").exists():
            found = run_checkpoints(path, cfg)
            if not found:
                raise TargetError(f"run directory {target!r} holds no checkpoint (checkpoints/step_*/ or final/ with "
                                  "config.json); is the run still in its first steps?")
            start, why_not = run_start(path, cfg)
            if start is not None:  # step 0 of the run's evaluation curve
                checkpoints.append(Checkpoint(f"{path.name}/start", str(start), 0, str(path), cfg))
            else:
                console.print(f"[yellow]note:[/yellow] {target}: its starting model (step 0) is not evaluated: {why_not}")
            checkpoints += [Checkpoint(label, str(d), step, str(path), cfg) for label, d, step in found]
        else:
            checkpoints.append(Checkpoint(target, str(path), None, None, cfg))
    return checkpoints


def default_out_dir(targets: Sequence[str], checkpoints: Sequence[Checkpoint]) -> Path:
    runs = {c.run for c in checkpoints}
    if len(targets) == 1 and len(runs) == 1 and None not in runs:
        return Path(next(iter(runs))) / "eval"
    return Path(f"eval_{time.strftime('%Y%m%d-%H%M%S')}")


# ----------------------------------------------------------------------------------------------------
# data
# ----------------------------------------------------------------------------------------------------
def check_eval_data(cfg: Config, *, limit: int | None) -> None:
    """Read every dataset of cfg.data.eval that is not a built-in arithmetic set (files and hf: sources)
    with its field map, as the sweep will read it (its first `limit` rows, all when None), before any
    model is built or loaded: a missing field or a malformed row raises `DataError` now, naming file and
    line, instead of after the model has loaded."""
    from mathrl.registry import ARITH_SOURCES
    from mathrl.tasks.loading import load_problems
    from mathrl.tasks.sources import field_map

    for source in cfg.data.eval:
        if source not in ARITH_SOURCES.names():
            load_problems(source, field_map(cfg, source), limit=limit, default_split="test")
