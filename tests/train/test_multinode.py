"""Several nodes with generation while training: trainer ranks on every node, the generator beside rank 0.

Two torchrun agents on this machine stand for two nodes (one trainer rank each, gloo, CPU), meeting at
one c10d rendezvous endpoint, with `rollout.max_staleness=1`: one generator process, which trainer
rank 0 spawns on its own node and feeds over 127.0.0.1; the other node's rank gets every batch from
rank 0 over the trainer's process group (docs/async.md, "Several nodes").

    python -m pytest tests/train/test_multinode.py -q -m slow      (about 30 seconds on 2 CPU cores)
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

SETTINGS = [
    "base.steps=200", "base.max_digits=1", "data.arith.max_digits=1", "base.hidden_size=32",
    "base.intermediate_size=64", "base.num_layers=2", "base.num_heads=2", "base.num_kv_heads=1",
    # 2 steps: step 1 samples version 0 (staleness 0), step 2 version 0 again (staleness 1, the bound)
    "train.steps=2", "train.save_every=2", "rollout.prompts_per_step=4", "rollout.n=4", "train.mini_batch_size=8",
    "data.eval_size=4", "eval.n=2", "eval.every=2", "reward.num_workers=0", "train.dist.timeout_s=120",
    "train.device=cpu", "rollout.max_staleness=1",
]
HANG_GUARD_S = 600  # a hang fails the test instead of blocking CI; never a performance threshold
GENERATOR_LINE = "generating while training"  # what trainer rank 0 prints once its generators have joined


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_command(node: int, nodes: int, endpoint: str, run_dir: Path) -> list[str]:
    """One node's launch: `torchrun --nnodes 2 --node_rank N --nproc_per_node 1 --rdzv_backend c10d ...`."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nodes), "--node_rank", str(node),
            "--nproc_per_node", "1", "--rdzv_backend", "c10d", "--rdzv_endpoint", endpoint, "--rdzv_id", "mathrl-multinode",
            "-m", "mathrl.train", *SETTINGS, "--run-dir", str(run_dir)]


@pytest.mark.slow
def test_two_nodes_with_a_generator_beside_rank_0(tmp_path: Path) -> None:
    run = tmp_path / "run"
    env = {**os.environ, "MATHRL_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    endpoint = f"127.0.0.1:{_free_port()}"
    logs = [tmp_path / f"node{node}.log" for node in (0, 1)]
    agents = [subprocess.Popen(node_command(node, 2, endpoint, run), env=env, stdout=open(logs[node], "w"),
                               stderr=subprocess.STDOUT, start_new_session=True) for node in (0, 1)]
    try:
        codes = [a.wait(timeout=HANG_GUARD_S) for a in agents]
    finally:
        for a in agents:  # a failed or hung launch: its agent, ranks and generator go with it
            if a.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(a.pid, signal.SIGKILL)
                a.wait()
    text = [log.read_text() for log in logs]
    assert codes == [0, 0], "\n".join(f"--- node {n} (exit {c}):\n{t[-3000:]}" for n, (c, t) in enumerate(zip(codes, text)))
    # one node holds global rank 0 and its generator (with c10d, torchrun numbers the nodes itself)
    assert sum(GENERATOR_LINE in t for t in text) == 1, text
    assert (run / "final" / "model.safetensors").is_file() and (run / "summary.json").is_file()
    ckpt = run / "checkpoints" / "step_000002"
    assert (ckpt / "optimizer" / ".metadata").is_file()  # both ranks' optimizer shards, one directory
    assert json.loads((ckpt / "trainer_state.json").read_text())["world_size"] == 2
    steps: dict[int, dict] = {}
    for row in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()):
        steps.setdefault(row["step"], {}).update(row)
    staleness = {s: steps[s]["rollout/staleness_max"] for s in (1, 2)}
    assert all(v <= 1 for v in staleness.values()), staleness
    assert staleness == {1: 0, 2: 1}, staleness  # fixed lag 1: the batches came from the generator
