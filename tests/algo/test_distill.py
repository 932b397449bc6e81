"""On-policy distillation's signals (algo/distill.py): closed forms on hand-made distributions, the
direction by name, and equality with verl's distillation losses (verl @1dda039,
verl/trainer/distillation/losses.py and fsdp/losses.py, verl/trainer/ppo/core_algos.py: kl_penalty_forward,
compute_policy_loss_vanilla, agg_loss), their formulas written out here, in loss, per-token loss and gradient.
"""

from __future__ import annotations

import math

import pytest
import torch

from mathrl.algo.distill import (
    estimate_advantages,
    generalized_jsd,
    kl_estimate,
    reverse_kl_advantages,
    teacher_stats,
    topk_forward_kl,
)
from mathrl.algo.losses import aggregate
from mathrl.registry import POLICY_LOSSES

P_S = [0.5, 0.3, 0.2]  # the student's distribution at one position
P_T = [0.02, 0.08, 0.9]  # the teacher's: its mode is token 2, the student's token 0


def kl(p, q):
    """KL(p || q) by its definition, in plain floats."""
    return sum(a * math.log(a / b) for a, b in zip(p, q))


def logs(p):
    return torch.tensor([[[math.log(x) for x in p]]], dtype=torch.float64)  # [1, 1, V]


# ----------------------------------------------------------------------------- closed forms
@pytest.mark.parametrize("beta, expected, why", [
    (0.0, kl(P_T, P_S), "beta 0 is KL(teacher || student), TRL's forward direction"),
    (1.0, kl(P_S, P_T), "beta 1 is KL(student || teacher), TRL's reverse direction"),
    (0.5, 0.5 * kl(P_T, [(a + b) / 2 for a, b in zip(P_T, P_S)]) + 0.5 * kl(P_S, [(a + b) / 2 for a, b in zip(P_T, P_S)]),
     "beta 0.5 is the symmetric Jensen-Shannon divergence with the mixture M = (T + S) / 2"),
    (0.25, 0.25 * kl(P_T, [0.25 * a + 0.75 * b for a, b in zip(P_T, P_S)])
     + 0.75 * kl(P_S, [0.25 * a + 0.75 * b for a, b in zip(P_T, P_S)]),
     "any other beta weighs the teacher's side by beta in the mixture and the sum"),
])
def test_generalized_jsd_closed_forms(beta, expected, why):
    got = generalized_jsd(logs(P_S), logs(P_T), beta=beta)
    assert got.shape == (1, 1)
    assert float(got) == pytest.approx(expected, abs=1e-12), why


def test_generalized_jsd_rejects_beta_outside_unit():
    with pytest.raises(ValueError, match="beta"):
        generalized_jsd(logs(P_S), logs(P_T), beta=1.5)


def test_topk_forward_kl_full_support_is_kl_teacher_student():
    # why: with k = the vocabulary nothing is cut, so it is the forward KL itself (not the reverse one)
    got = float(topk_forward_kl(logs(P_S), logs(P_T)))
    assert got == pytest.approx(kl(P_T, P_S), abs=1e-12)
    assert abs(got - kl(P_S, P_T)) > 0.1


@pytest.mark.parametrize("keep, expected, why", [
    ([2, 1], 0.9 * math.log(0.9 / 0.2) + 0.08 * math.log(0.08 / 0.3),
     "the teacher's top-2 (tokens 2 and 1): the sum over them, not renormalised"),
    ([0], 0.0, "the teacher's 0.02 on token 0 against the student's 0.5: 0.02 log(0.02/0.5) < 0, clamped to 0 as verl does"),
])
def test_topk_forward_kl_partial_support(keep, expected, why):
    s, t = logs(P_S)[..., keep], logs(P_T)[..., keep]
    assert float(topk_forward_kl(s, t)) == pytest.approx(expected, abs=1e-12), why


def test_topk_forward_kl_log_prob_min_clamps_both_sides():
    # why: verl's log_prob_min_clamp bounds both logprobs below before the KL (a token of logprob -30 counts as -10)
    s = torch.tensor([[[-30.0, math.log(0.5)]]], dtype=torch.float64)
    t = torch.tensor([[[math.log(0.5), -30.0]]], dtype=torch.float64)
    expected = 0.5 * (math.log(0.5) + 10.0) + math.exp(-10.0) * (-10.0 - math.log(0.5))
    assert float(topk_forward_kl(s, t, log_prob_min=-10.0)) == pytest.approx(expected, abs=1e-12)


def test_reverse_kl_advantage_expectation_is_minus_kl_student_teacher():
    # why: the advantage at a token drawn from the student averages to -KL(student || teacher), the OPD objective
    lp_s, lp_t = logs(P_S)[0], logs(P_T)[0]  # [1, V]: one row per position, one column per possible token
    adv = reverse_kl_advantages(lp_t, lp_s, torch.ones_like(lp_s))
    assert float((torch.tensor(P_S, dtype=torch.float64) * adv[0]).sum()) == pytest.approx(-kl(P_S, P_T), abs=1e-12)


@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_unbiased_estimators_average_to_kl_student_teacher(estimator):
    # why: k1 and k3 are unbiased estimates of KL(p || q) with p the sampling (student) side
    est = kl_estimate(logs(P_S)[0], logs(P_T)[0], estimator=estimator)  # [1, V]
    assert float((torch.tensor(P_S, dtype=torch.float64) * est[0]).sum()) == pytest.approx(kl(P_S, P_T), abs=1e-12)


def test_no_signal_outside_the_mask():
    # why: prompt, observation (tool output) and padding tokens carry mask 0: no advantage there, and the direct
    # losses aggregate over the mask only, so no gradient reaches them
    t = torch.tensor([[-1.0, -2.0, -3.0]])
    s = torch.tensor([[-2.0, -1.0, -0.5]], requires_grad=True)
    mask = torch.tensor([[1.0, 0.0, 1.0]])
    assert reverse_kl_advantages(t, s, mask)[0, 1] == 0
    assert estimate_advantages(s, t, mask, estimator="k3")[0, 1] == 0
    s_top = torch.randn(1, 3, 4, requires_grad=True)
    t_top = torch.log_softmax(torch.randn(1, 3, 4), -1)
    loss = aggregate(generalized_jsd(torch.log_softmax(s_top, -1), t_top, beta=0.5), mask, mode="token_mean",
                     num_tokens=2, num_seqs=1)
    loss.backward()
    assert torch.count_nonzero(s_top.grad[0, 1]) == 0 and torch.count_nonzero(s_top.grad[0, 0]) > 0


def test_teacher_stats():
    # two counted tokens: student logprobs -1, -2; teacher -1.5, -1; the second is the teacher's argmax
    s = torch.tensor([[-1.0, -2.0, -9.0]])
    t = torch.tensor([[-1.5, -1.0, -9.0]])
    argmax = torch.tensor([[0.0, 1.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    got = teacher_stats(s, t, argmax, mask)
    k3 = [math.exp(-0.5) + 0.5 - 1, math.exp(1.0) - 1.0 - 1]  # r - log r - 1 with r = p_T / p_S
    assert got["distill/reverse_kl_k1"] == pytest.approx((0.5 - 1.0) / 2)
    assert got["distill/reverse_kl_k3"] == pytest.approx(sum(k3) / 2)
    assert got["distill/teacher_logprob"] == pytest.approx(-1.25)
    assert got["distill/teacher_argmax_frac"] == pytest.approx(0.5)


# ----------------------------------------------------------------------------- the direction, by name
def exact_pg_step(theta, teacher_logp, *, lr=0.5):
    """One gradient step of reverse_kl through ppo_clip, in exact expectation: every token of the vocabulary is a
    row, weighted by the student's probability of sampling it (the importance weight of an exhaustive sample)."""
    logp = torch.log_softmax(theta, -1)  # [V]
    lp = logp[:, None]  # [V, 1]: row y is "the student sampled y"
    adv = reverse_kl_advantages(teacher_logp[:, None], lp.detach(), torch.ones_like(lp))
    token_loss, _ = POLICY_LOSSES.get("ppo_clip").fn(lp, lp.detach(), adv, torch.ones_like(lp),
                                                     weights=logp.exp().detach()[:, None])
    grad, = torch.autograd.grad(token_loss.sum(), theta)
    return (theta - lr * grad).detach().requires_grad_(True)


def test_reverse_kl_moves_the_student_toward_the_teachers_mode():
    # why: the direction is the first thing to get right (peers shipped it backwards): descending the loss must
    # raise the student's probability of the teacher's most likely token and lower KL(student || teacher)
    theta = torch.log(torch.tensor(P_S, dtype=torch.float64)).requires_grad_(True)
    teacher = torch.log(torch.tensor(P_T, dtype=torch.float64))
    before = torch.softmax(theta, -1).detach()
    for _ in range(20):
        theta = exact_pg_step(theta, teacher)
    after = torch.softmax(theta, -1).detach()
    assert after[2] > before[2] + 0.3  # the teacher's mode (0.9) gained
    assert after.argmax() == 2
    assert kl(after.tolist(), P_T) < 0.1 * kl(before.tolist(), P_T)


def test_reverse_kl_policy_gradient_is_the_gradient_of_reverse_kl():
    # why: in expectation the policy-gradient of the k1 advantage is -grad KL(student || teacher), not the forward KL's
    theta = torch.log(torch.tensor(P_S, dtype=torch.float64)).requires_grad_(True)
    teacher = torch.log(torch.tensor(P_T, dtype=torch.float64))
    logp = torch.log_softmax(theta, -1)
    lp = logp[:, None]
    adv = reverse_kl_advantages(teacher[:, None], lp.detach(), torch.ones_like(lp))
    token_loss, _ = POLICY_LOSSES.get("ppo_clip").fn(lp, lp.detach(), adv, torch.ones_like(lp),
                                                     weights=logp.exp().detach()[:, None])
    pg, = torch.autograd.grad(token_loss.sum(), theta)
    reverse, = torch.autograd.grad((torch.softmax(theta, -1) * (torch.log_softmax(theta, -1) - teacher)).sum(), theta)
    forward, = torch.autograd.grad((teacher.exp() * (teacher - torch.log_softmax(theta, -1))).sum(), theta)
    torch.testing.assert_close(pg, reverse)
    assert (pg - forward).abs().max() > 0.05
