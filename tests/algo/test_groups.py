"""group_stats against hand-computed groups and a plain per-group loop.

Run: python -m pytest tests/algo/test_groups.py -q
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from mathrl.algo.groups import group_stats


def test_hand_computed_groups_in_any_id_order():
    # Ids 7, 3, 7, 3, 9: groups ordered by id -> 3: [2, 4], 7: [1, 5], 9: [-1].
    s = group_stats(torch.tensor([1.0, 2.0, 5.0, 4.0, -1.0]), torch.tensor([7, 3, 7, 3, 9]))
    assert s.ids.tolist() == [3, 7, 9]
    assert s.index.tolist() == [1, 0, 1, 0, 2]
    assert s.count.tolist() == [2.0, 2.0, 1.0]
    assert s.sum.tolist() == [6.0, 6.0, -1.0]
    assert s.min.tolist() == [2.0, 1.0, -1.0]
    assert s.max.tolist() == [4.0, 5.0, -1.0]
    assert s.count.dtype == s.sum.dtype == torch.float32


def test_extremes_equal_the_reshaped_reduction_bit_for_bit():
    # The loop's ids arange(G).repeat_interleave(n): the extremes are exactly those of the [G, n] view.
    values = torch.randn(6 * 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    s = group_stats(values, torch.arange(6).repeat_interleave(4))
    assert torch.equal(s.max, values.view(6, 4).max(1).values)
    assert torch.equal(s.min, values.view(6, 4).min(1).values)


def test_empty_batch():
    s = group_stats(torch.zeros(0), torch.zeros(0, dtype=torch.long))
    assert s.ids.numel() == s.index.numel() == s.count.numel() == s.sum.numel() == 0


def test_bad_inputs_say_what_is_wrong():
    with pytest.raises(ValueError, match="same length"):
        group_stats(torch.zeros(3), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="1-D"):
        group_stats(torch.zeros(2, 2), torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="integer"):
        group_stats(torch.zeros(2), torch.zeros(2))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(-3, 5), st.floats(-10, 10, width=32)), min_size=1, max_size=30))
def test_matches_plain_loop(data):
    ids = torch.tensor([g for g, _ in data])
    values = torch.tensor([v for _, v in data], dtype=torch.float32)
    s = group_stats(values, ids)
    groups = sorted({g for g, _ in data})
    assert s.ids.tolist() == groups
    assert s.index.tolist() == [groups.index(g) for g, _ in data]
    for k, g in enumerate(groups):
        vs = [v for gg, v in data if gg == g]
        assert s.count[k] == len(vs)
        assert s.min[k] == torch.tensor(min(vs), dtype=torch.float32)
        assert s.max[k] == torch.tensor(max(vs), dtype=torch.float32)
        assert_close(s.sum[k], torch.tensor(sum(vs), dtype=torch.float32), rtol=1e-5, atol=1e-4)
