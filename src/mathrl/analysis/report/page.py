"""`mathrl report`: one self-contained HTML page that compares training runs (docs/report.md).

    mathrl report runs/clip_sym runs/clip_higher --out clip.html --title "clip-higher ablation"

Reads the run directories that `mathrl train` writes (layout in src/mathrl/run_dir.py) and writes

    clip.html           the runs' eval tables, the config fields that differ between them, one chart per
                        metric with one line per run (inline SVG, analysis/charts.py: no JS library, no
                        external URL), and any inspect*.html token maps found in the run directories
    clip_plots/*.png    the same charts as PNGs (matplotlib), for slides and papers

The page works without JavaScript; a short inline script only adds hover values. Each chart is an
`<svg class="chart" data-metric="...">`. This module assembles the page: what to chart (`SECTIONS`), the
styles and script, the HTML around the pieces that runs.py (reading run directories), tables.py (the
tables) and analysis/charts.py (the charts) make.
"""

from __future__ import annotations

import html
import re
import time
from pathlib import Path

from mathrl.analysis.charts import PALETTE, Line, line_width, svg_line_chart, write_pngs
from mathrl.analysis.report.runs import Run, load_run, run_labels
from mathrl.analysis.report.tables import config_table, eval_tables, runs_table, sweep_tables, token_maps

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


_EVAL_KEY = re.compile(r"^eval/(?P<set>.+)/(?P<kind>pass|maj)@(?P<k>\d+)$")


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
