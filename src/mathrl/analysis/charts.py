"""The line charts of `mathrl report`: an inline SVG per metric (one line per run, drawn here, so no
JS library and no external URL) and the same charts as PNGs (matplotlib), for slides and papers.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from pathlib import Path

# matplotlib's tab10, so a run has the same colour in the SVG charts and in the PNGs.
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
           "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]

# Series with at most this many points get a marker (with a native <title> tooltip) at each point;
# longer ones are plain lines, read with the hover script.
MAX_MARKED_POINTS = 40


# ---- the SVG line chart -----------------------------------------------------------------------------

@dataclass
class Line:
    label: str
    color: str
    steps: list[int]
    values: list[float]  # may hold nan/inf: the line breaks there and an x marks the step
    width: float = 1.8  # stroke width in px


def line_width(run_index: int) -> float:
    """Earlier runs are drawn wider, so a run that overlaps another (same seed, same early steps) still
    shows as a border around it instead of disappearing."""
    return max(1.2, 2.8 - 0.5 * run_index)


def nice_ticks(lo: float, hi: float, *, count: int = 5, integer: bool = False) -> tuple[float, float, list[float]]:
    """An axis domain widened to round numbers and its ticks: (lo', hi', ticks), steps of 1, 2, 2.5 or 5 x 10^e.

    nice_ticks(0.13, 0.87) -> (0.0, 1.0, [0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
    """
    if not hi > lo:  # one value: give it some room (a constant 0, e.g. a clip fraction, gets [0, 1])
        if lo == 0:
            hi = 1.0
        else:
            pad = abs(lo) * 0.05
            lo, hi = lo - pad, hi + pad
    raw = (hi - lo) / count
    exp = math.floor(math.log10(raw))
    step = next(m * 10**exp for m in (1, 2, 2.5, 5, 10) if m * 10**exp >= raw * 0.999)
    if integer:
        step = max(1.0, round(step))
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    ticks = [i * step for i in range(first, last + 1)]
    return ticks[0], ticks[-1], ticks


def format_tick(value: float, step: float) -> str:
    """A tick label with just enough digits to tell ticks `step` apart (0.25 -> "0.25", 1e-06 -> "1e-06")."""
    if abs(value) < step * 1e-6:
        return "0"
    exp = math.floor(math.log10(step) + 1e-9)
    extra = 1 if round(step / 10**exp, 6) == 2.5 else 0  # 0.25, 2.5, ...: one more digit
    decimals = max(0, -exp + extra)
    if decimals <= 6:
        return f"{value:.{decimals}f}"
    return f"{value:.{max(1, math.floor(math.log10(abs(value))) - exp + 1 + extra)}g}"


def svg_line_chart(metric: str, lines: list[Line], *, width: int = 520, height: int = 280) -> str:
    """One metric of several runs as an inline <svg class="chart" data-metric=...>: axes, ticks, grid,
    one <polyline class="series"> per finite stretch of each run, a legend below the plot.

    Each polyline carries its exact data (data-run, data-steps, data-values) for the hover script.
    """
    left, right, top, bottom = 62, 14, 26, 40
    legend_h = 16 * len(lines) + 6
    plot_w, plot_h = width - left - right, height - top - bottom
    total_h = height + legend_h
    finite = [(s, v) for ln in lines for s, v in zip(ln.steps, ln.values) if math.isfinite(v)]
    all_steps = [s for ln in lines for s in ln.steps]
    x0, x1, xticks = nice_ticks(min(all_steps), max(all_steps), integer=True) if all_steps else (0, 1, [0, 1])
    if finite:
        y0, y1, yticks = nice_ticks(min(v for _, v in finite), max(v for _, v in finite))
    else:
        y0, y1, yticks = 0.0, 1.0, [0.0, 1.0]

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * plot_w

    def sy(y: float) -> float:
        return top + plot_h - (y - y0) / (y1 - y0) * plot_h

    esc = html.escape
    out = [
        f'<svg class="chart" data-metric="{esc(metric)}" width="{width}" height="{total_h}" '
        f'viewBox="0 0 {width} {total_h}" role="img" aria-label="{esc(metric)} by step" '
        f'data-plot="{left},{top},{plot_w},{plot_h}" data-xdomain="{x0:g},{x1:g}">',
        f"<title>{esc(metric)}</title>",
        f'<text class="title" x="{left}" y="16">{esc(metric)}</text>',
    ]
    # grid and ticks
    ystep = yticks[1] - yticks[0] if len(yticks) > 1 else 1.0
    for t in yticks:
        y = sy(t)
        out.append(f'<line class="grid" x1="{left}" x2="{left + plot_w}" y1="{y:.2f}" y2="{y:.2f}"/>')
        out.append(f'<text class="tick" x="{left - 6}" y="{y + 4:.2f}" text-anchor="end">{format_tick(t, ystep)}</text>')
    xstep = xticks[1] - xticks[0] if len(xticks) > 1 else 1.0
    for t in xticks:
        x = sx(t)
        out.append(f'<line class="axis" x1="{x:.2f}" x2="{x:.2f}" y1="{top + plot_h}" y2="{top + plot_h + 4}"/>')
        out.append(f'<text class="tick" x="{x:.2f}" y="{top + plot_h + 17}" text-anchor="middle">{format_tick(t, xstep)}</text>')
    out.append(f'<line class="axis" x1="{left}" x2="{left}" y1="{top}" y2="{top + plot_h}"/>')
    out.append(f'<line class="axis" x1="{left}" x2="{left + plot_w}" y1="{top + plot_h}" y2="{top + plot_h}"/>')
    out.append(f'<text class="axis-label" x="{left + plot_w / 2:.1f}" y="{top + plot_h + 33}" text-anchor="middle">step</text>')
    # the runs
    for ln in lines:
        marked = len(ln.steps) <= MAX_MARKED_POINTS
        for seg in _finite_segments(ln.steps, ln.values):
            pts = " ".join(f"{sx(s):.2f},{sy(v):.2f}" for s, v in seg)
            steps = ",".join(str(s) for s, _ in seg)
            values = ",".join(f"{v:.6g}" for _, v in seg)
            out.append(f'<polyline class="series" data-run="{esc(ln.label)}" stroke="{ln.color}" '
                       f'stroke-width="{ln.width:g}" points="{pts}" '
                       f'data-steps="{steps}" data-values="{values}"/>')
            if marked or len(seg) == 1:
                for s, v in seg:
                    out.append(f'<circle cx="{sx(s):.2f}" cy="{sy(v):.2f}" r="{ln.width + 0.8:g}" fill="{ln.color}">'
                               f"<title>{esc(ln.label)}: {v:.6g} at step {s}</title></circle>")
        for s, v in zip(ln.steps, ln.values):
            if not math.isfinite(v):  # keep a blow-up visible rather than silently dropping it
                out.append(f'<text class="nonfinite" x="{sx(s):.2f}" y="{top + 10}" fill="{ln.color}" '
                           f'text-anchor="middle">\u00d7<title>{esc(ln.label)}: {v} at step {s}</title></text>')
    out.append(f'<line class="guide" x1="0" x2="0" y1="{top}" y2="{top + plot_h}" visibility="hidden"/>')
    # legend
    for i, ln in enumerate(lines):
        y = height + 10 + 16 * i
        out.append(f'<line x1="{left}" x2="{left + 18}" y1="{y}" y2="{y}" stroke="{ln.color}" stroke-width="2.5"/>')
        out.append(f'<text class="legend" x="{left + 24}" y="{y + 4}">{esc(ln.label)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def _finite_segments(steps: list[int], values: list[float]) -> list[list[tuple[int, float]]]:
    segments: list[list[tuple[int, float]]] = [[]]
    for s, v in zip(steps, values):
        if math.isfinite(v):
            segments[-1].append((s, v))
        elif segments[-1]:
            segments.append([])
    return [seg for seg in segments if seg]


# ---- PNG copies ---------------------------------------------------------------------------------------

def png_name(metric: str) -> str:
    """reward/mean -> reward__mean.png (one flat folder; '/' is not allowed in a file name)."""
    return metric.replace("/", "__") + ".png"


def write_pngs(charts: list[tuple[str, list[Line]]], folder: Path) -> list[Path]:
    """One PNG per chart with matplotlib. Figure + FigureCanvasAgg rather than pyplot: no global
    figure state and no backend switch in the caller's process."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for metric, lines in charts:
        fig = Figure(figsize=(6.4, 3.6), dpi=100)
        FigureCanvasAgg(fig)
        fig.subplots_adjust(left=0.11, right=0.97, top=0.91, bottom=0.14)  # fixed: tight_layout doubles the time
        ax = fig.add_subplot()
        for ln in lines:
            values = [v if math.isfinite(v) else math.nan for v in ln.values]  # nan breaks the line
            marker = "o" if len(ln.steps) <= MAX_MARKED_POINTS else None
            ax.plot(ln.steps, values, color=ln.color, label=ln.label, marker=marker, markersize=2 * ln.width + 1,
                    linewidth=ln.width)
        ax.set_title(metric, fontsize=10, family="monospace")
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        path = folder / png_name(metric)
        fig.savefig(path)
        paths.append(path)
    return paths

