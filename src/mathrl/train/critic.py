"""PPO's critic: the value pass, the clipped value-loss update, and VC-PPO value pretraining. Used when
algo.adv.estimator is gae (algo.critic.*; its advantages and value targets: `algo.estimators.ppo_gae`).
"""

from __future__ import annotations

import math

import torch
from rich.console import Console

import mathrl.train.dist as tdist
from mathrl.algo.critic import explained_variance, gae, outcome_token_rewards, value_loss
from mathrl.algo.losses import aggregate, dp_scale, global_counts, masked_mean
from mathrl.config import Config
from mathrl.model.dtypes import autocast
from mathrl.model.scoring import input_device
from mathrl.model.value import response_values
from mathrl.seeds import CRITIC_STREAM, derive_seed
from mathrl.tasks.sources import ProblemStream
from mathrl.train.batching import Rows, TrainBatch, ValueBatch
from mathrl.train.collect import SINGLE, collect_rollouts, prepare
from mathrl.train.dist import Ranks
from mathrl.train.passes import per_token_pass
from mathrl.train.update import Updated, UpdateLog, backward, mini_batches, optimizer_step


def value_pass(critic, batch: Rows, cfg: Config, *, rows: list[int] | None = None) -> torch.Tensor:
    """[N, T] critic values V(s_t) of the sampled responses, no grad (0 at masked positions)."""

    def forward(critic, mb: Rows) -> list[torch.Tensor]:
        return [response_values(critic, mb.prompt_ids, mb.prompt_mask, mb.response_ids, mb.context_mask)]

    (values,) = per_token_pass(critic, batch, cfg, forward, rows=rows)
    return values


def update_critic(critic, optimizer, scheduler, batch: TrainBatch | ValueBatch, cfg: Config, *, step: int,
                  rows: list[int] | None = None, scaler=None) -> Updated:
    """Mini-batches x epochs of clipped value-loss updates (token mean over the whole mini-batch);
    `scaler`: the critic's own loss scaler (model.dtype=float16, `update.loss_scaler`)."""
    crit = cfg.algo.critic
    sums = {"clipped": 0.0, "tokens": 0.0}
    log, device = UpdateLog(), input_device(critic)
    for mini in mini_batches(batch, cfg, seed=derive_seed(cfg.seed, step + CRITIC_STREAM), rows=rows):
        num_tokens, num_seqs = global_counts(mini.rows.loss_mask)
        total = 0.0
        with autocast(cfg.model.dtype, device):
            for micro in mini.micros:
                micro = micro.to(device)
                values = response_values(critic, micro.prompt_ids, micro.prompt_mask, micro.response_ids,
                                         micro.context_mask)
                token_loss, is_clipped = value_loss(values, micro.old_values, micro.returns, micro.loss_mask,
                                                    clip_eps=crit.value_clip)
                loss = aggregate(token_loss, micro.loss_mask, mode="token_mean", num_tokens=num_tokens,
                                 num_seqs=num_seqs)
                backward(loss * dp_scale(), scaler)
                sums["clipped"] += float(is_clipped.sum())
                sums["tokens"] += float(micro.loss_mask.sum())
                total += loss.item()
            terms = tdist.all_reduce_sums({"value_loss": total})
        optimizer_step(critic, optimizer, scheduler, cfg, log, terms, {}, scaler=scaler)
    sums = tdist.all_reduce_sums(sums)
    m = batch.loss_mask
    losses = log.terms["value_loss"]
    metrics = {
        "critic/value_loss": sum(losses) / len(losses),
        "critic/vf_clipfrac": sums["clipped"] / max(sums["tokens"], 1.0),
        "critic/grad_norm": sum(log.grad_norms) / len(log.grad_norms),
        "critic/values_mean": float(masked_mean(batch.old_values, m)),
        "critic/returns_mean": float(masked_mean(batch.returns, m)),
        "critic/lr": log.lr,  # of the step's last update
        "critic/skipped_updates": float(log.skipped - log.inf_skipped),
    }
    if cfg.model.dtype == "float16":
        metrics["critic/loss_scale"] = log.loss_scale
        metrics["critic/skipped_inf_steps"] = float(log.inf_skipped)
    explained = explained_variance(batch.old_values, batch.returns, m)
    if math.isfinite(explained):  # undefined when every target is equal (e.g. every answer right)
        metrics["critic/explained_var"] = explained
    return Updated(metrics, skipped=log.skipped - log.inf_skipped)


def pretrain_critic(cfg: Config, critic, optimizer, scheduler, *, train_stream: ProblemStream, engine, tokenizer,
                    verifier, console: Console, ranks: Ranks = SINGLE, scaler=None) -> dict[str, float]:
    """VC-PPO value pretraining (Yuan et al. 2025, §4.1): before the first policy update, fit the
    critic for algo.critic.pretrain_steps steps on rollouts of the starting policy, with Monte-Carlo
    targets (lambda = 1), so the first advantages do not come from an untrained value head.
    Returns the step-0 metrics critic/pretrain_*."""
    crit, first, last = cfg.algo.critic, None, {}
    for k in range(1, crit.pretrain_steps + 1):
        got = collect_rollouts(cfg, -k, train_stream=train_stream, engine=engine, tokenizer=tokenizer, verifier=verifier,
                               ranks=ranks)
        if not got.problems:
            continue
        prep = prepare(cfg, got, ranks)  # the policy step's start (train/step.py): sample filters, rows, this rank's rows
        values = value_pass(critic, prep.batch, cfg, rows=prep.rows)  # [N, T]
        token_rewards = outcome_token_rewards(got.rewards, prep.batch.response_mask)
        _, returns = gae(token_rewards, values, prep.batch.response_mask, gamma=crit.gamma, lam=1.0)
        batch = ValueBatch(**prep.batch.tensors(), old_values=values, returns=returns)
        last = update_critic(critic, optimizer, scheduler, batch, cfg, step=-k, rows=prep.rows, scaler=scaler).metrics
        first = last["critic/value_loss"] if first is None else first
        console.print(f"critic pretraining {k}/{crit.pretrain_steps}: value loss {last['critic/value_loss']:.4f}")
    out = {"critic/pretrain_steps": float(crit.pretrain_steps)}
    if first is not None:
        out["critic/pretrain_value_loss_first"] = first
        out["critic/pretrain_value_loss_last"] = last["critic/value_loss"]
    return out
