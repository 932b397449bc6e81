"""Group filters (DAPO dynamic sampling, accuracy band) and DAPO overlong filtering, against
hand-computed cases and a plain per-group loop.

Run: python -m pytest tests/algo/test_filters.py -q
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from mathrl.algo.filters import group_filter, overlong_mask


def _counts(res):
    return res.kept_groups, res.dropped_all_correct, res.dropped_all_wrong, res.dropped_out_of_band


# ---------------------------------------------------------------------------------- nonconstant


def test_nonconstant_drops_all_equal_groups():
    # Group 0 = [1, 1] all correct -> dropped; group 1 = [0, 0] all wrong -> dropped;
    # group 2 = [1, 0] mixed -> kept.
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 0.0])
    ids = torch.tensor([0, 0, 1, 1, 2, 2])
    res = group_filter(rewards, ids, mode="nonconstant")
    assert res.keep.tolist() == [False, False, True]
    assert res.keep_rows.tolist() == [False, False, False, False, True, True]
    assert _counts(res) == (1, 1, 1, 0)


def test_nonconstant_single_sample_group_is_dropped():
    # A one-sample group is all-equal by definition: its GRPO advantage is exactly 0.
    # Group 5 = [1] (correct) and group 6 = [0] (wrong) are dropped; group 9 = [0, 1] kept.
    res = group_filter(torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.tensor([5, 6, 9, 9]), mode="nonconstant")
    assert res.keep.tolist() == [False, False, True]
    assert _counts(res) == (1, 1, 1, 0)


def test_nonconstant_groups_are_ordered_by_sorted_id_not_appearance():
    # Ids appear as 7, 3: keep[] follows the sorted ids [3, 7]. Group 7 = [0.5, 0.5] is constant;
    # group 3 = [0.2, 0.9] is not.
    res = group_filter(torch.tensor([0.5, 0.5, 0.2, 0.9]), torch.tensor([7, 7, 3, 3]), mode="nonconstant")
    assert res.group_order.tolist() == [3, 7]
    assert res.keep.tolist() == [True, False]
    assert res.keep_rows.tolist() == [False, False, True, True]


def test_nonconstant_uses_rewards_and_correct_only_classifies():
    # Rewards differ (a shaped reward 1.0 vs 0.8) although both answers are correct: the group has
    # signal and is kept. Group 1 has equal rewards but mixed correctness (a reward that ignores
    # correctness): dropped, and counted as neither all-correct nor all-wrong (nor out of band).
    rewards = torch.tensor([1.0, 0.8, 0.5, 0.5])
    correct = torch.tensor([1.0, 1.0, 1.0, 0.0])
    res = group_filter(rewards, torch.tensor([0, 0, 1, 1]), mode="nonconstant", correct=correct)
    assert res.keep.tolist() == [True, False]
    assert _counts(res) == (1, 0, 0, 0)


def test_nonconstant_all_correct_classified_by_correct_not_reward_sign():
    # Rewards all -0.2 (e.g. correct answers with a length penalty) but correct = 1: all-correct.
    res = group_filter(torch.tensor([-0.2, -0.2]), torch.tensor([0, 0]), mode="nonconstant",
                       correct=torch.tensor([True, True]))
    assert _counts(res) == (0, 1, 0, 0)


# ---------------------------------------------------------------------------------- band


def test_band_edges_are_inclusive():
    # Five groups of 5 samples with 0..4 correct plus one with 5: accuracies 0, .2, .4, .6, .8, 1.
    # Band [0.2, 0.8] inclusive keeps .2, .4, .6, .8; drops 0 (all wrong) and 1 (all correct).
    correct = torch.tensor([[1.0] * k + [0.0] * (5 - k) for k in range(6)]).flatten()
    ids = torch.arange(6).repeat_interleave(5)
    res = group_filter(correct, ids, mode="band", band=(0.2, 0.8))
    assert_close(res.accuracy, torch.tensor([0.0, 0.2, 0.4, 0.6, 0.8, 1.0], dtype=torch.float64))
    assert res.keep.tolist() == [False, True, True, True, True, False]
    assert _counts(res) == (4, 1, 1, 0)


def test_band_counts_out_of_band_separately():
    # Groups of 10: 1/10 correct (0.1 < 0.3) and 9/10 (0.9 > 0.7) are out of band but neither
    # all-correct nor all-wrong; 3/10 = 0.3 is exactly on the lower edge and kept (float64 3/10 is
    # the same double as the literal 0.3); 7/10 on the upper edge, kept.
    ks = [1, 9, 3, 7]
    correct = torch.tensor([[1.0] * k + [0.0] * (10 - k) for k in ks]).flatten()
    ids = torch.arange(4).repeat_interleave(10)
    res = group_filter(correct, ids, mode="band", band=(0.3, 0.7))
    assert res.keep.tolist() == [False, False, True, True]
    assert _counts(res) == (2, 0, 0, 2)


def test_band_fractional_correct_on_edge_is_kept():
    # correct = [0.1, 0.2] sums to 0.30000000000000004 in float64; the mean 0.15000000000000002 is
    # above the double 0.15, yet must still count as on the upper edge of a band ending at 0.15.
    assert (0.1 + 0.2) / 2 > 0.15  # the rounding residue really exists
    res = group_filter(torch.tensor([0.0, 0.0]), torch.tensor([0, 0]), mode="band", band=(0.0, 0.15),
                       correct=torch.tensor([0.1, 0.2], dtype=torch.float64))
    assert res.keep.tolist() == [True]


def test_band_without_correct_uses_positive_rewards():
    # Rewards [1, -1, 0, 2]: correct := reward > 0 -> [1, 0, 0, 1], accuracy 0.5, inside [0.2, 0.8].
    res = group_filter(torch.tensor([1.0, -1.0, 0.0, 2.0]), torch.tensor([0, 0, 0, 0]), mode="band")
    assert_close(res.accuracy, torch.tensor([0.5], dtype=torch.float64))
    assert res.keep.tolist() == [True]


def test_band_full_range_keeps_constant_groups():
    # Band [0, 1] keeps everything, including all-correct and all-wrong groups: band looks only at
    # accuracy, never at reward constancy.
    res = group_filter(torch.tensor([1.0, 1.0, 0.0, 0.0]), torch.tensor([0, 0, 1, 1]), mode="band", band=(0.0, 1.0))
    assert res.keep.tolist() == [True, True]
    assert _counts(res) == (2, 0, 0, 0)


def test_band_single_sample_groups():
    # One-sample groups have accuracy 0 or 1: both outside (0.2, 0.8) and counted as all-wrong /
    # all-correct, not as out of band.
    res = group_filter(torch.tensor([1.0, 0.0]), torch.tensor([0, 1]), mode="band")
    assert _counts(res) == (0, 1, 1, 0)


# ---------------------------------------------------------------------------------- none, validation


def test_none_keeps_everything():
    # mode "none": all groups kept, all drop counts 0, whatever the rewards.
    res = group_filter(torch.tensor([1.0, 1.0, 0.0]), torch.tensor([0, 0, 1]), mode="none")
    assert res.keep_rows.all()
    assert _counts(res) == (2, 0, 0, 0)


def test_empty_batch():
    # N = 0: no groups, nothing kept, no error.
    res = group_filter(torch.zeros(0), torch.zeros(0, dtype=torch.long), mode="nonconstant")
    assert res.keep.numel() == 0 and res.keep_rows.numel() == 0
    assert _counts(res) == (0, 0, 0, 0)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"mode": "dapo"}, "mode must be"),
        ({"mode": "band", "band": (0.8, 0.2)}, "lo <= hi"),
        ({"mode": "band", "band": (-0.1, 0.5)}, "0 <= lo"),
        ({"mode": "band", "correct": torch.ones(3)}, "correct must have shape"),
    ],
)
def test_invalid_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        group_filter(torch.ones(2), torch.tensor([0, 0]), **kwargs)


def test_float_group_ids_raise():
    with pytest.raises(ValueError, match="integer"):
        group_filter(torch.ones(2), torch.tensor([0.0, 0.0]), mode="none")


# ---------------------------------------------------------------------------------- against a loop


@settings(max_examples=60, deadline=None)
@given(
    data=st.lists(st.tuples(st.integers(0, 4), st.sampled_from([0.0, 0.5, 1.0])), min_size=0, max_size=24),
    mode=st.sampled_from(["none", "nonconstant", "band"]),
)
def test_matches_plain_loop(data, mode):
    ids = torch.tensor([g for g, _ in data], dtype=torch.long)
    rewards = torch.tensor([r for _, r in data], dtype=torch.float32)
    res = group_filter(rewards, ids, mode=mode, band=(0.25, 0.75))
    groups = sorted({g for g, _ in data})
    expected_keep = []
    for g in groups:
        rs = [r for gg, r in data if gg == g]
        acc = sum(r > 0 for r in rs) / len(rs)
        if mode == "none":
            expected_keep.append(True)
        elif mode == "nonconstant":
            expected_keep.append(max(rs) != min(rs))
        else:
            expected_keep.append(0.25 <= acc <= 0.75)
    assert res.keep.tolist() == expected_keep
    assert res.keep_rows.tolist() == [expected_keep[groups.index(g)] for g, _ in data]
    assert sum(_counts(res)) == len(groups)  # the counts partition the groups


# ---------------------------------------------------------------------------------- overlong_mask


def test_overlong_mask_zeros_truncated_rows_only():
    # Row 1 was truncated: all of it leaves the loss. Rows 0 and 2 keep their (partial) masks.
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    out = overlong_mask(torch.tensor([False, True, False]), mask)
    assert_close(out, torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]]))
    assert mask[1].sum() == 3  # the input is not modified


def test_overlong_mask_keeps_dtype():
    # A bool mask stays bool, so it can be used for indexing exactly like the input.
    out = overlong_mask(torch.tensor([True, False]), torch.ones(2, 2, dtype=torch.bool))
    assert out.dtype == torch.bool
    assert out.tolist() == [[False, False], [True, True]]


def test_overlong_mask_shape_mismatch_raises():
    with pytest.raises(ValueError, match="expected truncated"):
        overlong_mask(torch.tensor([True]), torch.ones(2, 3))
