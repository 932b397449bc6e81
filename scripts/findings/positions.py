"""`positions`: the critic's value and the policy advantage by response position, PPO runs of a grid.

    python scripts/findings positions recipes/findings/ppo.yaml --out runs/findings --steps 1 50 \\
        --fig docs/findings/ppo_positions.png

PPO runs with a critic write positions.jsonl, one row per step: the mean sampling-time value and the
mean policy advantage of the loss tokens at each response position, and how many responses reach it
(`algo.positions.position_means`). VC-PPO (Yuan et al. 2025, figs. 2-3) reads the critic this way: an
untrained critic scores a response's first tokens low, so the GAE advantages of those tokens are
inflated; value pretraining flattens the curve. Per variant and asked step:

* table: over position buckets [edges[i], edges[i+1]) the count-weighted mean value and advantage of
  each seed (`algo.positions.bucket_means`), then mean ± ci95 over seeds;
* figure: value and advantage by position (the mean over seeds of each position's mean, where at
  least one response of the seed reaches it), one line per variant and step.

Runs without positions.jsonl (no critic: GRPO) are left out with a note.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from findings.common import ci_cell, color, markdown_table, new_figure, variant_name, write_outputs
from mathrl.algo.positions import bucket_means
from mathrl.run_dir import RunDir

DEFAULT_EDGES = (0, 2, 4, 8, 16, 32, 64)
QUANTITIES = ("value", "advantage")


def step_row(run: Path, step: int) -> dict:
    """positions.jsonl's row of `step` in `run`; ValueError naming the steps it has."""
    rows = {int(r["step"]): r for r in RunDir(run).positions()}
    if step not in rows:
        raise ValueError(f"{run}/positions.jsonl has no row for step {step}"
                         + (f" (steps {min(rows)}-{max(rows)})" if rows else " (it is empty)"))
    return rows[step]


def bucket_row(row: dict, quantity: str, edges: Sequence[int]) -> list[float]:
    """bucket_means of one positions.jsonl row's `quantity` ("value" or "advantage")."""
    return bucket_means(torch.tensor(row[quantity], dtype=torch.float32), torch.tensor(row["count"]), list(edges))


def run_positions(sources: Sequence[Path], *, fig_path: Path, out: Path | None = None, steps: Sequence[int] = (1,),
                  edges: Sequence[int] = DEFAULT_EDGES, labels: Sequence[str] | None = None) -> str:
    """Tabulate and plot; returns the table (also written next to the figure)."""
    if not steps:
        raise ValueError("--steps needs at least one step")
    if len(sources) == 1 and sources[0].suffix in (".yaml", ".yml"):
        from ablate import load_grid

        if out is None:
            raise ValueError("a grid file needs --out, the directory ablate.py wrote its runs to")
        paths = [out / v.name for v in load_grid(sources[0])[1]]
    else:
        paths = [Path(s) for s in sources]
    if labels and len(labels) != len(paths):
        raise ValueError(f"--group needs one label per run: {len(labels)} labels for {len(paths)} runs")
    variants: dict[str, list[Path]] = {}
    for i, path in enumerate(paths):
        name = labels[i] if labels else variant_name(path.name)
        if not RunDir(path).positions_path.is_file():
            print(f"note: {path} has no positions.jsonl (no critic, or not run); variant {name} is left out",
                  file=sys.stderr)
            continue
        variants.setdefault(name, []).append(path)
    if not variants:
        raise ValueError("no run has positions.jsonl: positions are written by PPO runs with a critic "
                         "(algo.adv.estimator=gae)")
    buckets = [f"[{lo},{hi})" for lo, hi in zip(edges, edges[1:])]
    header = ["variant", "step"] + [f"{q} {b}" for q in QUANTITIES for b in buckets]
    rows = []
    fig, axes = new_figure(len(QUANTITIES), cols=2)
    for i, (name, runs) in enumerate(variants.items()):
        for j, step in enumerate(steps):
            records = [step_row(run, step) for run in runs]
            cells = []
            for q in QUANTITIES:
                per_seed = [bucket_row(r, q, edges) for r in records]
                cells += [ci_cell([s[b] for s in per_seed if s[b] == s[b]]) for b in range(len(buckets))]  # nan: empty
            rows.append([name, str(step), *cells])
            for ax, q in zip(axes, QUANTITIES):
                length = max(len(r[q]) for r in records)
                xs, ys = [], []
                for t in range(length):
                    seen = [r[q][t] for r in records if t < len(r["count"]) and r["count"][t] > 0]
                    if seen:
                        xs.append(t)
                        ys.append(sum(seen) / len(seen))
                ax.plot(xs, ys, color=color(i), linestyle=("-", "--", ":", "-.")[j % 4], linewidth=1.3,
                        label=f"{name} step {step} (n={len(records)})")
    for ax, q in zip(axes, QUANTITIES):
        ax.set_title(f"mean {q} by response position", fontsize=9)
        ax.set_xlabel("response position")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    table = markdown_table(header, rows)
    write_outputs(fig_path, fig, table)
    return table


__all__ = ["DEFAULT_EDGES", "bucket_row", "run_positions", "step_row"]
