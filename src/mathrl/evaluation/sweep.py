"""`mathrl eval`: evaluate checkpoints honestly, across seeds, with confidence intervals.

    mathrl eval runs/20250101-120000                      # every checkpoint of a run, held-out arithmetic
    mathrl eval runs/x --step 30 --neighbours 1           # + pass@1 averaged over steps 20, 30, 40
    mathrl eval /models/Qwen2.5-Math-1.5B --data math500.jsonl aime24.jsonl --template zero \\
        --n 16 --seeds 0 1 2 --max-new-tokens 3000
    mathrl eval tiny-arith runs/x/final --limit 50 reward.num_workers=4

TARGETs and key.path=value overrides may stand before or after the options. A TARGET is a Hugging
Face model directory, a run directory (its config.yaml gives the defaults; its starting model as
step 0 when it is on this machine (`run_start`), then every checkpoint in checkpoints/step_*/ and
final/, ordered by the step in its trainer_state.json; the weights of every `train.keep_every`-th
step, eval.every by default, are kept for this) or `tiny-arith` (the cached tiny base model).

For every checkpoint x dataset x seed this calls `evaluation.evaluate.evaluate` (the engine and
verifier training uses, one Verifier for the whole sweep, the seed as the sampling seed), then
reports per checkpoint x dataset: every metric's mean, sample std and Student-t 95% CI across seeds
(`metrics.mean_std_ci95`), for pass@1 also the 95% CI of a bootstrap over problems
(`metrics.bootstrap_ci95`, always inside [0, 1]; the one the tables print), and the collapse rates
(`reward.collapse`). Every checkpoint sees the
same seeds, so checkpoints are compared on equal random draws. Results go to `--out` (default
`<run>/eval` for a single run target, else `eval_<timestamp>`): results.json (everything, per seed
too; rewritten after each checkpoint so a long sweep leaves partial results) and results.md.
docs/evaluation.md explains the choices.

Library use:

    report = sweep(["runs/x"], SweepSettings(n=4, seeds=[0, 1]), out=Path("runs/x/eval"))
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from mathrl.config import Config, ConfigError, load_config, parse_override
from mathrl.evaluation.evaluate import evaluate
from mathrl.evaluation.metrics import bootstrap_ci95, default_ks, mean_std_ci95, problem_scores
from mathrl.model.paths import TINY_BASE
from mathrl.reward.collapse import is_garbled, is_repetitive
from mathrl.run_dir import RunDir
from mathrl.tasks.sources import build_eval_sets
from mathrl.track.console import make_progress

__all__ = [
    "Checkpoint",
    "SweepSettings",
    "TargetError",
    "sweep",
    "resolve_targets",
    "run_checkpoints",
    "model_device",
    "neighbourhood_average",
    "results_markdown",
    "results_table",
]

# Overrides that would silently do nothing here: sampling settings come from the flags, the model from TARGET.
_FLAG_KEYS = {"eval.n": "--n", "eval.temperature": "--temperature", "eval.top_p": "--top-p",
              "eval.seed": "--seeds", "model.path": "a TARGET"}
_OVERRIDE = re.compile(r"^[A-Za-z_][\w.]*=")
_EXAMPLES = 3  # example responses kept per row (first sample of the first problems, and collapsed ones)
_EXAMPLE_CHARS = 400


class TargetError(ValueError):
    """A TARGET that is not a model directory, a run directory or tiny-arith."""


@dataclass
class SweepSettings:
    """What `mathrl eval` samples, and from which data. None means "from the target's config"."""

    n: int = 8  # samples per problem: pass@1 is their mean (avg@n); pass@k for k in default_ks(n)
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])  # sampling seeds: mean and std across them
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int | None = None  # default: eval.max_new_tokens, else rollout.max_new_tokens of the config
    limit: int | None = None  # problems per dataset; default: all rows of a file, data.eval_size arithmetic problems
    template: str | None = None  # default: data.template of the config
    data: list[str] | None = None  # "arith" (arith_decimal, arith_hard), .jsonl/.parquet files, hf:<name>[:<config>][@<split>]; default: data.eval
    device: str = "auto"  # auto = cuda when available, else cpu
    step: int | None = None  # neighbourhood averaging around this training step
    neighbours: int = 1  # checkpoints on each side of `step` that join its average

    def validate(self) -> None:
        errors = []
        if self.n < 1:
            errors.append(f"--n must be >= 1, got {self.n}")
        if not self.seeds:
            errors.append("--seeds needs at least one seed")
        elif len(set(self.seeds)) != len(self.seeds):
            errors.append(f"--seeds has duplicates {self.seeds}: a repeated seed repeats the same draws and shrinks the CI falsely")
        if not self.temperature >= 0:
            errors.append(f"--temperature must be >= 0 (0 is greedy decoding), got {self.temperature}")
        elif self.temperature == 0 and self.n > 1:
            errors.append(f"--temperature 0 is greedy decoding: all --n {self.n} samples of a problem would be the "
                          "same; add --n 1")
        if not 0 < self.top_p <= 1:
            errors.append(f"--top-p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            errors.append(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if self.limit is not None and self.limit < 1:
            errors.append(f"--limit must be >= 1, got {self.limit}")
        if self.neighbours < 0:
            errors.append(f"--neighbours must be >= 0, got {self.neighbours}")
        if errors:
            raise ConfigError("\n".join(errors))  # one line per problem


@dataclass
class Checkpoint:
    """One model to evaluate and the config it is evaluated with."""

    label: str  # "<run name>/step_000010", "<run name>/final", or the model directory as given
    path: str  # the Hugging Face model directory
    step: int | None  # training step from trainer_state.json; None for a plain model directory
    run: str | None  # the run directory it belongs to; None for a plain model directory
    cfg: Config = field(repr=False)  # run config.yaml (or defaults) <- overrides <- flags


# ----------------------------------------------------------------------------------------------------
# targets and overrides (cli.py parses the command line)
# ----------------------------------------------------------------------------------------------------
def split_args(args: Sequence[str]) -> tuple[list[str], list[str]]:
    """(targets, overrides): `key.path=value` words are overrides unless they name an existing path."""
    targets, overrides = [], []
    for a in args:
        (overrides if _OVERRIDE.match(a) and not Path(a).exists() else targets).append(a)
    return targets, overrides


# ----------------------------------------------------------------------------------------------------
# targets -> checkpoints
# ----------------------------------------------------------------------------------------------------
def check_overrides(overrides: Sequence[str]) -> None:
    for text in overrides:
        key, _ = parse_override(text)
        if key in _FLAG_KEYS:
            raise ConfigError(f"override {text!r} has no effect in `mathrl eval`; use {_FLAG_KEYS[key]} instead")


def eval_config(run_dir: Path | None, overrides: Sequence[str], settings: SweepSettings) -> Config:
    """The run's config.yaml (or the defaults) <- overrides <- the --template / --data flags."""
    cfg = load_config(run_dir / "config.yaml" if run_dir else None, list(overrides), check_paths=False)
    if settings.template is not None:
        cfg.data.template = settings.template
    if settings.data is not None:
        cfg.data.eval = list(settings.data)
    return cfg


def run_checkpoints(run_dir: Path, cfg: Config) -> list[tuple[str, Path, int]]:
    """(label, path, step) of every checkpoint of a run, ordered by step.

    The step is trainer_state.json's "step"; without that file, the number in step_<N>, or
    train.steps for final/. Two directories with the same step (final/ and a step_<N> saved at the
    last step) are one checkpoint: the step_<N> one is kept.
    """
    # RunDir knows the layout; a checkpoint being written lives in step_<N>.tmp-* and is not listed
    found = [(f"{run_dir.name}/{name}", d, cfg.train.steps if step is None else int(step), final)
             for name, d, step, final in RunDir(run_dir).model_dirs()]
    found.sort(key=lambda x: (x[2], x[3]))
    out, seen = [], set()
    for label, d, step, _ in found:
        if step not in seen:
            seen.add(step)
            out.append((label, d, step))
    return out


def run_start(run_dir: Path, cfg: Config) -> tuple[Path | None, str]:
    """The model a run started from, its step 0, when it is on this machine: (directory, "") or
    (None, why it is not evaluated). That is the parent checkpoint of a `train.init_from` run, the cached
    tiny base model, or a local `model.path` directory; a hub id is never downloaded for it."""
    from mathrl.model.tiny import base_model_dir

    run = RunDir(run_dir)
    if run.parent_path.exists():
        parent = Path(json.loads(run.parent_path.read_text())["checkpoint"])
        return (parent, "") if (parent / "config.json").exists() else (None, f"its parent checkpoint {parent} is gone")
    if cfg.model.init == "random":
        return None, "model.init=random: its starting weights were never saved"
    if cfg.model.path == TINY_BASE:
        base = base_model_dir(cfg.base)
        if (base / "model.safetensors").exists():
            return base, ""
        return None, "the tiny base model is not in this machine's cache (`mathrl base` with the run's base.* settings builds it)"
    local = Path(cfg.model.path).expanduser()
    if (local / "config.json").exists():
        return local, ""
    return None, f"model.path={cfg.model.path} is not a local directory (give it as another TARGET to evaluate it)"


def _target_config(target: str, overrides: Sequence[str], settings: SweepSettings) -> Config:
    """The config a TARGET is evaluated with, found without building or loading anything; raises
    TargetError for a TARGET that is not a model directory, a run directory or tiny-arith."""
    path = Path(target).expanduser()
    if target == TINY_BASE and not path.exists():
        cfg = eval_config(None, overrides, settings)
        cfg.model.path = TINY_BASE
        return cfg
    if not path.exists():
        raise TargetError(f"target {target!r} does not exist; give a model directory, a run directory "
                          f"(with config.yaml) or {TINY_BASE}")
    if (path / "config.yaml").exists():
        return eval_config(path, overrides, settings)
    if (path / "config.json").exists():
        return eval_config(None, overrides, settings)
    raise TargetError(f"target {target!r} is neither a run directory (no config.yaml) nor a Hugging Face "
                      "model directory (no config.json)")


def resolve_targets(targets: Sequence[str], *, overrides: Sequence[str], settings: SweepSettings, console: Console) -> list[Checkpoint]:
    """Every checkpoint the TARGETs stand for, in the order given (a run's checkpoints by step).

    Every TARGET's config and data (`check_eval_data`) are checked before the first model is built: a
    wrong field map fails in seconds, not after the tiny base model has been pretrained."""
    check_overrides(overrides)
    configs = [_target_config(target, overrides, settings) for target in targets]
    checked = set()
    for cfg in configs:
        if repr(cfg.data) not in checked:  # targets with the same data settings read it once
            checked.add(repr(cfg.data))
            check_eval_data(cfg, limit=settings.limit)
    checkpoints: list[Checkpoint] = []
    for target, cfg in zip(targets, configs):
        path = Path(target).expanduser()
        if target == TINY_BASE and not path.exists():
            from mathrl.model.paths import resolve_model_path
            from mathrl.tasks.arithmetic import base_pretraining_text

            checkpoints.append(Checkpoint(TINY_BASE, resolve_model_path(cfg, console, pretraining_text=base_pretraining_text(cfg.base)), None, None, cfg))
        elif (path / "config.yaml").exists():
            found = run_checkpoints(path, cfg)
            if not found:
                raise TargetError(f"run directory {target!r} holds no checkpoint (checkpoints/step_*/ or final/ with "
                                  "config.json); is the run still in its first steps?")
            start, why_not = run_start(path, cfg)
            if start is not None:  # step 0 of the run's evaluation curve
                checkpoints.append(Checkpoint(f"{path.name}/start", str(start), 0, str(path), cfg))
            else:
                console.print(f"[yellow]note:[/yellow] {target}: its starting model (step 0) is not evaluated: {why_not}")
            checkpoints += [Checkpoint(label, str(d), step, str(path), cfg) for label, d, step in found]
        else:
            checkpoints.append(Checkpoint(target, str(path), None, None, cfg))
    return checkpoints


def default_out_dir(targets: Sequence[str], checkpoints: Sequence[Checkpoint]) -> Path:
    runs = {c.run for c in checkpoints}
    if len(targets) == 1 and len(runs) == 1 and None not in runs:
        return Path(next(iter(runs))) / "eval"
    return Path(f"eval_{time.strftime('%Y%m%d-%H%M%S')}")


# ----------------------------------------------------------------------------------------------------
# data
# ----------------------------------------------------------------------------------------------------
def check_eval_data(cfg: Config, *, limit: int | None) -> None:
    """Read every dataset of cfg.data.eval that is not a built-in arithmetic set (files and hf: sources)
    with its field map, as the sweep will read it (its first `limit` rows, all when None), before any
    model is built or loaded: a missing field or a malformed row raises `DataError` now, naming file and
    line, instead of after the model has loaded."""
    from mathrl.registry import ARITH_SOURCES
    from mathrl.tasks.loading import load_problems
    from mathrl.tasks.sources import field_map

    for source in cfg.data.eval:
        if source not in ARITH_SOURCES.names():
            load_problems(source, field_map(cfg, source), limit=limit, default_split="test")


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
            garbled = [is_garbled(t, rollout.logprobs[i][mask[i]].tolist()) for i, t in enumerate(texts)]
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
                _write(out, report)  # partial results survive an interrupted sweep
    finally:
        for engine in engines.values():
            engine.close()
        if own_verifier:
            verifier.close()
    if settings.step is not None:
        report["neighbourhood"] = neighbourhood_average(report["results"], step=settings.step,
                                                        neighbours=settings.neighbours)
    report["complete"] = True
    _write(out, report)
    console.print(results_table(report))
    for r in report["results"]:
        if r["dropped_prompts"]:
            console.print(f"[yellow]note:[/yellow] {r['checkpoint']} {r['dataset']}: {r['dropped_prompts']} prompts over "
                          "data.max_prompt_tokens were dropped; raise it to score the whole set")
    console.print(f"[bold]results[/bold] {out / 'results.json'}, {out / 'results.md'}")
    return report


# ----------------------------------------------------------------------------------------------------
# output
# ----------------------------------------------------------------------------------------------------
def _json_safe(x):
    """NaN/inf become null: strict JSON has neither, and a reader should see "unknown", not a crash."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


def _write(out: Path, report: dict) -> None:
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
