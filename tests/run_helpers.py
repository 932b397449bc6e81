"""Reading a run's metrics.jsonl by step and comparing two runs step by step: exact for what is
sampled and counted, within float summation order for losses and norms (2 ranks vs 1 process)."""

import json
import math
import subprocess
import sys
from pathlib import Path

# Float tolerance of 2 ranks vs 1 process: the mini-batch's per-rank partial sums are added in another
# order (and the gradient all-reduced), ~1e-7 relative here; 1e-4 leaves room without hiding a bug
# such as a per-rank instead of global normaliser (a factor 2).
RTOL, ATOL = 1e-4, 1e-6
EXACT = ("reward/", "rollout/response_length", "filter/", "collapse/")


def metrics(run_dir: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    by_step: dict[int, dict] = {}
    for row in rows:
        by_step.setdefault(row["step"], {}).update(row)
    return by_step


def assert_same_steps(a: dict[int, dict], b: dict[int, dict], steps) -> None:
    for step in steps:
        x, y = a[step], b[step]
        keys = {k for k in x if not k.startswith("perf/") and k != "actor/rollout_entropy"}
        assert keys <= set(y), f"step {step}: missing {sorted(keys - set(y))}"
        for k in sorted(keys):
            if k.startswith(EXACT):
                assert x[k] == y[k], f"step {step} {k}: {x[k]} != {y[k]}"
            else:
                assert math.isclose(x[k], y[k], rel_tol=RTOL, abs_tol=ATOL), f"step {step} {k}: {x[k]} vs {y[k]}"


def launch_train(env: dict, run_dir: Path, overrides: list[str], *extra: str, nproc: int = 1, wait: bool = True,
                 timeout: float = 600):
    """`mathrl train <overrides> <extra> --run-dir run_dir [--nproc N]` in its own session, its output in
    <run_dir>.log: waited for (exit 0 asserted, the log's tail on failure; `timeout` only turns a hang into a
    failure), or with `wait=False` returned running."""
    cmd = [sys.executable, "-m", "mathrl.cli", "train", *overrides, *extra, "--run-dir", str(run_dir)]
    if nproc > 1:
        cmd += ["--nproc", str(nproc)]
    log = open(run_dir.parent / f"{run_dir.name}.log", "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    if not wait:
        return proc
    code = proc.wait(timeout=timeout)
    assert code == 0, (run_dir.parent / f"{run_dir.name}.log").read_text()[-4000:]
    return proc
