"""The RL loop, top to bottom: problems -> rollout -> reward -> filters -> scoring -> advantages -> updates -> log.

    mathrl train                                   # the embedded default (tiny model, arithmetic)
    mathrl train rollout.n=16 algo.clip.eps_high=0.2

One call of `train(cfg)` runs a whole experiment and writes its run directory (layout in
train/run_dir.py). The pieces live next door: collect.py (rollouts, rewards, filters), update.py (the
mini-batch x epoch x micro-batch updates, scoring passes), critic.py (PPO's critic), checkpoint.py.

Teardown, in this order on every rank, whether the run finished or failed:
  1. the progress display (its `with` block),
  2. the verifier's worker processes (its `with` block),
  3. the rollout engine (vLLM's shutdown still needs the process group),
  4. the metric sinks (files flushed and closed, W&B / MLflow runs ended),
  5. only when the run finished: a barrier, then the process group is destroyed (`close_distributed`).
Engine and sinks are held by `Held`, which closes each once. A failed rank skips step 5: a peer may be
dead or waiting in another collective, which a barrier would join for up to train.dist.timeout_s, and
torchrun stops the job anyway. Checkpoints leave no thread behind (`dcp.save` returns when the shards
are written). A torchrun rank then ends its process without the interpreter's shutdown (why: the
docstring of train/dist.py).
"""

from __future__ import annotations

import contextlib
import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console

from mathrl.algo.advantages import expand_to_tokens, group_advantages, reinforce_pp_advantages, rloo_advantages
from mathrl.algo.controllers import (
    AdaptiveEntropyController,
    AdaptiveKLController,
    CoefController,
    FixedCoef,
    SkyworkEntropyController,
)
from mathrl.algo.kl import apply_kl_reward_penalty, kl_penalty
from mathrl.algo.losses import masked_mean
from mathrl.config import Config, dump_yaml, to_dict
from mathrl.evaluation.evaluate import EvalResult, evaluate
from mathrl.model.io import load_model_and_tokenizer
from mathrl.model.paths import resolve_model_path
from mathrl.model.value import load_critic
from mathrl.reward.reflection import reflection_stats
from mathrl.reward.verify import Verifier
from mathrl.rollout.factory import build_engine
from mathrl.tasks.sources import EvalSet, PretrainText, ProblemStream, build_eval_sets, build_train_stream
from mathrl.track.console import StepProgress, summary_table
from mathrl.track.sinks import Tracker
from mathrl.train.batching import TrainBatch
from mathrl.train.checkpoint import latest_checkpoint, load_trainer_state, save_checkpoint, save_hf_model, set_rng_state
from mathrl.train.collect import (
    CollapseWatch,
    collect_rollouts,
    filter_samples,
    new_train_batch,
    rank_rows,
    rollout_records,
)
from mathrl.train.dist import (
    DistributedError,
    Ranks,
    broadcast_object,
    close_distributed,
    collective_failure,
    init_distributed,
    shard_model,
)
from mathrl.train.critic import gae_targets, outcome_token_rewards, pretrain_critic, update_critic, value_pass
from mathrl.train.run_dir import RunDir, open_run_dir
from mathrl.train.update import engine_logprobs_are_old, scoring_pass, update_policy


@dataclass
class TrainResult:
    run_dir: Path
    base: dict[str, EvalResult]
    final: dict[str, EvalResult]
    wall_seconds: float


class NonFiniteError(RuntimeError):
    """Too many consecutive steps with a non-finite loss or gradient."""


def train(cfg: Config, *, console: Console | None = None, resume: bool = True) -> TrainResult:
    """Run the experiment `cfg` describes: in this process, or as one rank of a torchrun job (the
    ranks split each step's prompts; rank 0 alone writes the run directory, logs and evaluates)."""
    ranks = init_distributed(timeout_s=cfg.train.dist.timeout_s)
    console = (console or Console()) if ranks.main else Console(quiet=True)
    held = Held()
    try:
        result = _train(cfg, console=console, resume=resume, ranks=ranks, held=held)
    except BaseException as e:
        with contextlib.suppress(Exception):  # the run's own error is the one to report
            held.close()
        if isinstance(e, Exception) and ranks.distributed and collective_failure(e):
            raise DistributedError(
                f"rank {ranks.rank}: a collective failed ({str(e).splitlines()[0][:200]}); another rank stopped or "
                f"did not answer within train.dist.timeout_s={cfg.train.dist.timeout_s:g}s. Rerun the same command "
                "to resume from the last complete checkpoint") from e
        raise
    close_distributed()
    return result


class Held:
    """The rollout engine and the metric sinks of a run, closed in the teardown order of the module
    docstring (engine, then sinks), each at most once: by the finished run where it ends with them, or
    by `train` when the run fails."""

    def __init__(self) -> None:
        self.engine = None
        self.tracker = None

    def close_engine(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None:
            engine.close()

    def close(self) -> None:
        self.close_engine()
        tracker, self.tracker = self.tracker, None
        if tracker is not None:
            tracker.close()


def _train(cfg: Config, *, console: Console, resume: bool, ranks: Ranks, held: Held) -> TrainResult:
    t_start = time.time()
    opened = None
    if ranks.main:  # rank 0 creates or resumes the run directory; the others learn what it found
        try:
            opened = (open_run_dir(cfg.run_dir, config_text=dump_yaml(cfg), resume=resume, console=console), None)
        except Exception as e:  # every rank raises it, none waits for the others in vain
            opened = (None, e)
    found, error = broadcast_object(opened)
    if error is not None:  # e.g. a run directory that holds a run it cannot resume: one line, no traceback
        raise error
    run, checkpoint = found
    console.print(f"[bold]run directory[/bold] {run.path}" + (f" ({ranks.world_size} ranks)" if ranks.distributed else ""))
    seed_everything(cfg.seed)

    # ---- model, data, engine, optimizer, reference, critic ---------------------------------------
    model_path = broadcast_object(resolve_model_path(cfg, console) if ranks.main else None)  # rank 0 builds the tiny base
    console.print(f"loading model from {model_path}")
    parent = Path(cfg.train.init_from) if cfg.train.init_from and checkpoint is None else None
    model, tokenizer = load_model_and_tokenizer(checkpoint or parent or model_path, dtype=cfg.model.dtype)
    if cfg.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    train_stream: ProblemStream = build_train_stream(cfg, tokenizer)
    eval_sets = build_eval_sets(cfg, tokenizer, limit=cfg.data.eval_size)
    # rollout.engine: torch samples from `model` itself; vllm loads the weights `model` was loaded from.
    # Several ranks: the engine gets its own unsharded copy (ranks stop generating at different lengths,
    # which a sharded model's collectives cannot follow), refreshed by update_weights after each update.
    engine_model = model
    if ranks.distributed:
        engine_model = load_model_and_tokenizer(checkpoint or parent or model_path, dtype=cfg.model.dtype)[0]
        engine_model.to(ranks.device).eval()
        model = shard(model, cfg, ranks)
    engine = held.engine = build_engine(cfg, model=engine_model, tokenizer=tokenizer,
                                       model_path=checkpoint or parent or model_path)
    optimizer, scheduler = build_optimizer(model.parameters(), cfg, lr=cfg.train.lr)
    controllers = build_controllers(cfg)
    ptx = PretrainText(cfg, tokenizer) if cfg.algo.ptx.coef > 0 else None
    ref_model = None
    if cfg.needs_reference:  # loaded only when a KL term or ref_gain_clip needs it
        console.print("loading the reference model (a frozen copy of the starting model)")
        ref_model, _ = load_model_and_tokenizer(model_path, dtype=cfg.model.dtype)
        ref_model = shard(ref_model.eval().requires_grad_(False), cfg, ranks)
    critic = critic_optimizer = critic_scheduler = None
    if cfg.algo.adv.estimator == "gae":  # PPO with a learned critic; it resumes from checkpoints like the policy
        critic_source = critic_path(cfg, checkpoint=checkpoint, parent=parent, model_path=model_path)
        console.print(f"loading the critic from {critic_source}")
        critic = shard(load_critic(critic_source, dtype=cfg.model.dtype), cfg, ranks)
        critic.train()
        critic_optimizer, critic_scheduler = build_optimizer(critic.parameters(), cfg, lr=cfg.algo.critic.lr or cfg.train.lr)
    optimizers = {"optimizer": optimizer, "scheduler": scheduler}
    if critic is not None:
        optimizers.update(critic_optimizer=critic_optimizer, critic_scheduler=critic_scheduler)

    # ---- resume (same run) or continue (train.init_from: a new run from another run's checkpoint) --
    start_step, skipped_in_a_row, skipped_total = 1, 0, 0
    if checkpoint is not None or parent is not None:
        state = load_trainer_state(checkpoint or parent, optimizers=optimizers, controllers=controllers,
                                   models={"optimizer": model, "critic_optimizer": critic})
        if checkpoint is not None:  # everything the next step depends on comes back from the checkpoint
            set_rng_state(state["rng"])
            train_stream.load_state_dict(state["data"])
            if ptx is not None:
                ptx.load_state_dict(state["ptx"])
            skipped_total = int(state.get("skipped_steps", 0))
            if ranks.main:
                run.truncate_after(state["step"])  # rows a killed run wrote after this checkpoint
            start_step = state["step"] + 1
            console.print(f"[bold]resuming[/bold] from {checkpoint} (step {state['step']} of {cfg.train.steps})")
        else:  # staged growth (e.g. a longer rollout.max_new_tokens): optimizer, schedule, controllers kept
            if ranks.main:
                run.write_parent(parent, state["step"])
            console.print(f"[bold]continuing[/bold] from {parent} (step {state['step']} of its run); recorded in parent.json")
    tracker = held.tracker = Tracker(run.path, tensorboard=cfg.log.tensorboard, wandb=cfg.log.wandb,
                                     mlflow=cfg.log.mlflow, wandb_project=cfg.log.wandb_project,
                                     mlflow_experiment=cfg.log.mlflow_experiment,
                                     config=to_dict(cfg)) if ranks.main else SilentTracker()

    def trainer_state() -> dict:
        return {
            "controllers": {k: c.state_dict() for k, c in controllers.items()},
            "data": train_stream.state_dict(),
            "ptx": ptx.state_dict() if ptx is not None else None,
            "skipped_steps": skipped_total,
        }

    def evaluate_if_due(step: int, latest: dict, last_eval: dict) -> tuple[dict, dict]:
        """(latest results, their logged metrics): new ones when the step is due an evaluation."""
        if not (ranks.main and eval_due(cfg, step)):
            return latest, last_eval
        progress.note(f"step {step}: evaluating")
        results = run_evals(eval_sets, engine=engine, tokenizer=tokenizer, verifier=verifier, cfg=cfg)
        return results, log_evals(step, results, tracker, run)

    def save_if_due(step: int) -> None:
        # no checkpoint while updates are being skipped: the last one stays the last good one
        if save_due(cfg, step) and not skipped_in_a_row:
            save_checkpoint(run.checkpoints, step, model=model, tokenizer=tokenizer, state=trainer_state(),
                            keep_last=cfg.train.keep_last, keep_every=cfg.train.keep_every, critic=critic,
                            ranks=ranks, **optimizers)

    for note in train_stream.notes:
        console.print(note)
    for es in eval_sets:
        if es.dropped_too_long:
            console.print(f"eval set {es.name}: {es.dropped_too_long} problems dropped, their prompts exceed "
                          f"data.max_prompt_tokens={cfg.data.max_prompt_tokens}")
    collapse = CollapseWatch()
    n = cfg.rollout.n
    with Verifier(num_workers=cfg.reward.num_workers, timeout_s=cfg.reward.timeout_s, boxed=cfg.reward.boxed) as verifier:
        # ---- evaluate the starting point ---------------------------------------------------------
        base_results = latest = {}
        last_eval: dict[str, float] = {}
        if not ranks.main:
            pass  # rank 0 evaluates
        elif checkpoint is None:
            console.print(f"evaluating the base model on {', '.join(f'{e.name} ({len(e.problems)} problems)' for e in eval_sets)}, "
                          f"{cfg.eval.n} samples each")
            base_results = latest = run_evals(eval_sets, engine=engine, tokenizer=tokenizer, verifier=verifier, cfg=cfg)
            last_eval = log_evals(0, base_results, tracker, run)
        else:
            base_results, latest, last_eval = evals_from_log(run)
        if critic is not None and cfg.algo.critic.pretrain_steps > 0 and checkpoint is None and parent is None:
            tracker.log(0, pretrain_critic(cfg, critic, critic_optimizer, critic_scheduler, train_stream=train_stream,
                                           engine=engine, tokenizer=tokenizer, verifier=verifier, console=console,
                                           ranks=ranks))

        with StepProgress(console, total=cfg.train.steps, completed=start_step - 1) as progress:
            for step in range(start_step, cfg.train.steps + 1):
                t0 = time.time()
                # ---- 1-3. problems -> rollout -> reward (+ shaping) -> group filter, refilled ----------
                got = collect_rollouts(cfg, step, train_stream=train_stream, engine=engine, tokenizer=tokenizer,
                                       verifier=verifier, ranks=ranks)
                t_rollout, t_reward = t0 + got.rollout_seconds, t0 + got.rollout_seconds + got.reward_seconds
                if not got.problems:  # every group was filtered out and on_exhausted=train_smaller: nothing to learn from
                    console.print(f"[yellow]warning:[/yellow] step {step}: dynamic sampling kept no group; update skipped")
                    tracker.log(step, got.metrics)
                    # the weights did not move, but a due evaluation and checkpoint still happen: on the last
                    # step they are the run's final scores and the checkpoint a finished run continues from
                    latest, last_eval = evaluate_if_due(step, latest, last_eval)
                    save_if_due(step)
                    progress.advance_empty()
                    continue
                rollout, rewards, correct = got.rollout, got.rewards, got.correct
                engine.sleep()  # rollout.vllm.enable_sleep_mode: its KV cache is freed until the next generate
                # ---- sample filters: masked out of the loss, counted per reason ------------------------
                loss_mask, filter_metrics = filter_samples(cfg, rollout, got.texts, got.results)
                metrics = {**got.metrics, **filter_metrics}
                batch = new_train_batch(rollout, loss_mask, correct)
                rows = rank_rows(len(got.problems), n, ranks)  # this rank's groups (None: all, one process)

                # ---- 4. scoring passes: old logprobs (training model), reference logprobs/entropy ----
                if engine_logprobs_are_old(cfg, model):  # train.old_logprobs: sampled from these float32 weights
                    batch.old_logprobs, rollout_entropy = rollout.logprobs * batch.response_mask, None
                else:
                    batch.old_logprobs, rollout_entropy = scoring_pass(model, batch, cfg, with_entropy=True, rows=rows)
                if ref_model is not None:
                    batch.ref_logprobs, batch.ref_entropy = scoring_pass(ref_model, batch, cfg, with_entropy=True, rows=rows)
                    metrics["actor/ref_kl"] = float(masked_mean(batch.old_logprobs - batch.ref_logprobs, batch.loss_mask))
                    metrics["actor/ref_entropy"] = float(masked_mean(batch.ref_entropy, batch.loss_mask))

                # ---- 5. coefficients, KL reward penalty, advantages ---------------------------------
                mean_entropy = float(masked_mean(rollout_entropy, batch.loss_mask)) if rollout_entropy is not None else None
                coefs = {"entropy": controllers["entropy"].update(mean_entropy)}
                coefs["kl"] = (controllers["kl"].update(metrics["actor/ref_kl"], n_steps=len(batch))
                               if cfg.algo.kl.use != "none" else 0.0)
                kl_rewards = torch.zeros_like(batch.response_mask)  # [N, T]
                if cfg.algo.kl.use == "reward":
                    kl_tok = kl_penalty(batch.old_logprobs, batch.ref_logprobs, estimator=cfg.algo.kl.estimator)
                    kl_rewards = apply_kl_reward_penalty(torch.zeros_like(kl_tok), kl_tok, batch.loss_mask, coef=coefs["kl"])
                    metrics["reward/kl_penalty"] = float(-kl_rewards.sum(-1).mean())
                if critic is not None:  # PPO: token-level GAE from the critic's values, KL penalty per token
                    batch.old_values = value_pass(critic, batch, cfg, rows=rows)
                    token_rewards = outcome_token_rewards(rewards, batch.response_mask) + kl_rewards
                    batch.advantages, batch.returns, metrics["actor/gae_lambda"] = gae_targets(cfg, batch, token_rewards)
                else:
                    batch.advantages = critic_free_advantages(cfg, batch, rewards, kl_rewards, num_groups=len(got.problems))

                # ---- 6. updates: mini-batches x epochs ---------------------------------------------
                metrics.update(update_policy(model, optimizer, scheduler, batch, cfg, step=step, coefs=coefs, ptx=ptx,
                                             rows=rows))
                if critic is not None:
                    metrics.update(update_critic(critic, critic_optimizer, critic_scheduler, batch, cfg, step=step,
                                                 rows=rows))
                if metrics["perf/skipped_updates"] > 0:
                    skipped_total += int(metrics["perf/skipped_updates"])
                    skipped_in_a_row += 1
                    console.print(f"[yellow]warning:[/yellow] step {step}: {int(metrics['perf/skipped_updates'])} optimizer "
                                  "step(s) skipped: non-finite loss or gradient")
                else:
                    skipped_in_a_row = 0
                metrics["perf/skipped_steps"] = float(skipped_total)
                metrics["actor/entropy_coef"] = coefs["entropy"]
                if mean_entropy is not None:
                    metrics["actor/rollout_entropy"] = mean_entropy
                if cfg.algo.kl.use != "none":
                    metrics["actor/kl_coef"] = coefs["kl"]
                t_train = time.time()
                # ---- sync: the engine samples the updated policy from the next generate on (in memory) --
                engine.update_weights(model.state_dict().items())
                metrics["perf/weight_sync_seconds"] = time.time() - t_train

                # ---- 7. metrics, logs, evaluation, checkpoint ----------------------------------------
                metrics.update(batch_metrics(got, batch, n=n, prompts_too_long=train_stream.encoder.dropped,
                                             reflection_words=cfg.log.reflection_words))
                metrics["data/unencodable_chars"] = float(train_stream.encoder.unencodable)  # prompt chars lost by the tokenizer
                metrics.update({
                    "perf/rollout_seconds": t_rollout - t0,
                    "perf/reward_seconds": t_reward - t_rollout,
                    "perf/train_seconds": t_train - t_reward,
                    "perf/step_seconds": time.time() - t0,
                    "perf/rollout_tokens_per_second": float(rollout.response_lengths.float().sum()) / max(t_rollout - t0, 1e-9),
                    "perf/peak_memory_gb": peak_memory_gb(ranks),
                })
                tracker.log(step, metrics)
                if ranks.main:
                    run.append_rollouts(rollout_records(step, got.problems, got.prompts_text, got.texts, got.results, rollout,
                                                        tokenizer, n, cfg.log.rollouts_per_step))
                latest, last_eval = evaluate_if_due(step, latest, last_eval)
                collapse.check(step, metrics, console)
                save_if_due(step)
                if skipped_in_a_row >= cfg.train.max_skipped_steps:
                    last = latest_checkpoint(run.checkpoints)
                    where = f"the last good checkpoint is {last}" if last else "no checkpoint had been written yet"
                    raise NonFiniteError(f"{skipped_in_a_row} consecutive steps had a non-finite loss or gradient; "
                                         f"stopping ({where})")
                progress.advance(metrics, last_eval)

    # ---- the final model and the summary ----------------------------------------------------------
    held.close_engine()
    console.print("saving the final model")
    save_hf_model(model, tokenizer, run.final, ranks=ranks)  # a plain Hugging Face directory at any world size
    if critic is not None:
        save_hf_model(critic, None, run.final / "critic", ranks=ranks)
    held.close()
    wall = time.time() - t_start
    if not ranks.main:
        return TrainResult(run_dir=run.path, base={}, final={}, wall_seconds=wall)
    (run.final / "trainer_state.json").write_text(json.dumps({"step": cfg.train.steps, **trainer_state()}, indent=2))
    run.write_summary({
        "wall_seconds": wall,
        "steps": cfg.train.steps,
        "base": {k: {"pass@1": v.pass_at_1, "pass@k": v.pass_at_k, "maj@n": v.maj_at_n} for k, v in base_results.items()},
        "final": {k: {"pass@1": v.pass_at_1, "pass@k": v.pass_at_k, "maj@n": v.maj_at_n} for k, v in latest.items()},
    })
    console.print(summary_table(base_results, latest, wall_seconds=wall, n=cfg.eval.n))
    console.print(f"[bold]run directory[/bold] {run.path}")
    return TrainResult(run_dir=run.path, base=base_results, final=latest, wall_seconds=wall)


# ------------------------------------------------------------------------------------------------
# the pieces train() calls, in the order it calls them
# ------------------------------------------------------------------------------------------------
def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % 2**32)
    except ImportError:  # pragma: no cover
        pass


def shard(model, cfg: Config, ranks: Ranks):
    """FSDP2-shard `model` over the ranks (train.dist.*); the model itself in one process."""
    if not ranks.distributed:
        return model
    return shard_model(model, ranks, mixed_precision=cfg.train.dist.mixed_precision, cpu_offload=cfg.train.dist.cpu_offload)


class SilentTracker:
    """The tracker of ranks other than 0: they log nothing."""

    def log(self, step: int, metrics: dict[str, float]) -> None:
        pass

    def close(self) -> None:
        pass


def peak_memory_gb(ranks: Ranks) -> float:
    """Peak memory of this process so far: CUDA memory allocated on its GPU under torchrun with NCCL,
    else its peak resident set size."""
    if ranks.device.type == "cuda":
        return torch.cuda.max_memory_allocated(ranks.device) / 2**30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB


def build_optimizer(params, cfg: Config, *, lr: float):
    """AdamW (train.betas, train.weight_decay) with a linear warm-up over train.warmup_steps optimizer steps."""
    optimizer = torch.optim.AdamW(params, lr=lr, betas=tuple(cfg.train.betas), weight_decay=cfg.train.weight_decay)
    warmup = max(1, cfg.train.warmup_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup))
    return optimizer, scheduler


def build_controllers(cfg: Config) -> dict[str, CoefController]:
    """The entropy and KL coefficient controllers (their state goes into checkpoints)."""
    ent = cfg.algo.entropy
    if ent.mode == "adaptive":
        entropy = AdaptiveEntropyController(ent.coef, ent.target, kp=ent.kp, min_coef=ent.min_coef, max_coef=ent.max_coef)
    elif ent.mode == "skywork":
        entropy = SkyworkEntropyController(ent.coef, ent.target, step=ent.step, min_coef=ent.min_coef, max_coef=ent.max_coef)
    else:
        entropy = FixedCoef(ent.coef if ent.mode == "fixed" else 0.0)
    kl = cfg.algo.kl
    if kl.use != "none" and kl.target is not None:
        kl_ctl: CoefController = AdaptiveKLController(kl.coef, kl.target, kl.horizon)
    else:
        kl_ctl = FixedCoef(kl.coef if kl.use != "none" else 0.0)
    return {"entropy": entropy, "kl": kl_ctl}


def critic_path(cfg: Config, *, checkpoint: Path | None, parent: Path | None, model_path: str) -> Path | str:
    """Where the critic comes from: the checkpoint's critic/ (resume), the parent's (init_from), else
    algo.critic.path, else a fresh value head on the policy (a GRPO parent continued with PPO included)."""
    origin = checkpoint or parent
    saved = origin / "critic" if origin is not None and (origin / "critic").is_dir() else None
    if checkpoint is not None and saved is None:
        raise ValueError(f"checkpoint {checkpoint} has no critic/: its run did not use algo.adv.estimator=gae; "
                         "start a new run (--no-resume, or train.init_from to continue its policy with PPO)")
    return saved or cfg.algo.critic.path or parent or model_path


def critic_free_advantages(cfg: Config, batch: TrainBatch, rewards: torch.Tensor, kl_rewards: torch.Tensor, *,
                           num_groups: int) -> torch.Tensor:
    """[N, T] advantages of the critic-free estimators (algo.adv.estimator), 0 outside batch.loss_mask.

    grpo / rloo: one advantage per response from the group's rewards (the sequence reward minus coef x
    its summed KL when algo.kl.use=reward), broadcast to its tokens.
    reinforce_pp: per-token returns (the sequence reward minus the KL penalty still to go) whitened
    over all the batch's counted tokens (`algo.advantages.reinforce_pp_advantages`).
    """
    adv = cfg.algo.adv
    if adv.estimator == "reinforce_pp":
        return reinforce_pp_advantages(rewards, batch.response_mask, kl_rewards=kl_rewards, loss_mask=batch.loss_mask)
    shaped = rewards + kl_rewards.sum(-1)  # [N]
    group_ids = torch.arange(num_groups).repeat_interleave(cfg.rollout.n)  # [N]
    if adv.estimator == "grpo":
        seq = group_advantages(shaped, group_ids, std_normalize=adv.std_normalize, std_scope=adv.std_scope)
    else:
        seq = rloo_advantages(shaped, group_ids)
    return expand_to_tokens(seq, batch.loss_mask)


def batch_metrics(got, batch: TrainBatch, *, n: int, prompts_too_long: int,
                  reflection_words: Sequence[str] = ()) -> dict[str, float]:
    """reward/*, rollout/* and data/* metrics of the step's kept samples."""
    rollout, results, correct = got.rollout, got.results, got.correct
    lengths = rollout.response_lengths.float()
    per_group = correct.view(len(got.problems), n)
    group_max, group_min = per_group.max(1).values, per_group.min(1).values
    reflections = reflection_stats(got.texts, reflection_words)
    return {
        "rollout/response_length_group_std": float(lengths.view(len(got.problems), n).std(1, unbiased=False).mean()),
        "rollout/reflection_rate": reflections["reflection_rate"],
        "rollout/reflections_per_response": reflections["reflections_per_response"],
        "reward/mean": float(got.rewards.mean()),
        "reward/accuracy": float(correct.mean()),
        "reward/no_answer_rate": sum(r.reason == "no_answer" for r in results) / len(results),
        "reward/timeout_rate": sum(r.reason == "timeout" for r in results) / len(results),
        "reward/error_rate": sum(r.reason == "error" for r in results) / len(results),
        "rollout/response_length": float(lengths.mean()),
        "rollout/response_length_max": float(lengths.max()),
        "rollout/truncated_frac": float(rollout.truncated.float().mean()),
        "data/prompts_too_long": float(prompts_too_long),
        "rollout/all_correct_groups": float((group_min == group_max).logical_and(group_max > 0).float().mean()),
        "rollout/all_wrong_groups": float((group_max <= 0).float().mean()),
        "rollout/logprob_mismatch": float(masked_mean((rollout.logprobs - batch.old_logprobs).abs(), rollout.response_mask)),
    }


def run_evals(eval_sets: list[EvalSet], *, engine, tokenizer, verifier, cfg: Config) -> dict[str, EvalResult]:
    return {
        es.name: evaluate(
            es.name, es.problems, es.prompt_ids, engine=engine, tokenizer=tokenizer, verifier=verifier,
            n=cfg.eval.n, max_new_tokens=cfg.eval_max_new_tokens, temperature=cfg.eval.temperature,
            top_p=cfg.eval.top_p, seed=cfg.eval.seed, reflection_words=cfg.log.reflection_words,
        )
        for es in eval_sets
    }


def log_evals(step: int, results: dict[str, EvalResult], tracker: Tracker, run: RunDir) -> dict[str, float]:
    metrics = {}
    for name, r in results.items():
        metrics.update(r.metrics(f"eval/{name}"))
    tracker.log(step, metrics)
    run.append_evals(step, results)
    return metrics


def eval_due(cfg: Config, step: int) -> bool:
    """Whether step `step` ends with an evaluation: every eval.every steps and after the last."""
    return step % cfg.eval.every == 0 or step == cfg.train.steps


def save_due(cfg: Config, step: int) -> bool:
    """Whether step `step` ends with a checkpoint: every train.save_every steps and after the last (0: never)."""
    return bool(cfg.train.save_every) and (step % cfg.train.save_every == 0 or step == cfg.train.steps)


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
