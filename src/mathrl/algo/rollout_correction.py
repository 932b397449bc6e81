"""Rollout/trainer mismatch correction: importance weights between the rollout engine and the trainer.

ρ = π_old(y) / π_rollout(y) = exp(old_logprobs − rollout_logprobs), detached, per token or per
sequence: TIS weighs a token's policy-gradient term by min(ρ, C), MIS by ρ · 1[ρ ≤ C]; rejection rules
(Geo-RS, IcePop, K3/K2-RS, OPSM) return keep masks that chain by intersection. Pure tensor functions.
Papers, switches and where verl differs: docs/tricks.md, "Rollout/trainer mismatch".

    w, keep = correction_weights(old_lp, rollout_lp, mask, mode="tis", level="token", cap=2.0)
    loss = aggregate(policy_loss(lp, old_lp, adv, mask)[0] * w, mask, mode=..., num_tokens=..., num_seqs=...)
    keeps = rule_keeps(old_lp, rollout_lp, mask, ["geo_rs", "k3_rs"], geo_rs_bounds=(0.999, 1.001), k3_rs_threshold=0.01)
    w = w * chain(keeps.values(), like=mask)  # [B, T]; rejected tokens teach nothing
    c = rollout_correction(old_lp, rollout_lp, mask, loss_mask, mode="tis", cap=2.0, rules=["k3_rs"], drop=True)
    c.weights, c.loss_mask, c.metrics  # the step's correction, all of the above at once

Tests: ``python -m pytest tests/algo/test_mismatch_correction.py -q``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from mathrl.algo.losses import masked_mean

__all__ = [
    "ADVANTAGE_RULES", "MASK_RULES", "CorrectionLevel", "CorrectionMode", "Corrected", "MaskRule",
    "advantage_rejection", "bypass_weights", "chain", "correction_weights", "rollout_correction",
    "geo_rs_keep", "icepop_keep", "kl_rs_keep", "log_ratio", "mismatch_kl", "opsm_keep", "rule_keeps",
]

CorrectionMode = Literal["tis", "mis"]
CorrectionLevel = Literal["token", "sequence"]
MaskRule = Literal["geo_rs", "icepop", "k3_rs", "k2_mean_rs", "k2_max_rs", "opsm"]
MASK_RULES: tuple[str, ...] = ("geo_rs", "icepop", "k3_rs", "k2_mean_rs", "k2_max_rs", "opsm")
ADVANTAGE_RULES = frozenset({"opsm"})  # rules that read the advantages: applied once they are computed

# |log ρ| is clamped to this before the divergence statistics of the rejection rules, as verl does
# (its SAFETY_BOUND): exp() stays finite in float32, and a token e^20 apart is rejected either way.
SAFETY_BOUND = 20.0


def _check_shapes(old_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor) -> None:
    shapes = {tuple(old_logprobs.shape), tuple(rollout_logprobs.shape), tuple(mask.shape)}
    if len(shapes) != 1 or old_logprobs.dim() != 2:
        raise ValueError(
            "old_logprobs, rollout_logprobs and mask must be [B, T] of the same shape, got "
            f"{tuple(old_logprobs.shape)}, {tuple(rollout_logprobs.shape)}, {tuple(mask.shape)}"
        )


def _check(old_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor, cap: float) -> None:
    _check_shapes(old_logprobs, rollout_logprobs, mask)
    if not cap > 1.0 or not math.isfinite(cap):
        raise ValueError(f"cap must be a finite number > 1 (an importance ratio of 1 is on-policy), got {cap}")


def log_ratio(old_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor, *, level: CorrectionLevel) -> Tensor:
    """log ρ: per token, or per sequence broadcast over the row's tokens; 0 at masked tokens.

    old_logprobs: [B, T] trainer logprobs of the sampled tokens under the weights that sampled;
    rollout_logprobs: [B, T] the rollout engine's logprobs of the same tokens; mask: [B, T] nonzero on the
    sampled tokens (the sequence ratio is over these); level: "token" or "sequence". -> [B, T] the log-ratio
    (detached).
    """
    m = mask.bool()
    diff = torch.where(m, (old_logprobs - rollout_logprobs).detach(), torch.zeros_like(old_logprobs))  # [B, T]
    if level == "token":
        return diff
    if level == "sequence":
        per_seq = diff.sum(-1, keepdim=True)  # [B, 1]
        return torch.where(m, per_seq.expand_as(diff), torch.zeros_like(diff))
    raise ValueError(f"unknown level {level!r}; choose token or sequence")


def correction_weights(
    old_logprobs: Tensor,
    rollout_logprobs: Tensor,
    mask: Tensor,
    *,
    mode: CorrectionMode,
    level: CorrectionLevel,
    cap: float,
    lower: float | None = None,
) -> tuple[Tensor, Tensor]:
    """Importance weights that correct the policy-gradient term for the rollout/trainer mismatch.

        tis: w = min(ρ, C) · 1[ρ ≥ L]         (Yao et al. 2025, TIS)
        mis: w = ρ · 1[L ≤ ρ ≤ C]             (Liu, Li et al. 2025, MIS)

    with ρ = exp(log_ratio(...)) per token or per sequence. min(ρ, C) is computed as
    exp(min(log ρ, log C)), so a sequence ratio far over the cap never overflows. The lower bound L
    (`lower`, None = no lower bound) rejects tokens the trainer finds far less likely than the engine
    did, which stale (off-policy) samples produce: verl's rejection uses L = 1/C, IcePop [0.5, 2].

    old_logprobs: [B, T] trainer logprobs (π_old, the weights the engine sampled with); rollout_logprobs: [B, T]
    engine logprobs of the same tokens (π_rollout); mask: [B, T] nonzero on the sampled tokens; mode: "tis" or
    "mis"; level: "token" or "sequence"; cap: C > 1; lower: L in (0, 1), or None. -> (weights [B, T]: detached,
    0 at masked tokens, multiply the per-token policy loss by it; rejected [B, T] float: 1 where the weight was
    cut, ρ > C (capped by tis, zeroed by mis) or ρ < L (zeroed by both), on the token or on every token of the
    sequence). A token tis capped keeps the weight C: only the zeroed ones (weight 0 and rejected) are
    rejections that `rejected: drop` takes out of the loss mask, as verl's TIS weights only clamp.
    """
    _check(old_logprobs, rollout_logprobs, mask, cap)
    if lower is not None and not 0.0 < lower < 1.0:
        raise ValueError(f"lower must be in (0, 1) (an importance ratio of 1 is on-policy), got {lower}")
    m = mask.bool()
    zeros = torch.zeros_like(old_logprobs)
    with torch.no_grad():
        lr = log_ratio(old_logprobs, rollout_logprobs, mask, level=level)  # [B, T]
        log_cap = math.log(cap)
        over = (lr > log_cap) & m  # [B, T]
        under = (lr < math.log(lower)) & m if lower is not None else torch.zeros_like(m)  # [B, T]
        if mode == "tis":
            weights = torch.exp(lr.clamp(max=log_cap))
        elif mode == "mis":
            weights = torch.where(over, zeros, torch.exp(lr.clamp(max=log_cap)))
        else:
            raise ValueError(f"unknown mode {mode!r}; choose tis or mis")
        weights = torch.where(m & ~under, weights, zeros)
    return weights, (over | under).to(old_logprobs.dtype)


# ----------------------------------------------------------------------------- rejection rules (masks)
# Each rule returns keep: [B, T] bool, False only at the sampled tokens it rejects (padding counts as
# kept: the loss mask takes it out anyway). The caller multiplies the policy-gradient weights by the
# chained keep mask, and with algo.rollout_correction.rejected=drop takes the rejected tokens out of
# the loss mask too (verl's rejection sampling edits its response_mask: that is `drop`).


def _sequence_mean(x: Tensor, mask: Tensor) -> Tensor:
    """[B, T] -> [B]: mean of x over each row's masked tokens (0 for a row with none)."""
    m = mask.to(x.dtype)
    return (x * m).sum(-1) / m.sum(-1).clamp(min=1.0)


def _per_row(keep_row: Tensor, mask: Tensor) -> Tensor:
    """[B] bool -> [B, T] bool: every token of a row shares its verdict; padding is kept."""
    return keep_row[:, None] | ~mask.bool()


def _check_window(lower: float, upper: float, name: str) -> None:
    if not (0.0 < lower <= 1.0 <= upper and math.isfinite(upper)):
        raise ValueError(f"{name} must be [lower, upper] with 0 < lower <= 1 <= upper (a ratio of 1 is on-policy "
                         f"and must be kept), got [{lower}, {upper}]")


def geo_rs_keep(old_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor, *, lower: float, upper: float) -> Tensor:
    """Geometric sequence rejection (Geo-RS): a response is kept whole when the geometric mean of its
    tokens' ratios is inside [lower, upper], and rejected whole otherwise.

        keep_i = 1[ log L <= (1/|y_i|) Σ_t log ρ_t <= log U ],   ρ_t = π_old(y_t) / π_rollout(y_t)

    The sequence ratio Π_t ρ_t (level="sequence") grows with the length, so no one cap fits a short and a
    long response; its per-token geometric mean does not (Liu, Li et al. 2025, "When Speed Kills
    Stability", part 3, geometric-level RS; verl `compute_rollout_rejection_mask(rollout_rs="seq_mean_k1")`,
    preset `decoupled_geo_rs` = "0.999_1.001"). log ρ is clamped to ±SAFETY_BOUND per token, as verl does.

    verl's seq_mean_k1 bounds the mean of k1 = log(π_rollout/π_old) = -log ρ, i.e. the reciprocal ratio:
    its "L_U" is [1/U, 1/L] here, the same window whenever L = 1/U. Here the bounds are on
    ρ = π_old/π_rollout, as for tis, mis and icepop, so lower and upper mean the same in every rule.

    old_logprobs, rollout_logprobs: [B, T] trainer (π_old) and engine (π_rollout) logprobs; mask: [B, T] nonzero
    on the sampled tokens (the mean is over these); lower, upper: the window, 0 < lower <= 1 <= upper. -> [B, T]
    bool keep mask (detached).
    """
    _check_window(lower, upper, "geo_rs bounds")
    with torch.no_grad():
        lr = log_ratio(old_logprobs, rollout_logprobs, mask, level="token").clamp(-SAFETY_BOUND, SAFETY_BOUND)
        mean_lr = _sequence_mean(lr, mask)  # [B]
        return _per_row((mean_lr >= math.log(lower)) & (mean_lr <= math.log(upper)), mask)


def icepop_keep(old_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor, *, lower: float, upper: float) -> Tensor:
    """IcePop token masking: a token whose ratio ρ = π_old/π_rollout is outside [lower, upper] is rejected
    (its policy-gradient weight becomes 0); the bounds are kept (inclusive).

        keep_t = 1[ L <= ρ_t <= U ]

    IcePop (Ling Team 2025, "Every Step Evolves: Scaling RL for Trillion-Scale Thinking Model", arXiv
    2510.18855, the IcePop objective) weighs each token by M(ρ) = ρ·1[α <= ρ <= β]: that is this mask
    times mode=tis with cap >= U (or mode=mis); this mask alone gives the kept tokens weight 1 (verl's
    rejection-only `rollout_rs="token_k1"`, whose bounds are on the reciprocal ratio: equal for L = 1/U).
    verl's IcePop weights (`rollout_is="token"`, threshold "L_U") are ρ times this mask.

    old_logprobs, rollout_logprobs, mask: [B, T]; lower, upper: the window, 0 < lower <= 1 <= upper ([0.5, 2] in
    this repo's docs of IcePop). -> [B, T] bool keep mask (detached).
    """
    _check_window(lower, upper, "icepop bounds")
    with torch.no_grad():
        lr = log_ratio(old_logprobs, rollout_logprobs, mask, level="token")  # [B, T]
        return ((lr >= math.log(lower)) & (lr <= math.log(upper))) | ~mask.bool()


def _sequence_max(x: Tensor, mask: Tensor) -> Tensor:
    """[B, T] -> [B]: max of x over each row's masked tokens (0 for a row with none, as verl)."""
    m = mask.bool()
    top = x.masked_fill(~m, float("-inf")).max(-1).values
    return torch.where(m.any(-1), top, torch.zeros_like(top))


def kl_rs_keep(old_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor, *, estimator: Literal["k2", "k3"],
               threshold: float, reduce: Literal["mean", "max"] = "mean") -> Tensor:
    """K3-RS / K2-RS: a response is rejected whole when the mean (or the max) over its tokens of a
    per-token estimate of KL(π_rollout ‖ π_old) is above `threshold` (Schulman 2020, "Approximating KL
    Divergence"):

        k3_t = ρ_t - 1 - log ρ_t        k2_t = ½ (log ρ_t)²
        mean: keep_i = 1[ (1/|y_i|) Σ_t k_t <= threshold ]     max: keep_i = 1[ max_t k_t <= threshold ]

    The tokens were sampled from π_rollout, so k3 is unbiased for that KL and >= 0 token by token; k2
    is its second-order approximation (both ≈ ½ (log ρ)² near ρ = 1). verl
    `compute_rollout_rejection_mask(rollout_rs="seq_mean_k3" / "seq_mean_k2")`, preset `decoupled_k3_rs`
    = 0.01; reduce="max" is its "seq_max_k2" / "seq_max_k3": one token far off rejects the response,
    however long it is. log ρ is clamped to ±SAFETY_BOUND per token first, as verl does.

    old_logprobs, rollout_logprobs, mask: [B, T]; estimator: "k3" or "k2"; threshold: > 0, in nats per token;
    reduce: "mean" or "max" over the row's masked tokens. -> [B, T] bool keep mask (detached).
    """
    if not threshold > 0 or not math.isfinite(threshold):
        raise ValueError(f"threshold must be a finite number > 0 (a KL estimate is >= 0), got {threshold}")
    with torch.no_grad():
        lr = log_ratio(old_logprobs, rollout_logprobs, mask, level="token").clamp(-SAFETY_BOUND, SAFETY_BOUND)
        if estimator == "k3":
            per_token = torch.exp(lr) - 1.0 - lr  # [B, T]
        elif estimator == "k2":
            per_token = 0.5 * lr.square()
        else:
            raise ValueError(f"unknown estimator {estimator!r}; choose k3 or k2")
        if reduce not in ("mean", "max"):
            raise ValueError(f"unknown reduce {reduce!r}; choose mean or max")
        per_seq = _sequence_mean(per_token, mask) if reduce == "mean" else _sequence_max(per_token, mask)  # [B]
        return _per_row(per_seq <= threshold, mask)


def opsm_keep(old_logprobs: Tensor, rollout_logprobs: Tensor, advantages: Tensor, mask: Tensor, *,
              delta: float) -> Tensor:
    """Off-policy sequence masking (OPSM; DeepSeek-AI 2025, DeepSeek-V3.2, arXiv 2512.02556, eq. 9): a
    token is rejected when its advantage is negative and its response's mean log-ratio between the
    behaviour policy and the trainer's is above δ:

        keep_{i,t} = 1[ A_{i,t} >= 0  or  (1/|y_i|) Σ_t (log π_rollout(y_t) - log π_old(y_t)) <= δ ]

    A response that the trainer already finds much less likely than the sampler did, and that is
    pushed down, teaches the policy from a region it no longer visits; positive ones are kept. This is
    TRL's `GRPOTrainer.get_off_policy_mask` (`off_policy_mask_threshold`): the k1 estimate (signed, not
    clamped) of KL(π_rollout ‖ π), the per-sequence mean (not sum), the sampling logprobs as the
    behaviour policy. TRL takes π as the current policy of each micro-batch; here it is π_old, the
    trainer's logprobs before the step's update (train/step.py applies the mask once per step, after the
    advantages): the same policy at the step's first optimizer step, which is every one when an RL step
    makes a single update (train.epochs=1, train.mini_batch_size = the rollout batch).

    old_logprobs, rollout_logprobs, mask: [B, T]; advantages: [B, T] (or [B], one per response); delta: δ in
    nats per token (TRL suggests 0.5 to start; the paper gives none). -> [B, T] bool keep mask (detached).
    """
    _check_shapes(old_logprobs, rollout_logprobs, mask)
    adv = advantages[:, None] if advantages.dim() == 1 else advantages
    if adv.shape[0] != mask.shape[0] or adv.dim() != 2:
        raise ValueError(f"advantages must be [B, T] or [B] with B = {mask.shape[0]}, got {tuple(advantages.shape)}")
    with torch.no_grad():
        kl = -_sequence_mean(log_ratio(old_logprobs, rollout_logprobs, mask, level="token"), mask)  # [B]
        return (adv.detach() >= 0) | (kl[:, None] <= delta) | ~mask.bool()


def rule_keeps(
    old_logprobs: Tensor,
    rollout_logprobs: Tensor,
    mask: Tensor,
    rules: Sequence[str],
    *,
    geo_rs_bounds: Sequence[float] = (0.999, 1.001),
    icepop_bounds: Sequence[float] = (0.5, 2.0),
    k3_rs_threshold: float = 0.01,
    k2_rs_threshold: float = 0.01,
    opsm_delta: float = 0.5,
    advantages: Tensor | None = None,
) -> dict[str, Tensor]:
    """{rule: its [B, T] bool keep mask} for each of `rules` (names of MASK_RULES, each at most once),
    with that rule's setting; `advantages` ([B, T]) is needed by opsm only. Chain them with `chain`."""
    _check_shapes(old_logprobs, rollout_logprobs, mask)
    unknown = [r for r in rules if r not in MASK_RULES]
    if unknown or len(set(rules)) != len(rules):
        raise ValueError(f"rules must be distinct names from {', '.join(MASK_RULES)}, got {list(rules)}")
    if "opsm" in rules and advantages is None:
        raise ValueError("the opsm rule needs the advantages")
    build = {
        "geo_rs": lambda: geo_rs_keep(old_logprobs, rollout_logprobs, mask, lower=geo_rs_bounds[0], upper=geo_rs_bounds[1]),
        "icepop": lambda: icepop_keep(old_logprobs, rollout_logprobs, mask, lower=icepop_bounds[0], upper=icepop_bounds[1]),
        "k3_rs": lambda: kl_rs_keep(old_logprobs, rollout_logprobs, mask, estimator="k3", threshold=k3_rs_threshold),
        "k2_mean_rs": lambda: kl_rs_keep(old_logprobs, rollout_logprobs, mask, estimator="k2", threshold=k2_rs_threshold),
        "k2_max_rs": lambda: kl_rs_keep(old_logprobs, rollout_logprobs, mask, estimator="k2", threshold=k2_rs_threshold,
                                        reduce="max"),
        "opsm": lambda: opsm_keep(old_logprobs, rollout_logprobs, advantages, mask, delta=opsm_delta),
    }
    return {rule: build[rule]() for rule in rules}


def chain(keeps: Iterable[Tensor], *, like: Tensor) -> Tensor:
    """The intersection of keep masks: [B, T] bool (the shape of `like`), True where every rule keeps the
    token; all True for no rule. verl chains its rejection options the same way (every one must pass)."""
    out = torch.ones(like.shape, dtype=torch.bool, device=like.device)
    for keep in keeps:
        out = out & keep
    return out


def bypass_weights(logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor, *, mode: CorrectionMode | None,
                   level: CorrectionLevel = "token", cap: float = 2.0, lower: float | None = None,
                   rules: Sequence[str] = (), **settings) -> Tensor:
    """The policy-gradient weights of bypass mode (old logprobs := the engine's): the importance weight of
    `mode` and the keep masks of `rules`, both between the current policy π_θ (its logprobs detached) and
    the rollout engine's, computed in the loss on each micro-batch, as verl's
    `compute_policy_loss_bypass_mode` computes them from `log_prob` and `rollout_log_prob`.

        w = correction_weights(π_θ, π_rollout)[0] · chain(rule_keeps(π_θ, π_rollout, rules))

    A rejected token is a zero term (verl's engine path divides by the loss-mask count taken before the
    loss, so rejected tokens stay in it: `rejected: zero`).

    logprobs: [B, T] π_θ's logprobs (grad is not followed); rollout_logprobs, mask: [B, T]; mode: "tis",
    "mis" or None (no weight, the keep masks alone); level, cap, lower: as `correction_weights`; rules: names
    of MASK_RULES but opsm; settings: `rule_keeps`' keyword arguments. -> [B, T] weights (detached, 0 at
    masked tokens).
    """
    current = logprobs.detach()
    if mode is None:
        weights = mask.to(current.dtype)
    else:
        weights, _ = correction_weights(current, rollout_logprobs, mask, mode=mode, level=level, cap=cap, lower=lower)
    keeps = rule_keeps(current, rollout_logprobs, mask, list(rules), **settings)
    return weights * chain(keeps.values(), like=mask).to(weights.dtype)


def mismatch_kl(old_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """(k1, k3): two estimates of KL(π_rollout ‖ π_old) per token, averaged over the masked tokens ([] each).

        k1 = mean_t (log π_rollout - log π_old)    unbiased, can be negative
        k3 = mean_t (ρ_t - 1 - log ρ_t)           unbiased, >= 0 per token

    unbiased because the tokens were sampled from π_rollout. verl's `compute_offpolicy_metrics` "kl" and
    "k3_kl". log ρ is clamped to ±SAFETY_BOUND inside k3 (verl's is not: there a token e^89 apart makes
    the metric inf; here it stays finite, and equal wherever |log ρ| <= 20).
    """
    _check_shapes(old_logprobs, rollout_logprobs, mask)
    with torch.no_grad():
        lr = log_ratio(old_logprobs, rollout_logprobs, mask, level="token")  # [B, T], 0 off the mask
        bounded = lr.clamp(-SAFETY_BOUND, SAFETY_BOUND)
        m = mask.to(lr.dtype)
        count = m.sum().clamp(min=1.0)
        k1 = -(lr * m).sum() / count
        k3 = ((torch.exp(bounded) - 1.0 - bounded) * m).sum() / count
    return k1, k3


# ----------------------------------------------------------------------------- the step's correction
@dataclass(frozen=True)
class Corrected:
    """What the correction leaves of a batch: the policy-gradient term's weights, the loss mask and the
    correction's metrics."""

    weights: Tensor | None  # [B, T] importance weights times the rules' keep masks; None: no weight (1 everywhere)
    loss_mask: Tensor  # [B, T] the loss mask given, less the rejected tokens with drop
    metrics: dict[str, float]  # rollout_corr/k1_kl, k3_kl, <rule>_rejected; actor/rollout_is_weight, _over_cap


def rollout_correction(old_logprobs: Tensor, rollout_logprobs: Tensor, response_mask: Tensor, loss_mask: Tensor, *,
                       mode: CorrectionMode | None = None, level: CorrectionLevel = "token", cap: float = 2.0,
                       lower: float | None = None, rules: Sequence[str] = (), drop: bool = False,
                       **settings) -> Corrected:
    """The importance weights of `mode` between the trainer's old logprobs and the sampling ones
    (`correction_weights`; None: no weight), times the keep masks of `rules` but the ADVANTAGE_RULES, which
    wait for the advantages (`advantage_rejection`); with `drop` the tokens they zero leave the loss mask too,
    so the normalisers (a token tis capped keeps the weight C and stays). With a weight or a rule on, the gap
    itself is measured over `loss_mask` (rollout_corr/k1_kl, k3_kl: `mismatch_kl`), each weight's mean and
    cut share (actor/rollout_is_weight, _over_cap) and each rule's rejected share, of `loss_mask`'s tokens
    and on its own (rollout_corr/<rule>_rejected). verl's `compute_rollout_correction_and_rejection_mask`.

    old_logprobs, rollout_logprobs, response_mask: [B, T] as `correction_weights`; loss_mask: [B, T] the sample
    filters' mask; mode, level, cap, lower: as `correction_weights`; rules: names of MASK_RULES; settings:
    `rule_keeps`' keyword arguments. -> Corrected, the loss mask returned as given when nothing is on.
    """
    if mode is None and not rules:
        return Corrected(weights=None, loss_mask=loss_mask, metrics={})
    k1, k3 = mismatch_kl(old_logprobs, rollout_logprobs, loss_mask)
    metrics = {"rollout_corr/k1_kl": float(k1), "rollout_corr/k3_kl": float(k3)}
    weights, kept = None, loss_mask
    if mode is not None:
        weights, rejected = correction_weights(old_logprobs, rollout_logprobs, response_mask, mode=mode, level=level,
                                               cap=cap, lower=lower)
        metrics["actor/rollout_is_weight"] = float(masked_mean(weights, loss_mask))
        metrics["actor/rollout_is_over_cap"] = float(masked_mean(rejected, loss_mask))
        if drop:  # only the zeroed tokens leave: a token tis capped keeps the weight C and stays
            kept = loss_mask * (1.0 - rejected * (weights == 0).to(rejected.dtype))
    keeps = rule_keeps(old_logprobs, rollout_logprobs, response_mask, [r for r in rules if r not in ADVANTAGE_RULES],
                       **settings)
    out = _rejection(keeps, weights, kept, filtered=loss_mask, drop=drop)
    return Corrected(weights=out.weights, loss_mask=out.loss_mask, metrics={**metrics, **out.metrics})


def advantage_rejection(old_logprobs: Tensor, rollout_logprobs: Tensor, response_mask: Tensor, advantages: Tensor, *,
                        weights: Tensor | None, loss_mask: Tensor, filtered: Tensor, rules: Sequence[str] = (),
                        drop: bool = False, **settings) -> Corrected:
    """The ADVANTAGE_RULES of `rules` (opsm), applied once the advantages are computed: `weights` and
    `loss_mask` (those `rollout_correction` left, [B, T]) less the tokens they reject, and each rule's rejected
    share of the sample filters' tokens `filtered` [B, T]. The trainer's old logprobs stand for the current
    policy (`opsm_keep` says when that equals TRL's per-micro-batch mask), so the update stays one loss with
    one weight per token. advantages: [B, T]; the rest as `rollout_correction`. -> Corrected."""
    rules = [r for r in rules if r in ADVANTAGE_RULES]
    if not rules:
        return Corrected(weights=weights, loss_mask=loss_mask, metrics={})
    keeps = rule_keeps(old_logprobs, rollout_logprobs, response_mask, rules, advantages=advantages, **settings)
    return _rejection(keeps, weights, loss_mask, filtered=filtered, drop=drop)


def _rejection(keeps: dict[str, Tensor], weights: Tensor | None, loss_mask: Tensor, *, filtered: Tensor,
               drop: bool) -> Corrected:
    """Each rule's share of the `filtered` tokens that it rejects (rollout_corr/<rule>_rejected, each rule on
    its own), then the rules chained: a token is kept only if every rule keeps it. A rejected token's weight
    becomes 0 (a zero term); with `drop` it also leaves the loss mask (verl's rejection)."""
    if not keeps:
        return Corrected(weights=weights, loss_mask=loss_mask, metrics={})
    metrics = {f"rollout_corr/{rule}_rejected": float(masked_mean((~keep).to(filtered.dtype), filtered))
               for rule, keep in keeps.items()}
    keep = chain(keeps.values(), like=loss_mask).to(loss_mask.dtype)  # [B, T] 1 = kept by every rule
    return Corrected(weights=keep if weights is None else weights * keep,
                     loss_mask=loss_mask * keep if drop else loss_mask, metrics=metrics)
