"""Shared fixtures: the character tokenizer and tiny random Qwen2 models (a few thousand parameters, CPU).

Everything here is small on purpose: the suite runs on a shared 2-core machine, its fast tier
(`pytest -m "not slow"`) in minutes; a test that takes more than a few seconds is marked `slow`.
"""

from __future__ import annotations

import os
from pathlib import Path

# before torch loads libgomp, which reads it once: waiting OpenMP threads sleep instead of spinning on
# cores that other jobs need (the same default as `import mathrl`, mathrl/__init__.py)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest
import torch

# Tiny models gain nothing from intra-op parallelism, and on a busy machine the thread pool's
# synchronisation dominates: a 2-layer forward measured 300 ms with 2 threads vs 5 ms with 1.
torch.set_num_threads(1)


def shared_math_dir() -> Path:
    """<repo>/../shared/data/math, or MATHRL_SHARED_DATA (that folder, or the shared/ folder above it)."""
    env = os.environ.get("MATHRL_SHARED_DATA")
    if env:
        root = Path(env)
        return root / "data" / "math" if (root / "data" / "math").is_dir() else root
    return Path(__file__).resolve().parents[2] / "shared" / "data" / "math"


@pytest.fixture(scope="session")
def shared_math() -> Path:
    """The folder of shared math jsonl files (may not exist: tests that need it skip)."""
    return shared_math_dir()


@pytest.fixture(scope="session")
def char_tokenizer():
    from mathrl.model.tiny import build_char_tokenizer

    return build_char_tokenizer()


@pytest.fixture(scope="session")
def make_tiny_qwen2(char_tokenizer):
    """Factory: a randomly initialised Qwen2ForCausalLM over the char tokenizer's vocabulary, in eval mode.

    `init_std` is larger than Qwen2's 0.02 so the next-token distributions are peaked rather than
    nearly uniform: sampled sequences then differ clearly between seeds and argmax ties are unlikely.
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM

    def make(*, seed: int = 0, hidden_size: int = 32, num_layers: int = 2, max_positions: int = 256,
             init_std: float = 0.2, tie_word_embeddings: bool = True):
        torch.manual_seed(seed)
        cfg = Qwen2Config(
            vocab_size=len(char_tokenizer),
            hidden_size=hidden_size,
            intermediate_size=2 * hidden_size,
            num_hidden_layers=num_layers,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=max_positions,
            tie_word_embeddings=tie_word_embeddings,
            initializer_range=init_std,
            pad_token_id=char_tokenizer.pad_token_id,
            eos_token_id=char_tokenizer.eos_token_id,
            bos_token_id=None,
        )
        return Qwen2ForCausalLM(cfg).eval()

    return make


@pytest.fixture(scope="session")
def tiny_model(make_tiny_qwen2):
    """One shared random model. Tests must not modify it (build their own with make_tiny_qwen2)."""
    return make_tiny_qwen2(seed=0)
