"""algo/distill.py against verl's distillation losses at verl @1dda039, whose formulas are written out below
from verl/trainer/distillation/losses.py (distillation_loss: the estimate clamped to [-10, 10], then either
the policy-gradient reward -estimate through compute_policy_loss_vanilla, or the estimate aggregated as it
is), verl/trainer/distillation/fsdp/losses.py (compute_forward_kl_topk) and verl/trainer/ppo/core_algos.py
(kl_penalty_forward, compute_policy_loss_vanilla with clip 0.2 / 0.2 and dual clip 3, agg_loss).

For each estimator verl offers (k1, k2, k3, and top-k forward KL), as a policy-gradient reward and as a
direct loss, under each aggregation mode: the loss, the per-token loss and the gradient are equal.
"""

from __future__ import annotations

import pytest
import torch

from mathrl.algo.distill import estimate_advantages, kl_estimate, topk_forward_kl
from mathrl.algo.losses import aggregate, batch_counts
from mathrl.registry import POLICY_LOSSES

MODES = {"token-mean": "token_mean", "seq-mean-token-sum": "seq_mean_token_sum",
         "seq-mean-token-mean": "seq_mean_token_mean", "seq-mean-token-sum-norm": "seq_mean_token_sum_norm"}
MAX_LEN = 6  # verl's loss_scale_factor of seq-mean-token-sum-norm, mathrl's max_len


# ----------------------------------------------------------------------------- verl's formulas, written out
def verl_kl_penalty_forward(logprob, ref_logprob, mode):
    if mode == "k1":
        return logprob - ref_logprob
    if mode == "k2":
        return 0.5 * (logprob - ref_logprob).square()
    kl = torch.clamp(ref_logprob - logprob, min=-20, max=20)  # k3 (low_var_kl)
    return torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)


def verl_agg_loss(loss_mat, loss_mask, mode):
    if mode == "token-mean":
        return (loss_mat * loss_mask).sum() / loss_mask.sum()
    if mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm"):
        seq_losses = (loss_mat * loss_mask).sum(-1)
        seq_mask = (loss_mask.sum(-1) > 0).float()
        loss = (seq_losses * seq_mask).sum() / seq_mask.sum()
        return loss / MAX_LEN if mode == "seq-mean-token-sum-norm" else loss
    seq_count = loss_mask.sum(-1)  # seq-mean-token-mean
    seq_losses = (loss_mat * loss_mask).sum(-1) / (seq_count + 1e-8)
    seq_mask = (seq_count > 0).float()
    return (seq_losses * seq_mask).sum() / seq_mask.sum()


def verl_vanilla(old_log_prob, log_prob, advantages):
    """compute_policy_loss_vanilla's per-token losses: clip 0.2 both sides, dual clip c = 3 for A < 0."""
    ratio = torch.exp(torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0))
    losses1 = -advantages * ratio
    losses2 = -advantages * torch.clamp(ratio, 0.8, 1.2)
    clip1 = torch.maximum(losses1, losses2)
    clip2 = torch.min(-advantages * 3.0, clip1)
    return torch.where(advantages < 0, clip2, clip1)


def verl_topk_losses(student_logits, teacher_topk_log_probs, teacher_topk_ids):
    s = torch.gather(torch.log_softmax(student_logits, dim=-1), -1, teacher_topk_ids).clamp_min(-10.0)
    t = teacher_topk_log_probs.clamp_min(-10.0)
    return (t.exp() * (t - s)).sum(-1).clamp_min(0.0)


def verl_distillation(per_token, log_prob, old_log_prob, mask, *, use_policy_gradient, mode):
    """distillation_loss: (the aggregated loss, the per-token loss matrix)."""
    per_token = per_token.clamp(min=-10.0, max=10.0)  # loss_max_clamp
    if use_policy_gradient:
        mat = verl_vanilla(old_log_prob, log_prob, -per_token.detach())
        return verl_agg_loss(mat, mask, mode), mat
    return verl_agg_loss(per_token, mask, mode), per_token


# ----------------------------------------------------------------------------- inputs
MASK = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])  # a padded row, an empty one
TEACHER = torch.tensor([[-0.2, -3.0, -1.0, -12.0], [-2.5, -0.1, -4.0, -1.0], [-1.0, -1.0, -1.0, -1.0]], dtype=torch.float64)
STUDENT = torch.tensor([[-1.0, -0.5, -1.1, -0.3], [-0.4, -2.0, -0.7, -0.2], [-0.5, -0.5, -0.5, -0.5]], dtype=torch.float64)
# the old policy: ratio 1 at some tokens, above 1.2 at a positive advantage, below 0.8, far above (dual clip)
OLD = STUDENT + torch.tensor([[0.0, 0.5, -0.4, 0.0], [-1.5, 0.3, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)


def ours(per_token_fn, *, pg, mode):
    """mathrl's loss, per-token loss and gradient (wrt the student's logprobs) for one estimator and form."""
    s = STUDENT.clone().requires_grad_(True)
    num_tokens, num_seqs = batch_counts(MASK)
    if pg:
        adv = estimate_advantages(s, TEACHER, MASK, estimator=per_token_fn, clamp=10.0)
        mat, _ = POLICY_LOSSES.get("ppo_clip").fn(s, OLD, adv, MASK, eps_low=0.2, eps_high=0.2, dual_clip_c=3.0)
    else:
        mat = kl_estimate(s, TEACHER, estimator=per_token_fn, clamp=10.0)
    loss = aggregate(mat, MASK, mode=MODES[mode], num_tokens=num_tokens, num_seqs=num_seqs, max_len=MAX_LEN)
    grad, = torch.autograd.grad(loss, s)
    return loss.detach(), mat.detach(), grad


def verls(estimator, *, pg, mode):
    s = STUDENT.clone().requires_grad_(True)
    loss, mat = verl_distillation(verl_kl_penalty_forward(s, TEACHER, estimator), s, OLD, MASK,
                                  use_policy_gradient=pg, mode=mode)
    grad, = torch.autograd.grad(loss, s)
    return loss.detach(), mat.detach(), grad


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("pg", [True, False], ids=["policy_gradient", "direct"])
@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_estimators_equal_verl(estimator, pg, mode):
    # why: the same inputs through verl's formulas and mathrl's functions give the same numbers in all three
    # views (the teacher's -12 at one token makes k3 exceed 10: both cap it there)
    loss, mat, grad = ours(estimator, pg=pg, mode=mode)
    v_loss, v_mat, v_grad = verls(estimator, pg=pg, mode=mode)
    torch.testing.assert_close(loss, v_loss, rtol=1e-7, atol=1e-9)
    torch.testing.assert_close(mat * MASK, v_mat * MASK, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(grad, v_grad, rtol=1e-7, atol=1e-9)


def test_k3_is_capped_on_these_inputs():
    # why: the cross-check above covers verl's clamps only if one is active: the teacher's -12 gives k3 > 10
    assert float(verl_kl_penalty_forward(STUDENT, TEACHER, "k3").max()) == 10.0


TOPK_IDS = torch.tensor([[[2, 0], [1, 3], [0, 1], [3, 2]]] * 3)  # [3, 4, 2]: the teacher's top-2 at each position
TOPK_LP = torch.log(torch.tensor([[[0.6, 0.3], [0.5, 0.1], [0.9, 0.05], [0.4, 0.4]]] * 3, dtype=torch.float64))
# [3, 4, V = 4]; the -12 puts the student's logprob of id 0 (in the teacher's top-2 there) under verl's -10 floor
LOGITS = torch.tensor([[[0.1, 2.0, -1.0, 0.5], [1.5, -0.3, 0.0, 2.2], [-12.0, 0.0, 1.0, 0.2],
                        [0.3, 0.3, 0.3, 0.3]]] * 3, dtype=torch.float64)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("pg", [True, False], ids=["policy_gradient", "direct"])
def test_topk_forward_kl_equals_verl(pg, mode):
    # why: verl's forward_kl_topk (the student's log-softmax gathered at the teacher's ids, not renormalised,
    # negatives clamped to 0); as a reward it is the advantage of the sampled token's policy gradient (verl warns
    # that this uses little of the top-k signal, and allows it)
    logits = LOGITS.clone().requires_grad_(True)
    s = STUDENT.clone().requires_grad_(True)
    num_tokens, num_seqs = batch_counts(MASK)
    per_token = topk_forward_kl(torch.log_softmax(logits, -1).gather(-1, TOPK_IDS), TOPK_LP, log_prob_min=-10.0)
    v_per_token = verl_topk_losses(logits, TOPK_LP, TOPK_IDS)
    if pg:
        adv = torch.where(MASK.bool(), -per_token.detach(), torch.zeros_like(per_token))
        mat, _ = POLICY_LOSSES.get("ppo_clip").fn(s, OLD, adv, MASK, eps_low=0.2, eps_high=0.2, dual_clip_c=3.0)
    else:
        mat = per_token
    loss = aggregate(mat, MASK, mode=MODES[mode], num_tokens=num_tokens, num_seqs=num_seqs, max_len=MAX_LEN)
    v_loss, v_mat = verl_distillation(v_per_token, s, OLD, MASK, use_policy_gradient=pg, mode=mode)
    wrt = s if pg else logits
    grad, = torch.autograd.grad(loss, wrt)
    v_grad, = torch.autograd.grad(v_loss, wrt)
    assert float(v_per_token.detach().max()) < 10.0  # verl's loss_max_clamp is not active: mathrl has no such clamp here
    assert float(torch.log_softmax(LOGITS, -1).gather(-1, TOPK_IDS).min()) < -10.0  # its log_prob_min_clamp is
    torch.testing.assert_close(loss, v_loss, rtol=1e-7, atol=1e-9)
    torch.testing.assert_close(mat.detach() * MASK, v_mat.detach() * MASK, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(grad, v_grad, rtol=1e-7, atol=1e-9)


# ----------------------------------------------------------------------------- the two forms at ratio 1
@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_at_ratio_one_the_forms_agree_in_value_not_in_gradient(estimator):
    # why: at ratio 1 the policy-gradient loss of A = -estimate is the estimate itself, token by token; its gradient
    # is estimate x grad log pi, the direct form's is grad estimate: different (for k1, 1 per token, whatever the teacher)
    s = STUDENT.clone().requires_grad_(True)
    num_tokens, num_seqs = batch_counts(MASK)
    adv = estimate_advantages(s, TEACHER, MASK, estimator=estimator, clamp=10.0)
    pg_mat, _ = POLICY_LOSSES.get("ppo_clip").fn(s, s.detach(), adv, MASK, eps_low=0.2, eps_high=0.2, dual_clip_c=3.0)
    direct_mat = kl_estimate(s, TEACHER, estimator=estimator, clamp=10.0)
    pg = aggregate(pg_mat, MASK, mode="token_mean", num_tokens=num_tokens, num_seqs=num_seqs)
    direct = aggregate(direct_mat, MASK, mode="token_mean", num_tokens=num_tokens, num_seqs=num_seqs)
    torch.testing.assert_close(pg, direct)
    g_pg, = torch.autograd.grad(pg, s)
    g_direct, = torch.autograd.grad(direct, s)
    assert (g_pg - g_direct).abs().max() > 0.05


def test_k1_direct_gradient_ignores_the_teacher():
    # why: verl refuses k1 as a direct loss: d(log pi_S - log pi_T)/d log pi_S = 1, whatever the teacher says
    grads = []
    for teacher in (TEACHER, TEACHER - 3.0):
        s = STUDENT.clone().requires_grad_(True)
        loss = aggregate(kl_estimate(s, teacher, estimator="k1"), MASK, mode="token_mean", num_tokens=6, num_seqs=2)
        grads.append(torch.autograd.grad(loss, s)[0])
    torch.testing.assert_close(grads[0], grads[1])


def test_k3_direct_gradient_is_the_forward_kl_gradient():
    # why: verl recommends k3 as a direct loss; its gradient (1 - pi_T/pi_S) grad log pi_S averages, over tokens drawn
    # from the student, to grad KL(teacher || student): the other direction than the k3 value estimates
    theta = torch.tensor([0.4, -0.2, 1.0, 0.0], dtype=torch.float64, requires_grad=True)
    teacher = torch.log_softmax(torch.tensor([2.0, 0.1, -1.0, 0.5], dtype=torch.float64), -1)
    logp = torch.log_softmax(theta, -1)
    k3 = kl_estimate(logp[None], teacher[None], estimator="k3")[0]  # [V]: each token's estimate if it were sampled
    expected_grad, = torch.autograd.grad((logp.exp().detach() * k3).sum(), theta)  # E_{y ~ pi_S}[grad k3(y)]
    forward, = torch.autograd.grad((teacher.exp() * (teacher - torch.log_softmax(theta, -1))).sum(), theta)
    reverse, = torch.autograd.grad((torch.softmax(theta, -1) * (torch.log_softmax(theta, -1) - teacher)).sum(), theta)
    torch.testing.assert_close(expected_grad, forward)
    assert (expected_grad - reverse).abs().max() > 0.05
