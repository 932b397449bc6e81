"""Per-token KL estimators between the policy and a reference model, and the KL reward penalty.

Switches: ``algo.kl.use`` (``loss``: add ``coef * aggregate(kl_penalty(...))`` to the loss, as in
GRPO, DeepSeekMath §4.1.2 eq. 4; ``reward``: subtract it from the token rewards before computing
advantages, as in Ziegler et al. 2019 / InstructGPT; ``none``), ``algo.kl.estimator`` and
``algo.kl.coef`` (or an ``AdaptiveKLController`` from ``mathrl.algo.controllers``).

Run the tests with ``python -m pytest tests/algo/test_entropy_kl.py -q``.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

__all__ = ["KLEstimator", "KL_ESTIMATORS", "kl_penalty", "apply_kl_reward_penalty"]

KLEstimator = Literal["k1", "k2", "k3", "k1+", "k3+"]
KL_ESTIMATORS: tuple[str, ...] = ("k1", "k2", "k3", "k1+", "k3+")

# exp() of a log-ratio beyond +-20 only adds inf/NaN risk; verl clamps the same way.
_LOG_RATIO_CLAMP = 20.0


def kl_penalty(
    logprobs: Tensor,
    ref_logprobs: Tensor,
    *,
    estimator: KLEstimator,
    clamp: float | None = 10.0,
) -> Tensor:
    """Per-token estimate of KL(p || q), p = policy, q = reference, from the sampled token's
    log-probabilities (Schulman 2020, "Approximating KL Divergence",
    http://joschu.net/blog/kl-approx.html).

    With log_r = log q - log p evaluated at a token sampled from p:
        k1 = -log_r = log p - log q          unbiased, high variance, can be negative
        k2 = 0.5 * (log p - log q)^2         biased, low variance, >= 0
        k3 = exp(log_r) - log_r - 1          unbiased, low variance, >= 0
    k3 is the estimator of GRPO (DeepSeekMath eq. 4). For k3 the log-ratio is clamped to [-20, 20]
    before exp() (keeps float32 finite and the backward NaN-free), and the result is clamped to
    [-clamp, clamp] (k3 >= 0, so in effect an upper cap at ``clamp``; verl's ``low_var_kl`` uses
    10). ``clamp=None`` disables the outer clamp. k1 and k2 are never clamped.

    "k1+" and "k3+" (verl's `kl_penalty` with a trailing "+") have the value of k1 / k3 and the gradient of
    k2, by a straight-through sum k2 - sg(k2) + sg(k): k1 and k3 are unbiased for the KL's value but their
    expected gradient is not the KL's gradient, while k2's is (d k2 / d log p = log p - log q, whose
    expectation under p is the gradient of KL(p || q) in the sampled logit's direction).

    logprobs: [B, T] log p(token) under the policy (differentiable); ref_logprobs: [B, T] log q(token) under the
    reference model; estimator: "k1", "k2" or "k3" (config ``algo.kl.estimator``); clamp: a bound on the k3
    estimate, or None. -> [B, T] the per-token KL estimate (unmasked: aggregate or mask it yourself).
    """
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(
            f"logprobs and ref_logprobs must have the same shape, got {tuple(logprobs.shape)} "
            f"and {tuple(ref_logprobs.shape)}"
        )
    diff = logprobs - ref_logprobs  # [B, T] log p - log q
    if estimator in ("k1+", "k3+"):
        value = kl_penalty(logprobs.detach(), ref_logprobs, estimator=estimator[:-1], clamp=clamp)  # [B, T]
        k2 = 0.5 * diff.square()  # [B, T] carries the gradient
        return k2 - k2.detach() + value
    if estimator == "k1":
        return diff
    if estimator == "k2":
        return 0.5 * diff.square()
    if estimator == "k3":
        log_r = (-diff).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)  # [B, T] log q - log p
        k3 = torch.exp(log_r) - log_r - 1.0
        return k3 if clamp is None else k3.clamp(-clamp, clamp)
    raise ValueError(f"unknown KL estimator {estimator!r}; choose one of {KL_ESTIMATORS}")


def apply_kl_reward_penalty(
    token_rewards: Tensor, kl: Tensor, mask: Tensor, *, coef: float
) -> Tensor:
    """Token rewards minus the KL penalty, r_t - coef * kl_t on counted tokens (``algo.kl.use:
    reward``; Ziegler et al. 2019 §2, Ouyang et al. 2022 eq. 2).

    ``kl`` is detached: rewards are constants for the policy gradient, the KL acts through the
    advantages only.

    token_rewards: [B, T] reward per token (e.g. the outcome reward on the last token); kl: [B, T] per-token KL
    estimate from ``kl_penalty``; mask: [B, T] nonzero on counted tokens, other positions keep their reward
    unchanged; coef: the penalty coefficient beta (config ``algo.kl.coef``). -> [B, T] the penalised rewards.
    """
    if not (token_rewards.shape == kl.shape == mask.shape):
        raise ValueError(
            "token_rewards, kl and mask must have the same shape, got "
            f"{tuple(token_rewards.shape)}, {tuple(kl.shape)}, {tuple(mask.shape)}"
        )
    penalty = torch.where(mask.bool(), coef * kl.detach(), torch.zeros_like(kl))  # [B, T]
    return token_rewards - penalty
