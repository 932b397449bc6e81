"""What each `mathrl` verb does: check what can be checked before work starts, then call the library.
Each handler takes the parsed arguments and a console and returns the exit status."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from rich.console import Console

from mathrl.cli.arguments import EXIT_ERROR, UsageError
from mathrl.config import Config, ConfigError, load_config
from mathrl.run_dir import RUNS_ROOT, new_run_dir


def _split_recipe(args: list[str]) -> tuple[str | None, list[str]]:
    recipe = None
    overrides = []
    for a in args:
        if a.endswith((".yaml", ".yml")) and "=" not in a and recipe is None:
            recipe = a
        else:
            overrides.append(a)
    return recipe, overrides


def _quiet_libraries() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def check_writable_dir(path: Path, what: str) -> None:
    """Raise ConfigError unless `path` is a directory that can be written, or can be created as one."""
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{what} {str(path)!r} is a file, not a directory; choose another {what}")
    existing = path.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"{what} {str(path)!r}: {str(existing)!r} is a file, so no directory can be made under it")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{what} {str(path)!r}: {str(existing)!r} cannot be written (read-only or no permission); "
                          f"choose another {what}")


def check_data_files(cfg: Config) -> None:
    """Read the local data files the run will read (data.train whole, each data.eval file's first
    data.eval_size rows) before anything is built or loaded: a malformed row fails now, naming file and
    line, instead of after the model has loaded. hf: datasets are read when the run starts."""
    from mathrl.tasks.loading import load_problems
    from mathrl.tasks.sources import field_map

    for where, source in cfg._data_files():
        if where == "data.train":
            load_problems(source, field_map(cfg, source), on_error=cfg.data.on_error)
        else:
            load_problems(source, field_map(cfg, source), limit=cfg.data.eval_size, default_split="test")


def train(ns: argparse.Namespace, console: Console) -> int:
    from mathrl.track.console import install_startup_log

    install_startup_log(console, quiet=ns.quiet)  # first: the config's checks log too (the python tool's sandbox)
    recipe, overrides = _split_recipe(ns.args)
    cfg = load_config(recipe, overrides)
    if ns.run_dir:
        cfg.run_dir = ns.run_dir  # a path, never re-read as YAML (--run-dir 2024-05-01 stays a string)
    check_writable_dir(Path(cfg.run_dir or RUNS_ROOT), "--run-dir")
    check_data_files(cfg)
    if ns.nproc < 1:
        raise UsageError(f"--nproc must be >= 1, got {ns.nproc}")
    cfg.run_dir = cfg.run_dir or str(new_run_dir(RUNS_ROOT))  # made once, here: every rank gets it
    ns.run_dir_used = cfg.run_dir  # for the Ctrl-C message
    if ns.nproc > 1:  # one torchrun job; every rank runs this command without --nproc, on the same run dir
        from mathrl.train.launch import launch

        return launch(ns.nproc, [*ns.args, "--run-dir", cfg.run_dir, *(["--no-resume"] if ns.no_resume else []),
                                 *(["-q"] if ns.quiet else [])])
    _quiet_libraries()
    from mathrl.train import loop

    return _run(loop.train, cfg, ns, console)


def _run(run, cfg, ns: argparse.Namespace, console: Console) -> int:
    """Call train or sft; a run directory that holds a finished run is not an error: say so and what to do."""
    from mathrl.run_dir import RunComplete

    try:
        run(cfg, console=console, resume=not ns.no_resume)
    except RunComplete as e:
        if not getattr(e, "reported_by_rank_0", False):  # under torchrun every rank raises it; rank 0 says it
            console.print(str(e))
    return 0


def sft(ns: argparse.Namespace, console: Console) -> int:
    from mathrl.track.console import install_startup_log

    install_startup_log(console, quiet=ns.quiet)
    recipe, overrides = _split_recipe(ns.args)
    cfg = load_config(recipe, overrides)
    cfg.run_dir = ns.run_dir or cfg.run_dir
    check_writable_dir(Path(cfg.run_dir or RUNS_ROOT), "--run-dir")
    from mathrl.train.sft import check_sft_config, sft

    check_sft_config(cfg)
    check_data_files(cfg)
    cfg.run_dir = cfg.run_dir or str(new_run_dir(RUNS_ROOT))
    ns.run_dir_used = cfg.run_dir  # for the Ctrl-C message
    _quiet_libraries()
    return _run(sft, cfg, ns, console)


def distill_data(ns: argparse.Namespace, console: Console) -> int:
    from mathrl.train import distill_data as distill

    settings = distill.DistillSettings(teacher=ns.teacher, out=ns.out, n=ns.n, prompts=ns.prompts, max_per_prompt=ns.max_per_prompt,
                               temperature=ns.temperature, seed=ns.seed, force=ns.force)
    settings.validate()
    settings.check_out()  # before anything loads
    recipe, overrides = _split_recipe(ns.args)
    cfg = distill.distill_config(recipe, overrides, settings)
    check_data_files(cfg)
    _quiet_libraries()
    distill.distill_data(cfg, settings, console=console)
    return 0


def config(ns: argparse.Namespace, console: Console) -> int:
    from mathrl.config import dump_yaml
    from mathrl.config.schema import plain, reference

    recipe, overrides = _split_recipe(ns.args)
    cfg = load_config(recipe, overrides, check_paths=False)
    if ns.yaml:
        print(dump_yaml(cfg), end="")
        return 0
    values = {e.key: e.default for e in reference(Config)}
    for e in reference(Config):
        if e.section:
            print(f"\n{e.key}:" + (f"  # {e.doc}" if e.doc else ""))
            continue
        value = cfg
        for part in e.key.split("."):
            value = getattr(value, part)
        value = plain(value)
        came = cfg.chosen.get(e.key)  # a value load_config chose, e.g. the policy loss's own clip range
        shown = f"{value!r}" + (f" ({came}; default {values[e.key]!r})" if came else
                                f" (default {values[e.key]!r})" if value != values[e.key] else "")
        allowed = f"  [{e.domain}]" if e.domain else ""
        print(f"{e.key}: {e.type} = {shown}{allowed}" + (f"  # {e.doc}" if e.doc else ""))
        for item in e.items:  # a list of entries: the keys of each, with a new entry's defaults
            allowed = f"  [{item.domain}]" if item.domain else ""
            print(f"  {item.key}: {item.type} = {item.default!r}{allowed}" + (f"  # {item.doc}" if item.doc else ""))
    return 0


def serve_teacher(ns: argparse.Namespace, console: Console) -> int:
    from mathrl.train.serve_teacher import serve_teacher as serve

    if not 0 <= ns.port <= 65535:
        raise UsageError(f"--port must be in 0-65535, got {ns.port}")
    _quiet_libraries()
    vllm_options = {k: v for k, v in (("gpu_memory_utilization", ns.gpu_memory_utilization), ("max_topk", ns.max_topk))
                    if v is not None}  # unset: serve_teacher's defaults
    if ns.engine != "vllm" and vllm_options:
        flags = " and ".join("--" + k.replace("_", "-") for k in vllm_options)
        raise UsageError(f"{flags} count only with --engine vllm; add it or leave them out")
    if not (0 < vllm_options.get("gpu_memory_utilization", 1) <= 1 and vllm_options.get("max_topk", 1) >= 1):
        raise UsageError("--gpu-memory-utilization must be in (0, 1] and --max-topk >= 1")
    serve(ns.model, host=ns.host, port=ns.port, dtype=ns.dtype, device=ns.device, console=console, engine=ns.engine,
          **vllm_options)
    return 0


def base(ns: argparse.Namespace, console: Console) -> int:
    from mathrl.model.paths import TINY_BASE, resolve_model_path
    from mathrl.tasks.arithmetic import base_pretraining_text
    from mathrl.track.console import make_console

    cfg = load_config(None, ns.args)
    cfg.model.path = TINY_BASE
    _quiet_libraries()
    # stdout holds only the path: $(mathrl base)
    print(resolve_model_path(cfg, make_console(stderr=True), pretraining_text=base_pretraining_text(cfg.base)), flush=True)
    return 0


def eval(ns: argparse.Namespace, console: Console) -> int:
    from mathrl.evaluation.sweep import sweep
    from mathrl.evaluation.targets import SweepSettings, TargetError, split_args

    targets, overrides = split_args(ns.args)
    if not targets:
        raise TargetError("no TARGET given: pass a model directory, a run directory or tiny-arith")
    if ns.step is None and ns.neighbours is not None:
        raise ConfigError("--neighbours needs --step (the checkpoint to average around)")
    settings = SweepSettings(
        n=ns.n, seeds=list(ns.seeds), temperature=ns.temperature, top_p=ns.top_p, max_new_tokens=ns.max_new_tokens,
        limit=ns.limit, template=ns.template, data=ns.data, device=ns.device, step=ns.step,
        neighbours=1 if ns.neighbours is None else ns.neighbours,
    )
    settings.validate()
    if ns.out:
        check_writable_dir(Path(ns.out), "--out")
    _quiet_libraries()
    sweep(targets, settings, overrides=overrides, console=console, out=Path(ns.out) if ns.out else None)
    return 0


def inspect(ns: argparse.Namespace, console: Console) -> int:
    import dataclasses

    from mathrl.analysis.inspect_cli import InspectOptions, inspect

    _quiet_libraries()
    options = InspectOptions(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(InspectOptions)})
    inspect(options, console)
    return 0


def plan(ns: argparse.Namespace, console: Console) -> int:
    from mathrl.plan.format import format_plan
    from mathrl.plan.memory import estimate_memory
    from mathrl.plan.setup_time import data_lines, launch_line, offline_model, setup_time

    recipe, overrides = _split_recipe(ns.args)
    cfg = load_config(recipe, overrides, check_paths=False)  # planning needs the architecture, not the data
    _quiet_libraries()
    gpus = 0 if cfg.train.device == "cpu" else ns.gpus
    trainer_gpus = list(range(ns.trainer_gpus)) if ns.trainer_gpus is not None and gpus else None
    plan = estimate_memory(cfg, gpus=gpus, gpu_mem_gib=ns.gpu_mem, trainer_gpus=trainer_gpus, host_mem_gib=ns.host_mem)
    print(format_plan(plan, cfg.model.path), flush=True)
    print(setup_time(cfg), flush=True)
    lines, data_ok = data_lines(cfg)
    for line in lines:
        print(line, flush=True)
    print(launch_line(recipe, overrides, gpus=gpus, trainer_gpus=ns.trainer_gpus if gpus else None), flush=True)
    return 0 if plan.fits and data_ok and not offline_model(cfg) else EXIT_ERROR  # the run would stop: say no


def report(ns: argparse.Namespace, console: Console) -> int:
    from mathrl.analysis.report import build_report

    out = build_report([Path(p) for p in ns.run_dirs], Path(ns.out), title=ns.title, pngs=not ns.no_png)
    console.print(f"wrote {out}" + ("" if ns.no_png else f" and its charts as PNGs in {out.stem}_plots/"))
    return 0


def export(ns: argparse.Namespace, console: Console) -> int:
    from mathrl.analysis.model_card import export_model

    out = export_model(ns.run, ns.out, checkpoint=ns.checkpoint, license=ns.license)
    console.print(f"wrote {out} (the model, its card README.md and mathrl_config.yaml)")
    return 0


def push(ns: argparse.Namespace, console: Console) -> int:
    from mathrl.analysis.model_card import push_model

    url = push_model(ns.run, ns.repo, private=ns.private, checkpoint=ns.checkpoint, license=ns.license)
    console.print(f"uploaded {ns.run} to {url}")
    return 0
