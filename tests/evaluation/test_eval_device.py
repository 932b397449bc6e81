"""`mathrl eval`: where a checkpoint's Hugging Face model loads. The torch engine samples from it, so it goes
to the evaluation device; vLLM loads its own weights there, so the model stays on the CPU (on the GPU it would
hold a second copy that vLLM's start-up check counts as taken). No GPU and no vLLM start needed: the loader
is replaced by one that records the device it was asked for.

Run: python -m pytest tests/evaluation/test_eval_device.py -q
"""

from __future__ import annotations

import pytest

from mathrl.config import load_config
from mathrl.evaluation import sweep as sweep_module
from mathrl.evaluation.sweep import model_device
from mathrl.evaluation.targets import Checkpoint, SweepSettings
from mathrl.model import io as model_io


@pytest.mark.parametrize(("engine", "device", "expected"), [
    ("torch", "cuda", "cuda"), ("torch", "cuda:1", "cuda:1"), ("torch", "cpu", "cpu"),
    ("vllm", "cuda", "cpu"), ("vllm", "cuda:1", "cpu"), ("vllm", "cpu", "cpu"),
])
def test_model_device(engine, device, expected):
    assert model_device(engine, device) == expected


class _Loaded(Exception):
    """Stops the evaluation right after the model was asked for."""


@pytest.mark.parametrize(("engine", "expected"), [("torch", "cuda"), ("vllm", "cpu")])
def test_a_checkpoint_loads_on_the_gpu_only_for_the_torch_engine(monkeypatch, engine, expected):
    asked = []

    def record(path, *, dtype="float32", device="cpu", overrides=None):
        asked.append((str(path), dtype, str(device)))
        raise _Loaded

    monkeypatch.setattr(model_io, "load_model_and_tokenizer", record)
    cfg = load_config(None, [f"rollout.engine={engine}"])
    ckpt = Checkpoint(label="model", path="/models/step_10", step=10, run=None, cfg=cfg)
    with pytest.raises(_Loaded):
        sweep_module._evaluate_checkpoint(ckpt, SweepSettings(), verifier=None, device="cuda", progress=None, task=None)
    assert asked == [("/models/step_10", "float32", expected)]
