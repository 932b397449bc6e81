"""Step time and peak memory of data-parallel training vs the number of ranks (torchrun, FSDP2).

Every world size runs the same job under torchrun (so 1 rank takes the same sharded code path as N),
on the same config, and the script reads the ranks' own measurements back from metrics.jsonl:
perf/step_seconds (mean over the steps after the first, which includes warm-up) and
perf/peak_memory_gb (rank 0: peak RSS on CPU, peak CUDA memory allocated on GPU).

    python benchmarks/dist_scaling.py                                   # CPU, gloo: 1 and 2 ranks, tiny model
    python benchmarks/dist_scaling.py --device cuda --nproc 1 2 4 8 \\
        model.path=config:qwen2.5-1.5b model.init=random rollout.max_new_tokens=512   # a GPU machine

The global batch is fixed (rollout.prompts_per_step x rollout.n), so more ranks means fewer samples
each: ideal scaling halves the step time per doubling. Extra key=value arguments are config overrides.
On CPU every world size gets the same cores: --threads (default: the cores this process may use) torch
threads in all, threads/ranks per rank (OMP_NUM_THREADS), so 2 ranks never run 2 x 2 threads on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mathrl.train.launch import available_cpus

# a small job: 16 prompts x 8 samples, 3 optimizer steps per RL step, no evaluation between steps
DEFAULTS = ["train.steps=5", "rollout.prompts_per_step=16", "rollout.n=8", "rollout.batch_size=32",
            "train.mini_batch_size=64", "eval.every=1000", "data.eval_size=8", "eval.n=1", "train.save_every=0",
            "reward.num_workers=0"]


def run(nproc: int, overrides: list[str], *, device: str, threads: int, out: Path) -> dict:
    env = dict(os.environ)
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # gloo on CPU even on a GPU machine
    # torchrun hands the caller's OMP_NUM_THREADS to every rank unchanged: give each its share instead
    env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(max(1, threads // nproc))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
           "-m", "mathrl.train", *DEFAULTS, *overrides, "--run-dir", str(out)]
    t0 = time.time()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.time() - t0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in rows if "perf/step_seconds" in r]
    return {
        "ranks": nproc,
        "threads_per_rank": int(env["OMP_NUM_THREADS"]),
        "step_s": statistics.mean(r["perf/step_seconds"] for r in steps[1:] or steps),
        "rollout_s": statistics.mean(r["perf/rollout_seconds"] for r in steps[1:] or steps),
        "train_s": statistics.mean(r["perf/train_seconds"] for r in steps[1:] or steps),
        "peak_gb": max(r["perf/peak_memory_gb"] for r in steps),
        "wall_s": wall,
        "reward_first_step": steps[0]["reward/mean"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, nargs="+", default=[1, 2], help="world sizes to run (default 1 2)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--threads", type=int, default=available_cpus(),
                   help="torch threads of the whole job, split evenly over its ranks (default: this process's cores)")
    p.add_argument("overrides", nargs="*", help="config overrides key.path=value")
    ns = p.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="mathrl-dist-scaling-") as tmp:
        for n in ns.nproc:
            results.append(run(n, ns.overrides, device=ns.device, threads=ns.threads, out=Path(tmp) / f"ranks{n}"))
            print(json.dumps(results[-1]), flush=True)
    base = results[0]["step_s"]
    print(f"\n| ranks ({ns.device}) | threads per rank | step s | rollout s | train s | speed-up "
          "| peak memory GiB (rank 0) | reward, step 1 |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        print(f"| {r['ranks']} | {r['threads_per_rank']} | {r['step_s']:.2f} | {r['rollout_s']:.2f} | {r['train_s']:.2f} "
              f"| {base / r['step_s']:.2f}x "
              f"| {r['peak_gb']:.2f} | {r['reward_first_step']:.4f} |")


if __name__ == "__main__":
    main()
