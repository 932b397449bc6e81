"""Which rows of a call each rank takes, and with which seeds: the one rule for splitting work across
data-parallel ranks, used by the training rollouts (train/collect.py), the training passes (the rows
a rank scores and trains on) and evaluation (evaluation/evaluate.py).

    lo, hi = split_range(count, rank, world_size)        # items: contiguous, balanced blocks
    rows = group_rows(num_groups, n, rank, world_size)   # training: this rank's whole groups of n rows
    for p in rank_pieces(len(prompts), n, batch_size, rank, world_size):  # its rollout rows, cut at shards
        engine.generate(prompts[p.start:p.end], seed=shard_seed(seed, p.shard, p.offset), ...)
    lo, hi = block_rows(total, block, rank, world_size)  # evaluation: whole seed blocks of the engine

Every split is contiguous in global order and depends on global positions only, so one process and N
ranks hold the same rows in the same order and (where a split respects the engine's seed blocks) draw
the same samples. Pure functions of integers: nothing here talks to other processes, and every room
may import it.
"""

from __future__ import annotations

from typing import NamedTuple

from mathrl.seeds import PIECE_MODULUS, PIECE_STRIDE, SHARD_STRIDE, derive_seed


def split_range(count: int, rank: int, world_size: int) -> tuple[int, int]:
    """[lo, hi) of `count` items owned by `rank` of `world_size`: contiguous blocks in global order,
    sizes differing by at most one (earlier ranks get the extra ones). Every item is in one block."""
    base, extra = divmod(count, world_size)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)


def group_rows(num_groups: int, n: int, rank: int, world_size: int) -> list[int]:
    """The rows of `num_groups` groups of `n` rows (group g holds rows g*n ... g*n + n-1) that `rank`
    owns: whole groups, `split_range` of the groups, so a prompt's n samples stay on one rank."""
    lo, hi = split_range(num_groups, rank, world_size)
    return list(range(lo * n, hi * n))


def shard_seed(seed: int, shard: int, offset: int = 0) -> int:
    """The sampling seed of rollout shard `shard` of a call seeded with `seed` (shard 0 keeps `seed`).

    offset: the first row of a rank's piece inside the shard, when a rank holds only part of it. 0 (the
    whole shard, or its first piece) keeps the one-process seed; any other offset gets a seed of its own,
    so two ranks that split one shard never replay the same random stream.
    """
    s = seed if shard == 0 else seed + shard * SHARD_STRIDE
    return s if offset == 0 else derive_seed(s, offset * PIECE_STRIDE + 1, modulus=PIECE_MODULUS)


class Piece(NamedTuple):
    """Rows [start, end) of a rollout call that one rank samples in one engine call."""

    start: int
    end: int
    shard: int  # the shard of batch_size rows the piece lies in
    offset: int  # the piece's first row inside its shard (see `shard_seed`)


def rank_pieces(rows: int, n: int, batch_size: int, rank: int, world_size: int) -> list[Piece]:
    """The pieces `rank` samples of a call of `rows` rows in groups of `n`: its rows (`group_rows`, a
    contiguous block in global order) cut at the shard boundaries of `batch_size` rows. One process:
    every shard whole, offset 0."""
    lo, hi = (g * n for g in split_range(rows // n, rank, world_size))
    pieces = []
    for start in range(0, rows, batch_size):
        a, b = max(start, lo), min(start + batch_size, hi)
        if a < b:
            pieces.append(Piece(a, b, start // batch_size, a - start))
    return pieces


def block_rows(total: int, block: int, rank: int, world_size: int) -> tuple[int, int]:
    """[lo, hi) of `total` rows that `rank` of `world_size` samples when an engine seeds its rows in
    blocks of `block` (its `seed_block`: a block's rows share one random stream): a contiguous run of
    whole blocks (`split_range` of the blocks; the last may be short), so that the rows are sampled
    exactly as one process samples them. Ranks differ by at most one block."""
    lo, hi = split_range(-(-total // block), rank, world_size)
    return min(lo * block, total), min(hi * block, total)
