"""On-policy distillation: per-token signals from a teacher's logprobs of the student's own samples.

The student samples (as in RL), a frozen teacher scores the same tokens, and each sampled token gets a
dense signal (``algo.distill.mode``), named by direction:

* ``reverse_kl``: the advantage log pi_T(y_t) - log pi_S(y_t), KL(student || teacher), mode-seeking;
* ``forward_kl_topk``: KL(teacher || student) over the teacher's top-k, a direct loss (verl), mass-covering;
* ``jsd``: TRL's ``generalized_jsd_loss`` (beta = 0: KL(teacher || student); beta = 1: KL(student || teacher)).

Every logprob is of the tempered distribution, the student's and the teacher's alike; verl's k1/k2/k3
single-sample estimators are ``kl_estimate`` (as a reward or a direct loss). Sources, conventions and
the gradient of each form: docs/guide.md ("Distillation from a teacher") and docs/tricks.md. Pure
tensor functions; tests: ``python -m pytest tests/algo/test_distill.py tests/algo/test_distill_verl.py -q``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from mathrl.algo.kl import kl_penalty

__all__ = ["reverse_kl_advantages", "kl_estimate", "estimate_advantages", "topk_forward_kl", "generalized_jsd",
           "teacher_stats"]


def _at_least_float32(x: Tensor) -> Tensor:
    """float32 for lower precisions (bfloat16 logprobs summed over k tokens), float64 kept."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def reverse_kl_advantages(teacher_logprobs: Tensor, student_logprobs: Tensor, mask: Tensor) -> Tensor:
    """Per-token advantage log pi_T(y_t) - log pi_S(y_t), 0 outside the mask (Thinking Machines' OPD).

    Its expectation under the student is -KL(pi_S || pi_T) at that position (the k1 estimate); with
    discount 0 each token's advantage is its own term, never a sum over later tokens, and nothing is
    normalised. ``student_logprobs`` is detached: the sampler's (Thinking Machines) or the current
    policy's (verl) logprobs, the caller's choice (``algo.distill.student``).

    teacher_logprobs, student_logprobs: [B, T] of the sampled tokens; mask: [B, T] nonzero on the tokens that
    carry a signal (no prompt, observation or padding token). -> [B, T]."""
    adv = teacher_logprobs - student_logprobs.detach()  # [B, T]
    return torch.where(mask.bool(), adv, torch.zeros_like(adv))


def kl_estimate(student_logprobs: Tensor, teacher_logprobs: Tensor, *, estimator: str,
                clamp: float | None = None) -> Tensor:
    """[B, T] verl's per-token estimate of KL(pi_S || pi_T) from the sampled token (``algo/kl.py:kl_penalty``
    with p = the student, q = the teacher: k1 log pi_S - log pi_T, k2 its square / 2, k3 r - log r - 1 with
    r = pi_T / pi_S, k3 capped at 10), then clamped to [-clamp, clamp] when ``clamp`` is set (verl's
    ``loss_max_clamp``, 10 by default there). Differentiable in ``student_logprobs``."""
    est = kl_penalty(student_logprobs, teacher_logprobs, estimator=estimator)  # [B, T]
    return est if clamp is None else est.clamp(-clamp, clamp)


def estimate_advantages(student_logprobs: Tensor, teacher_logprobs: Tensor, mask: Tensor, *, estimator: str,
                        clamp: float | None = None) -> Tensor:
    """[B, T] -kl_estimate, detached, 0 outside the mask: an estimator as a policy-gradient reward (verl's
    use_policy_gradient). k1 without clamp is ``reverse_kl_advantages``."""
    adv = -kl_estimate(student_logprobs.detach(), teacher_logprobs, estimator=estimator, clamp=clamp)
    return torch.where(mask.bool(), adv, torch.zeros_like(adv))


def topk_forward_kl(student_logprobs: Tensor, teacher_logprobs: Tensor, *,
                    log_prob_min: float | None = None) -> Tensor:
    """[B, T] sum_k pi_T(k) (log pi_T(k) - log pi_S(k)) over the teacher's top-k tokens, clamped below at 0.

    Neither side is renormalised over the k tokens (verl's ``compute_forward_kl_topk``), so a position
    where the student puts more mass on the k tokens than the teacher can come out negative; it is
    clamped to 0 there, as verl clamps it. ``log_prob_min`` (verl's ``log_prob_min_clamp``, -10 there;
    None here) bounds both sides' logprobs from below first.

    student_logprobs: [B, T, K] the student's (differentiable) logprobs of the teacher's top-k token ids;
    teacher_logprobs: [B, T, K] the teacher's."""
    s, t = _at_least_float32(student_logprobs), _at_least_float32(teacher_logprobs)
    if log_prob_min is not None:
        s, t = s.clamp_min(log_prob_min), t.clamp_min(log_prob_min)
    kl = (t.exp() * (t - s)).sum(-1)  # [B, T]
    return kl.clamp_min(0.0)


def generalized_jsd(student_logprobs: Tensor, teacher_logprobs: Tensor, *, beta: float) -> Tensor:
    """[B, T] the generalized JSD of TRL's ``generalized_jsd_loss`` (GKD, Agarwal et al. 2024, eq. 1) per position:

        beta = 0:  KL(pi_T || pi_S)            (mass-covering, forward)
        beta = 1:  KL(pi_S || pi_T)            (mode-seeking, reverse)
        otherwise: beta KL(pi_T || M) + (1 - beta) KL(pi_S || M),  M = beta pi_T + (1 - beta) pi_S

    summed over the last axis (the teacher's top-k support; the whole vocabulary gives TRL's value),
    negative values (possible only on a partial support) clamped to 0.

    student_logprobs: [B, T, K] (differentiable); teacher_logprobs: [B, T, K]; beta in [0, 1]."""
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must be in [0, 1], got {beta}")
    s, t = _at_least_float32(student_logprobs), _at_least_float32(teacher_logprobs)
    if beta == 0.0:
        jsd = (t.exp() * (t - s)).sum(-1)
    elif beta == 1.0:
        jsd = (s.exp() * (s - t)).sum(-1)
    else:
        mix = torch.logsumexp(torch.stack([t + math.log(beta), s + math.log(1.0 - beta)]), dim=0)  # [B, T, K] log M
        jsd = beta * (t.exp() * (t - mix)).sum(-1) + (1.0 - beta) * (s.exp() * (s - mix)).sum(-1)
    return jsd.clamp_min(0.0)


@torch.no_grad()
def teacher_stats(student_logprobs: Tensor, teacher_logprobs: Tensor, teacher_argmax: Tensor,
                  mask: Tensor) -> dict[str, float]:
    """The step's distillation metrics over the mask's tokens: the k1 and k3 estimates of KL(pi_S || pi_T)
    (the tokens were drawn from the student: both are unbiased), the teacher's mean logprob of the
    sampled tokens, and the share of them that are the teacher's most likely token.

    student_logprobs: [B, T] the sampler's; teacher_logprobs: [B, T]; teacher_argmax: [B, T] 1 where the
    sampled token is the teacher's argmax; mask: [B, T]."""
    m = mask.bool()
    count = max(int(m.sum()), 1)

    def mean(x: Tensor) -> float:
        return float(torch.where(m, x, torch.zeros_like(x)).sum()) / count

    return {
        "distill/reverse_kl_k1": mean(kl_penalty(student_logprobs, teacher_logprobs, estimator="k1")),
        "distill/reverse_kl_k3": mean(kl_penalty(student_logprobs, teacher_logprobs, estimator="k3", clamp=None)),
        "distill/teacher_logprob": mean(teacher_logprobs),
        "distill/teacher_argmax_frac": mean(teacher_argmax.float()),
    }
