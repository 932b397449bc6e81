"""`mathrl inspect`: token-level views of what RL changed in one response (guide: docs/inspect.md).

    mathrl inspect --base BASE_DIR --model runs/X/final --run runs/X --step 50 --index 0 --out inspect.html
    mathrl inspect --base BASE_DIR --model runs/X/final --prompt "25+213=" --response "5+3+0=08,..."
    mathrl inspect --run runs/X --step 50 --checkpoints runs/X/checkpoints/step_* --position 12

Loads the base and RL models (and any `--checkpoints`, one at a time), scores the response with each,
prints the summary tables and writes one self-contained HTML page. A rollouts.jsonl record of a tool
episode (an `observation` field) has its tool output scored as context, shown apart (dim with a "tool"
marker here, grey in the page) and left out of every statistic. `cli/arguments.py` registers the subcommand
and calls `inspect(InspectOptions(...), console)`; the computation is in `analysis/tokens/scores.py`,
`analysis/tokens/comparison.py` and `analysis/entropy_probe.py`, and the page in `analysis/tokens/html.py`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table
from rich.text import Text

from mathrl.analysis.entropy_probe import probe_checkpoint
from mathrl.analysis.tokens.comparison import EXPLORATION_NS, EXPLORATION_PS, TOKEN_CLASSES, compare, exploration_table
from mathrl.analysis.tokens.html import InspectReport, visible, write_html
from mathrl.analysis.tokens.scores import check_same_tokenizer, context_segments, observation_mask, token_probs
from mathrl.model.io import load_model_and_tokenizer
from mathrl.run_dir import RunDir


class InspectError(ValueError):
    """A problem with the inspect command's inputs, worded for the user."""


@dataclass
class InspectOptions:
    """What `mathrl inspect` was asked for (cli/arguments.py lists each option's meaning)."""

    prompt: str | None = None
    response: str | None = None
    rollouts: str | None = None
    run: str | None = None
    step: int | None = None
    index: int = 0
    chat_prompt: bool = False
    base: str | None = None
    model: str | None = None
    checkpoints: list[str] = field(default_factory=list)
    device: str | None = None
    dtype: str = "float32"
    out: str | None = None  # default: inspect.html in the run directory (--run / --rollouts), else ./inspect.html
    threshold: float = 0.1
    confident: float = 0.9
    saturated: float = 0.99
    top_k: int = 10
    entropy_k: int = 5
    position: int | None = None
    dist_k: int = 5


# ---------------------------------------------------------------------------- inputs


def read_rollout(path: str | Path, *, index: int, step: int | None = None) -> dict:
    """The `index`-th record of a rollouts.jsonl file (counting only records of `step` if given)."""
    path = Path(path)
    if not path.is_file():
        raise InspectError(f"{path} does not exist; give a rollouts.jsonl file (or --run with a run directory)")
    if index < 0:
        raise InspectError(f"--index must be >= 0, got {index}")
    seen, steps = 0, set()
    with path.open() as f:
        for line in f:
            if not line.strip():
                continue
            rec = json.loads(line)
            steps.add(rec.get("step"))
            if step is not None and rec.get("step") != step:
                continue
            if seen == index:
                return rec
            seen += 1
    where = f"step {step} of {path}" if step is not None else str(path)
    if seen == 0:
        known = sorted(s for s in steps if s is not None)
        span = f"; steps present: {known[0]} .. {known[-1]}" if known else ""
        raise InspectError(f"no records for {where}{span}")
    raise InspectError(f"--index {index} is out of range: {where} holds {seen} records (0 .. {seen - 1})")


def _run_config(run_dir: Path | None, console: Console):
    """The run's resolved config (config.yaml), or None (absent, or unreadable by this mathrl version)."""
    if run_dir is None or not RunDir(run_dir).config_path.is_file():
        return None
    from mathrl.config import ConfigError, load_config

    config_path = RunDir(run_dir).config_path
    try:
        return load_config(config_path, check_paths=False)
    except ConfigError as e:
        console.print(f"[yellow]note:[/yellow] could not read {config_path} ({e}); give --base, and "
                      "--chat-prompt if the run used data.template: chat")
        return None


@dataclass
class ResponseSource:
    """The response to inspect and where it came from."""

    label: str  # shown in the page's header
    prompt: str
    response: str | list[int]  # text, or the recorded token ids
    response_text: str
    run_dir: Path | None
    observation: list[int] | None = None  # [T] 1 = written by a tool (a tool episode's record), else None
    tool_calls: int | None = None


def _response_source(ns) -> ResponseSource:
    from_text = ns.prompt is not None or ns.response is not None
    from_file = ns.rollouts is not None or ns.run is not None
    if from_text and from_file:
        raise InspectError("give either --prompt/--response or --rollouts/--run, not both")
    if from_text:
        if ns.prompt is None or ns.response is None:
            raise InspectError("--prompt and --response go together")
        return ResponseSource("--prompt/--response", ns.prompt, ns.response, ns.response, None)
    if not from_file:
        raise InspectError("no response to inspect: give --prompt and --response, or --run DIR (or --rollouts FILE) "
                           "with --step and --index")
    path = Path(ns.rollouts) if ns.rollouts else RunDir(ns.run).rollouts_path
    rec = read_rollout(path, index=ns.index, step=ns.step)
    for key in ("prompt", "token_ids"):
        if key not in rec:
            raise InspectError(f"the record in {path} has no {key!r} field; is it a mathrl rollouts.jsonl?")
    label = (f"{path} step {rec.get('step')} #{ns.index} (problem {rec.get('problem_id')}, "
             f"reward {rec.get('reward')}, {rec.get('reason')})")
    run_dir = Path(ns.run) if ns.run else path.parent
    ids = [int(i) for i in rec["token_ids"]]
    observation = rec.get("observation")
    if observation is not None:
        try:
            observation_mask(observation, len(ids))
        except (TypeError, ValueError) as e:
            raise InspectError(f"the record's 'observation' field does not fit its token_ids: {e}") from None
        observation = [int(x) for x in observation]
    # the recorded token ids are exactly what was sampled (EOS included); re-encoding the text might not be
    return ResponseSource(label, rec["prompt"], ids, rec.get("response", ""), run_dir,
                          observation=observation, tool_calls=rec.get("tool_calls"))


# ---------------------------------------------------------------------------- the command


def default_out(ns: InspectOptions) -> Path:
    """inspect.html in the run directory the response came from (where `mathrl report` finds it), else here."""
    if ns.out:
        return Path(ns.out)
    if ns.run or ns.rollouts:
        return (Path(ns.run) if ns.run else Path(ns.rollouts).parent) / "inspect.html"
    return Path("inspect.html")


def inspect(ns: InspectOptions, console: Console) -> Path:
    """`mathrl inspect`: build the report, print its tables and write the HTML page; returns its path.
    Raises InspectError, TokenizerMismatchError, ModelLoadError or ValueError on bad inputs."""
    report = build_report(ns, console)
    print_report(report, console)
    out = write_html(report, default_out(ns))
    console.print(f"[bold]wrote[/bold] {out}")
    return out


def build_report(ns: InspectOptions, console: Console) -> InspectReport:
    """Pick the response, load the models (base and RL together, then each checkpoint alone), score and
    probe: the orchestration; every number comes from `analysis/tokens/scores.py`,
    `tokens/comparison.py` and `entropy_probe.py`."""
    _check_options(ns)
    src = _response_source(ns)
    cfg = _run_config(src.run_dir, console)
    add_special = not (ns.chat_prompt or (cfg is not None and cfg.data.template == "chat"))
    model_path, base_path = _model_paths(ns, cfg, console)
    device = ns.device or ("cuda" if torch.cuda.is_available() else "cpu")

    def load(path: str):
        model, tok = load_model_and_tokenizer(path, dtype=ns.dtype, device=device)
        return model.eval(), tok

    texts = [src.prompt] + ([src.response_text] if src.response_text else [])
    console.print(f"loading base {base_path} and model {model_path}")
    base_model, tokenizer = load(base_path)
    rl_model, rl_tok = load(model_path)
    check_same_tokenizer(tokenizer, rl_tok, texts, names=("base", "model"))

    # tool output is scored like any token (it is the context of later turns); the mask only keeps it
    # out of the statistics
    base_scores = token_probs(base_model, tokenizer, src.prompt, src.response, add_special_tokens=add_special,
                              observation=src.observation)
    rl_scores = token_probs(rl_model, tokenizer, src.prompt, src.response, add_special_tokens=add_special,
                            observation=src.observation)
    comparison = compare(base_scores, rl_scores, threshold=ns.threshold, confident=ns.confident,
                         saturated=ns.saturated, top_k=ns.top_k)
    # default: the most-moved sampled token (none when a tool wrote every token)
    position = ns.position if ns.position is not None else next(iter(comparison.top_moved), None)
    if position is not None and not 0 <= position < len(comparison):
        raise InspectError(f"--position {position} is outside the response (0 .. {len(comparison) - 1})")

    def probe(model, name: str, path: str, scores=None):
        return probe_checkpoint(model, tokenizer, src.prompt, base_scores.token_ids, name=name, path=str(path),
                                entropy_k=ns.entropy_k, position=position, dist_k=ns.dist_k, scores=scores,
                                add_special_tokens=add_special, observation=src.observation)

    probes = [probe(base_model, "base", base_path, base_scores)]
    del base_model
    for path, name in _checkpoints_to_probe(ns.checkpoints, {_resolved(base_path), _resolved(model_path)}, console):
        console.print(f"probing checkpoint {path}")
        model, tok = load(path)
        check_same_tokenizer(tokenizer, tok, texts, names=("base", name))
        probes.append(probe(model, name, path))
        del model
    probes.append(probe(rl_model, "rl", model_path, rl_scores))
    return InspectReport(
        source=src.label, prompt=src.prompt, base_path=str(base_path), model_path=str(model_path),
        comparison=comparison, exploration=exploration_table(EXPLORATION_PS, EXPLORATION_NS, comparison=comparison),
        probes=probes, position=position, notes=_notes(comparison, src, position, add_special=add_special),
    )


def _check_options(ns: InspectOptions) -> None:
    """The numeric options' domains, before anything loads."""
    for name in ("top_k", "entropy_k", "dist_k"):
        if getattr(ns, name) < 1:
            raise InspectError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(ns, name)}")
    if not 0 < ns.confident <= ns.saturated <= 1:
        raise InspectError(f"need 0 < --confident <= --saturated <= 1, got {ns.confident} and {ns.saturated}")


def _model_paths(ns: InspectOptions, cfg, console: Console) -> tuple[str, str]:
    """(the RL model, the base model): --model or the run's final/, --base or the run's starting model
    (the tiny base model is built here when the run used it). The model directories are checked first."""
    model_path = ns.model or (str(RunDir(ns.run).final) if ns.run else None)
    if model_path is None:
        raise InspectError("--model is required (or --run DIR, whose final/ model is used)")
    _check_model_dirs([model_path, *(c for c in ns.checkpoints if ".tmp-" not in Path(c).name)],
                      from_run=ns.model is None)
    base_path = ns.base
    if base_path is None:
        if cfg is None:
            raise InspectError("--base is required (or --run DIR with a config.yaml naming the starting model)")
        from mathrl.model.paths import resolve_model_path
        from mathrl.tasks.arithmetic import base_pretraining_text

        base_path = resolve_model_path(cfg, console, pretraining_text=base_pretraining_text(cfg.base))
    return model_path, base_path


def _checkpoints_to_probe(paths: Sequence[str], skip: set[str], console: Console):
    """(path, name) of each --checkpoints entry to probe, in order: not the base or RL model (`skip`, resolved
    paths), not one listed twice, not a checkpoint still being written (said on the console)."""
    for path, name in zip(paths, _checkpoint_names(paths)):
        if _resolved(path) in skip:
            continue
        if ".tmp-" in Path(path).name:  # a checkpoint still being written (train/checkpoint.py), e.g. from step_*
            console.print(f"skipping {path}: an unfinished checkpoint")
            continue
        skip.add(_resolved(path))
        yield path, name


def _notes(comparison, src: ResponseSource, position: int | None, *, add_special: bool) -> list[str]:
    """The page's and console's notes: how the prompt was tokenized, and what a tool wrote."""
    notes = []
    if not add_special:
        notes.append("prompt tokenized without special tokens (a rendered chat template)")
    n_tool = int(comparison.observation.sum())
    if n_tool:
        calls = ("" if src.tool_calls is None
                 else f" in {src.tool_calls} tool call{'s' if src.tool_calls != 1 else ''}")
        notes.append(f"{n_tool} of {len(comparison)} response tokens were written by a tool{calls}: scored as "
                     "context, shown apart, left out of every statistic")
        if position is not None and bool(comparison.observation[position]):
            notes.append(f"position {position} is tool output: its next-token distribution is what each model "
                         "would have written there, not a choice it made")
    return notes


def _check_model_dirs(paths: Sequence[str], *, from_run: bool) -> None:
    """Raise InspectError for a model path that names a local directory that is missing or holds no
    config.json, before the base model is built or any model loads. A path that does not exist and
    reads as a hub id (org/name) is left to the loader; `from_run`: the first path is a run's final/."""
    for i, path in enumerate(paths):
        local = Path(path).expanduser()
        if local.is_dir() and not (local / "config.json").exists():
            raise InspectError(f"{path} is a directory but not a Hugging Face model (no config.json)")
        if not local.exists() and ((from_run and i == 0) or str(path).startswith((".", "/", "~"))):
            raise InspectError(f"model {path} does not exist" + (" (the run has no final/ model yet; give --model)"
                                                                 if from_run and i == 0 else ""))


def _resolved(path: str | Path) -> str:
    return str(Path(path).expanduser().resolve())


def _checkpoint_names(paths: Sequence[str]) -> list[str]:
    """Directory names (step_000010), or parent/name where two names would clash (runA/final, runB/final)."""
    names = [Path(p).name for p in paths]
    return [f"{Path(p).parent.name}/{n}" if names.count(n) > 1 or n in ("base", "rl") else n
            for p, n in zip(paths, names)]


# ---------------------------------------------------------------------------- console


def _fmt_pct(x: float) -> str:
    return "–" if x != x else f"{100 * x:.1f}%"


def print_report(report: InspectReport, console: Console) -> None:
    """The summary tables (the token maps themselves are in the HTML page); tool output, if any, listed
    dim with a "tool" marker and left out of every number."""
    c = report.comparison
    _print_response(report, console)
    console.print(_moved_table(report))
    console.print(_top_moved_table(report))
    console.print(f"over-confident tokens (p_base ≥ {c.confident:g}, p_rl > p_base, p_rl ≥ {c.saturated:g}): "
                  f"{int(c.overconfident.sum())} of {int(c.sampled.sum())}")
    console.print(_exploration_table(report))
    if not report.probes:
        return
    console.print(_entropy_table(report))
    dists = [p for p in report.probes if p.distribution is not None]
    if dists:
        console.print(_distribution_table(report, dists))


def _print_response(report: InspectReport, console: Console) -> None:
    """One line on the response (its tokens, summed Δlogp, mean entropies), then its notes and tool output."""
    c = report.comparison
    sampled = c.sampled
    n_tool = int(c.observation.sum())
    over = f" sampled tokens (+ {n_tool} written by a tool)" if n_tool else " tokens"
    console.print(f"[bold]response[/bold] {report.source}: {int(sampled.sum())}{over}; "
                  f"Σ Δlogp = {float(c.delta_logp[sampled].sum()):+.3f} nats; mean entropy base "
                  f"{float(c.entropy_base[sampled].mean()):.3f} → rl {float(c.entropy_rl[sampled].mean()):.3f}")
    if n_tool:
        for note in report.notes:
            console.print(Text(note, style="dim"))
        for start, end in _tool_spans(c.observation):
            text = visible("".join(c.tokens[start:end]))
            if len(text) > 100:
                text = text[:48] + " … " + text[-48:]
            console.print(Text.assemble((f"  tool {start}..{end - 1} ", "bold dim"), (text, TOOL_STYLE)))


def _moved_table(report: InspectReport) -> Table:
    """Per token class: how many tokens moved by more than the threshold, up, down, over-confident."""
    c = report.comparison
    n_tool = int(c.observation.sum())
    t = Table(title=f"tokens moved by more than {c.threshold:g} in probability (RL − base)"
                    + (f", over the {int(c.sampled.sum())} sampled tokens" if n_tool else ""))
    for col in ("class", "tokens", "moved", "share", "up", "down", "over-confident"):
        t.add_column(col, justify="left" if col == "class" else "right")
    for name in (*TOKEN_CLASSES, "all"):
        s = c.summary[name]
        t.add_row(name, str(s.n_tokens), str(s.n_moved), _fmt_pct(s.share_moved), str(s.n_up), str(s.n_down),
                  str(s.n_overconfident))
    return t


def _top_moved_table(report: InspectReport) -> Table:
    c = report.comparison
    t = Table(title=f"top {len(c.top_moved)} moved tokens")
    for col in ("pos", "context \\[token]", "class", "p_base", "p_rl", "Δp", "Δlogp"):
        t.add_column(col, justify="left" if col in ("context \\[token]", "class") else "right")
    for i in c.top_moved:
        t.add_row(str(i), _context(report, i), c.classes[i],
                  f"{float(c.p_base[i]):.4f}", f"{float(c.p_rl[i]):.4f}", f"{float(c.delta_p[i]):+.4f}",
                  f"{float(c.delta_logp[i]):+.3f}")
    return t


def _exploration_table(report: InspectReport) -> Table:
    ns = list(report.exploration[0].chance) if report.exploration else []
    t = Table(title="exploration: chance that n rollouts sample a non-top token at least once, 1 − p^n")
    t.add_column("top-token p", justify="right")
    for n in ns:
        t.add_column(f"n={n}", justify="right")
    t.add_column("tokens ≥ p base / rl", justify="right")
    for row in report.exploration:
        t.add_row(f"{row.p:g}", *(_fmt_pct(row.chance[n]) for n in ns), f"{row.n_base} / {row.n_rl}")
    return t


def _entropy_table(report: InspectReport) -> Table:
    """Each probed model's highest-entropy positions, side by side."""
    n_tool = int(report.comparison.observation.sum())
    t = Table(title="entropy probe: highest-entropy positions (nats)")
    t.add_column("rank", justify="right")
    for p in report.probes:
        t.add_column(f"{p.name} (mean {p.mean_entropy:.3f})")
    k = max(len(p.top_positions) for p in report.probes)
    for rank in range(k):
        cells = []
        for p in report.probes:
            if rank < len(p.top_positions):
                e = p.top_positions[rank]
                context = _context(report, e.position, len(e.context)) if n_tool else _in_context(e.context, e.token)
                cells.append(Text.assemble(f"{e.position}: ", context, f" {e.entropy:.3f}"))
            else:
                cells.append("")
        t.add_row(str(rank + 1), *cells)
    return t


def _distribution_table(report: InspectReport, dists: list) -> Table:
    """The next-token distribution at the probed position under each model that has one (`dists`)."""
    n_tool = int(report.comparison.observation.sum())
    d0 = dists[0].distribution
    context = (_context(report, d0.position, len(d0.context)) if n_tool
               else _in_context(d0.context, d0.actual_token))
    t = Table(title=Text.assemble(f"next-token distribution at position {d0.position}: ", context))
    t.add_column("rank", justify="right")
    for p in dists:
        t.add_column(p.name)
    for rank in range(max(len(p.distribution.top) for p in dists)):
        t.add_row(str(rank + 1), *(
            Text(f"{visible(p.distribution.top[rank][0]):<6} {p.distribution.top[rank][2]:.4f}")
            if rank < len(p.distribution.top) else "" for p in dists))
    t.add_row("actual", *(Text(f"{visible(p.distribution.actual_token)} {p.distribution.actual_prob:.4f} "
                               f"(rank {p.distribution.actual_rank})") for p in dists))
    t.add_row("entropy", *(f"{p.distribution.entropy:.3f}" for p in dists))
    return t


TOOL_STYLE = "dim italic"  # tool output in the console (the page draws it grey with a dashed border)


def _in_context(context: str | list[tuple[str, bool]], token: str, *, tool_token: bool = False) -> Text:
    """'…context[token]' with the token in bold; Text, not markup, so '[' in math needs no escaping.
    `context` as text or as `context_segments` runs, whose tool output is drawn in TOOL_STYLE."""
    if isinstance(context, str):
        context = [(context, False)]
    parts = [(visible(t), TOOL_STYLE) if tool else visible(t) for t, tool in context]
    token_style = "bold " + TOOL_STYLE if tool_token else "bold"
    return Text.assemble("…", *parts, ("[" + visible(token) + "]", token_style))


def _context(report: InspectReport, position: int, width: int = 20) -> Text:
    """The context before response token `position`, tool output marked (it is never marked without tools)."""
    c = report.comparison
    segments = context_segments(report.prompt, c.tokens, position, width, observation=c.observation)
    return _in_context(segments, c.tokens[position], tool_token=bool(c.observation[position]))


def _tool_spans(observation) -> list[tuple[int, int]]:
    """[start, end) of each run of tool output in a [T] bool mask."""
    spans, start = [], None
    for i, tool in enumerate([*observation.tolist(), False]):
        if tool and start is None:
            start = i
        elif not tool and start is not None:
            spans.append((start, i))
            start = None
    return spans
