"""One RL step, top to bottom: collect -> score -> advantages -> update -> sync -> log.

    trainer = build_trainer(cfg, ranks, console=console)      # train/trainer.py
    with trainer.rewarder:
        result = rl_step(trainer, step)                       # result.trained, .groups, .collapse; .metrics logged

`collect` (problems -> rollout -> reward -> group filter, refilled) is a call of its own whose result
`rl_step` consumes: a caller that generated the batch elsewhere (ahead of time, in other processes:
train/generators/host.py) hands it in as `collected` and the rest of the step is unchanged.

Each stage hands the next a typed value (`Prepared`, `Scored`, `Advantages`, then the `TrainBatch`
the updates read, and the updates' `Updated`) and returns its own metrics; `rl_step` merges them once
into the step's log line, which nothing reads back (the skipped-update count is `Updated.skipped`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from mathrl.algo.estimators import AdvantageInputs, Advantages
from mathrl.algo.groups import group_stats
from mathrl.algo.kl import apply_kl_reward_penalty, kl_penalty
from mathrl.algo.losses import masked_mean
from mathrl.algo.policy_losses import top_entropy_mask
from mathrl.algo.positions import position_means
from mathrl.algo.rollout_correction import Corrected, advantage_rejection, rollout_correction
from mathrl.registry import ADVANTAGE_ESTIMATORS
from mathrl.reward.functions import Scores
from mathrl.reward.reflection import reflection_stats
from mathrl.rollout.engine import RolloutBatch
from mathrl.train.batching import TrainBatch
from mathrl.train.collect import CollapseRates, Collected, Prepared, collect_rollouts, prepare
from mathrl.train.critic import update_critic, value_pass
from mathrl.train.dist import Ranks
from mathrl.train.monitors import GroupOutcomes
from mathrl.train.passes import engine_logprobs_are_old, scoring_pass, sum_pi_squared_pass
from mathrl.train.teacher import TeacherScores, teacher_prompts, teacher_scores
from mathrl.train.trainer import Trainer
from mathrl.train.update import update_policy


@dataclass
class StepResult:
    """What the run needs of one step (train/loop.py); `metrics` is the step's log line, already logged."""

    trained: bool  # False: every group was filtered out and the weights did not move
    groups: GroupOutcomes  # how the step's groups turned out (train/monitors.py:SignalWatch)
    collapse: CollapseRates | None  # the kept samples' collapse rates; None when nothing was trained
    metrics: dict[str, float]


@dataclass
class Scored:
    """The scoring passes' results over the step's N rows, and the importance weights that follow."""

    old_logprobs: torch.Tensor  # [N, T] the old policy's (the trainer's, or the engine's standing in for them)
    entropy: torch.Tensor | None  # [N, T] the old policy's entropy; None when no scoring pass ran
    ref_logprobs: torch.Tensor | None  # [N, T] the reference's; None when no term needs the reference
    ref_entropy: torch.Tensor | None  # [N, T]
    ref_kl: float | None  # mean (old - reference) logprob over the loss mask's tokens: the KL controller's input
    is_weights: torch.Tensor | None  # [N, T] the policy-gradient term's importance weights; None: no correction
    loss_mask: torch.Tensor  # [N, T] the sample filters' mask, less the tokens the correction drops
    mean_entropy: float | None  # the old policy's entropy over loss_mask (the entropy controller's input); None: no pass
    metrics: dict[str, float]  # actor/ref_*, the correction's and the rejection rules' (rollout_corr/*, actor/rollout_is_*)
    correction: torch.Tensor | None = None  # [N, T] is_weights before the 80/20 token mask: the importance weights alone
    teacher: TeacherScores | None = None  # the distillation teacher's (algo.distill.mode), None when it is off


def rl_step(trainer: Trainer, step: int, collected: Collected | None = None) -> StepResult:
    """Train on one rollout batch (generated here unless `collected` is given); returns what the run
    needs to know of the step, its metrics already logged. A step whose every group was filtered out
    trains nothing (`StepResult.trained` False) and logs the collection's metrics."""
    cfg, t0 = trainer.cfg, time.time()

    # ---- collect: problems -> rollout -> reward (+ shaping) -> group filter, refilled -------------
    got = collected if collected is not None else collect(trainer, step)
    if not got.problems:  # every group was filtered out and on_exhausted=train_smaller: nothing to learn from
        return skip(trainer, step, got)
    trainer.engine.sleep()  # rollout.vllm.enable_sleep_mode: its KV cache is freed until the next generate
    prep = prepare(cfg, got, trainer.ranks)  # sample filters (loss mask), the rows the passes read, this rank's rows

    # ---- score: old logprobs (training model), reference logprobs and entropy ---------------------
    scored = score(trainer, got, prep)
    staleness = {}
    if got.versions is not None:  # sampled by a generator process: how old its policy was
        staleness = staleness_metrics(step, got.versions, prep.batch.rollout_logprobs, scored.old_logprobs,
                                      scored.loss_mask)

    # ---- advantages: coefficients, KL reward penalty, the estimator -------------------------------
    coefs = step_coefs(trainer, scored, rows=len(prep.batch))
    adv = advantages(trainer, got, prep, scored, coefs=coefs)
    masked = advantage_masks(cfg, scored, adv, prep)  # opsm: it reads the advantages
    scored = replace(scored, is_weights=masked.weights, loss_mask=masked.loss_mask)
    batch = train_batch(prep, scored, adv)
    if trainer.critic is not None and trainer.ranks.main:  # the critic read by position (VC-PPO's figures)
        trainer.run.append_positions(value_advantage_positions(step, batch))

    # ---- update: mini-batches x epochs of the policy (and the critic) -----------------------------
    update_metrics = update(trainer, batch, step, coefs=coefs, mean_entropy=scored.mean_entropy, rows=prep.rows)

    # ---- sync: the engine (and the generators) sample the updated policy from now on (in memory) ---
    t_train = time.time()
    sent = trainer.sync_weights(step)  # the engine's update, and the send to generator processes (async)
    sync = {"perf/weight_sync_seconds": time.time() - t_train}  # the engine's update and the send together
    if sent:
        sync["perf/weight_sync_bytes"] = sent["perf/weight_sync_bytes"]

    # ---- log: the stages' metrics, merged once ------------------------------------------------------
    metrics = {**got.metrics, **prep.checks.metrics, **scored.metrics, **staleness, **adv.metrics, **masked.metrics,
               **update_metrics, **sync}
    metrics = {**metrics, **log_step(trainer, step, got, batch, metrics, t0=t0, t_train=t_train)}
    return StepResult(trained=True, groups=group_outcomes(got, cfg.rollout.n), collapse=prep.checks.collapse,
                      metrics=metrics)


def skip(trainer: Trainer, step: int, got: Collected) -> StepResult:
    """A step that kept no group: say why, keep the generators' version count, log the collection."""
    d = got.drops
    why = ", ".join(f"{count} {reason}" for reason, count in (("all wrong", d.all_wrong), ("all correct", d.all_correct),
                                                              ("out of band", d.out_of_band)) if count)
    trainer.console.print(f"[yellow]warning:[/yellow] step {step}: dynamic sampling kept no group ({why}); update skipped")
    trainer.sync_weights(step, updated=False)  # version `step` is the unchanged weights: the generators count sends
    trainer.tracker.log(step, got.metrics)
    if trainer.ranks.main and got.dropped is not None:  # what was sampled and dropped: the samples to read when no group is kept
        d = got.dropped
        trainer.run.append_rollouts(rollout_records(step, d.problems, d.prompts_text, d.texts, d.results, d.rollout,
                                                    trainer.tokenizer, trainer.cfg.rollout.n, trainer.cfg.log.rollouts_per_step,
                                                    scores=d.scores if trainer.rewarder.logs_components else None,
                                                    dropped=True))
    return StepResult(trained=False, groups=GroupOutcomes(kept=0, kept_all_wrong=0, kept_all_correct=0, dropped=got.drops),
                      collapse=None, metrics=got.metrics)


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
                            tokenizer=trainer.tokenizer, verifier=trainer.rewarder, ranks=trainer.ranks)


def score(trainer: Trainer, got: Collected, prep: Prepared) -> Scored:
    """The old policy's logprobs (and entropy, when a scoring pass computes them), the reference's
    logprobs and entropy when a term needs them, and the importance weights of the correction."""
    cfg, batch, loss_mask = trainer.cfg, prep.batch, prep.checks.loss_mask
    if cfg.algo.rollout_correction.bypass or engine_logprobs_are_old(cfg, trainer.model):
        # bypass: the PPO ratio is taken against the engine's policy; else train.old_logprobs says these
        # float32 weights sampled, so the engine's logprobs are the trainer's own
        old_logprobs, entropy = batch.rollout_logprobs * batch.response_mask, None
    else:
        old_logprobs, entropy = scoring_pass(trainer.model, batch, cfg, with_entropy=True, rows=prep.rows)
    ref_logprobs = ref_entropy = ref_kl = None
    metrics: dict[str, float] = {}
    if cfg.needs_reference:  # the loaded reference copy, or the LoRA policy with its adapters disabled
        with trainer.reference() as ref_model:
            ref_logprobs, ref_entropy = scoring_pass(ref_model, batch, cfg, with_entropy=True, rows=prep.rows)
        ref_kl = float(masked_mean(old_logprobs - ref_logprobs, loss_mask))
        metrics["actor/ref_kl"] = ref_kl
        metrics["actor/ref_entropy"] = float(masked_mean(ref_entropy, loss_mask))
    corrected = correction(cfg, old_logprobs, batch.rollout_logprobs, batch.response_mask, loss_mask)
    loss_mask, corr_metrics = corrected.loss_mask, corrected.metrics
    is_weights, fork_metrics = forking_tokens(cfg, entropy, loss_mask, corrected.weights)
    teacher = score_teacher(trainer, got, prep) if cfg.needs_teacher else None
    mean_entropy = float(masked_mean(entropy, loss_mask)) if entropy is not None else None
    return Scored(old_logprobs=old_logprobs, entropy=entropy, ref_logprobs=ref_logprobs, ref_entropy=ref_entropy,
                  ref_kl=ref_kl, is_weights=is_weights, loss_mask=loss_mask, mean_entropy=mean_entropy,
                  metrics={**metrics, **corr_metrics, **fork_metrics, **(teacher.metrics if teacher else {})},
                  correction=corrected.weights, teacher=teacher)


def score_teacher(trainer: Trainer, got: Collected, prep: Prepared) -> TeacherScores:
    """The distillation teacher's scores of the step's tokens (train/teacher.py); with teacher.self, from its own
    prompts, teacher.context's question (the answer beside it), which the student never sees."""
    cfg = trainer.cfg
    prompts = None
    if cfg.teacher.self:
        prompts = teacher_prompts(got.problems, n=cfg.rollout.n, encoder=trainer.train_stream.encoder,
                                  tokenizer=trainer.tokenizer, context=cfg.teacher.context)
    with trainer.teacher() as model:
        return teacher_scores(model, prep.batch, cfg, rows=prep.rows, prompts=prompts)


def correction(cfg, old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, response_mask: torch.Tensor,
               loss_mask: torch.Tensor) -> Corrected:
    """The importance weights and the rejections of algo.off_policy / algo.rollout_correction that need no
    advantages (algo/rollout_correction.py:rollout_correction), all [N, T]; none in bypass mode, where the
    loss weighs pi_theta against the engine per micro-batch (`bypass_weights`)."""
    if cfg.algo.rollout_correction.bypass:
        return Corrected(weights=None, loss_mask=loss_mask, metrics={})
    return rollout_correction(old_logprobs, rollout_logprobs, response_mask, loss_mask, **correction_settings(cfg))


def correction_settings(cfg) -> dict:
    """algo.off_policy and algo.rollout_correction as `rollout_correction` takes them: the importance weight
    (Config.correction; none: no mode) and the rejection rules'."""
    c = cfg.correction()
    weight = {} if c is None else {"mode": c.mode, "level": c.level, "cap": c.cap, "lower": c.lower}
    return {**weight, **rejection_settings(cfg.algo.rollout_correction, weighted=c is not None)}


# the setting each rejection rule reads (algo/rollout_correction.py:rule_keeps)
RULE_SETTINGS = {"geo_rs": "geo_rs_bounds", "icepop": "icepop_bounds", "k3_rs": "k3_rs_threshold",
                 "k2_mean_rs": "k2_rs_threshold", "k2_max_rs": "k2_rs_threshold", "opsm": "opsm_delta"}


def rejection_settings(rc, *, weighted: bool = False) -> dict:
    """algo.rollout_correction's rejection rules and the settings of those listed, as `advantage_rejection`
    takes them; `rejected` only where something can reject (a rule, or a weight): a run reads no setting
    that has no effect on it (config/reads.py)."""
    rules = list(rc.masks)
    out: dict = {"rules": rules, **{RULE_SETTINGS[r]: getattr(rc, RULE_SETTINGS[r]) for r in rules}}
    if rules or weighted:
        out["drop"] = rc.rejected == "drop"
    return out


def advantage_masks(cfg, scored: Scored, adv: Advantages, prep: Prepared) -> Corrected:
    """The rejection rules that read the advantages (opsm, DeepSeek-V3.2's off-policy sequence masking),
    applied once they are computed (algo/rollout_correction.py:advantage_rejection) to the scored weights
    and loss mask, with each rule's rejected share (rollout_corr/<rule>_rejected)."""
    return advantage_rejection(scored.old_logprobs, prep.batch.rollout_logprobs, prep.batch.response_mask, adv.advantages,
                               weights=scored.is_weights, loss_mask=scored.loss_mask, filtered=prep.checks.loss_mask,
                               **rejection_settings(cfg.algo.rollout_correction))


def forking_tokens(cfg, entropy: torch.Tensor | None, loss_mask: torch.Tensor,
                   is_weights: torch.Tensor | None) -> tuple[torch.Tensor | None, dict[str, float]]:
    """algo.top_entropy_quantile (80/20 tokens): the policy-gradient weights times 1 on the step's tokens
    whose old-policy entropy is in the top share, 0 elsewhere (kept tokens: actor/top_entropy_frac). The
    share is of the whole step's loss tokens, so it does not depend on the micro-batch or rank split."""
    q = cfg.algo.top_entropy_quantile
    if q is None:
        return is_weights, {}
    if entropy is None:
        raise RuntimeError("algo.top_entropy_quantile needs the scoring pass's entropy; set train.old_logprobs=recompute")
    keep = top_entropy_mask(entropy, loss_mask, quantile=q)  # [N, T]
    metrics = {"actor/top_entropy_frac": float(masked_mean(keep, loss_mask))}
    return (keep if is_weights is None else is_weights * keep), metrics


def step_coefs(trainer: Trainer, scored: Scored, *, rows: int) -> dict[str, float]:
    """This step's entropy and KL coefficients from their controllers (`rows`: the batch's N)."""
    cfg = trainer.cfg
    coefs = {"entropy": trainer.controllers["entropy"].update(scored.mean_entropy)}
    coefs["kl"] = (trainer.controllers["kl"].update(scored.ref_kl, n_steps=rows)
                   if cfg.algo.kl.use != "none" else 0.0)
    return coefs


def advantages(trainer: Trainer, got: Collected, prep: Prepared, scored: Scored, *,
               coefs: dict[str, float]) -> Advantages:
    """algo.adv.estimator's advantages (with a critic, also its value targets and the critic's values [N, T]
    of the sampled responses they came from), with the metrics of both (the KL reward penalty's too)."""
    cfg, response_mask = trainer.cfg, prep.batch.response_mask
    kl_rewards = torch.zeros_like(response_mask)  # [N, T]
    metrics: dict[str, float] = {}
    if cfg.algo.kl.use == "reward":
        kl_tok = kl_penalty(scored.old_logprobs, scored.ref_logprobs, estimator=cfg.algo.kl.estimator)
        kl_rewards = apply_kl_reward_penalty(torch.zeros_like(kl_tok), kl_tok, scored.loss_mask, coef=coefs["kl"])
        metrics["reward/kl_penalty"] = float(-kl_rewards.sum(-1).mean())
    values = value_pass(trainer.critic, prep.batch, cfg, rows=prep.rows) if trainer.critic is not None else None
    group_ids = torch.arange(len(got.problems)).repeat_interleave(cfg.rollout.n)  # [N]
    components = None if got.scores is None else {  # [N] each reward component's raw score (gdpo normalises each)
        name: torch.tensor([0.0 if v is None else v for v in vs], dtype=torch.float32) for name, vs in got.scores.values.items()}
    estimator = ADVANTAGE_ESTIMATORS.get(cfg.algo.adv.estimator)
    stats = {}
    if estimator.needs_policy_stats:  # the optimal token baseline: pi_old's sum_v pi_v^2 per position (one more pass)
        stats = {"old_logprobs": scored.old_logprobs, "is_weights": scored.correction,
                 "sum_pi_squared": sum_pi_squared_pass(trainer.model, prep.batch, cfg, rows=prep.rows)}
    inputs = AdvantageInputs(rewards=got.rewards, response_mask=response_mask, loss_mask=scored.loss_mask,
                             kl_rewards=kl_rewards, group_ids=group_ids, values=values, components=components,
                             component_weights={f.name: f.weight for f in cfg.reward.functions},
                             greedy_rewards=got.greedy_rewards, **stats)
    out = estimator.fn(inputs, cfg.algo)
    if cfg.needs_teacher:  # on-policy distillation: the task's advantage weighs algo.distill.reward_weight
        out = replace(out, advantages=out.advantages * cfg.algo.distill.reward_weight)
    return replace(out, values=values, metrics={**metrics, **out.metrics})


def train_batch(prep: Prepared, scored: Scored, adv: Advantages) -> TrainBatch:
    """The batch the updates read: the prepared rows extended with every per-token value of the step
    (the reference's are zeros when no term needs them), the loss mask less the tokens the corrections drop."""
    zeros = torch.zeros_like(prep.batch.rollout_logprobs)  # [N, T]
    rows = {**prep.batch.tensors(), "loss_mask": scored.loss_mask}
    return TrainBatch(
        **rows, old_logprobs=scored.old_logprobs, advantages=adv.advantages,
        ref_logprobs=scored.ref_logprobs if scored.ref_logprobs is not None else zeros,
        ref_entropy=scored.ref_entropy if scored.ref_entropy is not None else zeros.clone(),
        is_weights=scored.is_weights, old_values=adv.values, returns=adv.returns,
        **({} if scored.teacher is None else {"teacher_logprobs": scored.teacher.logprobs,
                                              "teacher_topk_ids": scored.teacher.topk_ids,
                                              "teacher_topk_logprobs": scored.teacher.topk_logprobs}),
    )


def value_advantage_positions(step: int, batch: TrainBatch) -> dict:
    """positions.jsonl's row: the critic's mean value and the mean advantage at each response position."""
    values, counts = position_means(batch.old_values, batch.loss_mask)
    adv, _ = position_means(batch.advantages, batch.loss_mask)
    return {"step": step, "value": [round(v, 6) for v in values.tolist()],
            "advantage": [round(a, 6) for a in adv.tolist()], "count": counts.tolist()}


def update(trainer: Trainer, batch: TrainBatch, step: int, *, coefs: dict[str, float], mean_entropy: float | None,
           rows) -> dict[str, float]:
    """The policy (and critic) updates on the batch; counts the policy's optimizer steps skipped for a
    non-finite value (the run stops after too many: train/monitors.py). Returns the updates' metrics."""
    cfg, t = trainer.cfg, trainer
    policy = update_policy(t.model, t.optimizer, t.scheduler, batch, cfg, step=step, coefs=coefs, ptx=t.ptx, rows=rows,
                           scaler=t.scaler)
    metrics = dict(policy.metrics)
    if t.critic is not None:
        metrics.update(update_critic(t.critic, t.critic_optimizer, t.critic_scheduler, batch, cfg, step=step, rows=rows,
                                     scaler=t.critic_scaler).metrics)
    t.skips.record(step, policy.skipped, t.console)
    metrics["perf/skipped_steps"] = float(t.skips.total)
    metrics["actor/entropy_coef"] = coefs["entropy"]
    if mean_entropy is not None:
        metrics["actor/rollout_entropy"] = mean_entropy
    if cfg.algo.kl.use != "none":
        metrics["actor/kl_coef"] = coefs["kl"]
    return metrics


def log_step(trainer: Trainer, step: int, got: Collected, batch: TrainBatch, metrics: dict[str, float], *, t0: float,
             t_train: float) -> dict[str, float]:
    """Log `metrics` with the batch's reward/rollout/data metrics and the timings, write the sample rollouts,
    and return what it added to `metrics` (which it leaves as it was)."""
    cfg, stream = trainer.cfg, trainer.train_stream
    added = batch_metrics(got, batch, n=cfg.rollout.n, prompts_too_long=stream.encoder.dropped,
                          reflection_words=cfg.log.reflection_words)
    added["data/unencodable_chars"] = float(stream.encoder.unencodable)  # prompt chars lost by the tokenizer
    t_rollout = t0 + got.rollout_seconds
    t_reward = t_rollout + got.reward_seconds
    if got.versions is not None:  # generated in another process, before t0: the trainer's own time starts at t0
        t_reward = t0
    added.update({
        "perf/rollout_seconds": got.rollout_seconds,
        "perf/reward_seconds": got.reward_seconds,
        "perf/train_seconds": t_train - t_reward,
        "perf/step_seconds": time.time() - t0,
        "perf/rollout_tokens_per_second": float(batch.response_lengths.float().sum()) / max(t_rollout - t0, 1e-9),
        "perf/peak_memory_gb": peak_memory_gb(trainer.ranks),
        "perf/world_size": float(trainer.ranks.world_size),
    })
    trainer.tracker.log(step, {**metrics, **added})
    if trainer.ranks.main:
        trainer.run.append_rollouts(rollout_records(step, got.problems, got.prompts_text, got.texts, got.results,
                                                    batch, trainer.tokenizer, cfg.rollout.n, cfg.log.rollouts_per_step,
                                                    scores=got.scores if trainer.rewarder.logs_components else None))
    return added


def batch_metrics(got, batch: TrainBatch, *, n: int, prompts_too_long: int,
                  reflection_words: Sequence[str] = ()) -> dict[str, float]:
    """reward/*, rollout/* and data/* metrics of the step's kept samples."""
    results, correct = got.results, got.correct
    lengths = batch.response_lengths.float()
    all_correct, all_wrong = uniform_groups(correct, n)  # [G] each, the step's G groups of n
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
        "rollout/truncated_frac": float(batch.truncated.float().mean()),
        "data/prompts_too_long": float(prompts_too_long),
        "rollout/all_correct_groups": float(all_correct.float().mean()),
        "rollout/all_wrong_groups": float(all_wrong.float().mean()),
        "rollout/logprob_mismatch": float(masked_mean((batch.rollout_logprobs - batch.old_logprobs).abs(), batch.response_mask)),
    }


def uniform_groups(correct: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """correct: [N] of G groups of n consecutive samples -> ([G] bool, [G] bool): the groups whose every
    sample is right, and those whose every sample is wrong (no reward signal within the group either way)."""
    groups = group_stats(correct, torch.arange(len(correct) // n).repeat_interleave(n))
    return (groups.min == groups.max).logical_and(groups.max > 0), groups.max <= 0


def group_outcomes(got: Collected, n: int) -> GroupOutcomes:
    """How the step's groups turned out: kept, of them all wrong or all right, and dropped."""
    all_correct, all_wrong = uniform_groups(got.correct, n)
    return GroupOutcomes(kept=len(got.problems), kept_all_wrong=int(all_wrong.sum()), kept_all_correct=int(all_correct.sum()),
                         dropped=got.drops)


def rollout_records(step, problems, prompts_text, texts, results, rollout: RolloutBatch, tokenizer, n: int, limit: int,
                    scores: Scores | None = None, dropped: bool = False):
    """The first `limit` samples of a step, with per-token ids, strings and logprobs, for rollouts.jsonl;
    with `scores`, each sample's component scores too; `dropped`: samples of groups dynamic sampling
    dropped (a step that kept none), marked "dropped": true."""
    records = []
    for i in range(min(limit, len(texts))):
        length = int(rollout.context_mask[i].sum())
        ids = rollout.response_ids[i, :length].tolist()
        records.append({
            "step": step,
            "problem_id": problems[i // n].id,
            "prompt": prompts_text[i // n],
            "response": texts[i],
            "answer": problems[i // n].answer,
            "reward": results[i].score,
            "reason": results[i].reason,
            "extracted": results[i].extracted,
            "token_ids": ids,
            "tokens": tokenizer.convert_ids_to_tokens(ids),
            "logprobs": [round(x, 5) for x in rollout.rollout_logprobs[i, :length].tolist()],
            "truncated": bool(rollout.truncated[i]),
        })
        if rollout.observation_mask is not None:  # which tokens a tool wrote (mathrl inspect shows them apart)
            records[-1]["observation"] = [int(x) for x in rollout.observation_mask[i, :length].tolist()]
            records[-1]["tool_calls"] = int(rollout.tool_calls[i])
        if scores is not None:
            records[-1]["components"] = {name: values[i] for name, values in scores.values.items()}
        if dropped:
            records[-1]["dropped"] = True
    return records


def peak_memory_gb(ranks: Ranks) -> float:
    """Peak memory of this process so far: CUDA memory allocated on its GPU when it trains on one
    (train.device), else its peak resident set size."""
    if ranks.device.type == "cuda":
        return torch.cuda.max_memory_allocated(ranks.device) / 2**30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB
