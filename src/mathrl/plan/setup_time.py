"""The setup-time line of `mathrl plan`: what the run does before its first step that the memory plan does
not show (a tiny base model to build, a hub model to download, or nothing).
"""

from __future__ import annotations

import shlex
from pathlib import Path

from mathrl.config import TINY_BASE, Config, parse_config_path
from mathrl.model.paths import offline_variable

# Measured builds of the tiny base model, by its cache key (model/tiny.py:recipe_hash): minutes, and where.
# A test checks that the shipped recipes' keys are here, so a change of the base-model recipe shows.
MEASURED_BUILDS: dict[str, tuple[float, str]] = {
    "710f9396d286": (1.35, "the default recipe, 800 steps: 1 min 21 s on 2 AMD EPYC cores (README)"),
    "eb26bbf81fe3": (5.5, "recipes/arith_tools.yaml, 1500 steps: 5.5 min on 2 AMD EPYC cores (docs/findings.md)"),
    "72ba9bbaf988": (17.5, "recipes/arith_tools_mul.yaml, 1500 steps of 192 positions: 17.5 min on one AMD EPYC core "
                           "with the other busy (docs/findings.md)"),
}
_STEPS_OF_MEASURED = {"710f9396d286": 800, "eb26bbf81fe3": 1500, "72ba9bbaf988": 1500}


def setup_time(cfg: Config) -> str:
    """One line on what the run does before its first step: with the tiny base model, whether this
    recipe's base is cached, else how long its build took where it was measured, or an estimate from
    the measured builds (labelled so); with a hub id, whether it is in the local Hugging Face cache."""
    if cfg.model.path == TINY_BASE:
        from mathrl.model.tiny import base_model_dir, is_built, recipe_hash

        path = base_model_dir(cfg.base)
        if is_built(path):
            return f"setup: the tiny base model of this recipe is cached ({path}): no build"
        key = recipe_hash(cfg.base)
        first = f"setup: the tiny base model of this recipe is not cached: the run builds it first ({cfg.base.steps} pretraining steps"
        if key in MEASURED_BUILDS:
            return f"{first}; measured: {MEASURED_BUILDS[key][1]}; other CPUs and loads differ)"
        rates = [MEASURED_BUILDS[k][0] * 60 / n for k, n in _STEPS_OF_MEASURED.items()]  # seconds per pretraining step
        low, high = (cfg.base.steps * r / 60 for r in (min(rates), max(rates)))
        return (f"{first}; an estimate, not a measurement: {low:.0f}-{high:.0f} min, at the {min(rates):.2f}-{max(rates):.2f} s "
                "per step of the measured builds)")
    if parse_config_path(cfg.model.path) is not None:
        return "setup: random weights of a shipped architecture (model.init=random): nothing to download or build"
    from mathrl.model.paths import looks_like_hub_id

    if not looks_like_hub_id(cfg.model.path):
        return f"setup: loads {cfg.model.path} (a local directory): nothing to download or build"
    try:
        from huggingface_hub import try_to_load_from_cache
        cached = isinstance(try_to_load_from_cache(cfg.model.path, "config.json"), str)
    except Exception:  # pragma: no cover - transformers depends on it
        cached = False
    if cached:
        return f"setup: {cfg.model.path} is cached (the local Hugging Face cache): nothing to download"
    if offline_model(cfg):
        return (f"setup: {cfg.model.path} is not cached, and {offline_variable()} is set: the run will stop; download it "
                f"first with `hf download {cfg.model.path}` where the hub is reachable")
    return f"setup: {cfg.model.path} is not cached (the local Hugging Face cache): the run downloads it first"


def offline_model(cfg: Config) -> bool:
    """Whether the run would stop at once: model.path is a hub id that is not cached, and an offline variable is set."""
    from mathrl.model.paths import looks_like_hub_id

    if cfg.model.path == TINY_BASE or parse_config_path(cfg.model.path) is not None or not looks_like_hub_id(cfg.model.path):
        return False
    if offline_variable() is None:
        return False
    from huggingface_hub import try_to_load_from_cache

    return not isinstance(try_to_load_from_cache(cfg.model.path, "config.json"), str)


def data_lines(cfg: Config) -> tuple[list[str], bool]:
    """One line per local data file the recipe reads (data.train, data.eval), relative to the current
    directory as the run reads them: found, or missing (the run would stop); and whether all are there."""
    lines, ok = [], True
    for where, source in cfg._data_files():
        path = Path(source).expanduser()
        if path.is_file():
            lines.append(f"data: {where} {source}: found")
        else:
            ok = False
            lines.append(f"data: {where} {source}: no such file (from {Path.cwd()}): the run will stop; "
                         "run from the directory the recipe's paths are relative to, or override the key")
    return lines, ok


def launch_line(recipe: str | None, overrides: list[str], *, gpus: int, trainer_gpus: int | None,
                gpus_per_node: int = 8) -> str:
    """The command that runs the plan just made: one process on a CPU (`gpus` 0); `mathrl train --nproc N`
    on one machine (N: the trainer's GPUs; generator processes take the others); above `gpus_per_node`
    GPUs, torchrun on each of the machines, run from a directory they share."""
    words = " ".join(shlex.quote(w) for w in [*([recipe] if recipe else []), *overrides])
    ranks = trainer_gpus if trainer_gpus is not None else gpus
    if gpus <= 1 and ranks <= 1:
        return f"launch: mathrl train {words}".rstrip()
    if gpus <= gpus_per_node:
        return f"launch: mathrl train --nproc {ranks} {words}".rstrip()
    nodes, per_node = -(-ranks // gpus_per_node), min(ranks, gpus_per_node)
    name = Path(recipe).stem if recipe else "mathrl"
    return (f"launch, on each of the {nodes} machines ({per_node} GPUs each), from a directory they share: torchrun --nnodes {nodes} "
            f"--nproc-per-node {per_node} --rdzv-backend c10d --rdzv-endpoint NODE0:29500 --rdzv-id {name} -m mathrl.train {words}").rstrip()
