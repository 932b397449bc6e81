"""Pure tensor functions of the RL algorithms: advantages (group baselines, and GAE with a critic),
policy/value/entropy/KL losses, loss aggregation and coefficient controllers. docs/tricks.md maps
each paper trick to its config switch and function here."""

from mathrl.algo.advantages import (
    StdScope,
    discounted_returns,
    expand_to_tokens,
    group_advantages,
    rloo_advantages,
    whiten_advantages,
)
from mathrl.algo.critic import explained_variance, gae, length_adaptive_lambda, value_loss
from mathrl.algo.controllers import (
    AdaptiveEntropyController,
    AdaptiveKLController,
    CoefController,
    FixedCoef,
    SkyworkEntropyController,
)
from mathrl.algo.entropy import entropy_bonus_mask, entropy_from_logits, logprobs_and_entropy
from mathrl.algo.kl import KL_ESTIMATORS, KLEstimator, apply_kl_reward_penalty, kl_penalty
from mathrl.algo.losses import (
    AGG_MODES,
    AggMode,
    aggregate,
    batch_counts,
    dp_scale,
    global_counts,
    masked_mean,
    masked_sum,
    policy_loss,
    positive_example_lm_loss,
    sft_loss,
)

__all__ = [
    # advantages
    "StdScope",
    "group_advantages",
    "rloo_advantages",
    "whiten_advantages",
    "discounted_returns",
    "expand_to_tokens",
    # PPO with a critic
    "gae",
    "length_adaptive_lambda",
    "value_loss",
    "explained_variance",
    # losses and aggregation
    "AggMode",
    "AGG_MODES",
    "masked_sum",
    "masked_mean",
    "policy_loss",
    "aggregate",
    "batch_counts",
    "global_counts",
    "dp_scale",
    "sft_loss",
    "positive_example_lm_loss",
    # entropy
    "entropy_from_logits",
    "logprobs_and_entropy",
    "entropy_bonus_mask",
    # KL
    "KLEstimator",
    "KL_ESTIMATORS",
    "kl_penalty",
    "apply_kl_reward_penalty",
    # controllers
    "CoefController",
    "FixedCoef",
    "AdaptiveKLController",
    "AdaptiveEntropyController",
    "SkyworkEntropyController",
]
