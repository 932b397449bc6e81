"""Policy loss, masking helpers, aggregation modes and auxiliary LM losses on hand-computed tensors.

Run: python -m pytest tests/algo/test_losses.py -q
"""

import math

import pytest
import torch
from torch.testing import assert_close

from mathrl.algo.losses import (
    AGG_MODES,
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

E = math.e


# ---------------------------------------------------------------- masked_sum / masked_mean


def test_masked_sum_and_mean_hand_values():
    # Row 0 counts 1 + 2, row 1 counts only 4; row means 1.5 and 4; overall mean 7/3.
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    assert_close(masked_sum(x, mask), torch.tensor(7.0))
    assert_close(masked_sum(x, mask, 1), torch.tensor([3.0, 4.0]))
    assert_close(masked_mean(x, mask), torch.tensor(7 / 3))
    assert_close(masked_mean(x, mask, 1), torch.tensor([1.5, 4.0]))


def test_masked_mean_all_masked_row_is_zero_not_nan():
    # A fully masked row has count 0: its mean is defined as 0 (eps floor), never NaN.
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    assert_close(masked_mean(x, mask, dim=-1), torch.tensor([1.5, 0.0]))
    assert_close(masked_mean(x, torch.zeros_like(mask)), torch.tensor(0.0))


def test_masked_sum_ignores_nan_and_inf_at_padding():
    # Padding positions may hold -inf logprobs; multiplying by a 0 mask would give NaN, selecting
    # them away does not, in the value and in the gradient.
    x = torch.tensor([[1.0, float("-inf")], [float("nan"), 2.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    total = masked_sum(x, mask)
    total.backward()
    assert_close(total, torch.tensor(3.0))
    assert_close(x.grad, torch.tensor([[1.0, 0.0], [0.0, 1.0]]))


# ---------------------------------------------------------------- policy_loss


def _one_token(log_ratio, adv, **kwargs):
    """policy_loss on a single token with old_logprob 0; returns (loss, d loss / d logprob, stats)."""
    lp = torch.tensor([[float(log_ratio)]], requires_grad=True)
    adv_t, ones = torch.tensor([[float(adv)]]), torch.ones(1, 1)
    loss, stats = policy_loss(lp, torch.zeros(1, 1), adv_t, ones, **kwargs)
    loss.sum().backward()
    return loss.item(), lp.grad.item(), {k: v.item() for k, v in stats.items()}


# Each case: (log ratio, A, kwargs, expected loss, expected gradient, clipped, dual_clipped, why).
# eps_low = 0.2, eps_high = 0.28 unless stated; d loss / d logprob = -A * ratio when unclipped.
POLICY_CASES = [
    (0.0, 2.0, {}, -2.0, -2.0, 0, 0, "on-policy: ratio 1, loss -A, gradient -A"),
    (1.0, 1.0, {}, -1.28, 0.0, 1, 0, "A>0, ratio e > 1.28: upper clip active, no gradient"),
    (-1.0, 1.0, {}, -1 / E, -1 / E, 0, 0, "A>0, ratio 1/e < 0.8: min() keeps ratio*A, gradient flows"),
    (-1.0, -1.0, {}, 0.8, 0.0, 1, 0, "A<0, ratio 1/e < 0.8: lower clip active, no gradient"),
    (1.0, -1.0, {}, E, E, 0, 0, "A<0, ratio e: no eps clip on this side, loss |A| ratio"),
    (0.0, 0.0, {}, 0.0, 0.0, 0, 0, "A = 0: zero loss and gradient, not counted as clipped"),
    (math.log(1.25), 1.0, {}, -1.25, -1.25, 0, 0, "clip-higher: 1.25 < 1.28 is inside the range"),
    (math.log(1.25), 1.0, {"eps_high": 0.2}, -1.2, 0.0, 1, 0, "symmetric clip 1.2 clips the same token"),
    (2.0, -1.0, {"dual_clip_c": 3.0}, 3.0, 0.0, 0, 1, "dual clip: A<0, ratio e^2 > 3 -> loss 3|A|"),
    (1.0, -1.0, {"dual_clip_c": 3.0}, E, E, 0, 0, "dual clip inactive: ratio e < c = 3"),
    (2.0, -2.0, {"dual_clip_c": 3.0}, 6.0, 0.0, 0, 1, "dual bound scales with |A|: 3 * 2"),
    (2.0, 1.0, {"dual_clip_c": 3.0}, -1.28, 0.0, 1, 0, "dual clip never touches A>0 tokens"),
    (-1.0, -1.0, {"dual_clip_c": 3.0}, 0.8, 0.0, 1, 0, "dual clip leaves the lower eps clip alone"),
]


@pytest.mark.parametrize(
    "log_ratio,adv,kwargs,loss,grad,clipped,dual,why", POLICY_CASES, ids=[c[-1] for c in POLICY_CASES]
)
def test_policy_loss_hand_cases(log_ratio, adv, kwargs, loss, grad, clipped, dual, why):
    got_loss, got_grad, stats = _one_token(log_ratio, adv, **kwargs)
    assert got_loss == pytest.approx(loss, rel=1e-6), why
    assert got_grad == pytest.approx(grad, rel=1e-6, abs=1e-12), why
    assert stats["clipped"] == clipped, why
    assert stats["dual_clipped"] == dual, why
    assert stats["ratio"] == pytest.approx(math.exp(log_ratio), rel=1e-6)
    assert stats["ppo_kl"] == pytest.approx(-log_ratio, abs=1e-7)


def test_policy_loss_batched_masked_and_pure():
    # Two sequences; the masked position holds -inf logprob (padding): loss, stats and gradient
    # there are exactly 0 and finite; inputs are not modified; stats carry no graph.
    lp = torch.tensor([[0.0, -1.0], [1.0, float("-inf")]], requires_grad=True)
    old = torch.zeros(2, 2)
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    snapshot = [t.detach().clone() for t in (lp, old, adv, mask)]
    loss, stats = policy_loss(lp, old, adv, mask)
    assert_close(loss, torch.tensor([[-1.0, -1 / E], [E, 0.0]]))
    loss.sum().backward()
    assert torch.isfinite(lp.grad).all()
    assert_close(lp.grad, torch.tensor([[-1.0, -1 / E], [E, 0.0]]))
    for name, value in stats.items():
        assert value.shape == (2, 2) and not value.requires_grad, name
        assert value[1, 1] == 0, name
    for before, after in zip(snapshot, (lp, old, adv, mask)):
        assert torch.equal(before, after.detach())


def test_policy_loss_extreme_log_ratio_is_finite():
    # log ratio 100 is clamped to 20 before exp: loss |A| e^20 is finite and the clamp kills the
    # gradient instead of producing inf/NaN.
    lp = torch.tensor([[100.0]], requires_grad=True)
    loss, stats = policy_loss(lp, torch.zeros(1, 1), -torch.ones(1, 1), torch.ones(1, 1))
    loss.sum().backward()
    assert_close(loss, torch.tensor([[math.exp(20.0)]]))
    assert lp.grad.item() == 0.0
    assert_close(stats["ratio"], torch.tensor([[math.exp(20.0)]]))


def test_policy_loss_validation():
    ones = torch.ones(1, 2)
    with pytest.raises(ValueError, match="dual_clip_c"):
        policy_loss(ones, ones, ones, ones, dual_clip_c=1.0)
    with pytest.raises(ValueError, match="same shape"):
        policy_loss(ones, torch.ones(2, 1), ones, ones)
    with pytest.raises(ValueError, match=">= 0"):
        policy_loss(ones, ones, ones, ones, eps_low=-0.1)


# ---------------------------------------------------------------- aggregate


# Row 0 counts (1, 2), row 1 counts (4), row 2 is fully masked and must not count as a sequence.
LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])

AGG_CASES = [
    ("token_mean", None, 7 / 3, "(1+2+4) / 3 tokens"),
    ("seq_mean_token_mean", None, 2.75, "((1+2)/2 + 4/1) / 2 sequences"),
    ("seq_mean_token_sum", None, 3.5, "(3 + 4) / 2 sequences"),
    ("seq_mean_token_sum_norm", 4, 0.875, "7 / (max_len 4 * 2 sequences)"),
]


@pytest.mark.parametrize("mode,max_len,expected,why", AGG_CASES, ids=[c[0] for c in AGG_CASES])
def test_aggregate_hand_values(mode, max_len, expected, why):
    num_tokens, num_seqs = batch_counts(MASK)
    assert (num_tokens, num_seqs) == (3.0, 2.0)
    got = aggregate(LOSS, MASK, mode=mode, num_tokens=num_tokens, num_seqs=num_seqs, max_len=max_len)
    assert_close(got, torch.tensor(expected), msg=why)


def test_aggregate_covers_all_modes():
    assert {c[0] for c in AGG_CASES} == set(AGG_MODES)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_aggregate_nothing_counted_is_zero(mode):
    # An all-masked batch has zero counts; every mode returns 0, never NaN.
    mask = torch.zeros(2, 3)
    got = aggregate(LOSS[:2], mask, mode=mode, num_tokens=0.0, num_seqs=0.0, max_len=3)
    assert_close(got, torch.tensor(0.0))


def test_aggregate_uses_given_global_counts_not_local_ones():
    # A micro-batch holding 3 of 12 global tokens contributes 7/12, not its local mean 7/3.
    got = aggregate(LOSS, MASK, mode="token_mean", num_tokens=12.0, num_seqs=5.0)
    assert_close(got, torch.tensor(7 / 12))


def test_aggregate_errors():
    with pytest.raises(ValueError, match="max_len"):
        aggregate(LOSS, MASK, mode="seq_mean_token_sum_norm", num_tokens=3.0, num_seqs=2.0)
    with pytest.raises(ValueError, match="unknown loss aggregation mode"):
        aggregate(LOSS, MASK, mode="sum", num_tokens=3.0, num_seqs=2.0)


def test_counts_without_distributed():
    # Not initialised: global counts are the local ones and no rescaling is needed.
    assert global_counts(MASK) == batch_counts(MASK) == (3.0, 2.0)
    assert dp_scale() == 1.0


# ---------------------------------------------------------------- SFT / VAPO positive-example loss


def test_sft_loss():
    # Per-token NLL = -logprob on counted tokens, 0 elsewhere (even at -inf padding).
    lp = torch.tensor([[-0.5, -2.0, float("-inf")]])
    assert_close(sft_loss(lp, torch.tensor([[1, 1, 0]])), torch.tensor([[0.5, 2.0, 0.0]]))


def test_positive_example_lm_loss_float_rewards():
    # Rewards (1, -1, 0.5): sequences 0 and 2 are correct (reward > 0); sequence 1 is dropped.
    # Token-mean over the 3 correct tokens: (0.5 + 1.0 + 3.0) / 3 = 1.5.
    lp = torch.tensor([[-0.5, -1.0], [-2.0, -2.0], [-3.0, -9.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    loss, correct_mask = positive_example_lm_loss(lp, mask, torch.tensor([1.0, -1.0, 0.5]))
    assert_close(correct_mask, torch.tensor([[1.0, 1.0], [0.0, 0.0], [1.0, 0.0]]))
    assert_close(loss, torch.tensor([[0.5, 1.0], [0.0, 0.0], [3.0, 0.0]]))
    n_tok, n_seq = batch_counts(correct_mask)
    total = aggregate(loss, correct_mask, mode="token_mean", num_tokens=n_tok, num_seqs=n_seq)
    assert_close(total, torch.tensor(1.5))


def test_positive_example_lm_loss_bool_and_threshold():
    # A bool tensor is used as is; with float rewards the threshold decides.
    lp = torch.tensor([[-1.0], [-2.0]])
    mask = torch.ones(2, 1)
    _, by_bool = positive_example_lm_loss(lp, mask, torch.tensor([False, True]))
    assert_close(by_bool, torch.tensor([[0.0], [1.0]]))
    _, by_threshold = positive_example_lm_loss(lp, mask, torch.tensor([0.7, 0.9]), threshold=0.8)
    assert_close(by_threshold, torch.tensor([[0.0], [1.0]]))
    with pytest.raises(ValueError, match=r"\[B\]"):
        positive_example_lm_loss(lp, mask, torch.ones(3))
