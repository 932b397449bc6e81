"""Summarise several runs side by side as a Markdown table (used for docs/ablations.md).

    python scripts/ablation_table.py runs/clip_sym runs/clip_higher ...
    python scripts/ablation_table.py runs/ds_* --columns filter/kept_groups filter/gen_rounds

For each run: held-out pass@1 at the first and last evaluation and at every evaluation (curve),
and the mean over the last `--last` training steps of each metric column (default: the loss-term
metrics: entropy, clip fractions, entropy coefficient and clip fraction, KL; an `eval/...` column: its
value at the last evaluation), "–" where the run did not log it. `scripts/ablate.py` runs a whole grid and writes this table for it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mathrl.track.sinks import read_metrics

COLUMNS = [
    "actor/entropy", "actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/entropy_coef",
    "actor/entropy_clipfrac", "actor/ref_kl", "actor/kl_loss", "rollout/response_length", "reward/mean",
]


def summarise(run_dir: Path, last: int, columns: list[str]) -> dict[str, float | str]:
    rows = read_metrics(run_dir / "metrics.jsonl")
    evals = [r for r in rows if any(k.endswith("/pass@1") for k in r)]
    train = [r for r in rows if "reward/mean" in r][-last:]
    key = next(k for k in evals[0] if k.endswith("/pass@1"))
    out: dict[str, float | str] = {
        "run": run_dir.name,
        "pass@1 base": evals[0][key],
        "pass@1 final": evals[-1][key],
        "pass@1 curve": " → ".join(f"{r[key]:.2f}" for r in evals),
    }
    for col in columns:
        if col.startswith("eval/"):  # an evaluation metric: its value at the last evaluation that logged it
            logged = [r[col] for r in evals if isinstance(r.get(col), (int, float))]
            out[col] = logged[-1] if logged else "–"
            continue
        values = [r[col] for r in train if isinstance(r.get(col), (int, float))]
        out[col] = sum(values) / len(values) if values else "–"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--last", type=int, default=10, help="average the training metrics over the last N steps")
    parser.add_argument("--columns", nargs="+", default=COLUMNS, help="metric keys to show (default: loss-term metrics)")
    args = parser.parse_args()
    print(markdown_table([summarise(r, args.last, args.columns) for r in args.runs]), end="")


def markdown_table(rows: list[dict[str, float | str]]) -> str:
    header = list(rows[0])
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for row in rows:
        lines.append("| " + " | ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in (row[h] for h in header)) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
