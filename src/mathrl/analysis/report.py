"""`mathrl report`: one self-contained HTML page that compares training runs.

    mathrl report runs/clip_sym runs/clip_higher --out clip.html --title "clip-higher ablation"

Reads the run directories that `mathrl train` writes (layout in src/mathrl/run_dir.py) and writes

    clip.html           the runs' eval tables (base vs final pass@1, pass@k, maj@n), the config fields
                        that differ between them, one chart per metric with one line per run (inline
                        SVG drawn here, so no JS library and no external URL), and any inspect*.html
                        token maps found in the run directories (a tool episode's tool output is grey in them, as
                        `mathrl inspect` draws it)
    clip_plots/*.png    the same charts as PNGs (matplotlib), for slides and papers

The page works without JavaScript; a short inline script only adds hover values. Each chart is an
`<svg class="chart" data-metric="...">`. docs/report.md describes the page.
"""

from __future__ import annotations

import html
import json
import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mathrl.run_dir import RunDir, processes_note
from mathrl.track.sinks import flatten

# ---- what to chart ----------------------------------------------------------------------------------
# Sections of the page, in order, and the metric keys they chart (docs/metrics.md). "eval/*" expands to
# every held-out set's pass@1, pass@k (ascending k) and maj@n; any other "*" stands for a set name
# ("eval/*/tool/call_rate": that key of every set, in order of first appearance). A key that no run
# logged is skipped, so a section whose keys no run logged (Tools, for runs without tools) is absent.
SECTIONS: list[tuple[str, list[str]]] = [
    ("Reward and held-out accuracy", ["reward/mean", "eval/*"]),
    ("Entropy", ["actor/entropy", "actor/rollout_entropy", "actor/entropy_coef", "actor/entropy_clipfrac"]),
    ("KL and clipping", ["actor/ref_kl", "actor/kl_loss", "actor/pg_clipfrac", "actor/pg_clipfrac_lower"]),
    ("Length", ["rollout/response_length", "rollout/truncated_frac"]),
    ("Critic (PPO)", ["critic/value_loss", "critic/explained_var", "critic/values_mean", "critic/returns_mean",
                      "critic/vf_clipfrac", "actor/gae_lambda"]),
    ("What reached the batch", ["filter/kept_groups", "filter/gen_rounds", "filter/dropped_all_correct",
                                "filter/dropped_all_wrong", "filter/dropped_out_of_band"]),
    # collapse/* are the detectors' rates (every step); filter/<reason> the samples the sample filter dropped
    ("Collapse", ["collapse/repetitive", "collapse/garbled", "collapse/no_answer", "reward/no_answer_rate",
                  "filter/repetitive", "filter/garbled", "filter/no_answer"]),
    # tool/* are logged only by runs with rollout.tools (docs/metrics.md, the tool/* section)
    ("Tools", ["tool/call_rate", "tool/calls_mean", "tool/void_turn_rate", "tool/error_rate",
               "eval/*/tool/call_rate"]),
]

# Config fields left out of the difference table: they differ between any two runs by construction.
IGNORED_CONFIG_FIELDS = {"run_dir"}

# matplotlib's tab10, so a run has the same colour in the SVG charts and in the PNGs.
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
           "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]

# Series with at most this many points get a marker (with a native <title> tooltip) at each point;
# longer ones are plain lines, read with the hover script.
MAX_MARKED_POINTS = 40

_EVAL_KEY = re.compile(r"^eval/(?P<set>.+)/(?P<kind>pass|maj)@(?P<k>\d+)$")


# ---- reading run directories --------------------------------------------------------------------------

@dataclass
class EvalPoint:
    """One evaluation of one held-out set (a row of evals.jsonl, or half of summary.json)."""

    step: int | None
    n: int | None  # samples per problem
    num_problems: int | None
    pass_at_1: float
    pass_at_k: dict[int, float]  # k > 1 only
    maj_at_n: float | None


@dataclass
class Run:
    label: str  # short unique name shown in legends and tables
    path: Path
    color: str
    rows: list[dict[str, Any]]  # metrics.jsonl
    evals: dict[str, tuple[EvalPoint, EvalPoint]]  # set -> (first evaluation, last evaluation)
    summary: dict[str, Any] | None  # summary.json (None while the run is still going)
    config: dict[str, Any]  # config.yaml flattened to dotted keys
    config_text: str | None
    inspect_pages: list[Path] = field(default_factory=list)
    sweep: dict[str, Any] | None = None  # `mathrl eval`'s results.json in <run>/eval/, when it was run

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """Steps and values of one metric, in step order; non-finite values kept as nan/inf."""
        points = [(int(r["step"]), v) for r in self.rows if (v := _as_float(r.get(key))) is not None]
        points.sort(key=lambda p: p[0])
        return [s for s, _ in points], [v for _, v in points]

    @property
    def last_train_step(self) -> int | None:
        steps = [int(r["step"]) for r in self.rows if any(not k.startswith("eval/") and k != "step" for k in r)]
        return max(steps) if steps else None


def _as_float(value: Any) -> float | None:
    """A logged value as a float: numbers, and the strings "nan"/"inf"/"-inf" that JsonlSink writes."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and value in ("nan", "inf", "-inf"):
        return float(value)
    return None


def _eval_point_from_row(row: dict[str, Any]) -> EvalPoint:
    return EvalPoint(
        step=row.get("step"), n=row.get("n"), num_problems=row.get("num_problems"),
        pass_at_1=float(row["pass_at_1"]),
        pass_at_k={int(k): float(v) for k, v in (row.get("pass_at_k") or {}).items() if int(k) > 1},
        maj_at_n=row.get("maj_at_n"),
    )


def _eval_point_from_summary(entry: dict[str, Any], step: int | None) -> EvalPoint:
    return EvalPoint(
        step=step, n=None, num_problems=None, pass_at_1=float(entry["pass@1"]),
        pass_at_k={int(k): float(v) for k, v in (entry.get("pass@k") or {}).items() if int(k) > 1},
        maj_at_n=entry.get("maj@n"),
    )


def read_evals(run_dir: Path, summary: dict[str, Any] | None) -> dict[str, tuple[EvalPoint, EvalPoint]]:
    """Per held-out set: (first, last) evaluation, from evals.jsonl, else from summary.json."""
    by_set: dict[str, list[dict[str, Any]]] = {}
    for row in RunDir(run_dir).evals():
        by_set.setdefault(row["set"], []).append(row)
    if by_set:
        out = {}
        for name, rows in by_set.items():
            rows.sort(key=lambda r: r["step"])
            out[name] = (_eval_point_from_row(rows[0]), _eval_point_from_row(rows[-1]))
        return out
    if summary and "base" in summary and "final" in summary:
        return {
            name: (_eval_point_from_summary(summary["base"][name], 0),
                   _eval_point_from_summary(summary["final"][name], summary.get("steps")))
            for name in summary["base"] if name in summary["final"]
        }
    return {}


def run_labels(paths: list[Path]) -> list[str]:
    """Short unique names: the directory name, with as many parent folders as it takes to be unique."""
    parts = [p.resolve().parts for p in paths]
    depth = [1] * len(parts)
    while True:
        labels = ["/".join(p[-d:]) for p, d in zip(parts, depth)]
        clashing = [i for i, label in enumerate(labels) if labels.count(label) > 1]
        if not clashing:
            return labels
        grown = [i for i in clashing if depth[i] < len(parts[i])]
        if not grown:  # the same directory given twice
            return [f"{label} #{i + 1}" if i in clashing else label for i, label in enumerate(labels)]
        for i in grown:
            depth[i] += 1


def load_run(path: Path, *, label: str, color: str) -> Run:
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"run directory {path} does not exist")
    run = RunDir(path)
    if not run.is_run():
        raise ValueError(f"{path} is not a run directory: it has no metrics.jsonl, evals.jsonl or summary.json")
    summary = run.summary()
    config_text = run.config_text()
    return Run(
        label=label, path=path, color=color,
        rows=run.metrics(),
        evals=read_evals(path, summary),
        summary=summary,
        config=flatten(yaml.safe_load(config_text) or {}) if config_text else {},
        config_text=config_text,
        inspect_pages=sorted(path.glob("inspect*.html")),
        sweep=run.sweep_results(),
    )


def chart_metrics(runs: list[Run]) -> list[tuple[str, list[str]]]:
    """SECTIONS with "eval/*" expanded and the keys that no run logged dropped (empty sections too)."""
    logged: list[str] = []  # every key, in order of first appearance
    seen: set[str] = set()
    for run in runs:
        for row in run.rows:
            for k in row:
                if k not in seen:
                    seen.add(k)
                    logged.append(k)
    out = []
    for title, keys in SECTIONS:
        present: list[str] = []
        for key in keys:
            if key == "eval/*":
                present += _eval_chart_keys(logged)
            elif "*" in key:
                present += _wildcard_keys(key, logged)
            elif key in seen:
                present.append(key)
        if present:
            out.append((title, present))
    return out


def _wildcard_keys(pattern: str, keys: list[str]) -> list[str]:
    """The keys that `pattern` matches, "*" standing for one or more characters, in the order given."""
    regex = re.compile("^" + ".+".join(re.escape(part) for part in pattern.split("*")) + "$")
    return [k for k in keys if regex.match(k)]


def _eval_chart_keys(keys: list[str]) -> list[str]:
    """Per held-out set (in order of first appearance): pass@1, pass@k by ascending k, then maj@n."""
    sets: dict[str, list[tuple[int, int, str]]] = {}
    for key in keys:
        m = _EVAL_KEY.match(key)
        if m:
            order = 0 if m["kind"] == "pass" else 1
            sets.setdefault(m["set"], []).append((order, int(m["k"]), key))
    return [key for entries in sets.values() for _, _, key in sorted(entries)]


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


# ---- the HTML page ------------------------------------------------------------------------------------

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px auto; max-width: 1640px;
       padding: 0 24px; color: #1b1f24; background: #fff; }
h1 { font-size: 1.5em; margin-bottom: 4px; } h2 { margin-top: 36px; border-bottom: 1px solid #d0d7de; }
h3 { font-size: 1em; margin: 18px 0 6px; }
.meta, .note { color: #57606a; font-size: 0.9em; }
code, .mono { font-family: ui-monospace, "SFMono-Regular", Menlo, monospace; font-size: 0.9em; }
table { border-collapse: collapse; font-size: 0.9em; margin: 6px 0; }
th, td { border: 1px solid #d0d7de; padding: 4px 9px; text-align: left; vertical-align: top; }
th { background: #f6f8fa; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.swatch { display: inline-block; width: 12px; height: 12px; border-radius: 2px; margin-right: 6px;
          vertical-align: -1px; }
.delta { font-size: 0.85em; margin-left: 4px; } .pos { color: #1a7f37; } .neg { color: #cf222e; }
.best { font-weight: 600; }
.charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(520px, 1fr)); gap: 18px; }
svg.chart { max-width: 100%; height: auto; background: #fff; }
svg.chart .title { font: 600 13px ui-monospace, Menlo, monospace; fill: #1b1f24; }
svg.chart .tick, svg.chart .legend, svg.chart .axis-label { font: 11px system-ui, sans-serif; fill: #57606a; }
svg.chart .legend { fill: #1b1f24; }
svg.chart .grid { stroke: #eaeef2; } svg.chart .axis { stroke: #8c959f; }
svg.chart .series { fill: none; stroke-linejoin: round; }
svg.chart .guide { stroke: #8c959f; stroke-dasharray: 3 3; }
svg.chart .nonfinite { font: 700 13px sans-serif; }
#tip { position: fixed; display: none; pointer-events: none; background: rgba(255,255,255,0.96);
       border: 1px solid #d0d7de; border-radius: 4px; padding: 4px 8px; font-size: 12px;
       box-shadow: 0 1px 4px rgba(0,0,0,0.15); }
details { margin: 8px 0; } summary { cursor: pointer; }
pre { background: #f6f8fa; padding: 8px; overflow: auto; max-height: 420px; font-size: 0.8em; }
iframe { width: 100%; height: 640px; border: 1px solid #d0d7de; }
"""

# Hover values: the nearest logged step of each run under the cursor. Reads the exact values from the
# polylines' data attributes; writes with textContent only (run names are never parsed as HTML).
JS = """
(function () {
  var tip = document.getElementById("tip");
  if (!tip) { return; }
  function hide() {
    tip.style.display = "none";
    document.querySelectorAll("svg.chart line.guide").forEach(function (g) { g.setAttribute("visibility", "hidden"); });
  }
  document.querySelectorAll("svg.chart").forEach(function (svg) {
    var plot = svg.getAttribute("data-plot").split(",").map(Number);
    var xd = svg.getAttribute("data-xdomain").split(",").map(Number);
    var guide = svg.querySelector("line.guide");
    var series = Array.prototype.map.call(svg.querySelectorAll("polyline.series"), function (pl) {
      return { run: pl.getAttribute("data-run"), color: pl.getAttribute("stroke"),
               steps: pl.getAttribute("data-steps").split(",").map(Number),
               values: pl.getAttribute("data-values").split(",") };
    });
    svg.addEventListener("mousemove", function (ev) {
      var ctm = svg.getScreenCTM();
      if (!ctm || series.length === 0) { return; }
      var pt = svg.createSVGPoint();
      pt.x = ev.clientX; pt.y = ev.clientY;
      var p = pt.matrixTransform(ctm.inverse());
      if (p.x < plot[0] || p.x > plot[0] + plot[2] || p.y < plot[1] || p.y > plot[1] + plot[3]) { hide(); return; }
      var step = xd[0] + (p.x - plot[0]) / plot[2] * (xd[1] - xd[0]);
      var best = {}, order = [];
      series.forEach(function (s) {
        for (var i = 0; i < s.steps.length; i++) {
          var d = Math.abs(s.steps[i] - step);
          if (!(s.run in best)) { order.push(s.run); }
          if (!(s.run in best) || d < best[s.run].d) {
            best[s.run] = { d: d, step: s.steps[i], value: s.values[i], color: s.color };
          }
        }
      });
      tip.textContent = "";
      var head = document.createElement("div");
      head.textContent = svg.getAttribute("data-metric");
      head.style.fontWeight = "600";
      tip.appendChild(head);
      order.forEach(function (run) {
        var b = best[run], row = document.createElement("div");
        row.textContent = run + ": " + Number(b.value).toPrecision(4) + " (step " + b.step + ")";
        row.style.color = b.color;
        tip.appendChild(row);
      });
      guide.setAttribute("x1", p.x); guide.setAttribute("x2", p.x);
      guide.setAttribute("visibility", "visible");
      tip.style.display = "block";
      tip.style.left = Math.min(ev.clientX + 14, window.innerWidth - tip.offsetWidth - 8) + "px";
      tip.style.top = (ev.clientY + 14) + "px";
    });
    svg.addEventListener("mouseleave", hide);
  });
})();
"""


def _fmt(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _delta(base: float | None, final: float | None) -> str:
    if base is None or final is None:
        return ""
    d = final - base
    cls = "pos" if d > 0 else "neg" if d < 0 else ""
    return f'<span class="delta {cls}">{d:+.3f}</span>'


def _change_cell(base: float | None, final: float | None, *, best: bool = False) -> str:
    cls = "num best" if best else "num"
    return f'<td class="{cls}">{_fmt(base)} → {_fmt(final)}{_delta(base, final)}</td>'


def _run_cell(run: Run) -> str:
    return f'<td><span class="swatch" style="background:{run.color}"></span>{html.escape(run.label)}</td>'


def world_sizes(run: Run) -> str:
    """The processes that trained the run (perf/world_size of its steps), e.g. "2", or "1, 2" for a run
    resumed at another world size; "—" for a run logged before the key existed."""
    sizes = sorted({int(v) for v in run.series("perf/world_size")[1] if math.isfinite(v)})
    return ", ".join(str(s) for s in sizes) or "—"


def runs_table(runs: list[Run]) -> str:
    rows = []
    for run in runs:
        wall = run.summary.get("wall_seconds") if run.summary else None
        resumed = processes_note(run.summary.get("processes")) if run.summary else ""  # a resumed run: its processes
        wall_cell = _fmt(wall / 60, 1) + " min" if wall is not None else "—"
        if resumed:  # "52.0 min (resumed 2x)", each process's steps and minutes on hover
            wall_cell = f"<span title='{html.escape(resumed)}'>{wall_cell} ({resumed.split(':')[0]})</span>"
        status = "finished" if run.summary else "no summary.json (running or stopped)"
        engine = run.config.get("rollout.engine", "—")
        rows.append(
            f"<tr>{_run_cell(run)}<td class='mono'>{html.escape(str(run.path))}</td>"
            f"<td class='num'>{run.last_train_step if run.last_train_step is not None else '—'}</td>"
            f"<td class='num'>{wall_cell}</td>"
            f"<td class='num'>{world_sizes(run)}</td><td>{html.escape(str(engine))}</td>"
            f"<td>{status}</td><td class='num'>{len(run.inspect_pages)}</td></tr>"
        )
    return ("<table><tr><th>run</th><th>directory</th><th>last training step</th><th>wall time</th>"
            "<th>processes</th><th>rollout engine</th><th>status</th><th>token maps</th></tr>" + "".join(rows) + "</table>")


def best_runs(runs: list[Run], name: str) -> set[str]:
    """Labels of the runs whose last pass@1 on set `name` is the best among the runs evaluated like them:
    the same number of problems and samples per problem. Scores on 50 and on 200 problems, or avg@4 and
    avg@8, are not compared; a run with no one to compare with is not marked."""
    groups: dict[tuple, list[Run]] = {}
    for run in runs:
        final = run.evals[name][1]
        groups.setdefault((final.num_problems, final.n), []).append(run)
    best = set()
    for (problems, n), group in groups.items():
        if len(group) < 2 or problems is None:  # unknown size (a summary.json without evals.jsonl): not comparable
            continue
        top = max(r.evals[name][1].pass_at_1 for r in group)
        best |= {r.label for r in group if r.evals[name][1].pass_at_1 == top}
    return best


def eval_tables(runs: list[Run]) -> str:
    """Per held-out set, a row per run: first and last evaluation's pass@1, pass@k and maj@n."""
    sets: list[str] = []
    for run in runs:
        sets += [s for s in run.evals if s not in sets]
    if not sets:
        return "<p class='note'>No evaluations found (evals.jsonl, summary.json).</p>"
    out = []
    for name in sets:
        with_set = [r for r in runs if name in r.evals]
        ks = sorted({k for r in with_set for point in r.evals[name] for k in point.pass_at_k})
        best = best_runs(with_set, name)
        head = ("<tr><th>run</th><th>n</th><th>problems</th><th>steps</th><th>pass@1 (avg@n)</th>"
                + "".join(f"<th>pass@{k}</th>" for k in ks) + "<th>maj@n</th></tr>")
        rows = []
        for run in with_set:
            base, final = run.evals[name]
            steps = f"{base.step if base.step is not None else '?'} → {final.step if final.step is not None else '?'}"
            rows.append(
                f"<tr>{_run_cell(run)}<td class='num'>{final.n or '—'}</td>"
                f"<td class='num'>{final.num_problems or '—'}</td><td class='num'>{steps}</td>"
                + _change_cell(base.pass_at_1, final.pass_at_1, best=run.label in best)
                + "".join(_change_cell(base.pass_at_k.get(k), final.pass_at_k.get(k)) for k in ks)
                + _change_cell(base.maj_at_n, final.maj_at_n) + "</tr>"
            )
        sizes = {(r.evals[name][1].num_problems, r.evals[name][1].n) for r in with_set}
        note = ("<p class='note'>These runs were evaluated on different numbers of problems or samples: bold marks "
                "the best final pass@1 among runs evaluated alike only.</p>" if len(sizes) > 1 else "")
        out.append(f"<h3>{html.escape(name)}</h3><table>{head}{''.join(rows)}</table>{note}")
    out.append("<p class='note'>Each cell: first evaluation → last evaluation, then the change. pass@k is the "
               "unbiased estimator; maj@n is the majority vote over the n samples (docs/metrics.md).</p>")
    return "\n".join(out)


def sweep_tables(runs: list[Run]) -> str:
    """The evaluations `mathrl eval` wrote into each run's eval/ directory, apart from the training-time
    ones above: other problems, samples and seeds, so their numbers are not comparable cell by cell."""
    rows = []
    for run in runs:
        for r in (run.sweep or {}).get("results", []):
            p1 = r["metrics"]["pass@1"]
            ci = f" [{p1['ci95_low']:.3f}, {p1['ci95_high']:.3f}]" if "ci95_low" in p1 else ""
            rows.append(f"<tr>{_run_cell(run)}<td>{html.escape(str(r['checkpoint']))}</td>"
                        f"<td class='num'>{r['step'] if r['step'] is not None else '—'}</td>"
                        f"<td>{html.escape(r['dataset'])}</td><td class='num'>{r['num_problems']}</td>"
                        f"<td class='num'>{r['n']}</td><td class='num'>{len(r['seeds'])}</td>"
                        f"<td class='num'>{p1['mean']:.3f}{ci}</td></tr>")
    if not rows:
        return ""
    head = ("<tr><th>run</th><th>checkpoint</th><th>step</th><th>set</th><th>problems</th><th>n</th>"
            "<th>seeds</th><th>pass@1 [95% CI over problems]</th></tr>")
    return ("<h3>From <code>mathrl eval</code></h3><p class='note'>Written by <code>mathrl eval &lt;run&gt;</code> "
            "into the run's eval/results.json: its own problems, samples per problem and seeds.</p>"
            f"<table>{head}{''.join(rows)}</table>")


def config_differences(runs: list[Run]) -> list[str]:
    """The dotted config keys whose value differs between runs (or that some runs lack), in file order."""
    keys: list[str] = []
    for run in runs:
        keys += [k for k in run.config if k not in keys]
    missing = object()
    return [k for k in keys if k not in IGNORED_CONFIG_FIELDS
            and len({json.dumps(r.config.get(k, missing), default=str, sort_keys=True) for r in runs}) > 1]


def _config_value(run: Run, key: str) -> str:
    if key not in run.config:
        return "<span class='note'>absent</span>"
    value = run.config[key]
    text = value if isinstance(value, str) else json.dumps(value)
    return html.escape(text)


def config_table(runs: list[Run]) -> str:
    with_config = [r for r in runs if r.config]
    lacking = [r.label for r in runs if not r.config]
    out = []
    if lacking:
        out.append(f"<p class='note'>No config.yaml in: {html.escape(', '.join(lacking))}.</p>")
    if len(with_config) < 2:
        out.append("<p class='note'>Fewer than two runs have a config.yaml: nothing to compare.</p>")
    else:
        diff = config_differences(with_config)
        if not diff:
            out.append("<p class='note'>The configs are identical (apart from run_dir).</p>")
        else:
            head = "<tr><th>field</th>" + "".join(
                f"<th><span class='swatch' style='background:{r.color}'></span>{html.escape(r.label)}</th>"
                for r in with_config) + "</tr>"
            rows = "".join(
                f"<tr><td class='mono'>{html.escape(k)}</td>"
                + "".join(f"<td class='mono'>{_config_value(r, k)}</td>" for r in with_config) + "</tr>"
                for k in diff)
            same = len({k for r in with_config for k in r.config} - set(diff) - IGNORED_CONFIG_FIELDS)
            out.append(f"<table class='config-diff'>{head}{rows}</table>"
                       f"<p class='note'>{same} other fields are the same in every run (run_dir not compared).</p>")
    for run in with_config:
        out.append(f"<details><summary>config.yaml of {html.escape(run.label)}</summary>"
                   f"<pre>{html.escape(run.config_text or '')}</pre></details>")
    return "\n".join(out)


def token_maps(runs: list[Run]) -> str:
    """inspect*.html pages, each in a sandboxed iframe (srcdoc: the page stays one file)."""
    out = []
    for run in runs:
        for page in run.inspect_pages:
            out.append(
                f"<details><summary>{html.escape(run.label)}: {html.escape(page.name)}</summary>"
                f'<iframe sandbox="allow-scripts" title="{html.escape(page.name)}" '
                f'srcdoc="{html.escape(page.read_text(errors="replace"), quote=True)}"></iframe></details>'
            )
    return "\n".join(out)


def render_html(runs: list[Run], sections: list[tuple[str, list[tuple[str, str]]]], *, title: str,
                plots_dir: Path | None) -> str:
    """The page. `sections`: (section title, [(metric, svg), ...])."""
    esc = html.escape
    chart_html = []
    for section, charts in sections:
        chart_html.append(f"<h3>{esc(section)}</h3><div class='charts'>"
                          + "".join(f"<figure style='margin:0'>{svg}</figure>" for _, svg in charts) + "</div>")
    if not chart_html:
        chart_html.append("<p class='note'>None of the charted metrics was logged (metrics.jsonl).</p>")
    png_note = (f"<p class='note'>PNG copies of the charts: <code>{esc(plots_dir.name)}/</code> next to this file.</p>"
                if plots_dir else "")
    maps = token_maps(runs)
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{esc(title)}</title>
<link rel="icon" href="data:,">
<style>{CSS}</style>
</head>
<body>
<h1>{esc(title)}</h1>
<p class="meta">Made by <code>mathrl report</code> on {time.strftime("%Y-%m-%d %H:%M")} from {len(runs)} run
director{"y" if len(runs) == 1 else "ies"}. Metric names are defined in docs/metrics.md.</p>
<h2>Runs</h2>
{runs_table(runs)}
<h2>Held-out evaluation</h2>
<p class="note">During training: the evaluations of the training loop (evals.jsonl; data.eval_size problems,
eval.n samples each).</p>
{eval_tables(runs)}
{sweep_tables(runs)}
<h2>Config differences</h2>
{config_table(runs)}
<h2>Curves</h2>
<p class="note">One line per run; earlier runs are drawn wider, so overlapping lines stay visible.
Evaluation curves start at step 0, the starting model. A × at the top
of a chart, in the run's colour, marks a non-finite value (nan/inf); the line breaks there. Hover a chart for values.</p>
{png_note}
{"".join(chart_html)}
{"<h2>Token maps</h2>" + maps if maps else ""}
<div id="tip"></div>
<script>{JS}</script>
</body>
</html>
"""


def build_report(run_dirs: list[Path], out: Path, *, title: str | None = None, pngs: bool = True) -> Path:
    """Write the HTML report of `run_dirs` to `out`, and (pngs=True) its charts as PNGs to `<out stem>_plots/`.

    Returns `out`. Raises FileNotFoundError / ValueError for a missing directory or one that holds
    no run files.
    """
    if not run_dirs:
        raise ValueError("give at least one run directory")
    paths = [Path(p) for p in run_dirs]
    labels = run_labels(paths)
    runs = [load_run(p, label=label, color=PALETTE[i % len(PALETTE)]) for i, (p, label) in enumerate(zip(paths, labels))]
    out = Path(out)
    title = title or ("mathrl report: " + " vs ".join(labels) if len(labels) <= 4 else f"mathrl report: {len(runs)} runs")

    sections: list[tuple[str, list[tuple[str, str]]]] = []
    charts: list[tuple[str, list[Line]]] = []
    for section, metrics in chart_metrics(runs):
        svgs = []
        for metric in metrics:
            lines = [Line(r.label, r.color, *r.series(metric), width=line_width(i)) for i, r in enumerate(runs)]
            lines = [ln for ln in lines if ln.steps]  # a run that did not log it gets no line
            if not lines:  # logged, but never as a number
                continue
            charts.append((metric, lines))
            svgs.append((metric, svg_line_chart(metric, lines)))
        if svgs:
            sections.append((section, svgs))

    out.parent.mkdir(parents=True, exist_ok=True)
    plots_dir = out.with_name(out.stem + "_plots") if pngs else None
    if plots_dir is not None:
        write_pngs(charts, plots_dir)
    out.write_text(render_html(runs, sections, title=title, plots_dir=plots_dir), encoding="utf-8")
    return out
