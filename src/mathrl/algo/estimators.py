"""The advantage estimators by name (algo.adv.estimator): each is one function from an
`AdvantageInputs` to `Advantages`, registered in `mathrl.registry.ADVANTAGE_ESTIMATORS`.

A new estimator is one function and one registration, here or in any module imported before the
config is loaded (tests/algo/test_estimator_registry.py registers one and trains with it):

    def my_advantages(x: AdvantageInputs, algo) -> Advantages:
        seq = x.rewards - x.rewards.mean()                                  # [N]
        return Advantages(expand_to_tokens(seq, x.loss_mask))               # [N, T]

    ADVANTAGE_ESTIMATORS.register("mine", Estimator(my_advantages, needs_groups=False))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from mathrl.algo.advantages import (
    discounted_returns,
    expand_to_tokens,
    gdpo_advantages,
    gpg_advantages,
    group_advantages,
    maxrl_advantages,
    opo_advantages,
    passk_advantages,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
    whiten_advantages,
)
from mathrl.algo.critic import gae, length_adaptive_lambda, outcome_token_rewards
from mathrl.algo.token_baselines import optimal_token_baseline_advantages, remax_advantages
from mathrl.registry import ADVANTAGE_ESTIMATORS


@dataclass
class AdvantageInputs:
    """What a step knows when it estimates advantages (N responses, T response positions)."""

    rewards: Tensor  # [N] sequence rewards: verifier score plus shaping terms
    response_mask: Tensor  # [N, T] 1 on response tokens
    loss_mask: Tensor  # [N, T] 1 on the tokens that reach the loss (after sample and overlong filters)
    kl_rewards: Tensor  # [N, T] per-token KL reward penalty (zeros unless algo.kl.use=reward)
    group_ids: Tensor  # [N] the prompt each response answers (groups of rollout.n)
    values: Tensor | None = None  # [N, T] critic values at sampling time (estimators with needs_critic)
    components: dict[str, Tensor] | None = None  # reward.functions[].name -> [N] its raw (unweighted) score; None: not kept (gdpo)
    component_weights: dict[str, float] | None = None  # reward.functions[].name -> its weight (1.0 where absent)
    old_logprobs: Tensor | None = None  # [N, T] the old policy's logprobs (estimators with needs_policy_stats)
    sum_pi_squared: Tensor | None = None  # [N, T] sum_v pi_v^2 of each next-token distribution (needs_policy_stats)
    is_weights: Tensor | None = None  # [N, T] the policy-gradient term's importance weights; None: no correction
    greedy_rewards: Tensor | None = None  # [N] the reward of the greedy response to each row's prompt (needs_greedy)


@dataclass
class Advantages:
    advantages: Tensor  # [N, T], 0 outside loss_mask
    returns: Tensor | None = None  # [N, T] value targets (estimators with needs_critic)
    metrics: dict[str, float] = field(default_factory=dict)
    values: Tensor | None = None  # [N, T] the critic's values the targets came from (the step sets them; None: no critic)


@dataclass(frozen=True)
class Estimator:
    fn: Callable[[AdvantageInputs, Any], Advantages]  # (inputs, the config's algo section) -> advantages
    needs_critic: bool = False  # a learned value model is built, trained and its values passed in
    needs_groups: bool = True  # rollout.n must be > 1 (a group baseline of one sample is the sample)
    needs_policy_stats: bool = False  # old_logprobs and sum_pi_squared are passed in (a pass over the vocabulary)
    needs_greedy: bool = False  # a greedy response per prompt is sampled and scored: greedy_rewards


def sequence_rewards(x: AdvantageInputs) -> Tensor:
    """[N] each response's reward minus its summed KL penalty (algo.kl.use=reward)."""
    return x.rewards + x.kl_rewards.sum(-1)


def grpo(x: AdvantageInputs, algo) -> Advantages:
    """GRPO (Shao et al. 2024): the group-normalised sequence reward on every token; algo.adv.std_normalize
    off is Dr. GRPO (Liu et al. 2025), std_scope=batch normalises by the batch's std."""
    adv = algo.adv
    seq = group_advantages(sequence_rewards(x), x.group_ids, std_normalize=adv.std_normalize, std_scope=adv.std_scope)
    return Advantages(expand_to_tokens(seq, x.loss_mask))


def rloo(x: AdvantageInputs, algo) -> Advantages:
    """RLOO (Ahmadian et al. 2024): the reward minus the mean of the group's other rewards, on every token."""
    return Advantages(expand_to_tokens(rloo_advantages(sequence_rewards(x), x.group_ids), x.loss_mask))


def reinforce_pp(x: AdvantageInputs, algo) -> Advantages:
    """REINFORCE++ (Hu 2025): per-token returns (the sequence reward minus the KL penalty still to go)
    whitened over all the batch's counted tokens."""
    return Advantages(reinforce_pp_advantages(x.rewards, x.response_mask, kl_rewards=x.kl_rewards, loss_mask=x.loss_mask))


def ppo_gae(x: AdvantageInputs, algo) -> Advantages:
    """PPO with a learned critic: token-level GAE from the sampling-time values, the outcome reward on the
    last token plus the KL penalty per token.

    Decoupled GAE (VC-PPO): lam_actor for the advantages, lam_critic for the value targets; with
    algo.critic.length_adaptive_alpha the policy lambda is VAPO's 1 - 1/(alpha * length) per response.
    metrics: actor/gae_lambda, the mean policy lambda."""
    crit, mask = algo.critic, x.response_mask
    token_rewards = outcome_token_rewards(x.rewards, mask) + x.kl_rewards
    if crit.length_adaptive_alpha is not None:
        lam_actor = length_adaptive_lambda(mask.sum(-1), crit.length_adaptive_alpha)  # [N]
    else:
        lam_actor = torch.full((len(x.rewards),), crit.lam_actor)
    advantages, _ = gae(token_rewards, x.values, mask, gamma=crit.gamma, lam=lam_actor)
    _, returns = gae(token_rewards, x.values, mask, gamma=crit.gamma, lam=crit.lam_critic)
    if crit.whiten_advantages:
        advantages = whiten_advantages(advantages, x.loss_mask)
    return Advantages(advantages * x.loss_mask, returns, {"actor/gae_lambda": float(lam_actor.mean())})


ADVANTAGE_ESTIMATORS.register("grpo", Estimator(grpo))
ADVANTAGE_ESTIMATORS.register("rloo", Estimator(rloo))
ADVANTAGE_ESTIMATORS.register("reinforce_pp", Estimator(reinforce_pp, needs_groups=False))
ADVANTAGE_ESTIMATORS.register("gae", Estimator(ppo_gae, needs_critic=True, needs_groups=False))


# ---- the verl / prime-rl / SkyRL group estimators: each the sequence reward (minus its KL penalty, as
# verl sums token_level_rewards) through one pure function of algo/advantages.py, on every counted token.


def grpo_passk(x: AdvantageInputs, algo) -> Advantages:
    """Pass@k with k = rollout.n (Tang et al. 2025; verl grpo_passk): only each group's unique best response
    gets an advantage, (r_max - r_second_max) / (std + eps); algo.adv.std_normalize and std_scope as in grpo."""
    adv = algo.adv
    seq = passk_advantages(sequence_rewards(x), x.group_ids, std_normalize=adv.std_normalize, std_scope=adv.std_scope)
    return Advantages(expand_to_tokens(seq, x.loss_mask))


def reinforce_pp_baseline(x: AdvantageInputs, algo) -> Advantages:
    """REINFORCE++-baseline (Hu et al. 2025; verl reinforce_plus_plus_baseline): the reward minus its group mean
    on every token, whitened over all the batch's counted tokens."""
    return Advantages(reinforce_pp_baseline_advantages(sequence_rewards(x), x.group_ids, x.loss_mask))


def opo(x: AdvantageInputs, algo) -> Advantages:
    """OPO (Hao et al. 2025; verl opo): the reward minus the group's length-weighted mean reward, lengths
    counted in generated tokens (response_mask)."""
    seq = opo_advantages(sequence_rewards(x), x.group_ids, x.response_mask.sum(-1))
    return Advantages(expand_to_tokens(seq, x.loss_mask))


def gpg(x: AdvantageInputs, algo) -> Advantages:
    """GPG (Chu et al. 2025; verl gpg): alpha * (reward - group mean), alpha by algo.adv.gpg_alpha."""
    seq = gpg_advantages(sequence_rewards(x), x.group_ids, alpha=algo.adv.gpg_alpha)
    return Advantages(expand_to_tokens(seq, x.loss_mask))


def maxrl(x: AdvantageInputs, algo) -> Advantages:
    """MaxRL (Tajwar et al. 2026; prime-rl max_rl, SkyRL maxrl): (reward - group mean) / group mean."""
    return Advantages(expand_to_tokens(maxrl_advantages(sequence_rewards(x), x.group_ids), x.loss_mask))


def gdpo(x: AdvantageInputs, algo) -> Advantages:
    """GDPO (Liu et al. 2026; verl gdpo): each reward.functions component normalised within its group, summed
    with reward.functions[].weight, then (algo.adv.gdpo_whiten) whitened over the batch's counted tokens
    (token, verl) or its counted responses (sequence, TRL and NeMo-RL), or not (none).

    The rest of the sequence reward (shaping terms, reward.incorrect, the KL penalty) is centred on its group
    mean and added unscaled (`gdpo_advantages`). Without per-component scores the sequence reward is the one
    component, as in verl's fallback: then gdpo is grpo, whitened."""
    adv, total = algo.adv, sequence_rewards(x)  # [N]
    if x.components:
        weight_of = x.component_weights or {}
        components = torch.stack([x.components[name].to(total) for name in x.components])  # [K, N]
        weights = torch.tensor([weight_of.get(name, 1.0) for name in x.components], dtype=total.dtype)  # [K]
        shaping = total - (weights[:, None] * components).sum(0)  # [N]
    else:
        components, weights, shaping = total[None], None, None  # [1, N]
    seq = gdpo_advantages(components, x.group_ids, weights=weights, shaping=shaping,
                          std_normalize=adv.std_normalize, std_scope=adv.std_scope)  # [N]
    if adv.gdpo_whiten == "sequence":  # TRL / NeMo-RL: one value per counted response, unbiased std
        counted = x.loss_mask.sum(-1) > 0  # [N]
        seq = whiten_advantages(seq, counted.to(seq.dtype), unbiased=True)
    tokens = expand_to_tokens(seq, x.loss_mask)  # [N, T]
    if adv.gdpo_whiten == "token":  # verl's masked_whiten: a long response weighs more in the statistics
        tokens = whiten_advantages(tokens, x.loss_mask, unbiased=True)
    return Advantages(tokens)


ADVANTAGE_ESTIMATORS.register("grpo_passk", Estimator(grpo_passk))
ADVANTAGE_ESTIMATORS.register("reinforce_pp_baseline", Estimator(reinforce_pp_baseline))
ADVANTAGE_ESTIMATORS.register("opo", Estimator(opo))
ADVANTAGE_ESTIMATORS.register("gpg", Estimator(gpg))
ADVANTAGE_ESTIMATORS.register("maxrl", Estimator(maxrl))
ADVANTAGE_ESTIMATORS.register("gdpo", Estimator(gdpo))


# ---- per-token and greedy baselines (algo/token_baselines.py): the reward to go G_t (the outcome reward
# on the last token plus the KL penalty, gamma 1) minus a baseline, no whitening.


def reward_to_go(x: AdvantageInputs) -> Tensor:
    """[N, T] G_t = the outcome reward plus the KL penalty still to go (gamma 1), 0 off the response."""
    return discounted_returns(outcome_token_rewards(x.rewards, x.response_mask) + x.kl_rewards, x.response_mask)


def _policy_stats(x: AdvantageInputs, name: str) -> tuple[Tensor, Tensor]:
    if x.old_logprobs is None or x.sum_pi_squared is None:
        raise ValueError(f"algo.adv.estimator={name} needs the old logprobs and sum_pi_squared in its inputs")
    return x.old_logprobs, x.sum_pi_squared


def optimal_token_baseline(x: AdvantageInputs, algo) -> Advantages:
    """Optimal token baseline (verl optimal_token_baseline): G_t minus the group's W-weighted mean return at
    response position t, W the cumulative path variance sum_j (1 - 2 pi_j + sum_v pi_v^2), times the
    squared importance weight when a correction is on."""
    lp, spp = _policy_stats(x, "optimal_token_baseline")
    return Advantages(optimal_token_baseline_advantages(reward_to_go(x), lp, spp, x.loss_mask, x.group_ids,
                                                        is_weights=x.is_weights, align="position"))


def tir_optimal_token_baseline(x: AdvantageInputs, algo) -> Advantages:
    """The tool-integrated variant (verl tir_optimal_token_baseline): the steps are each response's counted
    tokens in order, so tool output between turns does not misalign the group's steps."""
    lp, spp = _policy_stats(x, "tir_optimal_token_baseline")
    return Advantages(optimal_token_baseline_advantages(reward_to_go(x), lp, spp, x.loss_mask, x.group_ids,
                                                        is_weights=x.is_weights, align="token"))


def remax(x: AdvantageInputs, algo) -> Advantages:
    """ReMax (Li et al. 2024; verl remax): G_t minus the reward of the greedy response to the same prompt."""
    if x.greedy_rewards is None:
        raise ValueError("algo.adv.estimator=remax needs greedy_rewards in its inputs (the greedy rollout)")
    return Advantages(remax_advantages(reward_to_go(x), x.greedy_rewards, x.loss_mask))


ADVANTAGE_ESTIMATORS.register("optimal_token_baseline", Estimator(optimal_token_baseline, needs_policy_stats=True))
ADVANTAGE_ESTIMATORS.register("tir_optimal_token_baseline", Estimator(tir_optimal_token_baseline,
                                                                      needs_policy_stats=True))
ADVANTAGE_ESTIMATORS.register("remax", Estimator(remax, needs_groups=False, needs_greedy=True))
