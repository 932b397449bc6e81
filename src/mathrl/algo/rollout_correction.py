"""Rollout/trainer mismatch correction: importance weights between the rollout engine and the trainer.

The rollout engine (vLLM, bf16 kernels, another attention implementation) samples from a
distribution π_rollout that is not exactly the trainer's π_old, although both hold the same weights.
The PPO ratio π_θ/π_old is then computed against the wrong behaviour policy and the update is
silently off-policy. The fix weighs the policy-gradient term of each token by the importance ratio
between the two, detached:

    ρ = π_old(y) / π_rollout(y) = exp(old_logprobs − rollout_logprobs)

* TIS, truncated importance sampling (Yao et al. 2025, "Your Efficient RL Framework Secretly Brings
  You Off-Policy RL Training"): weight min(ρ, C); the cap C bounds the variance.
* MIS, masked importance sampling (Liu, Li et al. 2025, "When Speed Kills Stability: Demystifying
  RL Collapse from the Training-Inference Mismatch"): weight ρ · 1[ρ ≤ C]; tokens (or whole
  sequences) whose ratio is over the cap are dropped from the gradient instead of capped.

At `level="token"` ρ is per token; at `level="sequence"` it is the ratio of the whole response,
exp(Σ_t (old − rollout)), given to every token of the row (the exact sequence-level correction,
with more variance). The weight multiplies the per-token policy loss before aggregation; the
normalisers of `losses.aggregate` stay the loss-mask counts, so a dropped token counts as a zero
term (the gradient never depends on how the batch was split). Weights are computed without grad.

    w, keep = correction_weights(old_lp, rollout_lp, mask, mode="tis", level="token", cap=2.0)
    per_token, stats = policy_loss(lp, old_lp, adv, mask)
    loss = aggregate(per_token * w, mask, mode=..., num_tokens=..., num_seqs=...)

Run the tests with ``python -m pytest tests/test_rollout_correction.py -q``.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

__all__ = ["CorrectionMode", "CorrectionLevel", "correction_weights", "log_ratio"]

CorrectionMode = Literal["tis", "mis"]
CorrectionLevel = Literal["token", "sequence"]


def _check(old_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor, cap: float) -> None:
    shapes = {tuple(old_logprobs.shape), tuple(rollout_logprobs.shape), tuple(mask.shape)}
    if len(shapes) != 1 or old_logprobs.dim() != 2:
        raise ValueError(
            "old_logprobs, rollout_logprobs and mask must be [B, T] of the same shape, got "
            f"{tuple(old_logprobs.shape)}, {tuple(rollout_logprobs.shape)}, {tuple(mask.shape)}"
        )
    if not cap > 1.0 or not math.isfinite(cap):
        raise ValueError(f"cap must be a finite number > 1 (an importance ratio of 1 is on-policy), got {cap}")


def log_ratio(old_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor, *, level: CorrectionLevel) -> Tensor:
    """log ρ: per token, or per sequence broadcast over the row's tokens; 0 at masked tokens.

    Args:
        old_logprobs: [B, T] trainer logprobs of the sampled tokens under the weights that sampled.
        rollout_logprobs: [B, T] the rollout engine's logprobs of the same tokens.
        mask: [B, T] nonzero on the sampled tokens (the sequence ratio is over these).
        level: "token" or "sequence".

    Returns:
        [B, T] log-ratio (detached).
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

    Args:
        old_logprobs: [B, T] trainer logprobs (π_old, the weights the engine sampled with).
        rollout_logprobs: [B, T] engine logprobs of the same tokens (π_rollout).
        mask: [B, T] nonzero on the sampled tokens.
        mode: "tis" or "mis".
        level: "token" or "sequence".
        cap: C > 1.
        lower: L in (0, 1), or None.

    Returns:
        weights: [B, T] detached, 0 at masked tokens; multiply the per-token policy loss by it.
        rejected: [B, T] float, 1 where the weight was cut: ρ > C (capped by tis, zeroed by mis) or
            ρ < L (zeroed by both); the token, or every token of the sequence.
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
