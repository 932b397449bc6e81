"""Updates on one rollout batch: the mini-batches and the optimizer step shared by the policy and critic
updates, and the policy update itself (the no-grad per-token passes: train/passes.py).

A rollout batch is shuffled (a generator seeded by the step), cut into mini-batches of
train.mini_batch_size rows (one optimizer step each), and those into micro-batches of at most
train.micro_batch_tokens tokens (one forward/backward each). Every micro-batch's loss is normalised by
the whole mini-batch's counts (`algo.losses.global_counts`), so the gradient does not depend on the split.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Callable

import torch

import mathrl.train.dist as tdist
from mathrl.algo.distill import generalized_jsd, reverse_kl_advantages, topk_forward_kl
from mathrl.algo.entropy import entropy_bonus_mask
from mathrl.algo.kl import kl_penalty
from mathrl.algo.losses import aggregate, dp_scale, global_counts, positive_example_lm_loss
from mathrl.algo.rollout_correction import bypass_weights
from mathrl.config import AlgoConfig, Config
from mathrl.model.dtypes import autocast
from mathrl.model.scoring import (
    input_device,
    next_token_logprobs,
    response_logprobs,
    response_logprobs_at,
)
from mathrl.registry import LOSS_TERMS, POLICY_LOSSES
from mathrl.seeds import derive_seed
from mathrl.tasks.sources import PretrainText
from mathrl.train.batching import Rows, TrainBatch, micro_batches


# ----------------------------------------------------------------------------- mini-batches and optimizer steps
@dataclass
class UpdateLog:
    """What one update did, one entry per optimizer step (skipped ones included)."""

    terms: dict[str, list[float]] = field(default_factory=dict)  # each loss term summed over a step's micro-batches
    extra: dict[str, list[float]] = field(default_factory=dict)  # terms added after the micro-batches (PTX)
    grad_norms: list[float] = field(default_factory=list)
    skipped: int = 0  # optimizer steps skipped for a non-finite loss or gradient
    inf_skipped: int = 0  # ... of which the loss scaler's: finite losses, a non-finite scaled gradient
    loss_scale: float = 0.0  # the loss scaler's scale after the last optimizer step (0: no scaler)
    lr: float = 0.0  # learning rate of the last optimizer step


@dataclass(frozen=True)
class Updated:
    """An update's result: its log line (actor/* or critic/*) and what the run decides on."""

    metrics: dict[str, float]
    skipped: int  # optimizer steps skipped for a non-finite loss or gradient, the loss scaler's own skips not counted


def loss_scaler(cfg: Config, device: torch.device, *, distributed: bool):
    """The dynamic loss scaler of model.dtype=float16, None otherwise. Several ranks: FSDP's
    ShardedGradScaler, which all-reduces the inf check, so every rank skips the same steps and keeps the
    same scale (its unscale works on FSDP2's DTensor gradients: tests/train/test_dist_train.py, float16)."""
    if cfg.model.dtype != "float16":
        return None
    if distributed:
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(device.type)
    return torch.amp.GradScaler(device.type)


def backward(loss: torch.Tensor, scaler) -> None:
    """loss.backward(), the loss multiplied by the scaler's scale first when there is one (float16:
    small gradients would otherwise flush to zero in the float16 backward)."""
    (loss if scaler is None else scaler.scale(loss)).backward()


@dataclass
class MiniBatch:
    """One optimizer step's share of a rollout batch on this rank."""

    rows: Rows  # this rank's rows of the mini-batch (all of it in one process), of the batch's record type
    micros: list[Rows]  # its micro-batches (CPU), padded with zero-loss stand-ins to the largest count of any rank


def mini_batches(batch: Rows, cfg: Config, *, seed: int, rows: list[int] | None = None) -> Iterator[MiniBatch]:
    """train.epochs passes over `batch`, shuffled by a generator seeded with `seed`, in mini-batches of
    train.mini_batch_size rows, each cut into micro-batches of at most train.micro_batch_tokens tokens.

    Data parallel: `batch` is the whole step's batch on every rank and `rows` this rank's rows. The
    shuffle is over the whole batch (the same on every rank), so a mini-batch holds the same samples as
    in one process; each rank gets its own rows of it, and a rank with fewer micro-batches than another
    gets zero-loss stand-ins, so every rank makes the same sharded-model calls."""
    order_gen = torch.Generator().manual_seed(seed)
    owned = torch.ones(len(batch), dtype=torch.bool)
    if rows is not None:
        owned = torch.zeros(len(batch), dtype=torch.bool)
        owned[torch.as_tensor(rows, dtype=torch.long)] = True
    for _epoch in range(cfg.train.epochs):
        order = torch.randperm(len(batch), generator=order_gen)
        for start in range(0, len(batch), cfg.train.mini_batch_size):
            chunk = order[start : start + cfg.train.mini_batch_size]
            mini = batch.select(chunk[owned[chunk]])
            micros = micro_batches(mini, cfg.train.micro_batch_tokens) if len(mini) else []
            filler = tdist.all_reduce_max(len(micros)) - len(micros)
            if filler:
                blank = batch.select(chunk[:1]).trimmed()
                blank.loss_mask = torch.zeros_like(blank.loss_mask)
                micros += [blank] * filler
            yield MiniBatch(mini, micros)


def optimizer_step(model, optimizer, scheduler, cfg: Config, log: UpdateLog, terms: dict[str, float],
                   extra: dict[str, float], *, scaler=None) -> None:
    """One optimizer step on the gradient the micro-batches left, recorded in `log` with its loss terms
    (`terms`, summed over micro-batches and ranks; `extra`: PTX's). The gradient is clipped to
    train.max_grad_norm; a step whose loss terms or gradient norm are not finite is skipped, not taken.

    model.dtype=float16: `scaler` (`loss_scaler`) is unscaled before the clip; a step whose scaled
    gradient overflowed is skipped (counted in `inf_skipped`) and the scale halves (torch.amp.GradScaler's
    dynamic scaling)."""
    if scaler is not None:
        scaler.unscale_(optimizer)  # the clip and the norm see the true gradient
    grad_norm = tdist.total_norm(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.max_grad_norm))
    log.lr = optimizer.param_groups[0]["lr"]
    if not step_if_finite(optimizer, scheduler, grad_norm, terms.values(), scaler=scaler):
        log.skipped += 1
        log.inf_skipped += scaler is not None and all(math.isfinite(v) for v in terms.values())
    if scaler is not None:
        log.loss_scale = scaler.get_scale()
    for k, v in terms.items():
        log.terms.setdefault(k, []).append(v)
    for k, v in extra.items():
        log.extra.setdefault(k, []).append(v)
    log.grad_norms.append(float(grad_norm))


def step_if_finite(optimizer, scheduler, grad_norm: torch.Tensor, losses: Iterable[float], *, scaler=None) -> bool:
    """Take the optimizer (and schedule) step unless the gradient norm or a loss is not finite: a
    skipped step leaves the weights as they were rather than corrupt them. The gradients are cleared
    either way. Returns whether the step was taken.

    With a loss scaler (already unscaled) the step goes through `scaler.step`, which skips it too
    when the scaler found an inf/nan gradient, and `scaler.update` adjusts the scale either way: halved
    after an overflow, doubled after growth_interval steps without one."""
    finite = bool(torch.isfinite(grad_norm)) and all(math.isfinite(v) for v in losses)
    if finite:
        if scaler is None:
            optimizer.step()
        else:
            scaler.step(optimizer)
        scheduler.step()
    if scaler is not None:
        scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return finite


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


# ----------------------------------------------------------------------------- loss terms
@dataclass(kw_only=True)
class TermInputs:
    """What a loss term sees of one micro-batch: the config's algo section, the policy's logprobs and
    entropy [n, t] of its sampled tokens, the micro-batch, the mini-batch's normalisers and the step's
    coefficients."""

    algo: AlgoConfig  # cfg.algo
    max_len: int  # rollout.max_new_tokens (the seq_mean_token_sum_norm normaliser)
    seed: int  # the step's seed, for a loss that picks tokens at random
    micro: TrainBatch
    logprobs: torch.Tensor  # [n, t]
    entropy: torch.Tensor  # [n, t]
    mask: torch.Tensor  # [n, t] micro.loss_mask
    num_tokens: float  # the whole mini-batch's counted tokens and sequences (all micro-batches, all ranks)
    num_seqs: float
    pos_tokens: float  # ... of its correct samples only
    pos_seqs: float
    coefs: dict[str, float]  # this step's controlled coefficients: entropy, kl
    topk_logprobs: torch.Tensor | None = None  # [n, t, K] the policy's logprobs of the teacher's top-k ids (algo.distill)

    def aggregate(self, token_loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """algo.loss_agg over the whole mini-batch's counts."""
        return aggregate(token_loss, mask, mode=self.algo.loss_agg, max_len=self.max_len,
                         num_tokens=self.num_tokens, num_seqs=self.num_seqs)


@dataclass(frozen=True)
class Term:
    """What a loss term gives of one micro-batch."""

    loss: torch.Tensor | None  # its weighted, signed contribution to the loss; None: it adds nothing this micro-batch
    value: float  # the value logged as actor/<name>
    sums: dict[str, float] = field(default_factory=dict)  # token counts added to the update's (actor/<key> / tokens)


@dataclass(frozen=True)
class LossTerm:
    """One term added to the policy-gradient loss, registered in mathrl.registry.LOSS_TERMS under the
    name it is logged as (actor/<name>): `fn` returns its `Term`; `enabled` reads the config's algo section."""

    enabled: Callable[[AlgoConfig], bool]
    fn: Callable[[TermInputs], Term]


def entropy_term(x: TermInputs) -> Term:
    """- entropy_coef x entropy (an entropy bonus), without the tokens ref_gain_clip masks."""
    ent = x.algo.entropy
    if x.coefs["entropy"] == 0.0:
        return Term(loss=None, value=0.0)
    bonus_mask = x.mask
    if ent.ref_gain_clip.max_gain is not None or ent.ref_gain_clip.max_ratio is not None:
        bonus_mask = entropy_bonus_mask(x.entropy.detach(), x.micro.ref_entropy, x.mask,
                                        max_gain=ent.ref_gain_clip.max_gain, max_ratio=ent.ref_gain_clip.max_ratio)
    # masked tokens contribute 0 but stay in the normaliser: the bonus per kept token is unchanged
    ent_term = x.aggregate(x.entropy, bonus_mask)
    return Term(loss=-(x.coefs["entropy"] * ent_term), value=-ent_term.item(),
                sums={"ent_masked": float((x.mask - bonus_mask).sum())})


def kl_loss_term(x: TermInputs) -> Term:
    """kl_coef x KL(policy || reference) as a loss (algo.kl.use=loss)."""
    kl_term = x.aggregate(kl_penalty(x.logprobs, x.micro.ref_logprobs, estimator=x.algo.kl.estimator), x.mask)
    return Term(loss=x.coefs["kl"] * kl_term, value=kl_term.item())


def pos_lm_term(x: TermInputs) -> Term:
    """VAPO's mu x NLL of the correct responses, token-normalised over the correct samples' tokens of the
    whole mini-batch."""
    if x.pos_tokens <= 0:
        return Term(loss=None, value=0.0)
    nll, pos_mask = positive_example_lm_loss(x.logprobs, x.mask, x.micro.correct)
    pos = aggregate(nll, pos_mask, mode="token_mean", num_tokens=x.pos_tokens, num_seqs=x.pos_seqs)
    return Term(loss=x.algo.pos_lm.coef * pos, value=pos.item())


# Added to the loss in this order; a new term is one function and one registration (here or outside).
LOSS_TERMS.register("entropy_loss", LossTerm(lambda algo: algo.entropy.mode != "none", entropy_term))
LOSS_TERMS.register("kl_loss", LossTerm(lambda algo: algo.kl.use == "loss", kl_loss_term))
LOSS_TERMS.register("pos_lm_loss", LossTerm(lambda algo: algo.pos_lm.coef > 0, pos_lm_term))


# ---- on-policy distillation (algo.distill.mode; algo/distill.py): one term per mode, beside the task's
# policy-gradient term, whose advantage the step scales by algo.distill.reward_weight
def reverse_kl_term(x: TermInputs) -> Term:
    """algo.policy_loss on the advantage log pi_T - log pi_S (the sampler's, or the current policy's detached:
    algo.distill.student), with the micro-batch's importance weights; logged: the mean advantage's negation,
    the k1 estimate of KL(student || teacher) over the micro-batch's share of the mini-batch's tokens."""
    student = x.micro.rollout_logprobs if x.algo.distill.student == "sampler" else x.logprobs
    adv = reverse_kl_advantages(x.micro.teacher_logprobs, student, x.mask)  # [n, t]
    loss, _ = pg_term(x, advantages=adv)
    return Term(loss=loss, value=-float(adv.sum()) / max(x.num_tokens, 1.0))


def topk_term(divergence: Callable[[TermInputs], torch.Tensor]) -> Callable[[TermInputs], Term]:
    """A direct loss term: the per-token divergence between the teacher's and the policy's top-k logprobs,
    aggregated by algo.loss_agg over the mini-batch."""

    def term(x: TermInputs) -> Term:
        loss = x.aggregate(divergence(x), x.mask)
        return Term(loss=loss, value=loss.item())

    return term


LOSS_TERMS.register("distill_reverse_kl", LossTerm(lambda algo: algo.distill.mode == "reverse_kl", reverse_kl_term))
LOSS_TERMS.register("distill_forward_kl_topk", LossTerm(lambda algo: algo.distill.mode == "forward_kl_topk", topk_term(
    lambda x: topk_forward_kl(x.topk_logprobs, x.micro.teacher_topk_logprobs))))
LOSS_TERMS.register("distill_jsd", LossTerm(lambda algo: algo.distill.mode == "jsd", topk_term(
    lambda x: generalized_jsd(x.topk_logprobs, x.micro.teacher_topk_logprobs, beta=x.algo.distill.beta))))


# ----------------------------------------------------------------------------- the policy update
def update_policy(
    model, optimizer, scheduler, batch: TrainBatch, cfg: Config, *, step: int, coefs: dict[str, float],
    ptx: PretrainText | None, rows: list[int] | None = None, scaler=None,
) -> Updated:
    """Mini-batches x epochs of updates on one rollout batch, one optimizer step per mini-batch.

    loss = algo.policy_loss's per-token loss (times batch.is_weights, the importance weights, where set),
    aggregated, + the enabled LOSS_TERMS (entropy bonus, KL as loss, positive-example NLL), each aggregated
    over the whole mini-batch's counts (all its micro-batches, all ranks: the gradient does not depend on
    the split), plus ptx_coef * the token-mean pretraining NLL of one PTX batch per optimizer step.
    """
    terms_on = [(name, term) for name, term in LOSS_TERMS.items() if term.enabled(cfg.algo)]
    sums = {k: 0.0 for k in ("entropy", *STANDARD_STATS, "tokens", "ent_masked")}  # token sums of the metrics
    extrema: dict[str, float] = {}  # the smallest / largest of a sequence statistic (seq_*_min, seq_*_max)
    log, device = UpdateLog(), input_device(model)
    seed = derive_seed(cfg.seed, step)
    for mini in mini_batches(batch, cfg, seed=seed, rows=rows):
        num_tokens, num_seqs = global_counts(mini.rows.loss_mask)
        pos_tokens, pos_seqs = global_counts(mini.rows.loss_mask * mini.rows.correct[:, None])
        totals: dict[str, float] = {}
        with autocast(cfg.model.dtype, device):
            for micro in mini.micros:
                micro = micro.to(device)
                logprobs, entropy, topk = policy_forward(model, micro, cfg)
                x = TermInputs(algo=cfg.algo, max_len=cfg.rollout.max_new_tokens, seed=seed, micro=micro,
                               logprobs=logprobs, entropy=entropy, mask=micro.loss_mask, num_tokens=num_tokens,
                               num_seqs=num_seqs, pos_tokens=pos_tokens, pos_seqs=pos_seqs, coefs=coefs,
                               topk_logprobs=topk)
                loss, stats = pg_term(x)
                terms = {"pg_loss": loss.item(), **{name: 0.0 for name, _ in LOSS_TERMS.items()}}
                for name, term in terms_on:
                    out = term.fn(x)
                    terms[name] = out.value
                    if out.loss is not None:
                        loss = loss + out.loss
                    for key, value in out.sums.items():
                        sums[key] = sums.get(key, 0.0) + value
                backward(loss * dp_scale(), scaler)
                for key, value in (("entropy", entropy.detach()), *stats.items()):
                    if key.startswith(SEQ_PREFIX):  # a row's value on its tokens: reduced over sequences
                        add_sequence_stat(sums, extrema, key, value, x.mask)
                        continue
                    sums[key] = sums.get(key, 0.0) + float((value * x.mask).sum())
                if any(key.startswith(SEQ_PREFIX) for key in stats):
                    sums["seqs"] = sums.get("seqs", 0.0) + float((x.mask.sum(-1) > 0).sum())
                sums["tokens"] += float(x.mask.sum())
                for k, v in terms.items():
                    totals[k] = totals.get(k, 0.0) + v
            totals = tdist.all_reduce_sums(totals)
            extra = ptx_update(model, ptx, cfg, scaler=scaler) if ptx is not None else {}
        optimizer_step(model, optimizer, scheduler, cfg, log, totals, extra, scaler=scaler)
    metrics = policy_metrics(log, tdist.all_reduce_sums(sums), cfg, terms_on=[name for name, _ in terms_on],
                             ptx=ptx is not None, extrema=reduce_extrema(extrema))
    return Updated(metrics, skipped=log.skipped - log.inf_skipped)


# logged for every loss (0 where it has none)
STANDARD_STATS = ("pg_clipfrac", "pg_clipfrac_lower", "ppo_kl", "pg_clipfrac_low", "pg_clipfrac_high")
SEQ_PREFIX = "seq_"  # a loss's statistic of its sequences (gspo's ratio): each row's value on its counted tokens


def add_sequence_stat(sums: dict[str, float], extrema: dict[str, float], key: str, value: torch.Tensor,
                      mask: torch.Tensor) -> None:
    """Fold a sequence statistic ([B, T], each row's value on its counted tokens) into the step's: a `_min`
    or `_max` key into its extreme over the rows with a counted token, any other into the sum over them
    (divided by the step's sequences in policy_metrics)."""
    counts = mask.sum(-1)
    rows = (value * mask).sum(-1)[counts > 0] / counts[counts > 0]  # [rows] each row's value
    if not key.endswith(("_min", "_max")):
        sums[key] = sums.get(key, 0.0) + float(rows.sum())  # every rank adds the key (the sums are all-reduced)
    elif len(rows):
        pick = min if key.endswith("_min") else max
        extrema[key] = pick(extrema.get(key, float(pick(rows))), float(pick(rows)))


def reduce_extrema(extrema: dict[str, float]) -> dict[str, float]:
    """The extremes over all ranks (each rank's, gathered)."""
    if not tdist.active():
        return extrema
    out: dict[str, float] = {}
    for part in tdist.all_gather_objects(extrema):
        for key, v in part.items():
            pick = min if key.endswith("_min") else max
            out[key] = pick(out.get(key, v), v)
    return out


def policy_forward(model, micro: TrainBatch, cfg: Config) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The policy's logprobs and entropy [n, t] of the micro-batch's tokens, and, when the teacher's top-k came
    with it (forward_kl_topk, jsd), the policy's logprobs [n, t, K] of those ids, from the same forward."""
    args = (model, micro.prompt_ids, micro.prompt_mask, micro.response_ids, micro.context_mask)
    kwargs = {"temperature": cfg.rollout.temperature, "chunk_size": cfg.model.logprob_chunk_size}
    if micro.teacher_topk_ids is None:
        return (*response_logprobs(*args, **kwargs), None)
    return response_logprobs_at(*args, micro.teacher_topk_ids, **kwargs)


def pg_term(x: TermInputs, advantages: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """algo.policy_loss's loss, aggregated by its own mode or algo.loss_agg, and its per-token stats; each
    token's term times its importance weight (x.micro.is_weights) when a correction is on, and in bypass mode
    times `bypass_weights` between pi_theta and the engine (algo.rollout_correction). A loss that picks
    tokens at random gets a generator seeded by the run, the step and the micro-batch's tokens (not the rank).
    `advantages` [n, t]: another advantage than the micro-batch's (on-policy distillation's)."""
    algo, micro = x.algo, x.micro
    entry = POLICY_LOSSES.get(algo.policy_loss)
    kwargs = entry.params(algo)
    if entry.needs_generator:
        content = zlib.crc32(micro.response_ids.cpu().numpy().tobytes())
        kwargs["generator"] = torch.Generator().manual_seed(derive_seed(x.seed, content))
    advantages = micro.advantages if advantages is None else advantages
    weights, extra = micro.is_weights, {}
    if bypass_weighed(algo):  # old logprobs are the engine's: weigh pi_theta against them, per micro-batch (verl)
        w = bypass_weights(x.logprobs, micro.old_logprobs, x.mask, **bypass_settings(algo))
        weights, extra = (w if weights is None else weights * w), {"bypass_is_weight": w}
    token_loss, stats = entry.fn(x.logprobs, micro.old_logprobs, advantages, x.mask, weights=weights, **kwargs)
    stats = {**stats, **extra}
    mode = entry.agg or algo.loss_agg
    loss = aggregate(token_loss, x.mask, mode=mode, max_len=x.max_len, num_tokens=x.num_tokens, num_seqs=x.num_seqs)
    return loss, stats


def bypass_weighed(algo: AlgoConfig) -> bool:
    """algo.rollout_correction.bypass with an importance weight or a rejection rule on."""
    rc = algo.rollout_correction
    return rc.bypass and (rc.mode != "none" or bool(rc.masks))


def bypass_settings(algo: AlgoConfig) -> dict:
    """algo.rollout_correction as `bypass_weights` takes it."""
    rc = algo.rollout_correction
    return {"mode": None if rc.mode == "none" else rc.mode, "level": rc.level, "cap": rc.cap, "lower": rc.lower,
            "rules": list(rc.masks), "geo_rs_bounds": rc.geo_rs_bounds, "icepop_bounds": rc.icepop_bounds,
            "k3_rs_threshold": rc.k3_rs_threshold, "k2_rs_threshold": rc.k2_rs_threshold}


def ptx_update(model, ptx: PretrainText, cfg: Config, *, scaler=None) -> dict[str, float]:
    """Backward of ptx_coef x the token-mean NLL of one pretraining batch; returns the NLL."""
    ids, attn = ptx.next_batch(cfg.algo.ptx.batch_size)
    nll = -next_token_logprobs(model, ids, attn, chunk_size=cfg.model.logprob_chunk_size)
    target_mask = attn[:, 1:].to(nll.device).float()
    ptx_loss = (nll * target_mask).sum() / target_mask.sum().clamp(min=1)
    backward(cfg.algo.ptx.coef * ptx_loss, scaler)
    return {"ptx_loss": ptx_loss.item()}


def policy_metrics(log: UpdateLog, sums: dict[str, float], cfg: Config, *, terms_on: list[str],
                   ptx: bool, extrema: dict[str, float] | None = None) -> dict[str, float]:
    """actor/* of the update from its log and its token sums (over all ranks)."""
    tokens = max(sums["tokens"], 1.0)
    metrics = {
        "actor/pg_loss": _mean(log.terms.get("pg_loss", [])),
        "actor/entropy": sums["entropy"] / tokens,
        **{f"actor/{key}": sums[key] / tokens for key in STANDARD_STATS},
        "actor/grad_norm": _mean(log.grad_norms),
        "actor/lr": log.lr,  # of the step's last update
        "actor/updates": float(len(log.grad_norms) - log.skipped),
        "perf/skipped_updates": float(log.skipped - log.inf_skipped),  # the loss scaler's own skips are expected
    }
    if cfg.model.dtype == "float16":
        metrics["actor/loss_scale"] = log.loss_scale
        metrics["actor/skipped_inf_steps"] = float(log.inf_skipped)
    for key in sorted(sums.keys() - {"entropy", *STANDARD_STATS, "tokens", "ent_masked", "seqs"}):  # a loss's own stats
        metrics[f"actor/{key}"] = sums[key] / (max(sums["seqs"], 1.0) if key.startswith(SEQ_PREFIX) else tokens)
    for key, value in sorted((extrema or {}).items()):
        metrics[f"actor/{key}"] = value
    for name in terms_on:
        metrics[f"actor/{name}"] = _mean(log.terms.get(name, []))
    if cfg.algo.entropy.mode != "none":
        metrics["actor/entropy_clipfrac"] = sums["ent_masked"] / tokens
    if ptx:
        metrics["actor/ptx_loss"] = _mean(log.extra.get("ptx_loss", []))
    return metrics
