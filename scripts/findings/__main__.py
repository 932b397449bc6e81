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
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.command == "curves":
            from findings.curves import run_curves

            table = run_curves(args.sources, fig_path=args.fig, out=args.out, metrics=args.metrics, x=args.x,
                               window=args.smooth, last=args.last, labels=args.group,
                               unfinished=args.unfinished)
        else:
            if args.limit < 1 or getattr(args, "n", 1) < 1:
                raise ValueError("--limit and --n must be >= 1")
            from transformers.utils import logging as hf_logging

            from findings.sampling import run_overconfidence, run_passk

            hf_logging.set_verbosity_error()  # as the mathrl CLI: no per-load progress bars between the lines
            hf_logging.disable_progress_bar()

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
