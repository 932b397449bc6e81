"""Step time and peak memory of data-parallel training vs the number of ranks (torchrun, FSDP2).

Every world size runs the same job under torchrun (so 1 rank takes the same sharded code path as N),
on the same config, and the script reads the ranks' own measurements back from metrics.jsonl:
perf/step_seconds (mean over the steps after the first, which includes warm-up),
perf/peak_memory_gb (rank 0: peak RSS on CPU, peak CUDA memory allocated on GPU) and
rollout/logprob_mismatch (engine vs trainer logprobs of the sampled tokens, mean over the steps).

    python benchmarks/dist_scaling.py                                   # CPU, gloo: 1 and 2 ranks, tiny model
    python benchmarks/dist_scaling.py --device cuda --nproc 1 2 4 8 \\
        model.path=config:qwen2.5-1.5b model.init=random rollout.max_new_tokens=512 \\
        data.dynamic_sampling.mode=none                                    # a GPU machine

A random-init model earns no reward, so dynamic sampling would drop every group and skip every update:
data.dynamic_sampling.mode=none makes each step one rollout round and a full update.

Each world size's run directory and its ranks' output (torchrun --tee, one log per rank) go under
--run-root (kept) or a temporary folder (deleted at the end); a run that fails prints its ranks' last lines.

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
    """Run the job at `nproc` ranks into run directory `out`; its ranks' logs go to `out`-logs/."""
    env = dict(os.environ)
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # gloo on CPU even on a GPU machine
    # torchrun hands the caller's OMP_NUM_THREADS to every rank unchanged: give each its share instead
    env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(max(1, threads // nproc))
    logs = out.with_name(out.name + "-logs")  # torchrun's per-rank stdout/stderr files
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
           "--log-dir", str(logs), "--tee", "3",
           "-m", "mathrl.train", *DEFAULTS, *overrides, "--run-dir", str(out)]
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with open(out.with_name(out.name + ".log"), "w") as log:
        code = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    wall = time.time() - t0
    if code != 0:
        lines = out.with_name(out.name + ".log").read_text().splitlines()
        tail = [line for line in lines if line.startswith("[default")][-20:]  # the ranks' own lines (torchrun --tee)
        raise SystemExit(f"{nproc} ranks: torchrun exited with {code}; the ranks' last lines ({log.name}):\n"
                         + "\n".join(tail))
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
        # |engine - trainer| logprob per sampled token (0 when the engine's logprobs are reused as old ones)
        "logprob_mismatch": statistics.mean(r["rollout/logprob_mismatch"] for r in steps),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, nargs="+", default=[1, 2], help="world sizes to run (default 1 2)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--threads", type=int, default=available_cpus(),
                   help="torch threads of the whole job, split evenly over its ranks (default: this process's cores)")
    p.add_argument("--run-root", type=Path, default=None,
                   help="keep each world size's run directory (ranksN/), console log (ranksN.log) and rank logs "
                   "(ranksN-logs/) here (default: a temporary folder, deleted)")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    p.add_argument("overrides", nargs="*", help="config overrides key.path=value")
    ns = p.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="mathrl-dist-scaling-") as tmp:
        root = ns.run_root or Path(tmp)
        for n in ns.nproc:
            results.append(run(n, ns.overrides, device=ns.device, threads=ns.threads, out=root / f"ranks{n}"))
            print(json.dumps(results[-1]), flush=True)
    if ns.out is not None:
        ns.out.parent.mkdir(parents=True, exist_ok=True)
        ns.out.write_text(json.dumps({"device": ns.device, "overrides": [*DEFAULTS, *ns.overrides], "results": results},
                                     indent=2))
    base = results[0]["step_s"]
    print(f"\n| ranks ({ns.device}) | threads per rank | step s | rollout s | train s | speed-up "
          "| peak memory GiB (rank 0) | reward, step 1 | logprob mismatch |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        print(f"| {r['ranks']} | {r['threads_per_rank']} | {r['step_s']:.2f} | {r['rollout_s']:.2f} | {r['train_s']:.2f} "
              f"| {base / r['step_s']:.2f}x "
              f"| {r['peak_gb']:.2f} | {r['reward_first_step']:.4f} | {r['logprob_mismatch']:.2e} |")


if __name__ == "__main__":
    main()
