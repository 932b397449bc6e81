"""The tables of `mathrl report`'s page: the runs, their held-out evaluations (during training and from
`mathrl eval`), the config fields that differ between them, and the token maps found in their directories.
"""

from __future__ import annotations

import html
import json
import math

from mathrl.analysis.report.runs import Run
from mathrl.run_dir import processes_note

# Config fields left out of the difference table: they differ between any two runs by construction.
IGNORED_CONFIG_FIELDS = {"run_dir"}


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

