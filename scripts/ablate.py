"""Run an ablation grid: one `mathrl train` per variant, one after another, then a Markdown table.

    python scripts/ablate.py recipes/ablations/loss_terms.yaml --out runs/abl
    python scripts/ablate.py recipes/ablations/batch.yaml --out runs/abl --only ds_band --dry-run

A grid file is YAML:

    recipe: null                            # optional base recipe for every run
    common: [train.steps=30, eval.every=10] # overrides shared by every run
    seeds: [0, 1]                           # optional; seed 0 keeps the plain name, others get _seed<N>
    columns: [actor/entropy, ...]           # metric keys for the table (see scripts/ablation_table.py)
    runs:
      clip_symmetric: [algo.clip.eps_high=0.2]
      clip_higher: []

Every variant's config is built and validated before the first run starts, so a typo in the last
variant fails in a second, naming the variant and the closest valid key, not after hours. Each run
goes to OUT/<name>; a finished run (summary.json present) is skipped, and a killed one resumes from
its last checkpoint (mathrl train's auto-resume), so re-running the same command completes a grid.
The table goes to OUT/<grid name>.md and to the console. Runs are sequential by default; `--jobs N`
runs N at once, each with cores/N torch threads (OMP_NUM_THREADS): two processes that each take
every core slow each other down far more than they gain, two with one thread each do not.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from mathrl.config import ConfigError, load_config

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ablation_table import COLUMNS, markdown_table, summarise  # noqa: E402 - the sibling script

GRID_KEYS = {"recipe", "common", "seeds", "columns", "runs"}


@dataclass
class Variant:
    name: str
    overrides: list[str]  # common + the variant's own + seed


def load_grid(path: Path) -> tuple[str | None, list[Variant], list[str]]:
    """(recipe, variants, columns) of a grid file; raises ValueError naming what is wrong."""
    grid = yaml.safe_load(path.read_text()) or {}
    if not isinstance(grid, dict) or not isinstance(grid.get("runs"), dict) or not grid["runs"]:
        raise ValueError(f"{path}: a grid needs a non-empty `runs:` mapping of name -> list of overrides")
    unknown = set(grid) - GRID_KEYS
    if unknown:
        raise ValueError(f"{path}: unknown grid keys {sorted(unknown)}; valid keys are {sorted(GRID_KEYS)}")
    common = [str(o) for o in grid.get("common") or []]
    seeds = [int(s) for s in grid.get("seeds") or [0]]
    variants = []
    for name, overrides in grid["runs"].items():
        if not isinstance(overrides, list):
            raise ValueError(f"{path}: run {name!r} must be a list of key.path=value overrides")
        for seed in seeds:
            suffix = "" if seed == 0 else f"_seed{seed}"
            variants.append(Variant(f"{name}{suffix}", [*common, *map(str, overrides), f"seed={seed}"]))
    return grid.get("recipe"), variants, [str(c) for c in grid.get("columns") or COLUMNS]


def train_command(recipe: str | None, variant: Variant, run_dir: Path) -> list[str]:
    """The `mathrl train` command line of one variant (this interpreter, `-m mathrl.cli`)."""
    return [sys.executable, "-m", "mathrl.cli", "train", *([str(recipe)] if recipe else []), *variant.overrides,
            "--run-dir", str(run_dir)]


def validate(recipe: str | None, variants: list[Variant]) -> None:
    """Build every variant's config; raises ConfigError naming the first variant that does not validate."""
    for v in variants:
        try:
            load_config(recipe, v.overrides)
        except ConfigError as e:
            raise ConfigError(f"variant {v.name!r}: {e}") from None


def thread_env(jobs: int) -> dict[str, str]:
    """The environment of a run when `jobs` run at once: cores/jobs torch threads each (OMP_NUM_THREADS)."""
    env = dict(os.environ)
    if jobs > 1:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // jobs))
    return env


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("grid", type=Path)
    parser.add_argument("--out", type=Path, default=Path("runs/abl"), help="parent directory of the runs (default runs/abl)")
    parser.add_argument("--only", nargs="+", help="run only these variants (names as in the table)")
    parser.add_argument("--last", type=int, default=10, help="average training metrics over the last N steps")
    parser.add_argument("--dry-run", action="store_true", help="validate and print the commands, run nothing")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once, each with cores/jobs torch threads (default 1)")
    args = parser.parse_args()

    try:
        recipe, variants, columns = load_grid(args.grid)
    except (OSError, ValueError, yaml.YAMLError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.only:
        missing = set(args.only) - {v.name for v in variants}
        if missing:
            print(f"error: --only names no variant of {args.grid}: {sorted(missing)}", file=sys.stderr)
            return 2
        variants = [v for v in variants if v.name in args.only]
    try:  # all configs are checked before anything runs
        validate(recipe, variants)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    if args.jobs < 1:
        print("error: --jobs must be >= 1", file=sys.stderr)
        return 2
    env = thread_env(args.jobs)
    running: list[tuple[Variant, subprocess.Popen, float]] = []
    failed = 0

    def reap_until(at_most: int) -> None:
        """Wait until at most `at_most` runs are still going, reporting each that ends."""
        nonlocal failed
        while True:
            for item in [r for r in running if r[1].poll() is not None]:
                running.remove(item)
                v, proc, started = item
                print(f"    {v.name}: exit {proc.returncode} after {time.monotonic() - started:.0f} s "
                      f"(log: {args.out / f'{v.name}.log'})", flush=True)
                failed = failed or proc.returncode
            if len(running) <= at_most:
                return
            time.sleep(1)

    for i, v in enumerate(variants, start=1):
        run_dir = args.out / v.name
        command = train_command(recipe, v, run_dir)
        if args.dry_run:
            print("mathrl " + shlex.join(command[3:]))
            continue
        if (run_dir / "summary.json").is_file():
            print(f"[{i}/{len(variants)}] {v.name}: finished earlier, kept")
            continue
        reap_until(args.jobs - 1)
        if failed:
            break
        print(f"[{i}/{len(variants)}] {v.name}: {' '.join(v.overrides)}", flush=True)
        args.out.mkdir(parents=True, exist_ok=True)
        with (args.out / f"{v.name}.log").open("a") as log:
            running.append((v, subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env), time.monotonic()))
    reap_until(0)
    if args.dry_run:
        return 0
    if failed:
        return failed
    table = markdown_table([summarise(args.out / v.name, args.last, columns) for v in variants])
    out = args.out / f"{args.grid.stem}.md"
    out.write_text(table)
    print(table, end="")
    print(f"table written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
