"""One RL step, top to bottom: collect -> score -> advantages -> update -> sync -> log.

    trainer = build_trainer(cfg, ranks, console=console)      # train/trainer.py
    with trainer.verifier:
        metrics = rl_step(trainer, step)

`collect` (problems -> rollout -> reward -> group filter, refilled) is a call of its own whose result
`rl_step` consumes: a caller that generated the batch elsewhere (ahead of time, in other processes:
train/generator.py) hands it in as `collected` and the rest of the step is unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from mathrl.algo.estimators import AdvantageInputs
from mathrl.algo.groups import group_stats
from mathrl.algo.kl import apply_kl_reward_penalty, kl_penalty
from mathrl.algo.losses import masked_mean
from mathrl.algo.positions import position_means
from mathrl.algo.rollout_correction import correction_weights
from mathrl.registry import ADVANTAGE_ESTIMATORS
from mathrl.reward.reflection import reflection_stats
from mathrl.train.batching import TrainBatch
from mathrl.train.collect import Collected, collect_rollouts, filter_samples, new_train_batch, rank_rows, rollout_records
from mathrl.train.critic import update_critic, value_pass
from mathrl.train.dist import Ranks
from mathrl.train.generator import push_weights
from mathrl.train.trainer import Trainer
from mathrl.train.update import engine_logprobs_are_old, scoring_pass, update_policy


def rl_step(trainer: Trainer, step: int, collected: Collected | None = None) -> dict[str, float]:
    """Train on one rollout batch (generated here unless `collected` is given); returns the step's
    metrics, already logged. A step whose every group was filtered out trains nothing and returns
    the collection's metrics (filter/kept_groups is 0)."""
    cfg, t0 = trainer.cfg, time.time()

    # ---- collect: problems -> rollout -> reward (+ shaping) -> group filter, refilled -------------
    got = collected if collected is not None else collect(trainer, step)
    if not got.problems:  # every group was filtered out and on_exhausted=train_smaller: nothing to learn from
        m = got.metrics
        why = ", ".join(f"{int(m[f'filter/dropped_{k}'])} {k.replace('_', ' ')}" for k in ("all_wrong", "all_correct", "out_of_band")
                        if m[f"filter/dropped_{k}"])
        trainer.console.print(f"[yellow]warning:[/yellow] step {step}: dynamic sampling kept no group ({why}); update skipped")
        if cfg.generator_workers:  # version `step` is the unchanged weights: the generators count versions by sends
            push_weights(trainer, step)
        trainer.tracker.log(step, got.metrics)
        return got.metrics
    trainer.engine.sleep()  # rollout.vllm.enable_sleep_mode: its KV cache is freed until the next generate
    loss_mask, filter_metrics = filter_samples(cfg, got.rollout, got.texts, got.results, got.void)  # masked out, counted per reason
    metrics = {**got.metrics, **filter_metrics}
    batch = new_train_batch(got.rollout, loss_mask, got.correct)
    rows = rank_rows(len(got.problems), cfg.rollout.n, trainer.ranks)  # this rank's groups (None: all, one process)

    # ---- score: old logprobs (training model), reference logprobs and entropy ---------------------
    rollout_entropy = score(trainer, batch, got, rows=rows, metrics=metrics)
    if got.versions is not None:  # sampled by a generator process: how old its policy was
        metrics.update(staleness_metrics(step, got.versions, got.rollout.logprobs, batch.old_logprobs, batch.loss_mask))

    # ---- advantages: coefficients, KL reward penalty, the estimator -------------------------------
    coefs, mean_entropy = step_coefs(trainer, batch, rollout_entropy, metrics)
    advantages(trainer, batch, got, coefs=coefs, rows=rows, metrics=metrics)
    if trainer.critic is not None and trainer.ranks.main:  # the critic read by position (VC-PPO's figures)
        trainer.run.append_positions(value_advantage_positions(step, batch))

    # ---- update: mini-batches x epochs of the policy (and the critic) -----------------------------
    update(trainer, batch, step, coefs=coefs, mean_entropy=mean_entropy, rows=rows, metrics=metrics)

    # ---- sync: the engine (and the generators) sample the updated policy from now on (in memory) ---
    t_train = time.time()
    trainer.engine.update_weights(trainer.engine_weights())
    sent = push_weights(trainer, step) if cfg.generator_workers else {}  # train/generator.py, async
    metrics["perf/weight_sync_seconds"] = time.time() - t_train
    if sent:
        metrics["perf/weight_sync_bytes"] = sent["perf/weight_sync_bytes"]

    # ---- log ---------------------------------------------------------------------------------------
    log_step(trainer, step, got, batch, metrics, t0=t0, t_train=t_train)
    return metrics


def staleness_metrics(step: int, versions: torch.Tensor, behaviour_logprobs: torch.Tensor, old_logprobs: torch.Tensor,
                      loss_mask: torch.Tensor) -> dict[str, float]:
    """How far the behaviour policy (the generator's) was from the trainer's at step `step` (from 1, the
    trainer holding version step-1).

    versions: [N] long, each sample's policy version; behaviour_logprobs, old_logprobs, loss_mask: [N, T]
    -> rollout/staleness_mean and _max (in versions: (step-1) - version), and rollout/mismatch_kl, the k3
    estimate of KL(behaviour || trainer) over the sampled tokens in the loss (they were drawn from the
    behaviour policy, so k3 is unbiased there; kl_penalty's p is the sampling side)."""
    staleness = (step - 1 - versions).float()  # [N]
    kl = kl_penalty(behaviour_logprobs, old_logprobs, estimator="k3", clamp=None)  # [N, T]
    return {"rollout/staleness_mean": float(staleness.mean()), "rollout/staleness_max": float(staleness.max()),
            "rollout/mismatch_kl": float(masked_mean(kl, loss_mask))}


def collect(trainer: Trainer, step: int) -> Collected:
    """The step's kept groups, generated with the engine's current weights (train/collect.py)."""
    return collect_rollouts(trainer.cfg, step, train_stream=trainer.train_stream, engine=trainer.engine,
                            tokenizer=trainer.tokenizer, verifier=trainer.verifier, ranks=trainer.ranks)


def score(trainer: Trainer, batch: TrainBatch, got: Collected, *, rows, metrics: dict) -> torch.Tensor | None:
    """Fill batch.old_logprobs (and the reference's logprobs and entropy when a term needs them);
    returns the old policy's entropy [N, T] when a scoring pass computed it."""
    cfg = trainer.cfg
    if engine_logprobs_are_old(cfg, trainer.model):  # train.old_logprobs: sampled from these float32 weights
        batch.old_logprobs, rollout_entropy = got.rollout.logprobs * batch.response_mask, None
    else:
        batch.old_logprobs, rollout_entropy = scoring_pass(trainer.model, batch, cfg, with_entropy=True, rows=rows)
    if cfg.needs_reference:  # the loaded reference copy, or the LoRA policy with its adapters disabled
        with trainer.reference() as ref_model:
            batch.ref_logprobs, batch.ref_entropy = scoring_pass(ref_model, batch, cfg, with_entropy=True, rows=rows)
        metrics["actor/ref_kl"] = float(masked_mean(batch.old_logprobs - batch.ref_logprobs, batch.loss_mask))
        metrics["actor/ref_entropy"] = float(masked_mean(batch.ref_entropy, batch.loss_mask))
    importance_weights(cfg, batch, metrics)
    return rollout_entropy


def importance_weights(cfg, batch: TrainBatch, metrics: dict) -> None:
    """Set batch.is_weights, the policy-gradient term's weights between the trainer's old logprobs and
    the sampling ones (Config.correction: algo.off_policy or algo.rollout_correction); with rejected=drop
    the rejected tokens leave the loss mask, and so the normalisers."""
    c = cfg.correction()
    if c is None:
        return
    batch.is_weights, rejected = correction_weights(batch.old_logprobs, batch.rollout_logprobs, batch.response_mask,
                                                    mode=c.mode, level=c.level, cap=c.cap, lower=c.lower)
    metrics["actor/rollout_is_weight"] = float(masked_mean(batch.is_weights, batch.loss_mask))
    metrics["actor/rollout_is_over_cap"] = float(masked_mean(rejected, batch.loss_mask))
    if c.rejected == "drop":
        batch.loss_mask = batch.loss_mask * (1.0 - rejected)


def step_coefs(trainer: Trainer, batch: TrainBatch, rollout_entropy: torch.Tensor | None,
               metrics: dict) -> tuple[dict[str, float], float | None]:
    """This step's entropy and KL coefficients from their controllers, and the old policy's mean entropy."""
    cfg = trainer.cfg
    mean_entropy = float(masked_mean(rollout_entropy, batch.loss_mask)) if rollout_entropy is not None else None
    coefs = {"entropy": trainer.controllers["entropy"].update(mean_entropy)}
    coefs["kl"] = (trainer.controllers["kl"].update(metrics["actor/ref_kl"], n_steps=len(batch))
                   if cfg.algo.kl.use != "none" else 0.0)
    return coefs, mean_entropy


def advantages(trainer: Trainer, batch: TrainBatch, got: Collected, *, coefs: dict[str, float], rows,
               metrics: dict) -> None:
    """Fill batch.advantages with algo.adv.estimator's (and, with a critic, batch.old_values and batch.returns)."""
    cfg = trainer.cfg
    kl_rewards = torch.zeros_like(batch.response_mask)  # [N, T]
    if cfg.algo.kl.use == "reward":
        kl_tok = kl_penalty(batch.old_logprobs, batch.ref_logprobs, estimator=cfg.algo.kl.estimator)
        kl_rewards = apply_kl_reward_penalty(torch.zeros_like(kl_tok), kl_tok, batch.loss_mask, coef=coefs["kl"])
        metrics["reward/kl_penalty"] = float(-kl_rewards.sum(-1).mean())
    if trainer.critic is not None:  # the values the critic gave the sampled responses
        batch.old_values = value_pass(trainer.critic, batch, cfg, rows=rows)
    group_ids = torch.arange(len(got.problems)).repeat_interleave(cfg.rollout.n)  # [N]
    inputs = AdvantageInputs(rewards=got.rewards, response_mask=batch.response_mask, loss_mask=batch.loss_mask,
                             kl_rewards=kl_rewards, group_ids=group_ids,
                             values=batch.old_values if trainer.critic is not None else None)
    out = ADVANTAGE_ESTIMATORS.get(cfg.algo.adv.estimator).fn(inputs, cfg)
    batch.advantages = out.advantages
    if out.returns is not None:
        batch.returns = out.returns
    metrics.update(out.metrics)


def value_advantage_positions(step: int, batch: TrainBatch) -> dict:
    """positions.jsonl's row: the critic's mean value and the mean advantage at each response position."""
    values, counts = position_means(batch.old_values, batch.loss_mask)
    adv, _ = position_means(batch.advantages, batch.loss_mask)
    return {"step": step, "value": [round(v, 6) for v in values.tolist()],
            "advantage": [round(a, 6) for a in adv.tolist()], "count": counts.tolist()}


def update(trainer: Trainer, batch: TrainBatch, step: int, *, coefs: dict[str, float], mean_entropy: float | None,
           rows, metrics: dict) -> None:
    """The policy (and critic) updates on the batch; counts the optimizer steps skipped for a non-finite value."""
    cfg, t = trainer.cfg, trainer
    metrics.update(update_policy(t.model, t.optimizer, t.scheduler, batch, cfg, step=step, coefs=coefs, ptx=t.ptx, rows=rows))
    if t.critic is not None:
        metrics.update(update_critic(t.critic, t.critic_optimizer, t.critic_scheduler, batch, cfg, step=step, rows=rows))
    t.skips.record(step, int(metrics["perf/skipped_updates"]), t.console)
    metrics["perf/skipped_steps"] = float(t.skips.total)
    metrics["actor/entropy_coef"] = coefs["entropy"]
    if mean_entropy is not None:
        metrics["actor/rollout_entropy"] = mean_entropy
    if cfg.algo.kl.use != "none":
        metrics["actor/kl_coef"] = coefs["kl"]


def log_step(trainer: Trainer, step: int, got: Collected, batch: TrainBatch, metrics: dict, *, t0: float,
             t_train: float) -> None:
    """Add the batch's reward/rollout/data metrics and the timings, log them, and write the sample rollouts."""
    cfg, stream, rollout = trainer.cfg, trainer.train_stream, got.rollout
    metrics.update(batch_metrics(got, batch, n=cfg.rollout.n, prompts_too_long=stream.encoder.dropped,
                                 reflection_words=cfg.log.reflection_words))
    metrics["data/unencodable_chars"] = float(stream.encoder.unencodable)  # prompt chars lost by the tokenizer
    t_rollout = t0 + got.rollout_seconds
    t_reward = t_rollout + got.reward_seconds
    if got.versions is not None:  # generated in another process, before t0: the trainer's own time starts at t0
        t_reward = t0
    metrics.update({
        "perf/rollout_seconds": got.rollout_seconds,
        "perf/reward_seconds": got.reward_seconds,
        "perf/train_seconds": t_train - t_reward,
        "perf/step_seconds": time.time() - t0,
        "perf/rollout_tokens_per_second": float(rollout.response_lengths.float().sum()) / max(t_rollout - t0, 1e-9),
        "perf/peak_memory_gb": peak_memory_gb(trainer.ranks),
        "perf/world_size": float(trainer.ranks.world_size),
    })
    trainer.tracker.log(step, metrics)
    if trainer.ranks.main:
        trainer.run.append_rollouts(rollout_records(step, got.problems, got.prompts_text, got.texts, got.results,
                                                    rollout, trainer.tokenizer, cfg.rollout.n, cfg.log.rollouts_per_step,
                                                    scores=got.scores if getattr(trainer.verifier, "logs_components", False) else None))


def batch_metrics(got, batch: TrainBatch, *, n: int, prompts_too_long: int,
                  reflection_words: Sequence[str] = ()) -> dict[str, float]:
    """reward/*, rollout/* and data/* metrics of the step's kept samples."""
    rollout, results, correct = got.rollout, got.results, got.correct
    lengths = rollout.response_lengths.float()
    groups = group_stats(correct, torch.arange(len(got.problems)).repeat_interleave(n))  # the step's G groups of n
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
        "rollout/all_correct_groups": float((groups.min == groups.max).logical_and(groups.max > 0).float().mean()),
        "rollout/all_wrong_groups": float((groups.max <= 0).float().mean()),
        "rollout/logprob_mismatch": float(masked_mean((rollout.logprobs - batch.old_logprobs).abs(), rollout.response_mask)),
    }


def peak_memory_gb(ranks: Ranks) -> float:
    """Peak memory of this process so far: CUDA memory allocated on its GPU when it trains on one
    (train.device), else its peak resident set size."""
    if ranks.device.type == "cuda":
        return torch.cuda.max_memory_allocated(ranks.device) / 2**30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB
