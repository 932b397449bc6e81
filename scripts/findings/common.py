"""What the three commands share: grouping runs into variants, mean ± CI cells, tables, figures."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path

from mathrl.analysis.charts import PALETTE
from mathrl.evaluation.metrics import mean_std_ci95

MISSING = "—"  # a metric no run of the variant logged
_SEED_SUFFIX = re.compile(r"_seed\d+$")


def variant_name(run_name: str) -> str:
    """The variant a run belongs to: its name without ablate.py's `_seed<N>` suffix ("a_seed2" -> "a")."""
    return _SEED_SUFFIX.sub("", run_name)


def group_runs(runs: Sequence[Path], labels: Sequence[str] | None = None) -> dict[str, list[Path]]:
    """variant -> its runs, in the order first seen. `labels` (one per run) overrides the names."""
    if labels and len(labels) != len(runs):
        raise ValueError(f"--group needs one label per run: {len(labels)} labels for {len(runs)} runs")
    groups: dict[str, list[Path]] = {}
    for i, run in enumerate(runs):
        groups.setdefault(labels[i] if labels else variant_name(Path(run).name), []).append(Path(run))
    return groups


def fmt(value: float, like: float | None = None) -> str:
    """Three decimals for fractions and small numbers, one for lengths and counts (chosen by `like`,
    default the value itself: a half-width is written with its mean's decimals)."""
    if math.isnan(value):
        return "nan"
    ref = value if like is None or math.isnan(like) else like
    return f"{value:.1f}" if abs(ref) >= 100 else f"{value:.3f}"


def ci_cell(values: Sequence[float]) -> str:
    """"mean ± ci95 (n=k)" over seeds or runs; "—" for no values. One value: "± nan" (spread unknown)."""
    if not values:
        return MISSING
    mean, _, half = mean_std_ci95(list(values))
    return f"{fmt(mean)} ± {fmt(half, mean)} (n={len(values)})"


def band(values: Sequence[float]) -> tuple[float, float, float]:
    """(mean, low, high) of the 95% CI for a plot; low = high = nan with fewer than two values (no band)."""
    mean, _, half = mean_std_ci95(list(values))
    return mean, mean - half, mean + half


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_outputs(fig_path: Path, figure, table: str) -> Path:
    """Save the figure and the table next to it (same stem, .md); returns the table's path."""
    fig_path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(fig_path, dpi=120)
    md = fig_path.with_suffix(".md")
    md.write_text(table)
    return md


def new_figure(panels: int, *, cols: int = 3, size: tuple[float, float] = (5.0, 3.4)):
    """(figure, axes) with one axis per panel, up to `cols` per row. Figure + FigureCanvasAgg, not
    pyplot: no global figure state and no backend switch in the caller's process (as analysis/charts.py)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    cols = max(1, min(cols, panels))
    rows = math.ceil(panels / cols)
    fig = Figure(figsize=(size[0] * cols, size[1] * rows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(rows, cols, i + 1) for i in range(panels)]
    return fig, axes


def color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]
