"""Advantages against a per-token or a greedy baseline: the optimal token baseline (and its tool-integrated
variant) and ReMax. Pure tensor functions; algo/estimators.py registers them by name.

    returns = discounted_returns(token_rewards, response_mask)              # [N, T] reward to go
    adv = optimal_token_baseline_advantages(returns, old_logprobs, sum_pi_squared, loss_mask, group_ids)
    adv = remax_advantages(returns, greedy_rewards, loss_mask)              # greedy_rewards: [N]

Run the tests with ``python -m pytest tests/algo/test_token_baselines.py -q``.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

__all__ = ["optimal_token_baseline_advantages", "path_variance_weights", "remax_advantages"]

Align = Literal["position", "token"]


def _check(returns: Tensor, mask: Tensor, **others: Tensor) -> None:
    if returns.dim() != 2 or returns.shape != mask.shape:
        raise ValueError(f"returns and mask must be [N, T] of one shape, got {tuple(returns.shape)}, {tuple(mask.shape)}")
    for name, t in others.items():
        if t.shape[0] != returns.shape[0]:
            raise ValueError(f"{name} must have N = {returns.shape[0]} rows, got {tuple(t.shape)}")


def path_variance_weights(logprobs: Tensor, sum_pi_squared: Tensor, mask: Tensor, *,
                          is_weights: Tensor | None = None) -> Tensor:
    """W_t = Σ_{j <= t} ||s_j||², the cumulative path-variance proxy of the optimal token baseline, with
    ||s_j||² = 1 - 2 π_j + Σ_v π_v² the squared norm of the score of the sampled token's softmax
    (∇_z log π(y_j) = onehot(y_j) - π), and each term times ρ̄_j² when importance weights are given
    (the MSE-optimal baseline under truncated IS). verl `compute_optimal_token_baseline_advantage`, steps 1-3.

    logprobs: [N, T] log π of the sampled tokens (the policy that scores the step); sum_pi_squared: [N, T]
    Σ_v π_v² of each position's next-token distribution; mask: [N, T] nonzero on the counted tokens (the sum
    runs over these only); is_weights: [N, T] or None. -> [N, T] W (float; the running sum carries over
    masked positions).
    """
    m = mask.to(logprobs.dtype)
    w = 1.0 - 2.0 * logprobs.exp() + sum_pi_squared  # [N, T]
    if is_weights is not None:
        w = w * is_weights.square()
    return (w * m).cumsum(-1)


def _compact(x: Tensor, order: Tensor) -> Tensor:
    return x.gather(-1, order)


def optimal_token_baseline_advantages(
    returns: Tensor,
    logprobs: Tensor,
    sum_pi_squared: Tensor,
    mask: Tensor,
    group_ids: Tensor,
    *,
    is_weights: Tensor | None = None,
    align: Align = "position",
    handle_zero_tail: bool = True,
    eps: float = 1e-8,
) -> Tensor:
    """Optimal token baseline (OTB): a baseline per prompt group and per step t, the W-weighted mean of
    the group's returns there,

        B_t = Σ_i G_{i,t} W_{i,t} / (Σ_i W_{i,t} + eps),     A_{i,t} = G_{i,t} - B_t

    with W the cumulative path variance (`path_variance_weights`), the sums over the group's responses
    that reach step t. It minimises the variance of the token-level policy gradient among baselines that
    depend on the step only (the gradient's variance grows with ||∇ log π||², which W tracks). verl
    `compute_optimal_token_baseline_advantage` (align="position": step t is the response position) and
    `compute_multi_turn_optimal_token_baseline_advantage` (align="token", the tool-integrated variant: step
    t is a response's t-th counted token, so tool output between model turns does not shift the steps).

    A group of one response gets no baseline (A = G). handle_zero_tail: when one response is strictly the
    longest of its group, its steps past the second longest have no peer, so B_t = G_t (times W/(W+eps))
    would make A ≈ 0 there: their baseline is 0 instead (A = G), as verl.

    returns: [N, T] reward to go G (e.g. `discounted_returns` of the outcome reward plus the KL penalty);
    logprobs, sum_pi_squared: [N, T] as `path_variance_weights`; mask: [N, T] nonzero on the counted tokens;
    group_ids: [N] the prompt of each response; is_weights: [N, T] or None; align: "position" or "token";
    eps: added to each step's weight sum. -> [N, T] advantages, 0 outside mask.
    """
    _check(returns, mask, logprobs=logprobs, sum_pi_squared=sum_pi_squared, group_ids=group_ids)
    if align not in ("position", "token"):
        raise ValueError(f"align must be position or token, got {align!r}")
    m = mask.bool()
    weights = path_variance_weights(logprobs, sum_pi_squared, mask, is_weights=is_weights)  # [N, T]
    if align == "token":  # the counted tokens of each row first, in order: step t = the t-th counted token
        order = torch.sort((~m).to(torch.int8), dim=-1, stable=True).indices  # [N, T]
        g, w, mc = _compact(returns, order), _compact(weights, order), _compact(m, order)
    else:
        g, w, mc = returns, weights, m
    mf = mc.to(g.dtype)
    _, inverse = torch.unique(group_ids, return_inverse=True)  # [N] group index 0..K-1
    k = int(inverse.max()) + 1 if len(inverse) else 0
    num = torch.zeros(k, g.shape[1], dtype=g.dtype).index_add_(0, inverse, g * w * mf)  # [K, T]
    den = torch.zeros(k, g.shape[1], dtype=g.dtype).index_add_(0, inverse, w * mf) + eps  # [K, T]
    baseline = (num / den)[inverse]  # [N, T]
    lengths = mc.sum(-1)  # [N]
    for group in range(k):
        rows = (inverse == group).nonzero().squeeze(-1)
        if len(rows) == 1:
            baseline[rows] = 0.0
            continue
        if handle_zero_tail:
            top2 = lengths[rows].sort(descending=True).values[:2]
            if top2[0] > top2[1]:
                baseline[rows[lengths[rows].argmax()], int(top2[1]):] = 0.0
    adv = (g - baseline) * mf  # [N, T] in the aligned steps
    if align == "token":
        adv = torch.zeros_like(adv).scatter_(-1, order, adv)  # back to the response positions
    return torch.where(m, adv, torch.zeros_like(adv))


def remax_advantages(returns: Tensor, greedy_rewards: Tensor, mask: Tensor) -> Tensor:
    """ReMax (Li et al. 2024, "ReMax: A Simple, Effective, and Efficient Reinforcement Learning Method for
    Aligning Large Language Models", arXiv 2310.10505, Algorithm 1): REINFORCE whose baseline is the reward
    of the greedy response to the same prompt,

        A_{i,t} = G_{i,t} - r(x_i, ŷ_i),     ŷ_i = the greedy (argmax) decoding of x_i

    verl `compute_remax_outcome_advantage` (its `reward_baselines`). No whitening, no group: one sample
    per prompt suffices, the greedy one is the control variate.

    returns: [N, T] reward to go G; greedy_rewards: [N] the reward of each response's prompt's greedy
    response; mask: [N, T] nonzero on the counted tokens. -> [N, T] advantages, 0 outside mask.
    """
    _check(returns, mask, greedy_rewards=greedy_rewards)
    if greedy_rewards.dim() != 1:
        raise ValueError(f"greedy_rewards must be [N], got {tuple(greedy_rewards.shape)}")
    adv = returns - greedy_rewards.to(returns.dtype)[:, None]  # [N, T]
    return torch.where(mask.bool(), adv, torch.zeros_like(adv))
