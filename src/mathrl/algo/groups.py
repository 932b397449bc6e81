"""Per-group reductions over a rollout batch: the rollout.n responses to one prompt form a group.

One pure function, ``group_stats``, gives every group's size, sum, min and max, and the group of
each row; advantages, the group filter, the Kimi length penalty and the step's group metrics read
their baselines, spans and constancy from it. Shapes use N = sampled responses, G = groups.

    s = group_stats(rewards, group_ids)      # rewards [N], group_ids [N]
    mean = (s.sum / s.count)[s.index]        # [N] each response's group mean
    constant = s.max == s.min                # [G] groups without a learning signal

Run the tests with ``python -m pytest tests/algo/test_groups.py -q``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["GroupStats", "group_stats"]


@dataclass(frozen=True)
class GroupStats:
    """What ``group_stats`` returns; per-group tensors follow ``ids`` (ascending)."""

    ids: Tensor
    """[G] the distinct group ids, ascending."""
    index: Tensor
    """[N] int64, the group of each row as a position in ``ids`` (0..G-1)."""
    count: Tensor
    """[G] rows per group, in the dtype of the values."""
    sum: Tensor
    """[G] sum of the values in each group."""
    min: Tensor
    """[G] smallest value in each group."""
    max: Tensor
    """[G] largest value in each group."""


def group_stats(values: Tensor, group_ids: Tensor) -> GroupStats:
    """Size, sum, min and max of ``values`` within each group of ``group_ids``.

    Ids may take any values in any order (dataset row ids, or the loop's
    ``arange(P).repeat_interleave(n)``); groups are ordered by ascending id. Min and max are exact;
    the sum adds each group's values in row order (``index_add``).

    values: [N] one value per response (float; the sums and extremes keep its dtype); group_ids: [N] integer
    prompt id per response. -> a ``GroupStats``; empty tensors when N = 0.
    """
    if values.dim() != 1 or group_ids.shape != values.shape:
        raise ValueError(
            f"values and group_ids must both be 1-D with the same length, got "
            f"{tuple(values.shape)} and {tuple(group_ids.shape)}"
        )
    if group_ids.is_floating_point():
        raise ValueError("group_ids must be an integer tensor (one id per prompt)")
    ids, index = torch.unique(group_ids, return_inverse=True)  # [G], [N] in [0, G)
    num_groups = ids.numel()
    zeros = torch.zeros(num_groups, dtype=values.dtype, device=values.device)
    return GroupStats(
        ids=ids,
        index=index,
        count=torch.bincount(index, minlength=num_groups).to(values.dtype),  # [G]
        sum=zeros.index_add(0, index, values),  # [G]
        min=zeros.scatter_reduce(0, index, values, reduce="amin", include_self=False),  # [G]
        max=zeros.scatter_reduce(0, index, values, reduce="amax", include_self=False),  # [G]
    )
