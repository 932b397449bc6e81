"""The policy losses by name (algo.policy_loss): PPO's clipped surrogate and the losses the field adopted
after it, each a pure function on plain tensors, registered in `mathrl.registry.POLICY_LOSSES`.

    token_loss, stats = fn(logprobs, old_logprobs, advantages, mask, *, weights=None, **hyperparameters)

All inputs [B, T]; the per-token loss [B, T] is 0 at masked tokens and already weighted, `stats` are
detached per-token floats [B, T] for actor/<key> (a `seq_*` stat is reduced over sequences);
`losses.aggregate` reduces the loss with the entry's aggregation or algo.loss_agg (docs/architecture.md,
"Policy losses"; the stats: docs/metrics.md). Each equals verl's
`compute_policy_loss_<name>` (@1dda039) but `gspo` under weights that vary within a row (docs/tricks.md).
A new loss is one function and one registration:

    def my_loss(logprobs, old_logprobs, advantages, mask, *, weights=None, beta=0.1):
        return weigh(-advantages * logprobs + beta * (logprobs - old_logprobs) ** 2, mask, weights), {}
    POLICY_LOSSES.register("mine", PolicyLoss(my_loss, params=lambda algo: {"beta": 0.1}))
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from mathrl.algo.losses import _LOG_RATIO_CLAMP, _check_same_shape, masked_mean, masked_sum, policy_loss
from mathrl.registry import POLICY_LOSSES

__all__ = [
    "PolicyLoss", "weigh", "ppo_clip", "gspo", "gspo_token", "cispo", "sapo", "geo_mean", "dppo_tv", "dppo_kl",
    "clip_cov", "kl_cov", "gpg", "dro", "top_entropy_mask",
]

SEQ_AGG = "seq_mean_token_mean"  # the aggregation of the sequence-level losses (gspo, sapo, geo_mean)


@dataclass(frozen=True)
class PolicyLoss:
    """A registered policy loss: its function, the keyword arguments a config gives it, and what it is."""

    fn: Callable[..., tuple[Tensor, dict[str, Tensor]]]
    params: Callable[[Any], dict[str, Any]] = lambda algo: {}  # the config's algo section -> the fn's hyperparameters
    agg: str | None = None  # its own aggregation (losses.AGG_MODES); None: algo.loss_agg
    sequence_ratio: bool = False  # one importance ratio per sequence: no token of a row has its own gradient weight
    dual_clip: bool = False  # reads algo.clip.dual_clip_c
    needs_generator: bool = False  # picks tokens at random: the caller passes a seeded torch.Generator
    # {algo.clip key: the loss's published value}: applied when the user sets no algo.clip.* of that name
    # (config/load.py); empty for a loss that reads no clip. `clip_defaults(fn)` reads them off the signature.
    defaults: dict[str, float] = field(default_factory=dict)


def weigh(loss: Tensor, mask: Tensor, weights: Tensor | None) -> Tensor:
    """[B, T] the per-token loss times the importance weights (if any), 0 at masked tokens."""
    m = mask.bool()
    if weights is not None:  # a weight at padding never reaches the product (nor its gradient)
        loss = loss * torch.where(m, weights.to(loss.device), torch.zeros((), dtype=loss.dtype, device=loss.device))
    return torch.where(m, loss, torch.zeros_like(loss))


def _stat(x: Tensor, mask: Tensor) -> Tensor:
    """[B, T] a detached float statistic, 0 at masked tokens."""
    return torch.where(mask.bool(), x.detach().to(torch.float32), torch.zeros((), dtype=torch.float32, device=x.device))


def _inputs(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The three inputs with 0 at masked positions (shapes checked): padding may hold -inf logprobs or
    NaN advantages, and a product taken before the final mask would carry them into the gradient."""
    _check_same_shape(logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages, mask=mask)
    m, zero = mask.bool(), torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    return torch.where(m, logprobs, zero), torch.where(m, old_logprobs, zero), torch.where(m, advantages, zero)


def _ratio(logprobs: Tensor, old_logprobs: Tensor) -> tuple[Tensor, Tensor]:
    """(log ratio clamped to [-20, 20], ratio) [B, T]: exp() stays finite (as verl clamps)."""
    log_ratio = (logprobs - old_logprobs).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    return log_ratio, torch.exp(log_ratio)


def _seq_mean(x: Tensor, mask: Tensor) -> Tensor:
    """[B] the mean of x over each row's counted tokens (0 for a row with none)."""
    return masked_sum(x, mask, -1) / mask.bool().sum(-1).to(x.dtype).clamp_min(1)


def _sides(clipped: Tensor, advantages: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """pg_clipfrac_low / pg_clipfrac_high [B, T]: the clipped tokens (`clipped` [B, T] bool) split by the side
    whose bound took effect: the lower bound where A < 0, the upper where A > 0 (verl's pg_clipfrac, by side)."""
    return {"pg_clipfrac_low": _stat(clipped & (advantages < 0), mask), "pg_clipfrac_high": _stat(clipped & (advantages > 0), mask)}


def _seq_stats(s: Tensor, clipped: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """The sequence ratio's statistics, each row's value [B] on its counted tokens [B, T]: seq_ratio_mean /
    _min / _max (train/update.py reduces them over the step's sequences: a mean per sequence, the smallest,
    the largest) and seq_clipfrac, the share of sequences clipped."""
    return {"seq_ratio_mean": _stat(_per_row(s, mask), mask), "seq_ratio_min": _stat(_per_row(s, mask), mask),
            "seq_ratio_max": _stat(_per_row(s, mask), mask), "seq_clipfrac": _stat(_per_row(clipped.float(), mask), mask)}


def _per_row(seq_loss: Tensor, mask: Tensor) -> Tensor:
    """[B, T] each row's loss on each of its counted tokens (seq_mean_token_mean sums it once per row)."""
    return torch.where(mask.bool(), seq_loss[:, None].expand(mask.shape), torch.zeros((), dtype=seq_loss.dtype,
                                                                                        device=seq_loss.device))


# ----------------------------------------------------------------------------- PPO
def ppo_clip(logprobs, old_logprobs, advantages, mask, *, weights=None, eps_low=0.2, eps_high=0.28, dual_clip_c=None):
    """PPO's clipped surrogate with clip-higher and optional dual clip (`losses.policy_loss`, which has
    the formulas); verl's `vanilla`. The default."""
    loss, info = policy_loss(logprobs, old_logprobs, advantages, mask, eps_low=eps_low, eps_high=eps_high,
                             dual_clip_c=dual_clip_c)
    return weigh(loss, mask, weights), {"pg_clipfrac": info["clipped"], "pg_clipfrac_lower": info["dual_clipped"],
                                        "ppo_kl": info["ppo_kl"], **_sides(info["clipped"].bool(), advantages, mask)}


# ----------------------------------------------------------------------------- sequence-level ratios
def gspo(logprobs, old_logprobs, advantages, mask, *, weights=None, eps_low=3e-4, eps_high=4e-4):
    """GSPO (Zheng et al. 2025, arXiv 2507.18071, eq. 5-7): one importance ratio per sequence, the
    geometric mean of its token ratios, clipped per sequence:

        s_i = exp(mean_t (logprobs - old_logprobs))        (log s_i clamped at 10, as verl)
        l_i = -min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i),  A_i = mean_t A_it

    Every counted token of row i carries l_i; aggregate with seq_mean_token_mean. The paper's clip
    range is tiny (3e-4, 4e-4) because s_i is a per-token geometric mean. With an advantage constant
    over each row (every outcome estimator) this equals verl's `gspo` (which is GSPO-token, `gspo_token`).
    Token-level importance weights weigh the row by their mean over its tokens.

    Returns stats pg_clipfrac (the row's clip, on each of its tokens), pg_clipfrac_lower (0), ppo_kl.
    """
    logprobs, old_logprobs, advantages = _inputs(logprobs, old_logprobs, advantages, mask)
    log_ratio = logprobs - old_logprobs  # [B, T]
    log_s = _seq_mean(log_ratio, mask).clamp(max=10.0)  # [B]
    s = torch.exp(log_s)  # [B]
    adv = _seq_mean(advantages, mask)  # [B]
    unclipped, clipped = -adv * s, -adv * s.clamp(1.0 - eps_low, 1.0 + eps_high)  # [B]
    loss = _per_row(torch.maximum(unclipped, clipped), mask)  # [B, T]
    row_clipped = clipped > unclipped  # [B]
    return weigh(loss, mask, weights), {"pg_clipfrac": _stat(_per_row(row_clipped.float(), mask), mask),
                                        "pg_clipfrac_lower": _stat(torch.zeros_like(loss), mask),
                                        "ppo_kl": _stat(-log_ratio, mask),
                                        **_sides(_per_row(row_clipped.float(), mask).bool(), _per_row(adv, mask), mask),
                                        **_seq_stats(s, row_clipped, mask)}


def gspo_token(logprobs, old_logprobs, advantages, mask, *, weights=None, eps_low=3e-4, eps_high=4e-4):
    """GSPO-token (Zheng et al. 2025, eq. 13-14): the sequence ratio's value with each token's own gradient,

        s_it = sg[s_i] * pi_theta(y_t) / sg[pi_theta(y_t)],   l_it = -min(s_it A_it, clip(s_it) A_it)

    so a per-token advantage is allowed; with a constant advantage per row the gradient is GSPO's.
    verl's `gspo`. Aggregate with seq_mean_token_mean."""
    logprobs, old_logprobs, advantages = _inputs(logprobs, old_logprobs, advantages, mask)
    log_ratio = logprobs - old_logprobs  # [B, T]
    log_s = _seq_mean(log_ratio, mask).detach()  # [B]
    log_st = (logprobs - logprobs.detach() + log_s[:, None]).clamp(max=10.0)  # [B, T]
    s = torch.exp(log_st)
    unclipped, clipped = -advantages * s, -advantages * s.clamp(1.0 - eps_low, 1.0 + eps_high)
    loss = torch.maximum(unclipped, clipped)
    s_row = torch.exp(log_s.clamp(max=10.0))  # [B] the sequence ratio's value
    adv_row = _seq_mean(advantages, mask)  # [B]
    row_clipped = -adv_row * s_row.clamp(1.0 - eps_low, 1.0 + eps_high) > -adv_row * s_row  # [B], as gspo's
    return weigh(loss, mask, weights), {"pg_clipfrac": _stat((clipped > unclipped).float(), mask),
                                        "pg_clipfrac_lower": _stat(torch.zeros_like(loss), mask),
                                        "ppo_kl": _stat(-log_ratio, mask), **_sides(clipped > unclipped, advantages, mask),
                                        **_seq_stats(s_row, row_clipped, mask)}


def geo_mean(logprobs, old_logprobs, advantages, mask, *, weights=None, eps_low=0.4, eps_high=0.4):
    """GMPO (Zhao et al. 2025, arXiv 2507.20673, eq. 4): the geometric mean of the token ratios, each
    clipped in LOG space to [-eps_low, eps_high] on the side that matters for the advantage's sign:

        r_it = sgn(A) * min(sgn(A) * log_ratio_it, sgn(A) * clip(log_ratio_it, -eps_low, eps_high))
        l_i  = -A_i * exp(mean_t r_it),   A_i = mean_t A_it

    (eps 0.4 is the paper's (e^-0.4, e^0.4)). No log-ratio clamp, as verl. Importance weights enter as
    their geometric mean over the row. Every counted token of row i carries l_i; aggregate with
    seq_mean_token_mean (verl averages over all rows of the batch, empty rows included; mathrl over the
    rows with a counted token).

    Returns stats pg_clipfrac (the log clip active where A > 0), pg_clipfrac_lower (where A < 0), ppo_kl.
    """
    logprobs, old_logprobs, advantages = _inputs(logprobs, old_logprobs, advantages, mask)
    log_ratio = logprobs - old_logprobs  # [B, T]
    sgn = torch.sign(advantages)
    clamped = log_ratio.clamp(-eps_low, eps_high)
    pessimistic = sgn * torch.minimum(sgn * log_ratio, sgn * clamped)  # [B, T]
    seq_loss = -_seq_mean(advantages, mask) * torch.exp(_seq_mean(pessimistic, mask))  # [B]
    if weights is not None:
        seq_loss = seq_loss * torch.exp(_seq_mean(torch.log(weights.to(seq_loss.device) + 1e-10), mask))
    clipped = (log_ratio != clamped).float()
    binds = (pessimistic != log_ratio) & mask.bool()  # [B, T] the bound on the advantage's side took effect
    return _per_row(seq_loss, mask), {"pg_clipfrac": _stat(clipped * (advantages > 0), mask),
                                      "pg_clipfrac_lower": _stat(clipped * (advantages < 0), mask),
                                      "ppo_kl": _stat(-log_ratio, mask), **_sides(binds, advantages, mask),
                                      **_seq_stats(torch.exp(_seq_mean(log_ratio, mask)), binds.any(-1), mask)}


# ----------------------------------------------------------------------------- every token keeps a gradient
def cispo(logprobs, old_logprobs, advantages, mask, *, weights=None, eps_low=1.0, eps_high=0.2):
    """CISPO (MiniMax-M1, arXiv 2506.13585, eq. 4-5): clip the importance weight, stop its gradient,
    and keep every token's gradient:

        l_it = -sg[clip(ratio_it, 1 - eps_low, 1 + eps_high)] * A_it * logprobs_it

    The method bounds the weight from above only: eps_low 1.0 (the weight's lower bound 0, never
    reached); eps_high 0.2 as verl's CISPO example.

    Returns stats pg_clipfrac (the weight was clipped), pg_clipfrac_lower (0), ppo_kl."""
    logprobs, old_logprobs, advantages = _inputs(logprobs, old_logprobs, advantages, mask)
    log_ratio, ratio = _ratio(logprobs, old_logprobs)
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high).detach()
    loss = -clipped * advantages * logprobs
    return weigh(loss, mask, weights), {"pg_clipfrac": _stat((ratio != clipped).float(), mask),
                                        "pg_clipfrac_lower": _stat(torch.zeros_like(loss), mask),
                                        "ppo_kl": _stat(-log_ratio, mask),
                                        "pg_clipfrac_low": _stat(ratio < 1.0 - eps_low, mask),
                                        "pg_clipfrac_high": _stat(ratio > 1.0 + eps_high, mask)}


def sapo(logprobs, old_logprobs, advantages, mask, *, weights=None, tau_pos=1.0, tau_neg=1.05):
    """SAPO (Gao et al. 2025, arXiv 2511.20347, eq. 6): a smooth, temperature-gated trust region in
    place of the hard clip:

        l_it = -f(ratio_it; tau) * A_it,   f(r; tau) = sigmoid(tau (r - 1)) * 4 / tau
        tau = tau_pos where A > 0, else tau_neg

    f's gradient is 1 at r = 1 and decays smoothly away from it. Aggregate with seq_mean_token_mean.
    Returns stats pg_clipfrac and pg_clipfrac_lower (0: nothing is clipped), ppo_kl."""
    logprobs, old_logprobs, advantages = _inputs(logprobs, old_logprobs, advantages, mask)
    log_ratio, ratio = _ratio(logprobs, old_logprobs)
    tau = torch.where(advantages > 0, torch.as_tensor(tau_pos, dtype=ratio.dtype),
                      torch.as_tensor(tau_neg, dtype=ratio.dtype))
    loss = -torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau) * advantages
    zeros = _stat(torch.zeros_like(loss), mask)
    return weigh(loss, mask, weights), {"pg_clipfrac": zeros, "pg_clipfrac_lower": zeros.clone(),
                                        "pg_clipfrac_low": zeros.clone(), "pg_clipfrac_high": zeros.clone(),
                                        "ppo_kl": _stat(-log_ratio, mask)}


def _dppo(logprobs, old_logprobs, advantages, mask, weights, valid: Tensor, ratio: Tensor, log_ratio: Tensor,
          trunc_c: float):
    """DPPO's loss once its trust-region mask `valid` [B, T] is known (shared by dppo_tv and dppo_kl)."""
    truncated = ratio.clamp(max=trunc_c).detach()
    valid = valid.detach().to(logprobs.dtype)
    loss = -advantages * truncated * logprobs * valid
    removed, up = valid == 0, advantages > 0  # the mask's upper check applies where A > 0, its lower elsewhere
    return weigh(loss, mask, weights), {"pg_clipfrac": _stat(1.0 - valid, mask),
                                        "pg_clipfrac_lower": _stat((ratio > trunc_c).float() * valid, mask),
                                        "ppo_kl": _stat(-log_ratio, mask), "pg_clipfrac_low": _stat(removed & ~up, mask),
                                        "pg_clipfrac_high": _stat(removed & up, mask)}


def dppo_tv(logprobs, old_logprobs, advantages, mask, *, weights=None, delta_low=0.2, delta_high=0.2, trunc_c=20.0):
    """DPPO-Binary-TV (arXiv 2602.04879, §4): a trust region on the probability itself, enforced by a
    mask only in the harmful direction, with a truncated, stopped importance weight (§5.4):

        valid_it = (p - p_old <= delta_high) if A > 0 else (p - p_old >= -delta_low)
        l_it     = -A_it * sg[min(ratio_it, trunc_c)] * logprobs_it * valid_it

    Returns stats pg_clipfrac (the mask removed the token), pg_clipfrac_lower (valid, ratio over
    trunc_c), ppo_kl."""
    logprobs, old_logprobs, advantages = _inputs(logprobs, old_logprobs, advantages, mask)
    log_ratio, ratio = _ratio(logprobs, old_logprobs)
    diff = torch.exp(logprobs) - torch.exp(old_logprobs)
    valid = torch.where(advantages > 0, diff <= delta_high, diff >= -delta_low)
    return _dppo(logprobs, old_logprobs, advantages, mask, weights, valid, ratio, log_ratio, trunc_c)


def dppo_kl(logprobs, old_logprobs, advantages, mask, *, weights=None, delta_low=0.2, delta_high=0.2, trunc_c=20.0):
    """DPPO-Binary-KL (arXiv 2602.04879, §4): as dppo_tv with the binary KL between Bernoulli(p_old)
    and Bernoulli(p) (the sampled token against the rest) as the divergence:

        D = p_old log(p_old / p) + (1 - p_old) log((1 - p_old + 1e-8) / (1 - p + 1e-8))
        valid_it = (D <= delta_high or p <= p_old) if A > 0 else (D <= delta_low or p >= p_old)
    """
    logprobs, old_logprobs, advantages = _inputs(logprobs, old_logprobs, advantages, mask)
    log_ratio, ratio = _ratio(logprobs, old_logprobs)
    p, p_old = torch.exp(logprobs), torch.exp(old_logprobs)
    binary_kl = p_old * (old_logprobs - logprobs) + (1 - p_old) * torch.log((1.0 - p_old + 1e-8) / (1.0 - p + 1e-8))
    valid = torch.where(advantages > 0, (binary_kl <= delta_high) | (p <= p_old), (binary_kl <= delta_low) | (p >= p_old))
    return _dppo(logprobs, old_logprobs, advantages, mask, weights, valid, ratio, log_ratio, trunc_c)


# ----------------------------------------------------------------------------- covariance-selected tokens
def _covariance(advantages: Tensor, logprobs: Tensor, mask: Tensor) -> Tensor:
    """[B, T] (A - mean A)(logp - mean logp) over the counted tokens (Cui et al. 2025, eq. 9), detached."""
    lp = logprobs.detach()
    return (advantages - masked_mean(advantages, mask)) * (lp - masked_mean(lp, mask))


def clip_cov(logprobs, old_logprobs, advantages, mask, *, weights=None, eps_low=0.2, eps_high=0.28, cov_ratio=2e-4,
             cov_lb=1.0, cov_ub=5.0, generator: torch.Generator | None = None):
    """Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs", arXiv 2505.22617,
    §4.2): PPO's clipped surrogate, with the gradient of a few tokens of high covariance between logp
    and A cut: among the counted tokens the ratio clip leaves alone whose covariance is in (cov_lb,
    cov_ub), max(1, int(cov_ratio x counted tokens)) are picked at random (from `generator`, or torch's
    global generator if None) and their loss set to 0. The covariance is centred on this call's tokens.

    Returns stats pg_clipfrac (the picked tokens, as verl), pg_clipfrac_lower (0), ppo_kl, and
    cov_selected_frac (the picked tokens again: the tokens the method touches)."""
    logprobs, old_logprobs, advantages = _inputs(logprobs, old_logprobs, advantages, mask)
    m = mask.bool()
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    unclipped, clipped = -advantages * ratio, -advantages * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    cov = _covariance(advantages, logprobs, mask)
    candidates = m & ~(clipped > unclipped) & (cov > cov_lb) & (cov < cov_ub)
    picked = torch.zeros_like(m)
    idx = torch.nonzero(candidates)  # [K, 2], row-major
    if len(idx):
        n_pick = max(int(cov_ratio * float(m.sum())), 1)
        idx = idx[torch.randperm(len(idx), generator=generator)[:n_pick]]
        picked[idx[:, 0], idx[:, 1]] = True
    loss = torch.where(picked, torch.zeros_like(ratio), torch.maximum(unclipped, clipped))
    return weigh(loss, mask, weights), {"pg_clipfrac": _stat(picked.float(), mask),
                                        "pg_clipfrac_lower": _stat(torch.zeros_like(loss), mask),
                                        "ppo_kl": _stat(-log_ratio, mask), "cov_selected_frac": _stat(picked.float(), mask),
                                        **_sides(m & (clipped > unclipped), advantages, mask)}


def kl_cov(logprobs, old_logprobs, advantages, mask, *, weights=None, cov_ratio=2e-4, kl_coef=0.1):
    """KL-Cov (Cui et al. 2025, arXiv 2505.22617, §4.2): the unclipped surrogate -ratio A, plus
    kl_coef x |log ratio| on the max(1, int(cov_ratio x counted tokens)) counted tokens of largest
    covariance between logp and A (centred on this call's tokens).

    Returns stats ppo_kl (|log ratio|: verl's kl_cov reports the absolute value), pg_clipfrac and
    pg_clipfrac_lower (0), cov_selected_frac (the penalised tokens)."""
    logprobs, old_logprobs, advantages = _inputs(logprobs, old_logprobs, advantages, mask)
    m = mask.bool()
    log_ratio = logprobs - old_logprobs
    loss = -advantages * torch.exp(log_ratio)
    picked = torch.zeros_like(m)
    flat = torch.nonzero(m.reshape(-1), as_tuple=True)[0]  # counted positions, row-major
    if len(flat):
        cov = _covariance(advantages, logprobs, mask).reshape(-1)[flat].cpu()
        k = max(1, int(len(flat) * cov_ratio))
        picked.view(-1)[flat[torch.topk(cov, k, largest=True).indices.to(flat.device)]] = True
    loss = torch.where(picked, loss + kl_coef * log_ratio.abs(), loss)
    zeros = _stat(torch.zeros_like(loss), mask)
    return weigh(loss, mask, weights), {"pg_clipfrac": zeros, "pg_clipfrac_lower": zeros.clone(),
                                        "pg_clipfrac_low": zeros.clone(), "pg_clipfrac_high": zeros.clone(),
                                        "ppo_kl": _stat(log_ratio.abs(), mask), "cov_selected_frac": _stat(picked.float(), mask)}


# ----------------------------------------------------------------------------- no ratio
def gpg(logprobs, old_logprobs, advantages, mask, *, weights=None):
    """GPG (Chu et al. 2025, arXiv 2504.02546, eq. 6): the plain policy gradient, l_it = -A_it logprobs_it.
    Returns stat ppo_kl (verl returns no metric)."""
    logprobs, old_logprobs, advantages = _inputs(logprobs, old_logprobs, advantages, mask)
    return weigh(-advantages * logprobs, mask, weights), {"ppo_kl": _stat(old_logprobs - logprobs, mask)}


def dro(logprobs, old_logprobs, advantages, mask, *, weights=None, beta=None):
    """DRO, as Tinker and verl (Richemond et al. 2024, "Offline Regularised RL for LLM Alignment"):
    the policy gradient with a quadratic penalty on the log ratio,

        l_it = -(A_it logprobs_it - beta / 2 (logprobs_it - old_logprobs_it)^2)

    Returns stat ppo_kl."""
    logprobs, old_logprobs, advantages = _inputs(logprobs, old_logprobs, advantages, mask)
    if beta is None or not beta > 0:
        raise ValueError(f"dro needs beta > 0 (algo.dro.beta), got {beta}")
    log_ratio = logprobs - old_logprobs
    loss = -(logprobs * advantages - 0.5 * beta * log_ratio.square())
    return weigh(loss, mask, weights), {"ppo_kl": _stat(-log_ratio, mask)}


# ----------------------------------------------------------------------------- 80/20 tokens
def top_entropy_mask(entropy: Tensor, mask: Tensor, *, quantile: float) -> Tensor:
    """The forking tokens (Wang et al. 2025, "Beyond the 80/20 Rule", arXiv 2506.01939, §4): 1 on the
    counted tokens whose entropy is at least the (1 - quantile) quantile of the counted tokens'
    entropies, as TRL's `top_entropy_quantile` (quantile 0.2: the top 20%; 1.0: every token; 0: the
    (1 - 0) quantile is the maximum, so only the highest-entropy token keeps its gradient, with its ties).

    entropy: [B, T] the token entropies (of the policy that sampled, or the old policy); mask: [B, T] nonzero on
    counted tokens; quantile: in [0, 1], the share of tokens kept. -> [B, T] float, 1 on kept tokens, 0
    elsewhere.
    """
    _check_same_shape(entropy=entropy, mask=mask)
    if not 0.0 <= quantile <= 1.0:
        raise ValueError(f"quantile must be in [0, 1], got {quantile}")
    m = mask.bool()
    if not m.any():
        return torch.zeros_like(entropy, dtype=torch.float32)
    threshold = torch.quantile(entropy[m].float(), 1.0 - quantile)
    return ((entropy >= threshold) & m).float()


# ----------------------------------------------------------------------------- the registry
CLIP_KEYS = ("eps_low", "eps_high")  # the algo.clip fields a loss's own defaults can set


def clip_defaults(fn: Callable[..., Any]) -> dict[str, float]:
    """{eps_low, eps_high: their defaults in `fn`'s signature}: the values the loss is published with."""
    params = inspect.signature(fn).parameters
    return {k: params[k].default for k in CLIP_KEYS if k in params}


def _clip(algo) -> dict[str, float]:
    return {"eps_low": algo.clip.eps_low, "eps_high": algo.clip.eps_high}


def _dppo_params(algo) -> dict[str, float]:
    d = algo.dppo
    return {"delta_low": d.delta_low, "delta_high": d.delta_high, "trunc_c": d.trunc_c}


POLICY_LOSSES.register("ppo_clip", PolicyLoss(
    ppo_clip, params=lambda algo: {**_clip(algo), "dual_clip_c": algo.clip.dual_clip_c}, dual_clip=True,
    defaults=clip_defaults(ppo_clip)))
POLICY_LOSSES.register("gspo", PolicyLoss(gspo, params=_clip, agg=SEQ_AGG, sequence_ratio=True,
                                          defaults=clip_defaults(gspo)))
POLICY_LOSSES.register("gspo_token", PolicyLoss(gspo_token, params=_clip, agg=SEQ_AGG, defaults=clip_defaults(gspo_token)))
POLICY_LOSSES.register("cispo", PolicyLoss(cispo, params=_clip, defaults=clip_defaults(cispo)))
POLICY_LOSSES.register("sapo", PolicyLoss(
    sapo, params=lambda algo: {"tau_pos": algo.sapo.tau_pos, "tau_neg": algo.sapo.tau_neg}, agg=SEQ_AGG))
POLICY_LOSSES.register("geo_mean", PolicyLoss(geo_mean, params=_clip, agg=SEQ_AGG, sequence_ratio=True,
                                              defaults=clip_defaults(geo_mean)))
POLICY_LOSSES.register("dppo_tv", PolicyLoss(dppo_tv, params=_dppo_params))
POLICY_LOSSES.register("dppo_kl", PolicyLoss(dppo_kl, params=_dppo_params))
POLICY_LOSSES.register("clip_cov", PolicyLoss(
    clip_cov, params=lambda algo: {**_clip(algo), "cov_ratio": algo.cov.ratio, "cov_lb": algo.cov.lb,
                                  "cov_ub": algo.cov.ub},
    needs_generator=True, defaults=clip_defaults(clip_cov)))
POLICY_LOSSES.register("kl_cov", PolicyLoss(
    kl_cov, params=lambda algo: {"cov_ratio": algo.cov.ratio, "kl_coef": algo.cov.kl_coef}))
POLICY_LOSSES.register("gpg", PolicyLoss(gpg))
POLICY_LOSSES.register("dro", PolicyLoss(dro, params=lambda algo: {"beta": algo.dro.beta}))
