"""The output of `mathrl eval`: results.json (everything, per seed too; NaN/inf as null), results.md and
the table printed at the end, from the report dict that evaluation/sweep.py builds.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

from rich.table import Table

__all__ = ["results_markdown", "results_table"]


def _json_safe(x):
    """NaN/inf become null: strict JSON has neither, and a reader should see "unknown", not a crash."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


def write_results(out: Path, report: dict) -> None:
    (out / "results.json").write_text(json.dumps(_json_safe(report), indent=2) + "\n")
    (out / "results.md").write_text(results_markdown(report))


def _pass1_cell(m: dict, seeds: int) -> str:
    """'0.273 [0.215, 0.331] · seeds 0.273 ± 0.055': the bootstrap CI over problems, then mean ± sd across
    seeds ('· 1 seed' alone: one seed has no spread). Results written before the interval over problems
    existed show the seed spread alone."""
    spread = "1 seed" if seeds == 1 else f"seeds {m['mean']:.3f} ± {m['std']:.3f}"
    if m.get("ci95_low") is None:
        return f"{m['mean']:.3f} · {spread}"
    return f"{m['mean']:.3f} [{m['ci95_low']:.3f}, {m['ci95_high']:.3f}] · {spread}"


PASS1_HEADER = "pass@1 [95% CI over problems] · seeds mean ± sd"


def _columns(report: dict) -> tuple[list[str], list]:
    n = report["settings"]["n"]
    ks = [k for k in report["settings"]["ks"] if k > 1]
    seeds = len(report["settings"]["seeds"])
    tools = any("tool/call_rate" in r["metrics"] for r in report["results"])
    headers = ["checkpoint", "step", "dataset", PASS1_HEADER, *(f"pass@{k}" for k in ks), f"maj@{n}",
               "no-answer", "repetitive", "garbled", "length", *(["tool calls", "call rate"] if tools else [])]

    def cells(r: dict) -> list[str]:
        m = r["metrics"]
        calls = [f"{m[k]['mean']:.2f}" if k in m else "" for k in ("tool/calls_mean", "tool/call_rate")] if tools else []
        return [r["checkpoint"], "" if r["step"] is None else str(r["step"]), r["dataset"], _pass1_cell(m["pass@1"], seeds),
                *(f"{m[f'pass@{k}']['mean']:.3f}" for k in ks), f"{m[f'maj@{n}']['mean']:.3f}",
                f"{m['no_answer_rate']['mean']:.3f}", f"{m['repetitive_rate']['mean']:.3f}",
                f"{m['garbled_rate']['mean']:.3f}", f"{m['response_length']['mean']:.1f}", *calls]

    return headers, cells


def results_markdown(report: dict) -> str:
    s = report["settings"]
    headers, cells = _columns(report)
    lines = [
        "# mathrl eval",
        "",
        f"n={s['n']} samples per problem, seeds {s['seeds']}, temperature {s['temperature']}, top-p {s['top_p']}. "
        f"pass@1 is avg@{s['n']} averaged over seeds, with its 95% CI from a bootstrap over problems (each "
        f"problem scored over all its seeds x {s['n']} samples; always inside [0, 1]), then the mean ± sample std "
        "across seeds; "
        "pass@k (unbiased estimator), maj@n and the rates are means across seeds. "
        "no-answer / repetitive / garbled are shares of samples; length is in tokens.",
        "",
        "| " + " | ".join(headers) + " |",
        "| " + " | ".join("---" for _ in headers) + " |",
    ]
    lines += ["| " + " | ".join(cells(r)) + " |" for r in report["results"]]
    if report["neighbourhood"]:
        lines += ["", "## Neighbourhood averages", "",
                  "| run | dataset | step | steps averaged | pass@1 per step | mean pass@1 |", "| --- | --- | --- | --- | --- | --- |"]
        for a in report["neighbourhood"]:
            per = ", ".join(f"{v:.3f}" for v in a["pass@1_per_step"])
            lines.append(f"| {a['run']} | {a['dataset']} | {a['step']} | {a['steps']} | {per} | {a['pass@1']:.3f} |")
    lines += _sampled_markdown(report["results"])
    if not report["complete"]:
        lines += ["", "_Partial results: the sweep has not finished._"]
    return "\n".join(lines) + "\n"


def _sampled_markdown(rows: Sequence[dict]) -> list[str]:
    """A few sampled responses per checkpoint and set, right and wrong ones, each under its gold answer."""
    lines = []
    for r in rows:
        ex = r.get("examples", {})
        shown = [(kind, e) for kind in ("right", "wrong", "repetitive", "garbled") for e in ex.get(kind, [])]
        if not shown:
            continue
        lines += ["", f"## Sampled responses: {r['checkpoint']}, {r['dataset']}", ""]
        for kind, e in shown:
            head = f"**{kind}**, problem `{e['problem_id']}`, seed {e['seed']}"
            if "gold" in e:
                head += f": gold `{e['gold']}`, boxed `{e['boxed']}` ({e['reason']})"
            fence = "~~~~" if "```" in e["response"] else "```"  # a response with its own code blocks
            lines += [head, "", fence + "text", e["response"], fence, ""]
    return lines


def results_table(report: dict) -> Table:
    s = report["settings"]
    headers, cells = _columns(report)
    table = Table(title=f"n={s['n']} samples per problem, seeds {s['seeds']}, temperature {s['temperature']}")
    for i, h in enumerate(headers):
        table.add_column(h, justify="left" if i in (0, 2) else "right")
    for r in report["results"]:
        table.add_row(*cells(r))
    if report["neighbourhood"]:
        table.caption = "; ".join(f"{a['dataset']} step {a['step']} ± {a['neighbours']}: mean pass@1 {a['pass@1']:.3f} "
                                  f"over steps {a['steps']}" for a in report["neighbourhood"])
    return table

