"""Per-position means of per-token quantities: the critic's value and the advantage by response position.

PPO's critic is read by position in VC-PPO (Yuan et al. 2025, "What's Behind PPO's Collapse in
Long-CoT? Value Optimization Holds the Secret", figs. 2-3): an untrained critic scores the first tokens
of a response low, so the GAE advantages of those tokens are inflated; value pretraining flattens the
curve toward the mean return. `position_means` gives those curves from the [N, T] tensors a step holds.

    values_mean, counts = position_means(batch.old_values, batch.loss_mask)
    adv_mean, _ = position_means(batch.advantages, batch.loss_mask)

Run the tests with ``python -m pytest tests/algo/test_positions.py -q``.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["position_means", "bucket_means"]


def position_means(x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Mean of `x` at each response position over the rows whose token there counts.

    x: [N, T] per-token values (critic values, advantages, entropy, ...); mask: [N, T] nonzero where the token
    counts. -> (means [T] float32, 0 at positions no row reaches; counts [T] int64, how many rows counted at
    each position).
    """
    if x.shape != mask.shape or x.dim() != 2:
        raise ValueError(f"x and mask must be [N, T] of the same shape, got {tuple(x.shape)} and {tuple(mask.shape)}")
    m = mask.bool()
    counts = m.sum(0)  # [T]
    sums = torch.where(m, x.detach().float(), torch.zeros((), dtype=torch.float32)).sum(0)  # [T]
    return sums / counts.clamp(min=1), counts


def bucket_means(means: Tensor, counts: Tensor, edges: list[int]) -> list[float]:
    """Count-weighted means of `position_means` output over position buckets [edges[i], edges[i+1]).

    means: [T] per-position means; counts: [T] the rows behind each; edges: increasing positions, the first
    usually 0 (a bucket past T is empty). -> len(edges) - 1 floats, NaN for a bucket no row reaches.
    """
    if len(edges) < 2 or any(b <= a for a, b in zip(edges, edges[1:])):
        raise ValueError(f"edges must be at least two increasing positions, got {edges}")
    out = []
    for lo, hi in zip(edges, edges[1:]):
        c = counts[lo:hi].float()
        total = float(c.sum())
        out.append(float((means[lo:hi] * c).sum()) / total if total else float("nan"))
    return out


def last_token_index(mask: Tensor) -> Tensor:
    """[B] long: the position of each row's last nonzero mask entry (0 for an empty row).

    mask: [B, T]. For a prefix mask this is length - 1; for an episode whose mask has gaps at tool
    observations it is the last model token, where an outcome reward belongs.
    """
    positions = torch.arange(mask.shape[-1], device=mask.device)  # [T]
    return torch.where(mask != 0, positions, torch.zeros_like(positions)).amax(-1)  # [B]
