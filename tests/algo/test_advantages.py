"""Advantage estimators against hand-computed values and a plain per-group loop.

Run: python -m pytest tests/algo/test_advantages.py -q
"""

import math

import pytest
import torch
from torch.testing import assert_close

from mathrl.algo.advantages import (
    discounted_returns,
    expand_to_tokens,
    group_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
    whiten_advantages,
)

SQRT_HALF = math.sqrt(0.5)


# ---------------------------------------------------------------- group_advantages (GRPO, Dr. GRPO)


def test_grpo_two_groups_hand_values():
    # Group 7 = [1, 0]: mean 0.5, unbiased std sqrt(((.5)^2 + (.5)^2) / 1) = sqrt(.5),
    # so A = +-0.5 / sqrt(.5) = +-sqrt(.5). Group 3 is the mirror image. Ids need not be contiguous.
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    ids = torch.tensor([7, 7, 3, 3])
    adv = group_advantages(rewards, ids, eps=0.0)
    assert_close(adv, torch.tensor([SQRT_HALF, -SQRT_HALF, -SQRT_HALF, SQRT_HALF]))


def test_grpo_uses_unbiased_std():
    # [1, 0, 0]: mean 1/3, deviations (2/3, -1/3, -1/3); unbiased var = (4/9 + 1/9 + 1/9) / 2 = 1/3.
    # A biased (1/n) std would give var 2/9 and different numbers.
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0]), torch.tensor([0, 0, 0]), eps=0.0)
    std = math.sqrt(1 / 3)
    assert_close(adv, torch.tensor([2 / 3 / std, -1 / 3 / std, -1 / 3 / std]))


def test_grpo_eps_is_added_to_std():
    # Same group as above with eps = 0.5: denominators are std + eps (verl/trl convention).
    adv = group_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), eps=0.5)
    assert_close(adv, torch.tensor([0.5 / (SQRT_HALF + 0.5), -0.5 / (SQRT_HALF + 0.5)]))


def test_single_sample_and_constant_groups_are_exactly_zero():
    # Group 1 has one sample (no baseline, std undefined); group 2 is all-equal at 0.1 in float64,
    # where sum/n = 0.30000000000000004/3 != 0.1: without the exact-zero rule the rounding residue
    # (~1e-17) divided by (0 + eps) would become a spurious advantage. Group 3 is all-equal at 1.
    rewards = torch.tensor([5.0, 0.1, 0.1, 0.1, 1.0, 1.0], dtype=torch.float64)
    ids = torch.tensor([1, 2, 2, 2, 3, 3])
    assert (0.1 + 0.1 + 0.1) / 3 != 0.1  # the residue really exists
    for kwargs in (
        {},
        {"eps": 0.0},
        {"std_normalize": False},
        {"std_scope": "batch"},
    ):
        adv = group_advantages(rewards, ids, **kwargs)
        assert torch.equal(adv, torch.zeros_like(adv)), kwargs
    assert torch.equal(rloo_advantages(rewards, ids), torch.zeros_like(rewards))


def test_dr_grpo_no_std_division():
    # Dr. GRPO (std_normalize=False): A = r - group mean. Group 0 = [1, 0, 0] -> (2/3, -1/3, -1/3).
    rewards = torch.tensor([1.0, 0.0, 0.0, 3.0, 1.0])
    adv = group_advantages(rewards, torch.tensor([0, 0, 0, 4, 4]), std_normalize=False)
    assert_close(adv, torch.tensor([2 / 3, -1 / 3, -1 / 3, 1.0, -1.0]))


def test_batch_std_scope_divides_by_batch_std():
    # Centre by group mean, divide by the unbiased std of all 4 rewards [1, 0, 3, 1]:
    # mean 1.25, var = (0.0625 + 1.5625 + 3.0625 + 0.0625) / 3 = 4.75 / 3.
    rewards = torch.tensor([1.0, 0.0, 3.0, 1.0])
    ids = torch.tensor([0, 0, 1, 1])
    std = math.sqrt(4.75 / 3)
    adv = group_advantages(rewards, ids, std_scope="batch", eps=0.0)
    assert_close(adv, torch.tensor([0.5 / std, -0.5 / std, 1.0 / std, -1.0 / std]))


def _loop_group_advantages(rewards, ids, std_normalize, std_scope, eps):
    """Reference: a plain python loop over groups with torch.std (unbiased)."""
    out = torch.zeros_like(rewards)
    batch_std = rewards.std() if len(rewards) > 1 else torch.tensor(0.0, dtype=rewards.dtype)
    for g in ids.unique():
        idx = (ids == g).nonzero().flatten()
        r = rewards[idx]
        if len(r) == 1 or bool((r == r[0]).all()):
            continue  # no signal: stays 0
        a = r - r.mean()
        if std_normalize:
            a = a / ((r.std() if std_scope == "group" else batch_std) + eps)
        out[idx] = a
    return out


@pytest.mark.parametrize("std_normalize", [True, False])
@pytest.mark.parametrize("std_scope", ["group", "batch"])
def test_group_advantages_matches_loop(std_normalize, std_scope):
    # Random shuffled group ids (arbitrary values, sizes 1..5) and binary or continuous rewards.
    gen = torch.Generator().manual_seed(0)
    for trial in range(10):
        n = int(torch.randint(1, 20, (1,), generator=gen))
        ids = torch.randint(100, 106, (n,), generator=gen)
        if trial % 2:
            rewards = torch.randint(0, 2, (n,), generator=gen).double()
        else:
            rewards = torch.randn(n, generator=gen, dtype=torch.float64)
        expected = _loop_group_advantages(rewards, ids, std_normalize, std_scope, 1e-6)
        got = group_advantages(rewards, ids, std_normalize=std_normalize, std_scope=std_scope)
        assert_close(got, expected)


def test_group_advantages_int_rewards_and_no_mutation():
    # Integer rewards are promoted to float; inputs are left untouched.
    rewards = torch.tensor([1, 0])
    ids = torch.tensor([0, 0])
    before = (rewards.clone(), ids.clone())
    adv = group_advantages(rewards, ids, eps=0.0)
    assert adv.is_floating_point()
    assert_close(adv, torch.tensor([SQRT_HALF, -SQRT_HALF]))
    assert torch.equal(rewards, before[0]) and torch.equal(ids, before[1])


def test_group_advantages_empty_and_errors():
    # An empty batch gives an empty result; bad shapes, float ids and bad scopes say what is wrong.
    assert group_advantages(torch.zeros(0), torch.zeros(0, dtype=torch.long)).shape == (0,)
    with pytest.raises(ValueError, match="same length"):
        group_advantages(torch.zeros(3), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="integer"):
        group_advantages(torch.zeros(2), torch.zeros(2))
    with pytest.raises(ValueError, match="std_scope"):
        group_advantages(torch.zeros(2), torch.zeros(2, dtype=torch.long), std_scope="global")


# ---------------------------------------------------------------- rloo_advantages


def test_rloo_hand_values():
    # Group [1, 0, 0]: A_0 = 1 - mean(0, 0) = 1; A_1 = 0 - mean(1, 0) = -0.5; A_2 likewise.
    # Group [2, 4]: A = 2 - 4 = -2 and 4 - 2 = 2. Singleton group 9 -> 0.
    rewards = torch.tensor([1.0, 0.0, 0.0, 2.0, 4.0, 7.0])
    ids = torch.tensor([0, 0, 0, 5, 5, 9])
    assert_close(rloo_advantages(rewards, ids), torch.tensor([1.0, -0.5, -0.5, -2.0, 2.0, 0.0]))


def test_rloo_matches_loop():
    # Leave-one-out baseline computed literally, sample by sample.
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 4, (15,), generator=gen)
    rewards = torch.randn(15, generator=gen, dtype=torch.float64)
    expected = torch.zeros_like(rewards)
    for i in range(15):
        others = [j for j in range(15) if ids[j] == ids[i] and j != i]
        if others:
            expected[i] = rewards[i] - rewards[others].mean()
    assert_close(rloo_advantages(rewards, ids), expected)


# ---------------------------------------------------------------- whiten_advantages (REINFORCE++)


def test_whiten_hand_values_with_mask():
    # Counted entries [1, 2, 4]: mean 7/3, biased var = ((4/3)^2 + (1/3)^2 + (5/3)^2) / 3 = 14/9.
    adv = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    std = math.sqrt(14 / 9)
    mean = 7 / 3
    expected = torch.tensor([[(1 - mean) / std, (2 - mean) / std, 0.0], [(4 - mean) / std, 0.0, 0.0]])
    assert_close(whiten_advantages(adv, mask, eps=0.0), expected)


def test_whiten_1d_without_mask_has_zero_mean_unit_var():
    # With no mask every entry counts; the result is standardised with the biased variance.
    out = whiten_advantages(torch.tensor([1.0, 2.0, 3.0, 6.0]), eps=0.0)
    assert_close(out.mean(), torch.tensor(0.0))
    assert_close(out.var(unbiased=False), torch.tensor(1.0))


def test_whiten_constant_or_empty_is_zero():
    # Constant advantages carry no signal (and rsqrt(0 + eps) would amplify rounding noise);
    # a fully masked batch has nothing to whiten.
    assert torch.equal(whiten_advantages(torch.full((2, 3), 0.1)), torch.zeros(2, 3))
    assert torch.equal(whiten_advantages(torch.ones(2, 3), torch.zeros(2, 3)), torch.zeros(2, 3))
    with pytest.raises(ValueError, match="mask shape"):
        whiten_advantages(torch.ones(2, 3), torch.ones(3, 2))


def test_reinforce_pp_hand_values_outcome_reward_minus_kl_to_go():
    # Two responses, outcome rewards 1 and 0, per-token KL penalties (already scaled and negative).
    # gamma = 1: the return of token t is the sequence reward minus the KL penalty still to go:
    #   row 0: 1 - 0.6 = 0.4, 1 - 0.5 = 0.5, 1 - 0.3 = 0.7
    #   row 1: 0 - 0.9 = -0.9, 0 - 0.5 = -0.5, (padding)
    # then one mean (0.04) and one unbiased variance (1.952 / 4 = 0.488, verl's masked_whiten) over all five tokens.
    # (An earlier loop whitened the sequence rewards instead, giving every token of a row one value.)
    rewards = torch.tensor([1.0, 0.0])
    response_mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    kl = torch.tensor([[-0.1, -0.2, -0.3], [-0.4, -0.5, 0.0]])
    returns = [0.4, 0.5, 0.7, -0.9, -0.5]
    mean, var = 0.04, 0.488
    std = math.sqrt(var + 1e-8)
    expected = torch.tensor([[(returns[0] - mean) / std, (returns[1] - mean) / std, (returns[2] - mean) / std],
                             [(returns[3] - mean) / std, (returns[4] - mean) / std, 0.0]])
    assert_close(reinforce_pp_advantages(rewards, response_mask, kl_rewards=kl), expected)


def test_reinforce_pp_without_kl_and_with_a_filtered_row():
    # No KL: every token of a response has the return r; a row masked out of the loss (sample
    # filter) neither shares the statistics nor gets an advantage. Counted: 1, 1 | 0, 0: mean 1/2, unbiased
    # variance (4 * 1/4) / 3 = 1/3, so +-(1/2) / sqrt(1/3) = +-0.8660.
    rewards = torch.tensor([1.0, 0.0, 5.0])
    response_mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    loss_mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    out = reinforce_pp_advantages(rewards, response_mask, loss_mask=loss_mask)
    h = 0.5 / math.sqrt(1 / 3)
    assert_close(out, torch.tensor([[h, h], [-h, -h], [0.0, 0.0]]), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="rewards"):
        reinforce_pp_advantages(torch.ones(2), torch.ones(3, 2))


# ---------------------------------------------------------------- returns and broadcasting


def test_discounted_returns_hand_values():
    # gamma = 1: reverse cumulative sum over counted tokens; the masked reward 3 is ignored.
    rewards = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 1.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    assert_close(discounted_returns(rewards, mask), torch.tensor([[3.0, 2.0, 0.0], [1.0, 1.0, 1.0]]))
    # gamma = 0.5: G = r_t + 0.5 G_{t+1}; row 1: (0.25, 0.5, 1).
    assert_close(
        discounted_returns(rewards, mask, gamma=0.5),
        torch.tensor([[2.0, 2.0, 0.0], [0.25, 0.5, 1.0]]),
    )


def test_expand_to_tokens():
    # Each counted token of sequence i gets A_i; padding and fully masked rows get 0.
    out = expand_to_tokens(torch.tensor([2.0, -1.0]), torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]))
    assert_close(out, torch.tensor([[2.0, 2.0, 0.0], [0.0, 0.0, 0.0]]))
    with pytest.raises(ValueError):
        expand_to_tokens(torch.ones(3), torch.ones(2, 4))
