"""Per-position means (algo/positions.py) against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from mathrl.algo.positions import bucket_means, position_means


def test_position_means_by_hand():
    # three rows of lengths 3, 2, 1: position 0 is seen by all three, position 2 only by row 0
    x = torch.tensor([[1.0, 2.0, 3.0, 9.0], [3.0, 4.0, 9.0, 9.0], [5.0, 9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0]])
    means, counts = position_means(x, mask)
    assert_close(means, torch.tensor([3.0, 3.0, 3.0, 0.0]))  # (1+3+5)/3, (2+4)/2, 3/1, nobody
    assert counts.tolist() == [3, 2, 1, 0]


def test_position_means_ignore_masked_values_even_when_not_finite():
    x = torch.tensor([[1.0, float("nan")], [3.0, float("inf")]])
    means, counts = position_means(x, torch.tensor([[1, 0], [1, 0]]))
    assert_close(means, torch.tensor([2.0, 0.0]))
    assert counts.tolist() == [2, 0]


def test_bucket_means_weight_positions_by_their_counts():
    means, counts = torch.tensor([3.0, 3.0, 3.0, 0.0]), torch.tensor([3, 2, 1, 0])
    # bucket [0, 2): (3*3 + 3*2) / 5 = 3; bucket [2, 4): 3*1 / 1 = 3; bucket [4, 6) is empty
    out = bucket_means(means, counts, [0, 2, 4, 6])
    assert out[:2] == [3.0, 3.0] and math.isnan(out[2])
    means = torch.tensor([1.0, 4.0])
    assert bucket_means(means, torch.tensor([3, 1]), [0, 2]) == [pytest.approx((1 * 3 + 4 * 1) / 4)]


def test_bad_shapes_and_edges_are_refused():
    with pytest.raises(ValueError, match="same shape"):
        position_means(torch.zeros(2, 3), torch.zeros(2, 2))
    with pytest.raises(ValueError, match="increasing"):
        bucket_means(torch.zeros(3), torch.zeros(3), [0, 0])
