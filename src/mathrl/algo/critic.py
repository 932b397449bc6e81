"""PPO with a learned critic: generalised advantage estimation, its decoupled and length-adaptive
variants, and the clipped value loss.

Pure tensor functions. Shapes: B sequences, T response positions; `mask` is 1 on the response
tokens of a row (a prefix of the row: responses are right-padded). Position t of a row is the state
"prompt + response[:t]" and its action is response token t; `values[:, t]` is the critic's estimate
V(s_t) of the return from there. The loop uses them with `algo.adv.estimator: gae`:

    adv_actor, _     = gae(token_rewards, values, mask, gamma=g, lam=lam_actor)    # policy advantages
    _, returns       = gae(token_rewards, values, mask, gamma=g, lam=lam_critic)   # value targets
    lam_actor        = length_adaptive_lambda(lengths, alpha)                       # VAPO, optional
    loss, clipped    = value_loss(new_values, values, returns, mask, clip_eps=...)

Run the tests with ``python -m pytest tests/algo/test_critic.py -q``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mathrl.algo.positions import last_token_index

__all__ = ["gae", "length_adaptive_lambda", "outcome_token_rewards", "value_loss", "explained_variance"]


def outcome_token_rewards(rewards: Tensor, response_mask: Tensor) -> Tensor:
    """[N, T]: each sequence's reward [N] on its last response token, 0 elsewhere (the last model token of
    an episode whose mask has gaps at tool observations)."""
    token_rewards = torch.zeros_like(response_mask)
    last = last_token_index(response_mask)  # [N]
    token_rewards[torch.arange(len(rewards)), last] = rewards.float() * (response_mask.sum(-1) > 0)
    return token_rewards


def gae(
    token_rewards: Tensor, values: Tensor, mask: Tensor, *, gamma: float = 1.0, lam: float | Tensor = 1.0
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016, "High-Dimensional Continuous Control
    Using Generalized Advantage Estimation", eq. 16), per row, backwards over the response:

        delta_t = r_t + gamma * V(s_{t+1}) - V(s_t)        V(s_T) = 0 after the last token (terminal)
        A_t     = delta_t + gamma * lam * A_{t+1}
        R_t     = A_t + V(s_t)                               (the value target, "returns")

    lam = 1 gives A_t = (discounted reward-to-go) - V(s_t), the Monte-Carlo target; lam = 0 the
    one-step TD error. Decoupled GAE (Yuan et al. 2025, VC-PPO, §4.2) calls this twice: lam_critic
    (1.0) for the value targets, lam_actor for the policy advantages.

    token_rewards: [B, T] reward at each position (an outcome reward sits on the last token; a per-token KL
    penalty may add to every token); values: [B, T] V(s_t) from the critic at the time of sampling (no grad);
    mask: [B, T] 1 on the policy's tokens, 0 on padding and on tool observations (skipped: the next policy
    token's value and advantage flow back across them); gamma: the discount (1.0 for episodic RLVR); lam: GAE
    lambda, a float or a [B] tensor (one per row, e.g. `length_adaptive_lambda`). -> (advantages [B, T], returns
    [B, T]), both 0 at masked positions.
    """
    if token_rewards.dim() != 2 or values.shape != token_rewards.shape or mask.shape != token_rewards.shape:
        raise ValueError(
            f"token_rewards, values and mask must all be [B, T], got {tuple(token_rewards.shape)}, "
            f"{tuple(values.shape)} and {tuple(mask.shape)}"
        )
    m = mask.to(torch.float32)
    r = token_rewards.to(torch.float32) * m
    v = values.to(torch.float32) * m  # V beyond the last token is 0: the episode has ended
    lam_t = torch.as_tensor(lam, dtype=torch.float32, device=r.device)
    if lam_t.dim() == 1 and lam_t.shape[0] != r.shape[0]:
        raise ValueError(f"lam must be a float or a [B] tensor, got shape {tuple(lam_t.shape)} for B={r.shape[0]}")
    lam_t = lam_t.reshape(-1) if lam_t.dim() else lam_t  # [B] or scalar
    num_rows, length = r.shape
    advantages = torch.zeros_like(r)
    running = torch.zeros(num_rows, dtype=torch.float32, device=r.device)  # A_{t+1}
    next_value = torch.zeros(num_rows, dtype=torch.float32, device=r.device)  # V(s_{t+1})
    for t in range(length - 1, -1, -1):
        delta = r[:, t] + gamma * next_value - v[:, t]
        # a masked position (padding after the end, or a tool observation inside an episode) is not a
        # step of the policy: A and V carry across it unchanged (after the end both are still 0)
        running = torch.where(m[:, t] > 0, delta + gamma * lam_t * running, running)
        advantages[:, t] = running * m[:, t]
        next_value = torch.where(m[:, t] > 0, v[:, t], next_value)
    returns = (advantages + v) * m
    return advantages, returns


def length_adaptive_lambda(lengths: Tensor, alpha: float) -> Tensor:
    """Per-sequence policy lambda of length-adaptive GAE (Yue et al. 2025, VAPO, §4.2, eq. 8):

        lam_policy = 1 - 1 / (alpha * l)

    so that the sum of the GAE weights, 1 / (1 - lam), grows with the response length l
    (alpha = 0.05 in the paper). Values below 0 (l < 1 / alpha) are clamped to 0.

    lengths: [B] response lengths in tokens (>= 1 where it matters; 0 gives 0); alpha: > 0. -> [B] float lambdas
    in [0, 1).
    """
    if alpha <= 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    l = lengths.to(torch.float32).clamp(min=1.0)
    return (1.0 - 1.0 / (alpha * l)).clamp(min=0.0)


def value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, *, clip_eps: float | None = 0.2
) -> tuple[Tensor, Tensor]:
    """Per-token clipped value loss (PPO as in OpenAI baselines ppo2; Schulman et al. 2017):

        V_clip = old + clamp(V - old, -eps, eps)
        loss_t = 0.5 * max((V - R)^2, (V_clip - R)^2)        (0.5 * (V - R)^2 with clip_eps None)

    Aggregate it over the mini-batch like the policy loss (`algo.losses.aggregate`).

    values: [B, T] V(s_t) from the critic being trained (with grad); old_values: [B, T] V(s_t) at the time of
    sampling; returns: [B, T] value targets from `gae`; mask: [B, T] 1 on counted tokens; clip_eps: the value
    clip range, or None for the plain squared error. -> (token_loss [B, T], clipped [B, T] float: 1 where the
    clipped term was the larger one and differed), both 0 at masked positions.
    """
    if not (values.shape == old_values.shape == returns.shape == mask.shape) or values.dim() != 2:
        raise ValueError(
            f"values, old_values, returns and mask must all be [B, T], got {tuple(values.shape)}, "
            f"{tuple(old_values.shape)}, {tuple(returns.shape)} and {tuple(mask.shape)}"
        )
    m = mask.to(values.dtype)
    unclipped = (values - returns) ** 2
    if clip_eps is None:
        return 0.5 * unclipped * m, torch.zeros_like(unclipped)
    clipped_values = old_values + (values - old_values).clamp(-clip_eps, clip_eps)
    clipped = (clipped_values - returns) ** 2
    loss = 0.5 * torch.maximum(unclipped, clipped) * m
    return loss, (clipped > unclipped).to(values.dtype).detach() * m


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> float:
    """1 - Var(R - V) / Var(R) over the counted tokens: 1 is a perfect critic, 0 one that predicts
    the mean, negative worse than that. NaN when the returns do not vary."""
    m = mask.bool()
    v, r = values[m].to(torch.float64), returns[m].to(torch.float64)
    if r.numel() < 2:
        return float("nan")
    var_r = r.var(unbiased=False)
    if var_r == 0:
        return float("nan")
    return float(1.0 - (r - v).var(unbiased=False) / var_r)
