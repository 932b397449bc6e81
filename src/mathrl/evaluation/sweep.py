"""`mathrl eval`: evaluate checkpoints honestly, across seeds, with confidence intervals.

    mathrl eval runs/20250101-120000                      # every checkpoint of a run, held-out arithmetic
    mathrl eval /models/Qwen2.5-Math-1.5B --data math500.jsonl --template zero --n 16 --seeds 0 1 2

A TARGET is a model directory, a run directory (its starting model, then its checkpoints by step) or
`tiny-arith`. Every checkpoint x dataset x seed is one `evaluation.evaluate.evaluate` call with the
same seeds; per checkpoint x dataset it reports each metric's mean, std and Student-t 95% CI across
seeds, a bootstrap 95% CI of pass@1 over problems, and the collapse rates. It loads models, runs the
engine and verifier, and writes results.json (rewritten after each checkpoint) and results.md to
`--out`. Arguments, what is reported and why: docs/evaluation.md.

    report = sweep(["runs/x"], SweepSettings(n=4, seeds=[0, 1]), out=Path("runs/x/eval"))
"""


from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from rich.console import Console

from mathrl.config import ConfigError
from mathrl.evaluation.evaluate import evaluate
from mathrl.evaluation.metrics import bootstrap_ci95, default_ks, mean_std_ci95, problem_scores
from mathrl.evaluation.results import results_table, write_results
from mathrl.evaluation.targets import Checkpoint, SweepSettings, default_out_dir, resolve_targets
from mathrl.reward.collapse import is_garbled, is_repetitive
from mathrl.tasks.sources import build_eval_sets
from mathrl.track.console import make_progress

__all__ = ["SweepSettings", "sweep", "model_device", "neighbourhood_average"]

_EXAMPLES = 3  # example responses kept per row (first sample of the first problems, and collapsed ones)
_EXAMPLE_CHARS = 400


# ----------------------------------------------------------------------------------------------------
# the sweep
# ----------------------------------------------------------------------------------------------------
class _RecordingEngine:
    """Passes `generate` through to the engine and keeps its last RolloutBatch.

    `evaluate` returns the first response per problem only; the collapse rates need every response
    and its token logprobs. Recording the batch evaluate scored (rather than sampling again) means the
    collapse rates describe exactly the samples behind pass@1, at no extra cost.
    """

    def __init__(self, engine):
        self.engine = engine
        self.last = None

    def generate(self, prompts, **kwargs):
        self.last = self.engine.generate(prompts, **kwargs)
        return self.last


def _device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def model_device(engine: str, device: str) -> str:
    """Where the checkpoint's Hugging Face model loads for rollout.engine=`engine` evaluating on `device`:
    there when the engine samples from it (torch), else on the CPU: vLLM loads its own weights on the GPU
    and takes later checkpoints' weights from this copy, which on the GPU would be memory (a 7B model in
    float32: 28 GiB) that vLLM's start-up check counts as taken."""
    from mathrl.rollout.factory import engine_samples_from_module

    return device if engine_samples_from_module(engine) else "cpu"


def _summary(values: Sequence[float]) -> dict[str, float | None]:
    mean, std, half = mean_std_ci95(values)
    return {"mean": mean, "std": std, "ci95": None if math.isnan(half) else half}


def _pass1_summary(per_seed: Sequence[float], per_problem: Sequence[Sequence[float]]) -> tuple[dict, list[float]]:
    """pass@1's summary and each problem's score over all seeds x samples.

    The summary is `_summary` across seeds (mean, std, and `ci95`, the Student-t half-width across
    seeds) plus `ci95_low` / `ci95_high`: the bootstrap 95% interval over problems
    (`metrics.bootstrap_ci95` of `metrics.problem_scores`, bootstrap seed 0), always inside [0, 1]."""
    scores = problem_scores(per_problem)
    _, low, high = bootstrap_ci95(scores, seed=0)
    return {**_summary(per_seed), "ci95_low": low, "ci95_high": high}, scores


def _clip(text: str) -> str:
    return text if len(text) <= _EXAMPLE_CHARS else text[:_EXAMPLE_CHARS] + f"... [{len(text)} chars]"


def _keep_sampled(examples: dict[str, list], seed: int, samples: list[dict], problems: Sequence) -> None:
    """Add the first sample of each problem (`EvalResult.samples`, in problem order) to `examples`,
    right and wrong answers apart, up to `_EXAMPLES` of each, with the gold answer beside what was boxed:
    what a user reads first to see whether the data and the prompt make sense to the model."""
    for sample, problem in zip(samples, problems):
        kind = "right" if sample["reason"] == "correct" else "wrong"
        if len(examples[kind]) < _EXAMPLES:
            examples[kind].append({"seed": seed, "problem_id": problem.id, "gold": problem.answer,
                                   "boxed": sample["extracted"], "reason": sample["reason"],
                                   "response": _clip(sample["response"])})


def _seed_record(seed: int, result, texts: list[str], repetitive: list[bool], garbled: list[bool]) -> dict:
    record: dict = {"seed": seed}
    record.update({f"pass@{k}": v for k, v in result.pass_at_k.items()})
    record[f"maj@{result.n}"] = result.maj_at_n
    record["no_answer_rate"] = result.no_answer_rate
    record["truncated_rate"] = result.truncated_rate
    record["response_length"] = result.mean_response_length
    record["reflection_rate"] = result.reflection_rate
    if result.integer_answer_rate is not None:  # a set whose gold answers are not all integers
        record["integer_answer_rate"] = result.integer_answer_rate
    record["repetitive_rate"] = sum(repetitive) / len(texts)
    record["garbled_rate"] = sum(garbled) / len(texts)
    record.update({f"reward/{k}": v for k, v in (result.rewards or {}).items()})  # reward.functions' components
    record.update(result.tools or {})  # with rollout.tools: tool/call_rate, tool/calls_mean, ... (docs/metrics.md)
    record["samples"] = [{**s, "response": _clip(s["response"])} for s in result.samples[:_EXAMPLES]]
    return record


def _checkpoint_engine(ckpt: Checkpoint, model, tokenizer, engines: dict):
    """The configured rollout engine (rollout.engine) for a loaded checkpoint. A vLLM engine is started
    once per architecture and settings, and later checkpoints are synced into it (seconds instead of a
    restart per checkpoint); an engine that samples from the loaded model itself (torch) is simply built on it."""
    from mathrl.rollout.factory import build_engine, engine_samples_from_module

    cfg = ckpt.cfg
    if engine_samples_from_module(cfg.rollout.engine):
        return build_engine(cfg, model=model, tokenizer=tokenizer, model_path=ckpt.path)
    key = (cfg.rollout.engine, repr(cfg.rollout.vllm), cfg.model.dtype,
           tuple((k, tuple(v.shape)) for k, v in model.state_dict().items()))
    if key in engines:
        engines[key].update_weights(model.state_dict().items())
    else:
        engines[key] = build_engine(cfg, model=model, tokenizer=tokenizer, model_path=ckpt.path)
    return engines[key]


def _evaluate_checkpoint(ckpt: Checkpoint, settings: SweepSettings, *, verifier, device: str, progress, task,
                         engines: dict | None = None) -> list[dict]:
    """One row per dataset: per-seed records and their summaries. `engines` keeps vLLM engines across
    checkpoints (the caller closes them)."""
    import torch

    from mathrl.model.io import load_model_and_tokenizer

    cfg = ckpt.cfg
    max_new_tokens = settings.max_new_tokens or cfg.eval_max_new_tokens
    model, tokenizer = load_model_and_tokenizer(ckpt.path, dtype=cfg.model.dtype,
                                                device=model_device(cfg.rollout.engine, device))
    model.eval()
    engine = _RecordingEngine(_checkpoint_engine(ckpt, model, tokenizer, {} if engines is None else engines))
    rows = []
    # a file is scored whole unless --limit is given (not cut at the training loop's data.eval_size)
    for source, es in zip(cfg.data.eval, build_eval_sets(cfg, tokenizer, limit=settings.limit)):
        per_seed, per_problem = [], []
        examples: dict[str, list] = {"right": [], "wrong": [], "repetitive": [], "garbled": []}
        for seed in settings.seeds:
            progress.update(task, info=f"{ckpt.label} | {es.name} | seed {seed}")
            result = evaluate(
                es.name, es.problems, es.prompt_ids, engine=engine, tokenizer=tokenizer, verifier=verifier,
                n=settings.n, max_new_tokens=max_new_tokens, temperature=settings.temperature,
                top_p=settings.top_p, seed=seed, reflection_words=cfg.log.reflection_words,
            )
            rollout = engine.last
            # the same decode evaluate() scored, for every sample (problem-major: n per problem)
            texts = tokenizer.batch_decode(rollout.response_ids, skip_special_tokens=True)
            mask = rollout.response_mask > 0  # [N, T]
            repetitive = [is_repetitive(t) for t in texts]
            garbled = [is_garbled(t, rollout.rollout_logprobs[i][mask[i]].tolist()) for i, t in enumerate(texts)]
            for kind, flags in (("repetitive", repetitive), ("garbled", garbled)):
                for i, flagged in enumerate(flags):
                    if flagged and len(examples[kind]) < _EXAMPLES:
                        examples[kind].append({"seed": seed, "problem_id": es.problems[i // settings.n].id,
                                               "response": _clip(texts[i])})
            _keep_sampled(examples, seed, result.samples, es.problems)
            per_seed.append(_seed_record(seed, result, texts, repetitive, garbled))
            per_problem.append(result.problem_pass_at_1)
            progress.advance(task)
        metric_keys = [k for k in per_seed[0] if k not in ("seed", "samples")]
        metrics = {k: _summary([r[k] for r in per_seed]) for k in metric_keys}
        metrics["pass@1"], scores = _pass1_summary([r["pass@1"] for r in per_seed], per_problem)
        rows.append({
            "checkpoint": ckpt.label, "step": ckpt.step, "run": ckpt.run, "path": ckpt.path,
            "dataset": es.name, "source": source, "num_problems": len(es.problems),
            "dropped_prompts": es.dropped_too_long,
            "n": settings.n, "seeds": list(settings.seeds), "template": cfg.data.template,
            "max_new_tokens": max_new_tokens, "temperature": settings.temperature, "top_p": settings.top_p,
            "metrics": metrics,
            "per_seed": per_seed,
            "problem_pass@1": scores,  # per problem (in dataset order): its fraction correct over all seeds x n samples
            "examples": examples,
        })
    del model, engine
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return rows


def neighbourhood_average(rows: Sequence[dict], *, step: int, neighbours: int) -> list[dict]:
    """pass@1 averaged over the checkpoint at `step` and up to `neighbours` checkpoints on each side.

    For every (run, dataset) whose checkpoints include `step`: take the run's checkpoint steps in
    order, the window [i - neighbours, i + neighbours] around `step` clipped to those that exist, and
    average the seed-mean pass@1 of those checkpoints (each checkpoint weighs the same). A single
    checkpoint's score is one draw from a noisy training trajectory; the window average is what a
    claim about "the model at step S" should rest on.
    """
    groups: dict[tuple[str, str], dict[int, float]] = {}
    for r in rows:
        if r["run"] is not None and r["step"] is not None:
            groups.setdefault((r["run"], r["dataset"]), {})[r["step"]] = r["metrics"]["pass@1"]["mean"]
    out = []
    for (run_dir, dataset), by_step in groups.items():
        steps = sorted(by_step)
        if step not in by_step:
            continue
        i = steps.index(step)
        window = steps[max(0, i - neighbours) : i + neighbours + 1]
        values = [by_step[s] for s in window]
        out.append({"run": run_dir, "dataset": dataset, "step": step, "neighbours": neighbours, "steps": window,
                    "pass@1_per_step": values, "pass@1": math.fsum(values) / len(values)})
    return out


def sweep(
    targets: Sequence[str],
    settings: SweepSettings,
    *,
    overrides: Sequence[str] = (),
    console: Console | None = None,
    out: Path | None = None,
    verifier=None,
) -> dict:
    """Evaluate every checkpoint of `targets` on every dataset with every seed; returns the report.

    Writes results.json and results.md to `out` (default: see `default_out_dir`), and prints a
    progress bar and the results table to `console`. `verifier` (anything with
    `score(completions, references)`) defaults to a `reward.functions.Rewarder` built from the first
    target's `reward.*` config (its `reward.functions` are reported per component) and closed at the end.
    """
    console = console or Console()
    settings.validate()
    checkpoints = resolve_targets(targets, overrides=overrides, settings=settings, console=console)
    if settings.step is not None and not any(c.step == settings.step for c in checkpoints):
        steps = sorted({c.step for c in checkpoints if c.step is not None})
        raise ConfigError(f"--step {settings.step} is not a checkpoint step of the targets; "
                          f"their steps: {steps or 'none (no run directory given)'}")
    out = out or default_out_dir(targets, checkpoints)
    if (out / "results.json").exists():
        console.print(f"[yellow]note:[/yellow] replacing the results already in {out}")
    made = _make_dirs(out)
    try:
        return _sweep(checkpoints, targets, settings, overrides=overrides, console=console, out=out, verifier=verifier)
    except BaseException:
        # A sweep that failed before its first result leaves no empty eval_<timestamp>/ behind; partial
        # results of a later failure (or Ctrl-C) stay where they were written.
        if not (out / "results.json").exists():
            for d in reversed(made):
                try:
                    d.rmdir()  # only an empty directory, and only one this sweep created
                except OSError:
                    break
        raise


def _make_dirs(out: Path) -> list[Path]:
    """mkdir -p `out`; returns the directories it created, outermost first."""
    missing = [p for p in [out, *out.parents] if not p.exists()][::-1]
    out.mkdir(parents=True, exist_ok=True)
    return missing


def _sweep(checkpoints: list[Checkpoint], targets: Sequence[str], settings: SweepSettings, *,
           overrides: Sequence[str], console: Console, out: Path, verifier) -> dict:
    from mathrl.reward.functions import build_rewarder

    device = _device(settings.device)
    report = {
        "settings": {**asdict(settings), "device": device, "ks": default_ks(settings.n), "targets": list(targets),
                     "overrides": list(overrides)},
        "checkpoints": [{"label": c.label, "path": c.path, "step": c.step, "run": c.run} for c in checkpoints],
        "results": [],
        "neighbourhood": [],
        "complete": False,
    }
    console.print(f"evaluating {len(checkpoints)} checkpoint(s), n={settings.n} samples per problem, "
                  f"seeds {settings.seeds}; writing to {out}")
    own_verifier = verifier is None
    if own_verifier:  # the reward components the run trained with (reward.functions), in the verifier's workers
        verifier = build_rewarder(checkpoints[0].cfg.reward)
    total = sum(len(c.cfg.data.eval) for c in checkpoints) * len(settings.seeds)
    progress = make_progress(console, "eval")  # plain log lines when the output is not a terminal
    engines: dict = {}  # vLLM engines, reused across checkpoints of one architecture
    try:
        with progress:
            task = progress.add_task("eval", total=total, info="")
            for ckpt in checkpoints:
                report["results"] += _evaluate_checkpoint(ckpt, settings, verifier=verifier, device=device,
                                                          progress=progress, task=task, engines=engines)
                write_results(out, report)  # partial results survive an interrupted sweep
    finally:
        for engine in engines.values():
            engine.close()
        if own_verifier:
            verifier.close()
    if settings.step is not None:
        report["neighbourhood"] = neighbourhood_average(report["results"], step=settings.step,
                                                        neighbours=settings.neighbours)
    report["complete"] = True
    write_results(out, report)
    console.print(results_table(report))
    for r in report["results"]:
        if r["dropped_prompts"]:
            console.print(f"[yellow]note:[/yellow] {r['checkpoint']} {r['dataset']}: {r['dropped_prompts']} prompts over "
                          "data.max_prompt_tokens were dropped; raise it to score the whole set")
    console.print(f"[bold]results[/bold] {out / 'results.json'}, {out / 'results.md'}")
    return report
