"""benchmarks/update_mfu.py's FLOP formula against torch's FLOP counter on a small Qwen2 update pass."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from mathrl.model.init import build_random_model
from mathrl.model.scoring import response_logprobs

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "update_mfu.py"


@pytest.fixture(scope="module")
def update_mfu():
    spec = importlib.util.spec_from_file_location("update_mfu", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_step_flops_match_the_counted_matmuls_of_forward_and_backward(update_mfu) -> None:
    config = update_mfu.build_config("tiny")
    config.vocab_size = 3000  # a head of real weight next to the layers (the tiny model's 99 tokens hide it)
    config._attn_implementation = "eager"  # attention as matmuls the counter sees (SDPA on CPU is not counted)
    model, _ = build_random_model(config, seed=0)
    b, p, t = 2, 8, 24
    ids = lambda n: torch.randint(2, config.vocab_size, (b, n))  # noqa: E731
    ones = lambda n: torch.ones(b, n, dtype=torch.bool)  # noqa: E731
    with FlopCounterMode(display=False) as counter:
        logprobs, _ = response_logprobs(model, ids(p), ones(p), ids(t), ones(t), with_entropy=False)
        logprobs.sum().backward()
    layer_params = sum(x.numel() for x in model.model.layers[0].parameters())
    f = update_mfu.step_flops(config, layer_params=layer_params, batch=b, prompt=p, response=t)
    # eager attention multiplies the full S x S scores (the causal mask is applied after), so it does
    # 2S / (S + 1) times the causal work that the formula counts
    s = p + t
    expected = f["layers"] + f["lm_head"] + f["attention"] * 2 * s / (s + 1)
    # layer_params also holds the norms' weights and the biases, which are no matmul FLOPs: < 1% here
    assert counter.get_total_flops() == pytest.approx(expected, rel=0.01)


@pytest.mark.parametrize("name, peak", [
    ("NVIDIA H200", 989.0),
    ("NVIDIA H100 80GB HBM3", 989.0),  # SXM
    ("NVIDIA H100 PCIe", 756.0),  # must not take the SXM number
    ("NVIDIA L40S", 362.0),  # must not take L4's
    ("NVIDIA L4", 121.0),
    ("NVIDIA GeForce GTX 1080", None),  # unknown: MFU needs --peak-tflops
])
def test_peak_is_looked_up_by_the_most_specific_device_name(update_mfu, name, peak) -> None:
    assert update_mfu.peak_tflops(name) == peak
