"""`entropy-tokens`: the highest-entropy tokens of a run's kept checkpoints, step by step.

    python scripts/findings entropy-tokens runs/x/a runs/x/a_seed1 --steps 0 100 200 300 --limit 100 \\
        --out docs/findings/entropy_tokens.md

For every run and every asked step this loads the run's checkpoint of that step (step 0: the model the
run started from; the others: checkpoints/step_<N>/ kept by `train.keep_every`, or final/, found as
`mathrl eval RUN` finds them, `evaluation.targets.run_checkpoints` / `run_start`), samples one response
per held-out problem (the run's first eval set, the first `--limit` problems, temperature 1, the run's
eval seed) and scores every response token under that same checkpoint (`analysis.tokens.token_probs`:
the entropy of the full next-token distribution at temperature 1). The responses of a variant's runs
(seeds) are pooled per step and go to `analysis.entropy_probe.top_entropy_tokens`; the Markdown table has one
row per (previous token, token) pair in some step's top k, and per step its mean entropy (nats) and how
many times it occurred. This is the field report's table of an entropy bonus gone wrong: the comma
after "wait", near-deterministic at the start, climbing to a high entropy over a long run.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from findings.common import group_runs, markdown_table
from findings.sampling import device_of, held_out, load, run_config
from mathrl.analysis.entropy_probe import EntropyTokensOverSteps, top_entropy_tokens
from mathrl.analysis.tokens import TokenScores, token_probs
from mathrl.evaluation.targets import run_checkpoints, run_start
from mathrl.rollout.factory import build_engine
from mathrl.tasks.sources import prompt_encoder


def checkpoint_dirs(run: Path, cfg, steps: Sequence[int]) -> dict[int, Path]:
    """step -> the model directory of that step of `run`; ValueError naming the steps there are."""
    found = {step: Path(d) for _, d, step in run_checkpoints(run, cfg)}
    start, why_not = run_start(run, cfg)
    if start is not None:
        found[0] = Path(start)
    missing = [s for s in steps if s not in found]
    if missing:
        why = f" (step 0: {why_not})" if 0 in missing and start is None else ""
        raise ValueError(f"{run} has no checkpoint of step {', '.join(map(str, missing))}{why}; its kept steps are "
                         f"{sorted(found)} (train.keep_every keeps the weights of every N-th step)")
    return {s: found[s] for s in steps}


@torch.no_grad()
def sample_token_scores(model, tokenizer, cfg, es, *, seed: int, model_path: Path) -> list[TokenScores]:
    """One response per problem of `es` sampled from `model` at temperature 1, every token scored by it."""
    engine = build_engine(cfg, model=model, tokenizer=tokenizer, model_path=model_path)
    out = engine.generate(es.prompt_ids, max_new_tokens=cfg.eval_max_new_tokens, temperature=1.0, top_p=1.0, seed=seed)
    encoder = prompt_encoder(cfg, tokenizer, max_new_tokens=cfg.eval_max_new_tokens)
    special = cfg.data.template != "chat"  # as PromptEncoder: a chat template carries its special tokens
    scores = []
    for i, problem in enumerate(es.problems):
        ids = out.response_ids[i, : int(out.response_lengths[i])].tolist()
        if ids:
            scores.append(token_probs(model, tokenizer, encoder.text(problem.question), ids, add_special_tokens=special))
    return scores


def entropy_tokens_table(result: EntropyTokensOverSteps, variant: str) -> str:
    """One row per tracked pair: the variant, the pair (previous token, then the token), per step the
    mean entropy and its count ("—": the pair did not occur at that step)."""
    header = ["variant", "previous token", "token"] + [f"step {s}: entropy (count)" for s in result.steps]
    rows = []
    for (previous, token), per_step in result.tracked.items():
        cells = [f"{per_step[s].entropy:.3f} ({per_step[s].count})" if s in per_step else "—" for s in result.steps]
        rows.append([variant, _show(previous), _show(token), *cells])
    return markdown_table(header, rows)


def _show(text: str) -> str:
    """A token as a table cell: in backquotes (spaces visible), pipes escaped; the response's start as —."""
    return "(start)" if text == "" else "`" + text.replace("|", "\\|").replace("`", "'") + "`"


def run_entropy_tokens(runs: Sequence[Path], *, steps: Sequence[int], out: Path, k: int = 10, min_count: int = 5,
                       limit: int = 100, labels: Sequence[str] | None = None, seed: int | None = None,
                       device: str = "auto", console=None) -> tuple[str, dict[str, EntropyTokensOverSteps]]:
    """Sample and score every run's checkpoints of `steps`, pool by variant; write and return the table."""
    from mathrl.track.console import make_console

    if not steps or any(s < 0 for s in steps):
        raise ValueError("--steps needs one or more steps >= 0")
    if k < 1 or min_count < 1 or limit < 1:
        raise ValueError("--k, --min-count and --limit must be >= 1")
    console = console or make_console(stderr=True)
    runs = [Path(r) for r in runs]
    groups = group_runs(runs, labels)
    device = device_of(device)
    configs = {run: run_config(run) for run in runs}
    dirs = {run: checkpoint_dirs(run, configs[run], steps) for run in runs}  # every checkpoint found before sampling
    results: dict[str, EntropyTokensOverSteps] = {}
    for variant, members in groups.items():
        by_step: dict[int, list[TokenScores]] = {s: [] for s in steps}
        for run in members:
            cfg = configs[run]
            for step, path in dirs[run].items():
                model, tokenizer = load(path, cfg, device)
                es = held_out(cfg, tokenizer, limit)
                console.print(f"entropy tokens of {run} step {step} ({path}, {len(es.problems)} problems)")
                by_step[step] += sample_token_scores(model, tokenizer, cfg, es, model_path=path,
                                                     seed=cfg.eval.seed if seed is None else seed)
                del model
        results[variant] = top_entropy_tokens(by_step, k, min_count=min_count)
    table = "".join(entropy_tokens_table(r, v) + "\n" for v, r in results.items()).rstrip("\n") + "\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(table)
    return table, results


__all__ = ["checkpoint_dirs", "entropy_tokens_table", "run_entropy_tokens", "sample_token_scores"]
