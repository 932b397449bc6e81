"""What `train` (the RL run) and `sft` both use: seeding, the optimizer, the tracker, the count of
steps skipped for a non-finite loss or gradient, the evaluation and checkpoint due checks, resuming
from a checkpoint, the evaluation logs and the run summary."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console

from mathrl.config import Config, to_dict
from mathrl.evaluation.evaluate import EvalResult, evaluate
from mathrl.reward.functions import Rewarder
from mathrl.reward.verify import Verifier
from mathrl.run_dir import RunDir, latest_checkpoint
from mathrl.seeds import set_rng_state
from mathrl.tasks.sources import EvalSet
from mathrl.track.sinks import Tracker
from mathrl.train.dist import Ranks, all_gather_objects


class NonFiniteError(RuntimeError):
    """Too many consecutive steps with a non-finite loss or gradient."""


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % 2**32)
    except ImportError:  # pragma: no cover
        pass


def build_optimizer(params, cfg: Config, *, lr: float, warmup_steps: int):
    """AdamW (train.betas, train.weight_decay) with a linear warm-up over `warmup_steps` optimizer steps."""
    optimizer = torch.optim.AdamW(params, lr=lr, betas=tuple(cfg.train.betas), weight_decay=cfg.train.weight_decay)
    warmup = max(1, warmup_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup))
    return optimizer, scheduler


class SilentTracker:
    """The tracker of ranks other than 0: they log nothing."""

    def log(self, step: int, metrics: dict[str, float]) -> None:
        pass

    def close(self) -> None:
        pass


def build_tracker(cfg: Config, run: RunDir, ranks: Ranks | None = None) -> Tracker | SilentTracker:
    """metrics.jsonl plus the sinks log.* asks for, on rank 0; a silent tracker on the other ranks."""
    if ranks is not None and not ranks.main:
        return SilentTracker()
    return Tracker(run.path, tensorboard=cfg.log.tensorboard, wandb=cfg.log.wandb, mlflow=cfg.log.mlflow,
                   wandb_project=cfg.log.wandb_project, mlflow_experiment=cfg.log.mlflow_experiment, config=to_dict(cfg))


@dataclass
class SkipCount:
    """Optimizer steps skipped for a non-finite loss or gradient: in all, and how many steps in a row had one."""

    total: int = 0
    in_a_row: int = 0

    def record(self, step: int, skipped: int, console: Console) -> None:
        if skipped > 0:
            self.total += skipped
            self.in_a_row += 1
            console.print(f"[yellow]warning:[/yellow] step {step}: {skipped} optimizer step(s) skipped: "
                          "non-finite loss or gradient")
        else:
            self.in_a_row = 0

    def stop_if_over(self, limit: int, checkpoints: Path) -> None:
        """Raise NonFiniteError after `limit` consecutive steps with a skip, naming the last good checkpoint."""
        if self.in_a_row >= limit:
            last = latest_checkpoint(checkpoints)
            where = f"the last good checkpoint is {last}" if last else "no checkpoint had been written yet"
            raise NonFiniteError(f"{self.in_a_row} consecutive steps had a non-finite loss or gradient; "
                                 f"stopping ({where})")


def eval_due(cfg: Config, step: int, *, last: int) -> bool:
    """Whether step `step` ends with an evaluation: every eval.every steps and after the last."""
    return step % cfg.eval.every == 0 or step == last


def save_due(cfg: Config, step: int, *, last: int) -> bool:
    """Whether step `step` ends with a checkpoint: every train.save_every steps and after the last (0: never)."""
    return bool(cfg.train.save_every) and (step % cfg.train.save_every == 0 or step == last)


def resume_from(checkpoint: Path, state: dict, *, stream, run: RunDir, console: Console, steps: int,
                main: bool = True) -> int:
    """Resume the run at `checkpoint`, whose trainer state `state` is (`checkpoint.load_trainer_state`,
    which put the optimizers back): the RNG states and the data stream's position come back, and the
    run's logs lose the rows written after the checkpoint (by rank 0, `main`); returns the step to run
    next. `steps` is the run's length, for the message."""
    set_rng_state(state["rng"])
    stream.load_state_dict(state["data"])
    if main:
        run.truncate_after(state["step"])  # rows a killed run wrote after this checkpoint
    console.print(f"[bold]resuming[/bold] from {checkpoint} (step {state['step']} of {steps})")
    return state["step"] + 1


def run_evals(eval_sets: list[EvalSet], *, engine, tokenizer, verifier: Verifier | Rewarder, cfg: Config,
              ranks: Ranks | None = None) -> dict[str, EvalResult]:
    """Every eval set evaluated; with several ranks each samples a block of the rows and every rank gets
    the whole result (`evaluation.evaluate.evaluate`), so no rank waits alone in a collective."""
    ranks = ranks or Ranks()
    return {
        es.name: evaluate(
            es.name, es.problems, es.prompt_ids, engine=engine, tokenizer=tokenizer, verifier=verifier,
            n=cfg.eval.n, max_new_tokens=cfg.eval_max_new_tokens, temperature=cfg.eval.temperature,
            top_p=cfg.eval.top_p, seed=cfg.eval.seed, reflection_words=cfg.log.reflection_words,
            rank=ranks.rank, world_size=ranks.world_size, gather=all_gather_objects,
        )
        for es in eval_sets
    }


def log_evals(step: int, results: dict[str, EvalResult], tracker, run: RunDir) -> dict[str, float]:
    metrics = {}
    for name, r in results.items():
        metrics.update(r.metrics(f"eval/{name}"))
    tracker.log(step, metrics)
    run.append_evals(step, results)
    return metrics


def evals_from_log(run: RunDir) -> tuple[dict[str, EvalResult], dict[str, EvalResult], dict[str, float]]:
    """Base and latest evaluations of a resumed run, read back from evals.jsonl."""
    rows = run.evals()
    fields = set(EvalResult.__dataclass_fields__) - {"samples"}

    def result(row: dict) -> EvalResult:
        r = EvalResult(**{k: v for k, v in row.items() if k in fields})
        r.pass_at_k = {int(k): v for k, v in r.pass_at_k.items()}  # JSON object keys are strings
        return r

    base = {r["set"]: result(r) for r in rows if r["step"] == 0}
    last_step = max(r["step"] for r in rows)
    latest = {r["set"]: result(r) for r in rows if r["step"] == last_step}
    metrics = {}
    for name, r in latest.items():
        metrics.update(r.metrics(f"eval/{name}"))
    return base, latest, metrics


def summary(*, wall_seconds: float, steps: int, base: dict[str, EvalResult], final: dict[str, EvalResult]) -> dict:
    """summary.json of a finished run: its length and the evaluations before and after."""

    def scores(results: dict[str, EvalResult]) -> dict:
        return {k: {"pass@1": v.pass_at_1, "pass@k": v.pass_at_k, "maj@n": v.maj_at_n} for k, v in results.items()}

    return {"wall_seconds": wall_seconds, "steps": steps, "base": scores(base), "final": scores(final)}
