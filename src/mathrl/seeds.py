"""How a run's random streams are seeded: every per-step, per-round, per-row or per-shard seed is
`derive_seed(seed, stream)`, a fixed function of the run's seed and the stream's number, so a stream
never depends on what else was drawn before it (nor on how many processes drew it).

    derive_seed(cfg.seed, step)                                   # the policy update's mini-batch order
    derive_seed(cfg.seed, step + CRITIC_STREAM)                   # the critic's
    derive_seed(cfg.seed, step + (round - 1) * REFILL_ROUND_STRIDE)  # rollouts of a refill round
    derive_seed(seed, row, modulus=GENERATOR_MODULUS)             # one engine row or block

The constants are primes far apart, so that the streams of different uses do not meet for any realistic
step, round, row or shard count; changing any of them changes every run's samples. `rng_state` /
`set_rng_state` save and put back the process-wide generators (Python's, NumPy's, torch's) as a whole: a
checkpoint keeps them, and code that lets a library reseed them (vLLM's start) restores them after it.
Imports nothing of mathrl, and NumPy and torch only when the RNG states are asked for: every layer may use it.
"""

from __future__ import annotations

import random
from typing import Any

SEED_MULTIPLIER = 1_000_003
"""Spreads consecutive run seeds apart: seed s's streams start at s * 1_000_003."""
CRITIC_STREAM = 500_009
"""Added to the step for the critic's mini-batch order (PPO), apart from the policy's."""
REFILL_ROUND_STRIDE = 7_919_993
"""Between the rollout seeds of a step's dynamic-sampling refill rounds; round 1 keeps the step's."""
SHARD_STRIDE = 1_000_000_007
"""Between the seeds of a rollout call's shards (`shards.py:shard_seed`)."""
PIECE_STRIDE = 998_244_353
"""Between the seeds of the pieces of one shard that several ranks share."""
GENERATOR_MODULUS = 2**63 - 1
"""Keeps a seed below 2**63: `torch.Generator.manual_seed` and vLLM take it."""
PIECE_MODULUS = 2**61 - 1
"""The bound of a shard piece's seed."""


def derive_seed(seed: int, stream: int = 0, *, modulus: int | None = None) -> int:
    """The seed of stream `stream` of a process seeded with `seed`: `seed * 1_000_003 + stream`,
    reduced modulo `modulus` when given (Python's %, so never negative)."""
    s = seed * SEED_MULTIPLIER + stream
    return s if modulus is None else s % modulus


def rng_state(*, cuda: bool = False) -> dict[str, Any]:
    """The global RNG states of Python, NumPy and torch (the CPU generator; with `cuda`, also every CUDA
    device's, None without CUDA), as tensors, lists and numbers that torch.load(weights_only=True) reads."""
    import numpy as np
    import torch

    version, internal, gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state = {
        "python": {"version": version, "internal": list(internal), "gauss": gauss},
        "numpy": {"keys": torch.from_numpy(np_keys.astype(np.int64)), "pos": int(np_pos),
                  "has_gauss": int(np_has_gauss), "gauss": float(np_gauss)},
        "torch": torch.get_rng_state(),
    }
    if cuda:
        state["cuda"] = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Put back the global RNG states `rng_state` returned (the CUDA devices' when it holds them)."""
    import numpy as np
    import torch

    py = state["python"]
    random.setstate((py["version"], tuple(py["internal"]), py["gauss"]))
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None:
        torch.cuda.set_rng_state_all(state["cuda"])
