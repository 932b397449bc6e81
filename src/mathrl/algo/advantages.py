"""Advantage estimators for critic-free RL on verifiable rewards, picked by ``algo.adv.estimator``.

Pure tensor functions: they never modify their inputs and keep no state. Shapes use N = sampled
responses in the rollout batch, B = sequences, T = response positions. Estimator -> function
(each one's paper and switch: docs/tricks.md):

    grpo: group_advantages             rloo: rloo_advantages             grpo_passk: passk_advantages
    reinforce_pp: reinforce_pp_advantages = whiten_advantages(discounted_returns(token_rewards, mask), loss_mask)
    reinforce_pp_baseline: reinforce_pp_baseline_advantages               opo: opo_advantages
    gpg: gpg_advantages                maxrl: maxrl_advantages           gdpo: gdpo_advantages, then whitened

then ``expand_to_tokens`` broadcasts sequence-level advantages to tokens.

Run the tests with ``python -m pytest tests/algo/test_advantages.py tests/algo/test_advantages_more.py -q``.
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
    "reinforce_pp_baseline_advantages",
    "passk_advantages",
    "opo_advantages",
    "GpgAlpha",
    "gpg_advantages",
    "maxrl_advantages",
    "gdpo_advantages",
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

    rewards: [N] scalar reward per response (int, bool or float); group_ids: [N] integer id of the prompt each
    response was sampled from, any values; std_normalize: divide by the std (GRPO) or not (Dr. GRPO), config
    ``algo.adv.std_normalize``; std_scope: ``"group"`` or ``"batch"``, config ``algo.adv.std_scope``; eps: added
    to the std before dividing. -> [N] advantages, float.
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

    rewards: [N] scalar reward per response; group_ids: [N] integer prompt id per response. -> [N] advantages,
    exactly 0 for single-sample groups (no baseline exists) and for groups whose rewards are all equal.
    """
    r = _as_float(rewards)  # [N]
    _, count, total, constant = _group_stats(r, group_ids)  # [N] each; validates the shapes
    if r.numel() == 0:
        return r.clone()
    loo_mean = (total - r) / (count - 1).clamp_min(1)  # [N] mean of the other samples
    adv = r - loo_mean
    keep = (count > 1) & ~constant
    return torch.where(keep, adv, torch.zeros_like(adv))


def whiten_advantages(adv: Tensor, mask: Tensor | None = None, *, eps: float = 1e-8, unbiased: bool = False) -> Tensor:
    """Batch whitening of advantages over the counted tokens (REINFORCE++, Hu 2025, "global
    advantage normalization"): (A - mean) / sqrt(var + eps), with mean and the *biased* variance
    taken over all unmasked entries of the batch, as the OpenRLHF reference implementation does;
    ``unbiased=True`` takes the Bessel-corrected (n-1) variance instead, as verl's ``masked_whiten``
    does (the estimators that follow verl: reinforce_pp_baseline, gdpo).

    Call it on the whole rollout batch (before splitting into mini-batches or ranks), so that
    every token is whitened with the same statistics.

    adv: [N] or [B, T] advantages (e.g. returns from ``discounted_returns``); mask: the same shape, nonzero
    where the entry counts, None counts every entry; eps: added to the variance; unbiased: divide the summed
    squared deviations by n - 1 (verl) instead of n (OpenRLHF). -> the same shape as ``adv``, 0 at masked
    entries; exactly 0 if every counted entry is equal (or none is counted, or only one).
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
    var = counted.var(unbiased=unbiased)  # [] biased (1/n) as in OpenRLHF, or unbiased (1/(n-1)) as in verl
    out = (a - mean) * torch.rsqrt(var + eps)
    return torch.where(m, out, zero)


def discounted_returns(token_rewards: Tensor, mask: Tensor, *, gamma: float = 1.0) -> Tensor:
    """Reward-to-go G_t = r_t + gamma * G_{t+1} over the counted tokens of each sequence
    (the REINFORCE++ return, Hu 2025, before whitening; Williams 1992).

    Use it when rewards are per token, e.g. an outcome reward on the last token plus the per-token
    KL penalty from ``mathrl.algo.kl.apply_kl_reward_penalty`` (``algo.kl.use: reward``).

    token_rewards: [B, T] reward per position; mask: [B, T] nonzero on counted tokens (masked positions
    contribute nothing and get 0); gamma: the discount, 1.0 for undiscounted episodic returns (the usual choice
    for RLVR). -> [B, T] returns, 0 at masked positions.
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
    normalisation: one mean and one variance for the whole batch, no per-prompt baseline), the unbiased
    (n-1) variance of verl's ``masked_whiten``, as every estimator here that whitens (OpenRLHF divides by n).

    rewards: [B] outcome reward per response; response_mask: [B, T] nonzero on generated tokens (where returns
    are accumulated); kl_rewards: [B, T] per-token KL penalty (<= 0 when the coefficient is positive), None = 0;
    loss_mask: [B, T] the tokens that share the whitening statistics (and get a nonzero advantage),
    None = response_mask. -> [B, T] advantages, 0 outside loss_mask.
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
    return whiten_advantages(returns, response_mask if loss_mask is None else loss_mask, unbiased=True)


def expand_to_tokens(adv: Tensor, mask: Tensor) -> Tensor:
    """Broadcast one advantage per sequence to each of its counted tokens (outcome supervision:
    every token of response i gets A_i; DeepSeekMath §4.1.2).

    adv: [B] advantage per sequence; mask: [B, T] nonzero on counted tokens. -> [B, T] advantages, 0 at masked
    positions.
    """
    if adv.dim() != 1 or mask.dim() != 2 or mask.shape[0] != adv.shape[0]:
        raise ValueError(
            f"expected adv [B] and mask [B, T], got {tuple(adv.shape)} and {tuple(mask.shape)}"
        )
    a = _as_float(adv)
    expanded = a.unsqueeze(-1).expand(mask.shape)  # [B, T]
    return torch.where(mask.bool(), expanded, torch.zeros_like(expanded))


# ---------------------------------------------------------------------------------------------------
# More group estimators (the verl / prime-rl / SkyRL ones). Shared conventions, those of
# group_advantages: rewards are one scalar per response (the loop passes the verifier score plus
# shaping terms minus the summed KL penalty, as verl sums its token_level_rewards); a single-sample
# group and a group whose rewards are all equal get exactly 0 (before any batch whitening, which
# shifts every row: reinforce_pp_baseline, gdpo). verl instead gives a single-sample
# group a baseline of 0 (so A = r, or r / (1 + eps)) and leaves the rounding residue of an all-equal
# group divided by eps; the loop never forms a group of one (rollout.n > 1 for these estimators).
# ---------------------------------------------------------------------------------------------------

GpgAlpha = Literal["valid_groups", "nonzero_rewards", "none"]


def _group_std(centred: Tensor, group_ids: Tensor, count: Tensor) -> Tensor:
    """[N] the unbiased (n-1) std of each sample's group from its deviations ``centred`` [N] from
    the group mean; 0 for a single-sample group."""
    sq = group_stats(centred.square(), group_ids)  # group sums of squared deviations
    return torch.sqrt(sq.sum[sq.index] / (count - 1).clamp_min(1))


def reinforce_pp_baseline_advantages(rewards: Tensor, group_ids: Tensor, loss_mask: Tensor) -> Tensor:
    """REINFORCE++-baseline (Hu et al. 2025, "REINFORCE++", arXiv 2501.03262, the variant with a
    group baseline; verl ``compute_reinforce_plus_plus_baseline_outcome_advantage``): subtract the
    group mean, put the result on every counted token, then whiten over all the batch's counted
    tokens (global advantage normalisation, so the std is the batch's, never a group's):

        A_{i,t} = whiten_{tokens}(r_i - mean(r_group))

    The whitening is verl's ``masked_whiten``: token-weighted mean, unbiased (n-1) variance,
    1e-8 added to it. Statistics are over ``loss_mask``, the tokens that reach the loss (verl's
    response_mask plays that role there). Like verl, an all-equal group's zeros are whitened too
    (they become -mean/std), so only a batch whose every counted token is equal gets exact zeros.

    rewards: [N] sequence reward per response; group_ids: [N] integer prompt id per response; loss_mask: [N, T]
    nonzero on the tokens that count. -> [N, T] advantages, 0 outside loss_mask.
    """
    centred = group_advantages(rewards, group_ids, std_normalize=False)  # [N] r - group mean
    return whiten_advantages(expand_to_tokens(centred, loss_mask), loss_mask, unbiased=True)  # [N, T]


def passk_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    std_normalize: bool = True,
    std_scope: StdScope = "group",
    eps: float = 1e-6,
) -> Tensor:
    """Pass@k advantages with k = the group size (Tang et al. 2025, "Optimizing Language Models for
    Inference Time Objectives using Reinforcement Learning", arXiv 2503.19595, the leave-one-out
    estimator of the max-of-k objective; verl ``compute_grpo_passk_outcome_advantage``).

    The group's objective is max_j r_j; leaving sample i out changes it only for the best sample,
    and by r_max - r_second. So only the group's best response gets a nonzero advantage:

        A_i = (r_max - r_second_max) / (std(r_group) + eps)   if i is the group's unique best
        A_i = 0                                                otherwise

    A tie for the best gives r_max - r_second_max = 0, so the whole group gets 0 (verl picks one of
    the tied rows by ``torch.topk`` and gives it 0 too). k is not a setting: it is rollout.n.

    rewards: [N] scalar reward per response; group_ids: [N] integer prompt id per response; std_normalize:
    divide by the std (verl's default) or not, config ``algo.adv.std_normalize``; std_scope: ``"group"``, the
    unbiased std of the group, as verl, or ``"batch"``, that of the whole batch (mathrl's extension, as in
    group_advantages), config ``algo.adv.std_scope``; eps: added to the std (verl: 1e-6). -> [N]
    advantages, >= 0: exactly 0 except for each group's unique best response. verl raises on a group of one;
    here it gets 0.
    """
    if std_scope not in ("group", "batch"):
        raise ValueError(f"std_scope must be 'group' or 'batch', got {std_scope!r}")
    r = _as_float(rewards)  # [N]
    groups, count, total, constant = _group_stats(r, group_ids)  # [N] each; validates the shapes
    if r.numel() == 0:
        return r.clone()
    best = groups.max[groups.index]  # [N] the group's max
    is_best = r == best  # [N]
    n_best = group_stats(is_best.to(r.dtype), group_ids).sum[groups.index]  # [N] how many share the max
    # The second largest value: the max once the best rows are set to -inf (-inf where all tie).
    runner_up = group_stats(torch.where(is_best, torch.full_like(r, -torch.inf), r), group_ids).max[groups.index]
    unique_best = is_best & (n_best == 1) & (count > 1)  # [N]
    gap = torch.where(unique_best, best - runner_up, torch.zeros_like(r))  # [N] r_max - r_second on the best row
    if not std_normalize:
        return gap
    if std_scope == "group":
        centred = torch.where(constant, torch.zeros_like(r), r - total / count)  # [N]
        std = _group_std(centred, group_ids, count)  # [N]
    else:
        std = r.std() if r.numel() > 1 else r.new_zeros(())  # [] unbiased
    # A nonzero gap means a non-constant group (std > 0), so the division is safe even with eps = 0.
    return torch.where(unique_best, gap / (std + eps), gap)


def opo_advantages(rewards: Tensor, group_ids: Tensor, lengths: Tensor) -> Tensor:
    """OPO's length-weighted baseline (Hao et al. 2025, "On-Policy RL with Optimal Reward Baseline",
    arXiv 2505.23585; verl ``compute_opo_outcome_advantage``):

        A_i = r_i - sum_j l_j r_j / sum_j l_j      (j over the group, l = response length)

    The variance-optimal baseline weighs each reward by ||grad log pi(y_j)||^2; OPO approximates
    that squared norm by the response length, since the gradient sums over tokens. No std division.

    rewards: [N] scalar reward per response; group_ids: [N] integer prompt id per response; lengths: [N]
    response lengths in tokens (the loop passes the generated tokens, response_mask, as verl does; a tool's
    observation tokens are not the policy's and do not count). -> [N] advantages, exactly 0 for single-sample
    and all-equal groups. A group whose lengths are all 0 (no tokens, so no gradient either) falls back to the
    plain mean (verl divides 0 by 0).
    """
    r = _as_float(rewards)  # [N]
    groups, count, total, constant = _group_stats(r, group_ids)  # [N] each; validates the shapes
    if r.numel() == 0:
        return r.clone()
    length = _as_float(lengths).to(r.dtype)  # [N]
    if length.shape != r.shape:
        raise ValueError(f"lengths must be [N] like rewards, got {tuple(length.shape)} and {tuple(r.shape)}")
    length_sum = group_stats(length, group_ids).sum[groups.index]  # [N] sum_j l_j over the group
    weighted = group_stats(length * r, group_ids).sum[groups.index]  # [N] sum_j l_j r_j
    baseline = torch.where(length_sum > 0, weighted / length_sum.clamp_min(1e-30), total / count)  # [N]
    keep = (count > 1) & ~constant
    return torch.where(keep, r - baseline, torch.zeros_like(r))


def gpg_advantages(rewards: Tensor, group_ids: Tensor, *, alpha: GpgAlpha = "valid_groups") -> Tensor:
    """GPG's advantage (Chu et al. 2025, "GPG: A Simple and Strong Reinforcement Learning Baseline
    for Model Reasoning", arXiv 2504.02546; verl ``compute_gpg_outcome_advantage``): the group-mean
    baseline without std division, scaled by a batch factor alpha,

        A_i = alpha * (r_i - mean(r_group)) / F_norm,    F_norm = 1 (verl's default and fixed value)

    alpha undoes the dilution of the batch-mean loss by samples whose advantage is 0 (GPG's
    "accurate gradient estimation"). It is the one arguable part, so it is a switch:

    - ``"valid_groups"``: alpha = N / (N - M), M = the samples of all-equal groups (single-sample
      groups included): the paper's B / (B - M) and the authors' code (AMAP-ML/GPG, loss divided by
      the share of groups with reward std > 0). 1 when no group has a signal (every A is 0 then).
    - ``"nonzero_rewards"``: alpha = N / max(#{i: r_i != 0}, 1), what verl computes (it counts nonzero
      *rewards*, so with 0/1 rewards alpha is 1 / accuracy, not the share of informative samples).
    - ``"none"``: alpha = 1, Dr. GRPO's advantage.

    GPG pairs this advantage with the plain policy-gradient loss (no ratio clipping); that is a
    policy-loss choice, not this function's.

    rewards: [N] scalar reward per response (one rollout batch: alpha is the batch's); group_ids: [N] integer
    prompt id per response; alpha: how alpha is computed, config ``algo.adv.gpg_alpha``. -> [N] advantages,
    exactly 0 for single-sample and all-equal groups.
    """
    r = _as_float(rewards)  # [N]
    _, count, _, constant = _group_stats(r, group_ids)  # [N] each; validates the shapes
    centred = group_advantages(r, group_ids, std_normalize=False)  # [N] r - group mean
    n = r.numel()
    if alpha == "valid_groups":
        valid = int(((count > 1) & ~constant).sum())  # N - M
        scale = n / valid if valid > 0 else 1.0
    elif alpha == "nonzero_rewards":
        scale = n / max(int(torch.count_nonzero(r)), 1)
    elif alpha == "none":
        scale = 1.0
    else:
        raise ValueError(f"alpha must be 'valid_groups', 'nonzero_rewards' or 'none', got {alpha!r}")
    return centred * scale


def maxrl_advantages(rewards: Tensor, group_ids: Tensor, *, eps: float = 1e-6) -> Tensor:
    """MaxRL's mean-normalised advantage (Tajwar et al. 2026, "Maximum Likelihood Reinforcement
    Learning", arXiv 2602.02710; as implemented in prime-rl ``MaxRLAlgorithm`` and SkyRL
    ``compute_maxrl_advantage``):

        A_i = (r_i - mean(r_group)) / (mean(r_group) + eps)

    With 0/1 rewards the group mean estimates the pass rate p, and dividing by it rather than by the
    std makes the policy gradient unbiased for the group-size truncation of the maximum-likelihood
    objective log p (hard prompts weigh ~1/p); a group of n interpolates between REINFORCE (n = 1)
    and maximum likelihood (n -> inf). Meant for non-negative (canonically 0/1) rewards.

    Choices where the two references differ: eps = 1e-6 is SkyRL's (prime-rl divides by the bare
    mean); a group whose mean is <= 0 gets 0, prime-rl's rule (SkyRL divides by a negative mean + eps,
    flipping the advantages' sign; with 0/1 rewards only the all-wrong group has mean 0, and both give
    0 there).

    rewards: [N] scalar reward per response, >= 0 for the formula's meaning; group_ids: [N] integer prompt id
    per response; eps: added to the mean. -> [N] advantages, exactly 0 for single-sample groups, all-equal
    groups and groups with mean <= 0.
    """
    r = _as_float(rewards)  # [N]
    _, count, total, constant = _group_stats(r, group_ids)  # [N] each; validates the shapes
    if r.numel() == 0:
        return r.clone()
    mean = total / count  # [N]
    keep = (count > 1) & ~constant & (mean > 0)
    return torch.where(keep, (r - mean) / (mean.clamp_min(0) + eps), torch.zeros_like(r))


def gdpo_advantages(
    components: Tensor,
    group_ids: Tensor,
    *,
    weights: Tensor | None = None,
    shaping: Tensor | None = None,
    std_normalize: bool = True,
    std_scope: StdScope = "group",
    eps: float = 1e-6,
) -> Tensor:
    """GDPO's decoupled sum (Liu et al. 2026, "GDPO: Group reward-Decoupled Normalization Policy
    Optimization for Multi-reward RL Optimization", arXiv 2601.05242; verl
    ``compute_gdpo_outcome_advantage``, its first two steps): normalise each reward component within
    its group as GRPO does, then take the weighted sum,

        A_i = sum_k w_k * (c_{k,i} - mean_group(c_k)) / (std_group(c_k) + eps)  [+ shaping_i - mean_group(shaping)]

    Normalising the sum instead (GRPO) lets a component with a large spread drown the others, and
    maps different combinations of component scores to the same advantage. The paper's last step,
    whitening the sum over the batch, is the estimator's (``algo.adv.gdpo_whiten``), on tokens.

    The components are the *raw* per-component scores and the weights multiply the *normalised*
    ones, as verl does (its ``gdpo_reward_weights``; here reward.functions[].weight). With one
    component of weight 1 and no shaping this is exactly ``group_advantages`` (GRPO).

    ``shaping`` is what the sequence reward holds besides the weighted components (length shaping
    terms, reward.incorrect, the KL reward penalty). verl's GDPO drops it; here it keeps its scale:
    it is centred on its group mean and never divided by a std (so a small penalty coefficient stays
    small, and rounding noise in it stays noise). With std_normalize=False the whole result is
    therefore the Dr. GRPO advantage of the summed reward.

    components: [K, N] the raw score of each of K components per response; group_ids: [N] integer prompt id per
    response; weights: [K] the weight of each component after normalisation, None = all 1; shaping: [N] the rest
    of the sequence reward, or None; std_normalize, std_scope, eps: as in ``group_advantages``, per component.
    -> [N] advantages, exactly 0 for single-sample groups and groups where every component (and the shaping) is
    constant.
    """
    if components.dim() != 2 or components.shape[1] != group_ids.shape[0]:
        raise ValueError(f"components must be [K, N] with N = len(group_ids), got {tuple(components.shape)} "
                         f"and group_ids {tuple(group_ids.shape)}")
    c = _as_float(components)  # [K, N]
    w = (torch.ones(c.shape[0], dtype=c.dtype, device=c.device) if weights is None
         else torch.as_tensor(weights, dtype=c.dtype, device=c.device))  # [K]
    if w.shape != (c.shape[0],):
        raise ValueError(f"weights must be [K] = [{c.shape[0]}], got {tuple(w.shape)}")
    out = torch.zeros(c.shape[1], dtype=c.dtype, device=c.device)  # [N]
    for k in range(c.shape[0]):
        normalised = group_advantages(c[k], group_ids, std_normalize=std_normalize, std_scope=std_scope, eps=eps)  # [N]
        out = out + w[k] * normalised
    if shaping is not None:
        out = out + group_advantages(shaping.to(c.dtype), group_ids, std_normalize=False)  # [N] centred, unscaled
    return out
