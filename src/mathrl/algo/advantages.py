"""Advantage estimators for critic-free RL on verifiable rewards.

Every function is a pure tensor function: it never modifies its inputs and keeps no state.
Shapes use N = number of sampled responses in the rollout batch, B = sequences, T = response
positions. The loop picks an estimator with ``algo.adv.estimator``:

    grpo          group_advantages(rewards, group_ids, std_normalize=..., std_scope=...)
    rloo          rloo_advantages(rewards, group_ids)
    reinforce_pp  reinforce_pp_advantages(rewards, response_mask, kl_rewards=..., loss_mask=...)
                  = whiten_advantages(discounted_returns(token_rewards, mask), loss_mask)

then broadcasts sequence-level advantages to tokens with ``expand_to_tokens``.

Run the tests with ``python -m pytest tests/test_advantages.py -q``.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from mathrl.algo.groups import GroupStats, group_stats
from mathrl.algo.positions import last_token_index

__all__ = [
    "StdScope",
    "group_advantages",
    "rloo_advantages",
    "whiten_advantages",
    "discounted_returns",
    "reinforce_pp_advantages",
    "expand_to_tokens",
]

StdScope = Literal["group", "batch"]


def _as_float(x: Tensor) -> Tensor:
    """Integer or bool rewards become the default float dtype; float tensors pass through."""
    return x if x.is_floating_point() else x.to(torch.get_default_dtype())


def _group_stats(r: Tensor, group_ids: Tensor) -> tuple[GroupStats, Tensor, Tensor, Tensor]:
    """The groups of ``r``, and per-sample group size, group sum, and whether the sample's group is
    constant (all three [N])."""
    g = group_stats(r, group_ids)
    # Why: sum/n need not round back to r exactly (3 x 0.1 / 3 != 0.1 in floating point), and the
    # rounding residue divided by (std + eps) with std == 0 would be a spurious O(1e-2) advantage.
    # Groups whose rewards are all equal carry no learning signal, so they get an exact 0.
    constant = g.max == g.min  # [G]
    return g, g.count[g.index], g.sum[g.index], constant[g.index]


def group_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    std_normalize: bool = True,
    std_scope: StdScope = "group",
    eps: float = 1e-6,
) -> Tensor:
    """Group-relative advantages: GRPO and Dr. GRPO.

    GRPO (Shao et al. 2024, DeepSeekMath §4.1.2, outcome supervision):
        A_i = (r_i - mean(r_group)) / (std(r_group) + eps)
    Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training", §3.1) removes the std
    division, which biases updates towards too-easy and too-hard questions: ``std_normalize=False``.
    ``std_scope="batch"`` keeps the group mean as baseline but divides by the std of the whole
    batch's rewards (the "group mean, batch std" normalisation studied in Liu et al. 2025, "Part I:
    Tricks or Traps? A Deep Dive into RL for LLM Reasoning"), which is robust when a group's std
    is tiny.

    The std is the *unbiased* (Bessel-corrected, n-1) std, as ``torch.std`` computes it in the
    original GRPO implementations (DeepSeekMath, verl ``compute_grpo_outcome_advantage``, trl).
    ``eps`` is added to the std, as there.

    Edge cases: a single-sample group, and a group whose rewards are all equal, get exactly 0
    (never NaN); the std of a single-sample group is treated as 0.

    Args:
        rewards: [N] scalar reward per response (int, bool or float).
        group_ids: [N] integer id of the prompt each response was sampled from; any values.
        std_normalize: divide by the std (GRPO) or not (Dr. GRPO). Config ``algo.adv.std_normalize``.
        std_scope: ``"group"`` or ``"batch"``. Config ``algo.adv.std_scope``.
        eps: added to the std before dividing.

    Returns:
        [N] advantages, float.
    """
    if std_scope not in ("group", "batch"):
        raise ValueError(f"std_scope must be 'group' or 'batch', got {std_scope!r}")
    r = _as_float(rewards)  # [N]
    groups, count, total, constant = _group_stats(r, group_ids)  # [N] each; validates the shapes
    if r.numel() == 0:
        return r.clone()
    centred = r - total / count  # [N]
    centred = torch.where(constant, torch.zeros_like(centred), centred)
    if not std_normalize:
        return centred

    if std_scope == "group":
        sq_dev = group_stats(centred.square(), group_ids).sum[groups.index]  # [N] group sum of squares
        std = torch.sqrt(sq_dev / (count - 1).clamp_min(1))  # [N] unbiased; singleton -> 0
    else:
        std = r.std() if r.numel() > 1 else r.new_zeros(())  # [] unbiased
    # Constant groups (singletons included) already have centred == 0; dividing them by 1 keeps
    # them at 0 even with eps = 0, where 0 / 0 would be NaN.
    denom = torch.where(constant, torch.ones_like(centred), std + eps)  # [N]
    return centred / denom


def rloo_advantages(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """REINFORCE leave-one-out advantages (RLOO; Ahmadian et al. 2024, "Back to Basics: Revisiting
    REINFORCE Style Optimization for Learning from Human Feedback in LLMs"; Kool et al. 2019):
    A_i = r_i - mean_{j != i, j in group} r_j.

    Equivalently A_i = n/(n-1) * (r_i - mean(r_group)): the Dr. GRPO advantage rescaled by
    n/(n-1), so with a fixed group size the two differ only by a constant factor.

    Args:
        rewards: [N] scalar reward per response.
        group_ids: [N] integer prompt id per response.

    Returns:
        [N] advantages; exactly 0 for single-sample groups (no baseline exists) and for groups
        whose rewards are all equal.
    """
    r = _as_float(rewards)  # [N]
    _, count, total, constant = _group_stats(r, group_ids)  # [N] each; validates the shapes
    if r.numel() == 0:
        return r.clone()
    loo_mean = (total - r) / (count - 1).clamp_min(1)  # [N] mean of the other samples
    adv = r - loo_mean
    keep = (count > 1) & ~constant
    return torch.where(keep, adv, torch.zeros_like(adv))


def whiten_advantages(adv: Tensor, mask: Tensor | None = None, *, eps: float = 1e-8) -> Tensor:
    """Batch whitening of advantages over the counted tokens (REINFORCE++, Hu 2025, "global
    advantage normalization"): (A - mean) / sqrt(var + eps), with mean and the *biased* variance
    taken over all unmasked entries of the batch, as the OpenRLHF reference implementation does.

    Call it on the whole rollout batch (before splitting into mini-batches or ranks), so that
    every token is whitened with the same statistics.

    Args:
        adv: [N] or [B, T] advantages (e.g. returns from ``discounted_returns``).
        mask: same shape, nonzero where the entry counts; None counts every entry.
        eps: added to the variance.

    Returns:
        Same shape as ``adv``; 0 at masked entries. If every counted entry is equal (or none is
        counted) the result is exactly 0.
    """
    m = torch.ones_like(adv, dtype=torch.bool) if mask is None else mask.bool()
    if m.shape != adv.shape:
        raise ValueError(f"mask shape {tuple(m.shape)} must equal adv shape {tuple(adv.shape)}")
    a = _as_float(adv)
    zero = torch.zeros_like(a)
    counted = a[m]  # [n] the entries that share one set of statistics
    # Same reason as in group_advantages: constant inputs must not turn rounding noise into signal.
    if counted.numel() == 0 or bool(counted.max() == counted.min()):
        return zero
    mean = counted.mean()  # []
    var = counted.var(unbiased=False)  # [] biased (1/n), as in OpenRLHF
    out = (a - mean) * torch.rsqrt(var + eps)
    return torch.where(m, out, zero)


def discounted_returns(token_rewards: Tensor, mask: Tensor, *, gamma: float = 1.0) -> Tensor:
    """Reward-to-go G_t = r_t + gamma * G_{t+1} over the counted tokens of each sequence
    (the REINFORCE++ return, Hu 2025, before whitening; Williams 1992).

    Use it when rewards are per token, e.g. an outcome reward on the last token plus the per-token
    KL penalty from ``mathrl.algo.kl.apply_kl_reward_penalty`` (``algo.kl.use: reward``).

    Args:
        token_rewards: [B, T] reward per position.
        mask: [B, T] nonzero on counted tokens; masked positions contribute nothing and get 0.
        gamma: discount, 1.0 for undiscounted episodic returns (the usual choice for RLVR).

    Returns:
        [B, T] returns, 0 at masked positions.
    """
    if token_rewards.dim() != 2 or mask.shape != token_rewards.shape:
        raise ValueError(
            f"token_rewards and mask must both be [B, T], got {tuple(token_rewards.shape)} "
            f"and {tuple(mask.shape)}"
        )
    m = mask.bool()
    r = _as_float(token_rewards)
    r = torch.where(m, r, torch.zeros_like(r))  # [B, T]
    if gamma == 1.0:
        # Reverse cumulative sum: one vectorised op instead of a loop over T.
        returns = r.flip(-1).cumsum(-1).flip(-1)  # [B, T]
    else:
        columns = []
        running = torch.zeros_like(r[:, 0])  # [B]
        for t in range(r.shape[1] - 1, -1, -1):
            running = torch.where(m[:, t], r[:, t] + gamma * running, running)  # a tool observation is no step
            columns.append(running)
        returns = torch.stack(columns[::-1], dim=1)  # [B, T]
    return torch.where(m, returns, torch.zeros_like(returns))


def reinforce_pp_advantages(
    rewards: Tensor,
    response_mask: Tensor,
    *,
    kl_rewards: Tensor | None = None,
    loss_mask: Tensor | None = None,
) -> Tensor:
    """REINFORCE++ token advantages (Hu 2025, "REINFORCE++", §3; OpenRLHF's ``reinforce`` estimator).

    The token reward is the outcome reward on the last response token plus the per-token KL penalty
    (``kl_rewards``, already negative and scaled, from ``mathrl.algo.kl.apply_kl_reward_penalty``).
    With gamma = 1 the return of token t is the sequence reward minus the KL penalty still to go,
        G_t = r(x, y) + sum_{i >= t} kl_rewards_i,
    and the advantage is G_t whitened over every counted token of the batch (global advantage
    normalisation: one mean and one variance for the whole batch, no per-prompt baseline).

    Args:
        rewards: [B] outcome reward per response.
        response_mask: [B, T] nonzero on generated tokens (where returns are accumulated).
        kl_rewards: [B, T] per-token KL penalty (<= 0 when the coefficient is positive); None = 0.
        loss_mask: [B, T] tokens that share the whitening statistics (and get a nonzero
            advantage); None = response_mask.

    Returns:
        [B, T] advantages, 0 outside loss_mask.
    """
    if rewards.dim() != 1 or response_mask.dim() != 2 or response_mask.shape[0] != rewards.shape[0]:
        raise ValueError(f"expected rewards [B] and response_mask [B, T], got {tuple(rewards.shape)} "
                         f"and {tuple(response_mask.shape)}")
    m = response_mask.bool()
    lengths = m.sum(-1)  # [B]
    last = last_token_index(response_mask)  # [B] position of each response's last model token
    token_rewards = torch.zeros(response_mask.shape, dtype=_as_float(rewards).dtype, device=rewards.device)
    token_rewards[torch.arange(len(rewards), device=rewards.device), last] = _as_float(rewards) * (lengths > 0)
    if kl_rewards is not None:
        token_rewards = token_rewards + kl_rewards
    returns = discounted_returns(token_rewards, response_mask, gamma=1.0)  # [B, T]
    return whiten_advantages(returns, response_mask if loss_mask is None else loss_mask)


def expand_to_tokens(adv: Tensor, mask: Tensor) -> Tensor:
    """Broadcast one advantage per sequence to each of its counted tokens (outcome supervision:
    every token of response i gets A_i; DeepSeekMath §4.1.2).

    Args:
        adv: [B] advantage per sequence.
        mask: [B, T] nonzero on counted tokens.

    Returns:
        [B, T] advantages, 0 at masked positions.
    """
    if adv.dim() != 1 or mask.dim() != 2 or mask.shape[0] != adv.shape[0]:
        raise ValueError(
            f"expected adv [B] and mask [B, T], got {tuple(adv.shape)} and {tuple(mask.shape)}"
        )
    a = _as_float(adv)
    expanded = a.unsqueeze(-1).expand(mask.shape)  # [B, T]
    return torch.where(mask.bool(), expanded, torch.zeros_like(expanded))
