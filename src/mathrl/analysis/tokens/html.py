"""Render an `InspectReport` as one self-contained HTML page (inline CSS, no scripts, no external URLs).

    from mathrl.analysis.tokens.html import write_html
    write_html(report, "inspect.html")

Sections: 1. the probability map (base and RL side by side); 2. what RL changed (Δ log-prob, the
over-confident and top-k moved tokens), the summary by token class, the top-k table and the exploration
table; 3. the entropy probe across checkpoints. What each view shows: docs/inspect.md; the definitions:
`analysis/tokens/scores.py`, `analysis/tokens/comparison.py`, `analysis/entropy_probe.py`.
`InspectReport`, the record of everything `mathrl inspect` shows (on the console and on this page), is
defined here.

Tool output (a response with an observation mask) is drawn apart in every view (class "t obs", grey
with a dashed border) and counted in no table. The CSS for it is added only to pages that have some,
so a page without tools is what it always was.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from pathlib import Path

from mathrl.analysis.entropy_probe import CheckpointProbe
from mathrl.analysis.tokens.comparison import TOKEN_CLASSES, Comparison, ExplorationRow
from mathrl.analysis.tokens.scores import context_segments


@dataclass
class InspectReport:
    """Everything `mathrl inspect` shows, for the console and the HTML page."""

    source: str  # where the response came from (a rollouts.jsonl record or "--prompt/--response")
    prompt: str
    base_path: str
    model_path: str
    comparison: Comparison
    exploration: list[ExplorationRow]
    probes: list[CheckpointProbe] = field(default_factory=list)
    position: int | None = None  # the probed position
    notes: list[str] = field(default_factory=list)


_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.5em auto; max-width: 1500px;
       padding: 0 1em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #ccc; }
h3 { font-size: 1em; margin: .4em 0; }
.meta { color: #555; font-size: .9em; }
.pair { display: grid; grid-template-columns: 1fr 1fr; gap: 1em; }
.text { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: .9em;
        white-space: pre-wrap; word-break: break-word; line-height: 1.8; border: 1px solid #ddd;
        padding: .6em; border-radius: 4px; }
.t { border-radius: 2px; box-shadow: inset -1px 0 0 rgba(0, 0, 0, .12); }  /* token boundaries */
.t.oc { outline: 2px solid #7b2cbf; outline-offset: -1px; }
.t.top { font-weight: bold; text-decoration: underline; }
.mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; white-space: pre; }
table { border-collapse: collapse; margin: .5em 0 1.2em; font-size: .9em; }
td, th { border: 1px solid #ddd; padding: 2px 8px; text-align: right; vertical-align: top; }
td.l, th.l { text-align: left; }
th { background: #f4f4f4; }
.legend { font-size: .85em; color: #444; margin: .3em 0 .6em; }
.legend .t { padding: 0 .4em; margin-right: .3em; }
.probes { display: flex; flex-wrap: wrap; gap: 1.2em; }
pre.prompt { white-space: pre-wrap; background: #f8f8f8; padding: .6em; border-radius: 4px; }
"""

# Only on pages with tool output (see the module docstring).
_TOOL_CSS = """
.t.obs { color: #555; border-top: 1px dashed #888; border-bottom: 1px dashed #888; box-shadow: none; }  /* one band per span */
.legend .t.obs { border: 1px dashed #888; }
.mono .obs { color: #777; background: #e6e6e6; }
"""

OBSERVATION_BACKGROUND = "#e6e6e6"  # tool output: not a probability, so none of the colour scales
OBSERVATION_TITLE = "tool output (not sampled, in no loss)"


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def visible(text: str) -> str:
    """Whitespace made visible for table cells: newline -> ↵, tab -> ⇥."""
    return text.replace("\n", "↵").replace("\t", "⇥")


def prob_colour(p: float) -> str:
    """Probability -> background: red (0) through yellow (0.5) to green (1)."""
    p = min(max(p, 0.0), 1.0)
    return f"hsl({120 * p:.0f}, 75%, {82 - 8 * p:.0f}%)"


def delta_colour(delta_logp: float, *, scale: float = 2.0) -> str:
    """Δ log-prob -> background: blue where RL raised the token, red where it lowered it; full colour at
    |Δ| >= `scale` nats."""
    a = min(abs(delta_logp) / scale, 1.0) * 0.85
    return f"rgba(33, 102, 172, {a:.2f})" if delta_logp > 0 else f"rgba(214, 96, 77, {a:.2f})"


def _pct(x: float) -> str:
    return "–" if math.isnan(x) else f"{100 * x:.1f}%"


def _title(c: Comparison, i: int) -> str:
    if bool(c.observation[i]):
        lines = [
            OBSERVATION_TITLE,
            f"#{i} {c.tokens[i]!r} (id {c.token_ids[i]})",
            f"p_base {float(c.p_base[i]):.4f}   p_rl {float(c.p_rl[i]):.4f} (as context; in no statistic)",
        ]
        return _e("\n".join(lines)).replace("\n", "&#10;")
    lines = [
        f"#{i} {c.tokens[i]!r} (id {c.token_ids[i]}, {c.classes[i]})",
        f"p_base {float(c.p_base[i]):.4f}   p_rl {float(c.p_rl[i]):.4f}",
        f"Δlogp {float(c.delta_logp[i]):+.3f}   Δp {float(c.delta_p[i]):+.4f}",
        f"entropy base {float(c.entropy_base[i]):.3f}   rl {float(c.entropy_rl[i]):.3f} nats",
    ]
    if bool(c.overconfident[i]):
        lines.append("over-confident")
    return _e("\n".join(lines)).replace("\n", "&#10;")


def _token_span(c: Comparison, i: int, background: str, classes: str = "t") -> str:
    text = c.tokens[i] if c.tokens[i] else "∅"
    if bool(c.observation[i]):
        background, classes = OBSERVATION_BACKGROUND, "t obs"
    return f'<span class="{classes}" style="background:{background}" title="{_title(c, i)}">{_e(text)}</span>'


def _prob_text(c: Comparison, probs) -> str:
    return "".join(_token_span(c, i, prob_colour(float(probs[i]))) for i in range(len(c)))


def _change_text(c: Comparison) -> str:
    top = set(c.top_moved)
    spans = []
    for i in range(len(c)):
        cls = "t" + (" oc" if bool(c.overconfident[i]) else "") + (" top" if i in top else "")
        spans.append(_token_span(c, i, delta_colour(float(c.delta_logp[i])), cls))
    return "".join(spans)


def _table(header: list[str], rows: list[list[str]], left: set[int] = frozenset()) -> str:
    """Cells are already HTML; columns in `left` are left-aligned."""
    def cls(j: int) -> str:
        return ' class="l"' if j in left else ""

    head = "".join(f"<th{cls(j)}>{h}</th>" for j, h in enumerate(header))
    body = "".join("<tr>" + "".join(f"<td{cls(j)}>{v}</td>" for j, v in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _tok_cell(text: str) -> str:
    return f'<span class="mono">{_e(visible(text))}</span>'


def _context_cell(context: str | list[tuple[str, bool]], token: str, *, tool_token: bool = False) -> str:
    """'context[token]'; `context` as text, or as `context_segments` runs whose tool output is marked."""
    if isinstance(context, str):
        context = [(context, False)]
    shown = "".join(f'<span class="obs">{_e(visible(t))}</span>' if tool else _e(visible(t)) for t, tool in context)
    token_html = f"<b>{_e(visible(token))}</b>"
    if tool_token:
        token_html = f'<span class="obs">{token_html}</span>'
    return f'<span class="mono">{shown}[{token_html}]</span>'


def _has_tools(c: Comparison) -> bool:
    return bool(c.observation.any())


def _position_cell(r: InspectReport, position: int, context: str, token: str) -> str:
    """A probed position's context cell: the probe's own context text, or, with tool output in the
    response, the same characters with the tool's marked (recomputed from the comparison's tokens)."""
    c = r.comparison
    if not _has_tools(c):
        return _context_cell(context, token)
    segments = context_segments(r.prompt, c.tokens, position, len(context), observation=c.observation)
    return _context_cell(segments, token, tool_token=bool(c.observation[position]))


def _tool_legend(c: Comparison) -> str:
    if not _has_tools(c):
        return ""
    return (f'<br><span class="t obs" style="background:{OBSERVATION_BACKGROUND}">tool output</span> = written by a '
            f"tool, not sampled and in no loss: {int(c.observation.sum())} tokens, scored as the context they are, "
            "left out of every count, share and table on this page.")


def _section_map(r: InspectReport) -> str:
    c = r.comparison
    legend = "".join(f'<span class="t" style="background:{prob_colour(p)}">{p:g}</span>' for p in (0, 0.25, 0.5, 0.75, 0.9, 1))
    return f"""
<h2>1. Probability map</h2>
<div class="legend">background = probability of each response token under each model (temperature 1): {legend}
hover a token for p_base, p_rl and Δlogp.{_tool_legend(c)}</div>
<div class="pair">
<div><h3>base <span class="meta">{_e(r.base_path)}</span></h3><div class="text">{_prob_text(c, c.p_base)}</div></div>
<div><h3>RL <span class="meta">{_e(r.model_path)}</span></h3><div class="text">{_prob_text(c, c.p_rl)}</div></div>
</div>"""


def _section_change(r: InspectReport) -> str:
    c = r.comparison
    legend = "".join(
        f'<span class="t" style="background:{delta_colour(d)}">{d:+g}</span>' for d in (-2, -1, -0.25, 0.25, 1, 2)
    )
    summary_rows = []
    for name in (*TOKEN_CLASSES, "all"):
        s = c.summary[name]
        summary_rows.append([name, str(s.n_tokens), str(s.n_moved), _pct(s.share_moved), str(s.n_up), str(s.n_down),
                             str(s.n_overconfident)])
    summary = _table(
        ["class", "tokens", f"moved (|Δp| &gt; {c.threshold:g})", "share moved", "up", "down", "over-confident"],
        summary_rows, left={0},
    )
    tools = _has_tools(c)
    top_rows = [
        [str(i), _context_cell(context_segments(r.prompt, c.tokens, i, observation=c.observation if tools else None),
                               c.tokens[i]),
         c.classes[i], f"{float(c.p_base[i]):.4f}", f"{float(c.p_rl[i]):.4f}", f"{float(c.delta_p[i]):+.4f}",
         f"{float(c.delta_logp[i]):+.3f}"]
        for i in c.top_moved
    ]
    top = _table(["pos", "context [token]", "class", "p_base", "p_rl", "Δp", "Δlogp"], top_rows, left={1, 2})
    oc = [i for i in range(len(c)) if bool(c.overconfident[i])]
    oc_list = " · ".join(f'#{i} <span class="mono">{_e(visible(c.tokens[i]))}</span>' for i in oc[:200])
    if len(oc) > 200:
        oc_list += f", … ({len(oc) - 200} more)"
    n_sampled = int(c.sampled.sum())
    total_dlogp = float(c.delta_logp[c.sampled].sum())
    if tools:
        total_line = (f"Σ Δlogp over the model's {n_sampled} sampled tokens = {total_dlogp:+.3f} nats (the log of "
                      "p_rl / p_base of the model's turns, given the same tool outputs).")
    else:
        total_line = (f"Σ Δlogp over the response = {total_dlogp:+.3f} nats (the log of p_rl(response) / "
                      "p_base(response)).")
    return f"""
<h2>2. What RL changed</h2>
<div class="legend">background = Δ log-prob (RL − base), full colour at ±2 nats: {legend}
<span class="t oc">outlined</span> = over-confident (p_base ≥ {c.confident:g}, p_rl &gt; p_base, p_rl ≥ {c.saturated:g});
<span class="t top">bold underlined</span> = the {len(c.top_moved)} tokens whose probability moved most.{_tool_legend(c)}</div>
<div class="text">{_change_text(c)}</div>
<p class="meta">{total_line}
Classes: formula = digits, + - * / = ^ ( ) [ ] {{ }} \\ &lt; &gt; . , and LaTeX commands; word = alphabetic; other = the rest.</p>
<h3>Tokens moved by more than {c.threshold:g} in probability, by class</h3>
{summary}
<h3>Top {len(c.top_moved)} moved tokens (largest |Δp|)</h3>
{top}
<h3>Over-confident tokens: {len(oc)} of {n_sampled}</h3>
<p class="meta">{oc_list or "none"}</p>
{_exploration(r)}"""


def _exploration(r: InspectReport) -> str:
    if not r.exploration:
        return ""
    ns = list(r.exploration[0].chance)
    counted = r.exploration[0].n_base is not None
    header = ["top-token p"] + [f"n = {n}" for n in ns] + (["tokens ≥ p: base", "tokens ≥ p: RL"] if counted else [])
    rows = []
    for row in r.exploration:
        cells = [f"{row.p:g}"] + [_pct(row.chance[n]) for n in ns]
        if counted:
            cells += [str(row.n_base), str(row.n_rl)]
        rows.append(cells)
    return f"""<h3>Exploration: chance that n rollouts sample a non-top token at least once, 1 − p<sup>n</sup></h3>
{_table(header, rows)}
<p class="meta">Where the policy puts p on its top token, a group of n rollouts contains an alternative there with
probability 1 − p<sup>n</sup>; without that contrast a group-relative advantage cannot move the position back.</p>"""


def _section_probe(r: InspectReport) -> str:
    if not r.probes:
        return ""
    blocks = []
    for p in r.probes:
        rows = [[str(e.position), _position_cell(r, e.position, e.context, e.token), f"{e.entropy:.3f}",
                 f"{e.prob:.4f}"]
                for e in p.top_positions]
        blocks.append(f"<div><h3>{_e(p.name)} <span class=\"meta\">mean entropy {p.mean_entropy:.3f}</span></h3>"
                      f"{_table(['pos', 'context [token]', 'entropy', 'p(token)'], rows, left={1})}</div>")
    out = f"""
<h2>3. Entropy probe</h2>
<p class="meta">Highest-entropy positions of the response at each checkpoint (full next-token distribution, nats).
Checkpoints: {', '.join(f'{_e(p.name)} = <span class="mono">{_e(p.path)}</span>' for p in r.probes)}</p>
<div class="probes">{''.join(blocks)}</div>"""
    dists = [p for p in r.probes if p.distribution is not None]
    if dists:
        d0 = dists[0].distribution
        k = max(len(p.distribution.top) for p in dists)
        rows = []
        for rank in range(k):
            row = [str(rank + 1)]
            for p in dists:
                top = p.distribution.top
                row.append(f'{_tok_cell(top[rank][0])} {top[rank][2]:.4f}' if rank < len(top) else "")
            rows.append(row)
        rows.append(["actual"] + [f"{_tok_cell(p.distribution.actual_token)} {p.distribution.actual_prob:.4f} "
                                  f"(rank {p.distribution.actual_rank})" for p in dists])
        rows.append(["entropy"] + [f"{p.distribution.entropy:.3f}" for p in dists])
        out += f"""
<h3>Next-token distribution at position {d0.position}: {_position_cell(r, d0.position, d0.context, d0.actual_token)}</h3>
{_table(["rank"] + [_e(p.name) for p in dists], rows, left=set(range(1, len(dists) + 1)))}"""
    return out


def render_html(report: InspectReport) -> str:
    c = report.comparison
    notes = "".join(f"<p class=\"meta\">{_e(n)}</p>" for n in report.notes)
    css = _CSS + (_TOOL_CSS if _has_tools(c) else "")
    n_tool = f" ({int(c.observation.sum())} written by a tool)" if _has_tools(c) else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>mathrl inspect</title><style>{css}</style></head>
<body>
<h1>mathrl inspect</h1>
<p class="meta">response: {_e(report.source)} · {len(c)} tokens{n_tool} · base <span class="mono">{_e(report.base_path)}</span>
· RL <span class="mono">{_e(report.model_path)}</span></p>
{notes}
<details><summary>prompt</summary><pre class="prompt">{_e(report.prompt)}</pre></details>
{_section_map(report)}
{_section_change(report)}
{_section_probe(report)}
</body></html>
"""


def write_html(report: InspectReport, path: str | Path) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_html(report), encoding="utf-8")
    return out
