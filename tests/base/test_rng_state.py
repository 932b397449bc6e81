"""The global RNG states (`mathrl.seeds.rng_state` / `set_rng_state`): what a checkpoint stores and what
the vLLM engine puts back after vLLM's start reseeds the process. Restored states must give the same
draws from Python's, NumPy's and torch's generators, and survive torch.save/load(weights_only=True)."""

from __future__ import annotations

import random

import numpy as np
import torch

from mathrl.seeds import rng_state, set_rng_state


def draws() -> tuple:
    return random.random(), random.gauss(0, 1), float(np.random.rand()), float(np.random.randn()), torch.rand(3).tolist()


def test_a_restored_state_gives_the_same_draws(tmp_path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    draws()  # leave a cached Gaussian in Python's and NumPy's state: it is part of the state too
    state = rng_state()
    expected = draws()
    torch.save(state, tmp_path / "rng.pt")  # as trainer_state.pt holds it
    random.seed(9), np.random.seed(9), torch.manual_seed(9)  # a library reseeds everything
    set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    assert draws() == expected


def test_cuda_states_are_taken_only_when_asked():
    assert "cuda" not in rng_state()  # a checkpoint's states: the CPU generators only
    state = rng_state(cuda=True)
    assert (state["cuda"] is None) == (not torch.cuda.is_available())
    expected = draws()
    set_rng_state(state)  # None: nothing to put back on a machine without CUDA
    assert draws() == expected
