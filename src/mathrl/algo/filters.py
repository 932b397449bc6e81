"""Which groups and which tokens of a rollout batch reach the loss: DAPO dynamic sampling, an accuracy-band prompt filter, and DAPO overlong filtering.

Every function is pure: it never modifies its inputs and keeps no state. Shapes use N = sampled
responses in the rollout batch, G = groups (prompts), T = response positions. In the loop:

    res = group_filter(rewards, group_ids, mode=cfg.data.dynamic_sampling.mode,
                       band=(lo, hi), correct=correct)       # data.dynamic_sampling.*
    rows = res.keep_rows                                      # [N] bool: train on these rows
    loss_mask = overlong_mask(rollout.truncated, loss_mask)   # reward.overlong.filter

Resampling until enough groups are kept (data.dynamic_sampling.max_rounds / on_exhausted) is the
loop's job; these functions only decide what one batch keeps. Metrics: ``filter/kept_groups``,
``filter/dropped_all_correct``, ``filter/dropped_all_wrong``, ``filter/dropped_out_of_band``.

Run the tests with ``python -m pytest tests/algo/test_filters.py -q``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from mathrl.algo.groups import group_stats

__all__ = ["GroupFilterMode", "GroupFilterResult", "group_filter", "overlong_mask"]

GroupFilterMode = Literal["none", "nonconstant", "band"]

# Band edges are compared with this slack so that an accuracy summed from fractional `correct`
# values (0.1 + 0.2 != 0.3 in floating point) still counts as on the edge. With 0/1 correctness
# k / n in float64 is already exactly the nearest double to the decimal edge (3 / 10 == 0.3).
_BAND_TOL = 1e-9


@dataclass(frozen=True)
class GroupFilterResult:
    """What ``group_filter`` keeps, per group and per row, and why groups were dropped.

    The three ``dropped_*`` counts and ``kept_groups`` partition the G groups,
    ``kept_groups + dropped_all_correct + dropped_all_wrong + dropped_out_of_band == G``, whenever
    ``correct`` follows the rewards (None, or the loop's filter on correctness itself). A
    ``nonconstant`` filter given a ``correct`` that disagrees with equal rewards drops a group of
    mixed correctness that none of the counts records.
    """

    keep: Tensor
    """[G] bool, one entry per group in the order of ``group_order`` (sorted unique ids)."""
    keep_rows: Tensor
    """[N] bool, True for every row of a kept group."""
    group_order: Tensor
    """[G] the unique group ids, ascending: ``keep[g]`` is the decision for id ``group_order[g]``.
    With the loop's ids ``arange(P).repeat_interleave(n)`` this is also first-appearance order."""
    accuracy: Tensor
    """[G] float64 fraction of correct responses per group (see ``group_filter``)."""
    kept_groups: int
    dropped_all_correct: int
    """Dropped groups in which every response is correct."""
    dropped_all_wrong: int
    """Dropped groups in which no response is correct."""
    dropped_out_of_band: int
    """``band`` mode: dropped groups with accuracy outside [lo, hi] that are neither all-correct
    nor all-wrong."""


def group_filter(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    mode: GroupFilterMode,
    band: tuple[float, float] = (0.2, 0.8),
    correct: Tensor | None = None,
) -> GroupFilterResult:
    """Keep only the groups that carry a learning signal.

    ``"nonconstant"`` is DAPO dynamic sampling (Yu et al. 2025, §3.2, the constraint of eq. 11):
    a group whose rewards are all equal has a zero group-relative advantage for every response, so
    it only dilutes the batch; it is dropped. A single-sample group is all-equal by definition and
    is dropped too (verl's DAPO recipe keeps singletons instead; here their GRPO/RLOO advantage is
    exactly 0, so keeping them would train on nothing).

    ``"band"`` keeps groups whose accuracy lies in [lo, hi], edges included: online prompt
    filtering by pass rate (Cui et al. 2025, PRIME, "online prompt filtering", which keeps
    accuracies in [0.2, 0.8]). It looks at accuracy only, never at reward constancy.

    ``"none"`` keeps every group (the counts are still filled, with every drop count 0).

    Accuracy of a group is the mean of ``correct`` over its rows, or, when ``correct`` is None,
    the fraction of rows with reward > 0. It also classifies every dropped group:
    accuracy 1 -> ``dropped_all_correct``, 0 -> ``dropped_all_wrong``, else ``dropped_out_of_band``
    (band mode; see ``GroupFilterResult`` for the nonconstant case).

    rewards: [N] scalar reward per response (int, bool or float); group_ids: [N] integer prompt id per response,
    any values, any order; mode: ``"none" | "nonconstant" | "band"`` (config ``data.dynamic_sampling.mode``);
    band: (lo, hi) with 0 <= lo <= hi <= 1 (config ``data.dynamic_sampling.band_low/band_high``); correct: [N]
    correctness per response (bool or 0/1 float), None derives it from rewards > 0. -> a ``GroupFilterResult``,
    its groups ordered by ascending id (``group_order``).
    """
    if mode not in ("none", "nonconstant", "band"):
        raise ValueError(f"mode must be 'none', 'nonconstant' or 'band', got {mode!r}")
    lo, hi = band
    if not 0.0 <= lo <= hi <= 1.0:
        raise ValueError(f"band must satisfy 0 <= lo <= hi <= 1, got {band}")
    if correct is not None and correct.shape != rewards.shape:
        raise ValueError(f"correct must have shape {tuple(rewards.shape)}, got {tuple(correct.shape)}")

    # float64 throughout: exact counts, and k/n lands on the double nearest to a decimal band edge.
    r = rewards.to(torch.float64)  # [N]
    c = (r > 0).to(torch.float64) if correct is None else correct.to(torch.float64)  # [N]
    hits = group_stats(c, group_ids)  # validates the shapes and ids
    num_groups = hits.ids.numel()
    accuracy = hits.sum / hits.count.clamp_min(1)  # [G]
    all_correct = accuracy >= 1.0 - _BAND_TOL  # [G]
    all_wrong = accuracy <= _BAND_TOL  # [G]

    if mode == "none":
        keep = torch.ones(num_groups, dtype=torch.bool, device=r.device)
    elif mode == "nonconstant":
        spread = group_stats(r, group_ids)
        keep = spread.max != spread.min  # [G] exact comparison: any difference at all is signal for GRPO
    else:
        keep = (accuracy >= lo - _BAND_TOL) & (accuracy <= hi + _BAND_TOL)  # [G]

    dropped = ~keep
    return GroupFilterResult(
        keep=keep,
        keep_rows=keep[hits.index],  # [N]
        group_order=hits.ids,
        accuracy=accuracy,
        kept_groups=int(keep.sum()),
        dropped_all_correct=int((dropped & all_correct).sum()),
        dropped_all_wrong=int((dropped & all_wrong).sum()),
        dropped_out_of_band=int((dropped & ~all_correct & ~all_wrong).sum()) if mode == "band" else 0,
    )


def overlong_mask(truncated: Tensor, loss_mask: Tensor) -> Tensor:
    """DAPO overlong filtering (Yu et al. 2025, §3.4): a truncated response never reached its
    answer, so its reward says nothing about its reasoning; its tokens are taken out of the loss
    instead of being punished for length.

    Combine with ``token_mean`` aggregation: the masked rows then also leave the normaliser.

    truncated: [N] bool, True where generation hit the length limit without EOS; loss_mask: [N, T] the mask of
    tokens that count (bool, int or float). -> [N, T] the loss mask with every truncated row all zero, in the
    dtype of ``loss_mask``.
    """
    if truncated.dim() != 1 or loss_mask.dim() != 2 or loss_mask.shape[0] != truncated.shape[0]:
        raise ValueError(
            f"expected truncated [N] and loss_mask [N, T], got {tuple(truncated.shape)} and "
            f"{tuple(loss_mask.shape)}"
        )
    keep = ~truncated.bool().unsqueeze(-1)  # [N, 1]
    return torch.where(keep, loss_mask, torch.zeros_like(loss_mask))  # [N, T]
