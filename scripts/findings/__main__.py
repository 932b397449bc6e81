"""Command line of scripts/findings (see __init__.py): parse the arguments and call curves / sampling."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# `python scripts/findings ...` puts scripts/findings/ on the path; the package and ablate.py sit in scripts/
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import findings  # noqa: E402


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python scripts/findings", description=findings.__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=findings.__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("curves", help="curves and final values of a grid's variants, mean ± 95%% CI over seeds")
    c.add_argument("sources", nargs="+", type=Path, help="a grid file (with --out), or run directories")
    c.add_argument("--out", type=Path, help="the directory ablate.py wrote the grid's runs to")
    c.add_argument("--fig", type=Path, required=True, help="the PNG to write (the table goes next to it as .md)")
    c.add_argument("--metrics", nargs="+", help="metric keys (default: every eval pass@1, then the grid's columns)")
    c.add_argument("--x", choices=["step", "tokens"], default="step",
                   help="x axis: the step, or the cumulative rollout/generated_tokens")
    c.add_argument("--smooth", type=int, default=5, help="rolling mean of training metrics over W steps (default 5)")
    c.add_argument("--last", type=int, default=10, help="final training value = mean over the last N steps (default 10)")
    c.add_argument("--group", nargs="+", help="the variant of each run, in order (default: the name without _seed<N>)")
    c.add_argument("--unfinished", action="store_true", help="include runs still going (no summary.json)")
    c.add_argument("--threshold", type=float,
                   help="pass@1 columns: also the first evaluation step reaching it, and the collapsed seeds")
    c.add_argument("--versus", metavar="VARIANT",
                   help="pass@1 columns: each variant's one-sided exact permutation p against this one")

    for name, text in (("passk", "pass@k of the base and the runs' final models"),
                       ("overconfidence", "how RL moved the probabilities of response tokens")):
        s = sub.add_parser(name, help=text)
        s.add_argument("runs", nargs="+", type=Path, help="finished run directories")
        s.add_argument("--base", required=True, help="the base model directory, or tiny-arith (the run's cached base)")
        s.add_argument("--limit", type=int, default=100, help="held-out problems (default 100)")
        s.add_argument("--fig", type=Path, required=True, help="the PNG to write (table .md and numbers .json next to it)")
        s.add_argument("--group", "--label", dest="group", nargs="+",
                       help="the variant of each run, in order (default: the name without _seed<N>)")
        s.add_argument("--seed", type=int, help="sampling seed (default: the run's eval.seed)")
        s.add_argument("--device", default="auto", help="auto (cuda when available), cpu or cuda")
        if name == "passk":
            s.add_argument("--n", type=int, default=64, help="samples per problem (default 64)")

    o = sub.add_parser("positions", help="critic value and advantage by response position (PPO runs)")
    o.add_argument("sources", nargs="+", type=Path, help="a grid file (with --out), or run directories")
    o.add_argument("--out", type=Path, help="the directory ablate.py wrote the grid's runs to")
    o.add_argument("--fig", type=Path, required=True, help="the PNG to write (the table goes next to it as .md)")
    o.add_argument("--steps", nargs="+", type=int, default=[1], help="steps of positions.jsonl (default 1)")
    o.add_argument("--edges", nargs="+", type=int, help="position bucket edges (default 0 2 4 8 16 32 64)")
    o.add_argument("--group", nargs="+", help="the variant of each run, in order (default: the name without _seed<N>)")

    e = sub.add_parser("entropy-tokens", help="the highest-entropy tokens of runs' kept checkpoints, step by step")
    e.add_argument("runs", nargs="+", type=Path, help="finished run directories (a variant's seeds are pooled)")
    e.add_argument("--steps", nargs="+", type=int, required=True,
                   help="checkpoint steps (0: the starting model; others kept by train.keep_every, or the last)")
    e.add_argument("--out", type=Path, required=True, help="the Markdown table to write")
    e.add_argument("--k", type=int, default=10, help="tokens per step (default 10)")
    e.add_argument("--min-count", type=int, default=5, help="a token must occur this often at a step (default 5)")
    e.add_argument("--limit", type=int, default=100, help="held-out problems, one response each (default 100)")
    e.add_argument("--group", "--label", dest="group", nargs="+", help="the variant of each run, in order")
    e.add_argument("--seed", type=int, help="sampling seed (default: the run's eval.seed)")
    e.add_argument("--device", default="auto", help="auto (cuda when available), cpu or cuda")

    t = sub.add_parser("teach", help="distillation arms against their compute: pass@k by step, token and FLOP (finding 19)")
    t.add_argument("runs", nargs="+", type=Path, help="finished run directories: RL runs, with or without a teacher, and SFT runs")
    t.add_argument("--teacher", type=Path, required=True, help="the teacher's run directory (its final/ and evals.jsonl)")
    t.add_argument("--fig", type=Path, required=True, help="the PNG to write (the table goes next to it as .md)")
    t.add_argument("--group", nargs="+", help="the arm of each run, in order (default: the name without _seed<N>)")
    t.add_argument("--share", type=float, default=0.95, help="threshold: this share of the teacher's pass@1 (default 0.95)")
    t.add_argument("--versus", metavar="ARM", help="each arm's one-sided permutation p of final pass@1 against this one")

    a = sub.add_parser("all", help="every findings run and analysis (scripts/findings/pipeline.py), one progress bar")
    a.add_argument("--out", type=Path, default=Path("runs/findings"), help="the runs' directory (default runs/findings)")
    a.add_argument("--fig-dir", type=Path, default=Path("docs/findings"),
                   help="where figures and tables go (default docs/findings)")
    a.add_argument("--jobs", type=int, default=2, help="commands at once, each with cores/jobs threads (default 2)")
    a.add_argument("--only", nargs="+", metavar="FINDING", help="only these findings (the names --dry-run lists)")
    a.add_argument("--grids", nargs="+", type=Path, metavar="GRID",
                   help="grid files instead of the registry (a registered one keeps its analyses, others get curves)")
    a.add_argument("--dry-run", action="store_true", help="print every command and the count, run nothing")
    return p


def from_repo(path: Path) -> Path:
    """`path` as the jobs see it (they run in the repository root): relative to it when inside it, else absolute."""
    from findings.pipeline import REPO

    path = path.resolve()
    return path.relative_to(REPO) if path.is_relative_to(REPO) else path


def run_all(args) -> int:
    import ablate

    from findings.pipeline import FINDINGS, build_jobs, describe, grid_findings, run_jobs
    from mathrl.config import ConfigError
    from mathrl.track.console import make_console

    if args.jobs < 1:
        raise ValueError("--jobs must be >= 1")
    findings = grid_findings([g.resolve() for g in args.grids]) if args.grids else FINDINGS
    try:
        jobs = build_jobs(findings, out=from_repo(args.out), fig_dir=from_repo(args.fig_dir), only=args.only)
    except ConfigError as e:
        raise ValueError(str(e)) from None
    if args.dry_run:
        print(describe(jobs), end="")
        return 0
    console = make_console()
    todo = [j for j in jobs if not j.done]
    console.print(f"{len(jobs)} commands, {len(jobs) - len(todo)} done earlier; runs in {args.out}, "
                  f"figures in {args.fig_dir}", markup=False, highlight=False)
    failed = run_jobs(jobs, parallel=args.jobs, console=console, env=ablate.thread_env(args.jobs))
    if failed:
        print(f"error: {len(failed)} commands failed or were skipped: {', '.join(failed)}", file=sys.stderr)
        return 1
    console.print(f"all {len(jobs)} commands done; figures and tables in {args.fig_dir}", markup=False,
                  highlight=False)
    return 0


def quiet_transformers() -> None:
    """As the mathrl CLI: no per-load progress bars between the lines."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.command == "all":
            return run_all(args)
        if args.command == "entropy-tokens":
            from findings.entropy_tokens import run_entropy_tokens

            quiet_transformers()

            table, _ = run_entropy_tokens(args.runs, steps=args.steps, out=args.out, k=args.k, min_count=args.min_count,
                                          limit=args.limit, labels=args.group, seed=args.seed, device=args.device)
            print(table, end="")
            print(f"table written to {args.out}")
            return 0
        if args.command == "positions":
            from findings.positions import DEFAULT_EDGES, run_positions

            table = run_positions(args.sources, fig_path=args.fig, out=args.out, steps=args.steps,
                                  edges=args.edges or DEFAULT_EDGES, labels=args.group)
            print(table, end="")
            print(f"figure written to {args.fig}, table to {args.fig.with_suffix('.md')}")
            return 0
        if args.command == "teach":
            from findings.teach import run_teach

            table = run_teach(args.runs, teacher=args.teacher, fig_path=args.fig, labels=args.group,
                              share=args.share, versus=args.versus)
        elif args.command == "curves":
            from findings.curves import run_curves

            table = run_curves(args.sources, fig_path=args.fig, out=args.out, metrics=args.metrics, x=args.x,
                               window=args.smooth, last=args.last, labels=args.group,
                               unfinished=args.unfinished, threshold=args.threshold, versus=args.versus)
        else:
            if args.limit < 1 or getattr(args, "n", 1) < 1:
                raise ValueError("--limit and --n must be >= 1")
            from findings.sampling import run_overconfidence, run_passk

            quiet_transformers()

            if args.command == "passk":
                table, _ = run_passk(args.base, args.runs, n=args.n, limit=args.limit, fig_path=args.fig,
                                     labels=args.group, seed=args.seed, device=args.device)
            else:
                table, _ = run_overconfidence(args.base, args.runs, limit=args.limit, fig_path=args.fig,
                                              labels=args.group, seed=args.seed, device=args.device)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(table, end="")
    print(f"figure written to {args.fig}, table to {args.fig.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
