"""The `mathrl` command: parses arguments and calls the library.

    mathrl train [RECIPE.yaml] [key.path=value ...] [--run-dir DIR]
    mathrl base  [base.key=value ...]                  build (or find) the tiny base model
    mathrl eval  TARGET... [key.path=value ...] [--n 8 --seeds 0 1 2 ...]   evaluate checkpoints (docs/evaluation.md)
    mathrl inspect --base PATH --model PATH (--run DIR --step S --index I | --prompt T --response T)
                                                      token-level views of what RL changed (docs/inspect.md)
    mathrl report RUN_DIR... [--out report.html]      one HTML page comparing runs (docs/report.md)
"""

from __future__ import annotations

import argparse
import os
import sys

from rich.console import Console

from mathrl.config import ConfigError, load_config
from mathrl.analysis import inspect_cli, report
from mathrl.evaluation import sweep


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mathrl", description="RL from verifiable rewards for math reasoning.")
    sub = parser.add_subparsers(dest="command", required=True)
    p_train = sub.add_parser("train", help="run an RL experiment (no arguments: the built-in arithmetic demo)")
    p_train.add_argument("args", nargs="*", help="an optional recipe .yaml, then key.path=value overrides")
    p_train.add_argument("--run-dir", help="where to write the run (default: runs/<timestamp>); an existing run there is resumed")
    p_train.add_argument("--no-resume", action="store_true",
                         help="start over even if --run-dir holds a run (the old run is moved aside, never deleted)")
    p_base = sub.add_parser("base", help="build (or find in the cache) the tiny base model")
    p_base.add_argument("args", nargs="*", help="base.key=value overrides")
    sweep.add_arguments(sub.add_parser(
        "eval", help="evaluate checkpoints: avg@n pass@1 over seeds with 95% CIs, pass@k, maj@n, collapse rates"))
    inspect_cli.add_arguments(sub.add_parser(
        "inspect", help="token-level views of what RL changed in one response: probabilities, Δlogp, entropy (HTML)"))
    report.add_arguments(sub.add_parser(
        "report", help="one self-contained HTML page comparing runs: curves, eval tables, config differences"))
    ns = parser.parse_args(argv)

    console = Console()
    if ns.command == "eval":  # TARGETs and overrides are parsed by the sweep, not load_config
        _quiet_libraries()
        return sweep.run(ns, console)
    if ns.command == "report":  # its own options; no recipe or overrides
        return report.run(ns, console)
    if ns.command == "inspect":  # its own options; no recipe or overrides
        _quiet_libraries()
        return inspect_cli.run(ns, console)
    try:
        recipe, overrides = _split_recipe(ns.args)
        cfg = load_config(recipe, overrides)
        if getattr(ns, "run_dir", None):
            cfg.run_dir = ns.run_dir  # a path, never re-read as YAML (--run-dir 2024-05-01 stays a string)
    except ConfigError as e:
        console.print(f"[red]config error:[/red] {e}")
        return 2
    _quiet_libraries()

    if ns.command == "base":
        from mathrl.tasks.sources import resolve_model_path

        cfg.model.path = "tiny-arith"
        console.print(resolve_model_path(cfg, console))
        return 0
    from mathrl.train.loop import DynamicSamplingExhausted, NonFiniteError, RunComplete, train

    try:
        train(cfg, console=console, resume=not ns.no_resume)
    except RunComplete as e:
        console.print(str(e))
        return 0
    except (FileExistsError, ValueError, NonFiniteError, DynamicSamplingExhausted) as e:
        console.print(f"[red]error:[/red] {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
