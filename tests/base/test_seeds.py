"""derive_seed and the seeds built on it give exactly the values of the formulas each use wrote out
before they shared one function: a changed seed would silently change every run's samples.

Run: python -m pytest tests/base/test_seeds.py -q
"""

import itertools

from mathrl.rollout.base import row_seed
from mathrl.seeds import CRITIC_STREAM, GENERATOR_MODULUS, REFILL_ROUND_STRIDE, derive_seed
from mathrl.shards import shard_seed

SEEDS = [0, 1, 7, 42, 1_000_003, 2**31 - 1, 2**62, -5]
SMALL = [0, 1, 2, 3, 17, 999, 4096, 10**9]


def test_step_round_critic_and_draw_seeds():
    for seed, step, rnd in itertools.product(SEEDS, SMALL, [1, 2, 5]):
        assert derive_seed(seed, step) == seed * 1_000_003 + step  # the policy update, the task's draws
        assert derive_seed(seed, step + CRITIC_STREAM) == seed * 1_000_003 + step + 500_009
        assert (derive_seed(seed, step + (rnd - 1) * REFILL_ROUND_STRIDE)
                == seed * 1_000_003 + step + (rnd - 1) * 7_919_993)


def test_row_and_block_seeds():
    for seed, row in itertools.product(SEEDS, SMALL):
        assert row_seed(seed, row) == (seed * 1_000_003 + row) % (2**63 - 1)
        assert 0 <= row_seed(seed, row) < GENERATOR_MODULUS
    # the torch engine seeds each block of batch_size rows with the row seed of the block's number
    for seed, first_row, i, batch_size in itertools.product(SEEDS, [0, 8, 64], [0, 8, 24], [8]):
        assert (row_seed(seed, (first_row + i) // batch_size)
                == (seed * 1_000_003 + (first_row + i) // batch_size) % (2**63 - 1))


def test_shard_seeds():
    def old(seed, shard, offset):
        s = seed if shard == 0 else seed + shard * 1_000_000_007
        return s if offset == 0 else (s * 1_000_003 + offset * 998_244_353 + 1) % (2**61 - 1)

    for seed, shard, offset in itertools.product(SEEDS, [0, 1, 2, 7], [0, 1, 4, 100, 4095]):
        assert shard_seed(seed, shard, offset) == old(seed, shard, offset)
