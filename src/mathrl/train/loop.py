"""The RL run's driver: build the trainer, evaluate the start, run `rl_step` for every step (with the
due evaluations and checkpoints), then save the final model and the summary.

    mathrl train                                   # the embedded default (tiny model, arithmetic)
    mathrl train rollout.n=16 algo.clip.eps_high=0.2

One call of `train(cfg)` runs a whole experiment and writes its run directory (layout in run_dir.py).
The pieces live next door: trainer.py (build_trainer), step.py (rl_step), collect.py, update.py,
critic.py, checkpoint.py, monitors.py (and mathrl/shards.py: which rows each rank takes); generator
processes (rollout.max_staleness >= 1) in generators/host.py; SIGTERM in preempt.py. It owns the
run's processes, engine, sinks and process group, and closes them in a fixed order on every rank:
docs/architecture.md, "One RL step" and "The run's teardown".
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from mathrl.config import Config
from mathrl.evaluation.evaluate import EvalResult
from mathrl.run_dir import release_run_dir
from mathrl.track.console import StepProgress, plural, summary_table
from mathrl.train.checkpoint import save_final_model, save_hf_model
from mathrl.train.critic import pretrain_critic
from mathrl.train.dist import DistributedError, Ranks, close_distributed, collective_failure, init_distributed
from mathrl.train.generators.host import next_batch, start_generator
from mathrl.train.preempt import Preempted, StopSignal
from mathrl.train.shared import NonFiniteError, eval_due, evals_from_log, log_evals, run_evals, summary
from mathrl.train.step import rl_step
from mathrl.train.teacher_rows import RowTeacher
from mathrl.train.trainer import Trainer, build_trainer, parent_label

__all__ = ["NonFiniteError", "TrainResult", "train"]


@dataclass
class TrainResult:
    run_dir: Path
    base: dict[str, EvalResult]
    final: dict[str, EvalResult]
    wall_seconds: float


def train(cfg: Config, *, console: Console | None = None, resume: bool = True) -> TrainResult:
    """Run the experiment `cfg` describes: in this process, or as one rank of a torchrun job (the
    ranks split each step's prompts and each evaluation's rows; rank 0 alone writes the run directory and logs)."""
    ranks = init_distributed(timeout_s=cfg.train.dist.timeout_s, device=cfg.train.device)
    console = (console or Console()) if ranks.main else Console(quiet=True)
    try:
        result = _train(cfg, console=console, resume=resume, ranks=ranks)
    except Exception as e:
        if ranks.distributed and collective_failure(e):
            raise DistributedError(
                f"rank {ranks.rank}: a collective failed ({str(e).splitlines()[0][:200]}); another rank stopped or "
                f"did not answer within train.dist.timeout_s={cfg.train.dist.timeout_s:g}s. Rerun the same command "
                "to resume from the last complete checkpoint") from e
        raise
    close_distributed()
    return result


def _train(cfg: Config, *, console: Console, resume: bool, ranks: Ranks) -> TrainResult:
    with StopSignal(main=ranks.main) as stop:  # SIGTERM: at once until the first step, then between steps
        with stop.at_once():  # the base model's build, loading, the engine's start: nothing to save yet
            trainer = build_trainer(cfg, ranks, console=console, resume=resume)
        trainer.stop = stop
        try:
            result = _run(trainer)
        except BaseException:
            with contextlib.suppress(Exception):  # the run's own error is the one to report
                close_held(trainer)
            raise
    release_run_dir(trainer.run.path)  # finished: the writer's lock goes before the process does
    return result


def close_held(trainer: Trainer) -> None:
    """A failed run's teardown of what it holds, in the order of the module docstring: the engine, then
    the metric sinks (a finished run closes them in `finish`)."""
    if trainer.generator is not None:
        trainer.generator.close(finished=False)
    trainer.engine.close()
    close_teacher(trainer)
    trainer.tracker.close()


def close_teacher(trainer: Trainer) -> None:
    """A teacher on an engine of its own (teacher.engine=vllm) releases it; a model or a server client holds none."""
    if isinstance(trainer.teacher_model, RowTeacher):
        trainer.teacher_model.close()


def _run(trainer: Trainer) -> TrainResult:
    with trainer.rewarder:
        with trainer.stop.at_once():
            trainer.generator = start_generator(trainer)  # None: the engine samples in this process
        try:
            _steps(trainer)
        except BaseException:  # the generators go before the verifier (teardown order above)
            if trainer.generator is not None:
                with contextlib.suppress(Exception):
                    trainer.generator.close(finished=False)
                trainer.generator = None
            raise
        if trainer.generator is not None:
            trainer.generator.close(finished=True)
            trainer.generator = None
    return finish(trainer)


def _steps(trainer: Trainer) -> None:
    """The starting point's evaluation, then every step with its due evaluation and checkpoint."""
    cfg, console = trainer.cfg, trainer.console
    with trainer.stop.at_once():  # nothing to save before the first step: SIGTERM stops the evaluation where it is
        evaluate_start(trainer)
    with StepProgress(console, total=cfg.train.steps, completed=trainer.start_step - 1) as progress:
        for step in range(trainer.start_step, cfg.train.steps + 1):
            result = rl_step(trainer, step, generated(trainer, step) if cfg.generator_workers else None)
            # an empty step did not move the weights, but a due evaluation and checkpoint still happen:
            # on the last step they are the run's final scores and the checkpoint a finished run continues from
            evaluate_if_due(trainer, step, progress)
            if result.trained:
                trainer.collapse.check(step, result.collapse, console)
            stop = trainer.end_step(step)  # the due checkpoint (steps, minutes, SIGTERM); stop: SIGTERM asked to
            trainer.signal.record(step, result.groups, n=cfg.rollout.n)
            trainer.signal.check(step, cfg, console, main=trainer.ranks.main)  # stops a run whose groups have had no signal for a while
            if stop:
                raise Preempted(step, main=trainer.ranks.main)
            if not result.trained:
                progress.advance_empty()
                continue
            trainer.skips.stop_if_over(cfg.train.max_skipped_steps, trainer.run.checkpoints)
            progress.advance(result.metrics, trainer.last_eval)


def generated(trainer: Trainer, step: int):
    """Step `step`'s batch from the generator processes. The first step's wait spans their start (model
    loading, an engine's start, the first version's sampling) and saves nothing: SIGTERM stops it at once."""
    if step > trainer.start_step:
        return next_batch(trainer, step)
    with trainer.stop.at_once():
        return next_batch(trainer, step)


def evaluate_start(trainer: Trainer) -> None:
    """The starting point's evaluation (read back from the log when resuming) and VC-PPO critic pretraining."""
    cfg, t = trainer.cfg, trainer
    if t.checkpoint is None:  # every rank samples its share; rank 0 logs
        start = "the base model" if t.parent is None else f"the starting model ({parent_label(t.parent)})"
        sets = ", ".join(f"{e.name} ({plural(len(e.problems), 'problem')})" for e in t.eval_sets)
        t.console.print(f"evaluating {start} on {sets}, {plural(cfg.eval.n, 'sample')} each")
        t.base_results = t.latest = run_evals(t.eval_sets, engine=t.engine, tokenizer=t.tokenizer, verifier=t.rewarder,
                                              cfg=cfg, ranks=t.ranks)
        t.last_eval = log_evals(0, t.base_results, t.tracker, t.run) if t.ranks.main else {}
    elif not t.ranks.main:
        pass  # rank 0 reads the resumed run's evaluations back
    else:
        t.base_results, t.latest, t.last_eval = evals_from_log(t.run)
    if t.critic is not None and cfg.algo.critic.pretrain_steps > 0 and t.checkpoint is None and t.parent is None:
        t.tracker.log(0, pretrain_critic(cfg, t.critic, t.critic_optimizer, t.critic_scheduler, train_stream=t.train_stream,
                                         engine=t.engine, tokenizer=t.tokenizer, verifier=t.rewarder, console=t.console,
                                         ranks=t.ranks, scaler=t.critic_scaler))


def evaluate_if_due(trainer: Trainer, step: int, progress: StepProgress) -> None:
    """A new evaluation when step `step` is due one (`eval_due`): every rank samples its share of it,
    rank 0 logs it."""
    t = trainer
    if not eval_due(t.cfg, step, last=t.cfg.train.steps):
        return
    progress.note(f"step {step}: evaluating")
    t.latest = run_evals(t.eval_sets, engine=t.engine, tokenizer=t.tokenizer, verifier=t.rewarder, cfg=t.cfg, ranks=t.ranks)
    t.last_eval = log_evals(step, t.latest, t.tracker, t.run) if t.ranks.main else {}


def finish(trainer: Trainer) -> TrainResult:
    """Close the engine, save the final model (and critic), write the summary."""
    cfg, t, console = trainer.cfg, trainer, trainer.console
    t.engine.close()
    close_teacher(t)
    console.print("saving the final model")
    save_final_model(t.model, t.tokenizer, t.run.final, ranks=t.ranks)  # a plain Hugging Face directory at any world size (LoRA: merged, and final/adapter/)
    if t.critic is not None:
        save_hf_model(t.critic, None, t.run.final / "critic", ranks=t.ranks)
    t.tracker.close()
    processes = t.wall_processes(cfg.train.steps)  # a resumed run: every process that ran it
    wall = sum(p["wall_seconds"] for p in processes)
    if not t.ranks.main:
        return TrainResult(run_dir=t.run.path, base={}, final={}, wall_seconds=wall)
    (t.run.final / "trainer_state.json").write_text(json.dumps({"step": cfg.train.steps, **t.state(), "processes": processes},
                                                               indent=2))
    t.run.write_summary({**summary(wall_seconds=wall, steps=cfg.train.steps, base=t.base_results, final=t.latest),
                         "machine": t.machine, "processes": processes})
    console.print(summary_table(t.base_results, t.latest, wall_seconds=wall, n=cfg.eval.n, processes=processes))
    console.print(f"[bold]run directory[/bold] {t.run.path}")
    return TrainResult(run_dir=t.run.path, base=t.base_results, final=t.latest, wall_seconds=wall)
