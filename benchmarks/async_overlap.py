"""Generate while training on one machine: seconds per RL step of the synchronous loop, of 2 data-parallel
ranks, and of a generator process beside the trainer (rollout.max_staleness=1), on the same job.

    python benchmarks/async_overlap.py                      # the default job of dist_scaling.py, 2 cores
    python benchmarks/async_overlap.py --steps 6 --modes sync async
    python benchmarks/async_overlap.py --workload small --steps 4   # grpo_step_vs_trl.py's small workload

Workloads (`--workload`):
- default: dist_scaling.py's job, the embedded default's RL step (16 prompts x 8 samples, 48 new tokens);
- small: grpo_step_vs_trl.py's small workload: a 28M-parameter Qwen2-shaped model with random weights,
  4 prompts x 4 samples of 256 tokens, mini-batch 8 (generation dominates; the reward is 0, so
  dynamic sampling is off, as on that benchmark).

Modes (each a fresh `python -m mathrl.train` process, `--threads` cores in all):
- sync:  one process, `--threads` torch threads (OMP_NUM_THREADS);
- sync1: one process, one thread (a reference where other jobs share the cores: there the threads of
  `sync` wait for each other at every operation);
- nproc: `--threads` ranks of 1 thread (torchrun, FSDP2; the same as `mathrl train --nproc N`);
- async: rollout.max_staleness=1 (fixed lag, one step off-policy): one generator process with
  threads/2 threads and the trainer with the rest, each on cores of its own (the default placement).

Time per RL step: the mean, over the steps after the first (warm-up; in async the generator's start),
of perf/step_seconds, plus perf/wait_seconds in async (the trainer waiting for its batch), i.e. the
trainer's whole cycle; evaluations and checkpoints are outside it in every mode. ratio = sync's s/step /
the mode's. Learning outcome: the mean reward over the run's steps and the held-out pass@1 before and
after (eval at the start and the end only). Run it on an otherwise idle machine: a shared CPU makes every
number noisy, the overlap most of all (it needs both cores at once).
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

# dist_scaling.py's job: 16 prompts x 8 samples, 2 optimizer steps per RL step, evaluation at the start and end
DEFAULTS = ["rollout.prompts_per_step=16", "rollout.n=8", "rollout.batch_size=32", "train.mini_batch_size=64",
            "eval.every=1000", "data.eval_size=32", "eval.n=1", "train.save_every=0", "reward.num_workers=0"]
# grpo_step_vs_trl.py's small workload (its WORKLOADS["small"]); the model path is added when it is built
SMALL = ["rollout.prompts_per_step=4", "rollout.n=4", "rollout.max_new_tokens=256", "train.mini_batch_size=8",
         "train.lr=2e-4", "data.dynamic_sampling.mode=none", "data.eval_size=4"]


def small_model(root: Path) -> str:
    """The small workload's random model, built by grpo_step_vs_trl.py's own function."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from grpo_step_vs_trl import build_small_model

    return build_small_model(root / "small-model")


def command(mode: str, threads: int, overrides: list[str], out: Path) -> tuple[list[str], dict]:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    args = [*DEFAULTS, *overrides, "--run-dir", str(out)]
    if mode == "nproc":
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = "1"
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(threads),
                "-m", "mathrl.train", *args], env
    env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(1 if mode == "sync1" else threads)
    if mode == "async":
        args = ["rollout.max_staleness=1", f"rollout.generator.threads={max(1, threads // 2)}", *args]
    return [sys.executable, "-m", "mathrl.train", *args], env


def run(mode: str, threads: int, overrides: list[str], out: Path) -> dict:
    cmd, env = command(mode, threads, overrides, out)
    t0 = time.time()
    with open(out.with_name(out.name + ".log"), "w") as log:
        code = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    if code != 0:
        tail = out.with_name(out.name + ".log").read_text().splitlines()[-15:]
        raise SystemExit(f"{mode}: exited with {code}:\n" + "\n".join(tail))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in rows if "perf/step_seconds" in r]
    timed = steps[1:] or steps
    evals = [r for r in rows if any(k.endswith("/pass@1") for k in r) and "perf/step_seconds" not in r]
    pass1 = [next(v for k, v in r.items() if k.endswith("/pass@1")) for r in evals]
    return {
        "mode": mode,
        "step_s": statistics.mean(r["perf/step_seconds"] + r.get("perf/wait_seconds", 0.0) for r in timed),
        "wait_s": statistics.mean(r.get("perf/wait_seconds", 0.0) for r in timed),
        "rollout_s": statistics.mean(r["perf/rollout_seconds"] for r in timed),
        "train_s": statistics.mean(r["perf/train_seconds"] for r in timed),
        "reward_mean": statistics.mean(r["reward/mean"] for r in steps),
        "pass1_start": pass1[0] if pass1 else float("nan"),
        "pass1_end": pass1[-1] if pass1 else float("nan"),
        "staleness_mean": statistics.mean(r.get("rollout/staleness_mean", 0.0) for r in steps),
        "wall_s": time.time() - t0,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", choices=["default", "small"], default="default", help="see the module docstring")
    p.add_argument("--modes", nargs="+", choices=["sync", "sync1", "nproc", "async"], default=["sync", "nproc", "async"])
    p.add_argument("--steps", type=int, default=8, help="RL steps per run (the first is not timed)")
    p.add_argument("--threads", type=int, default=available_cpus(), help="cores of every mode (default: this process's)")
    p.add_argument("--run-root", type=Path, default=None, help="keep the run directories and logs here")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    p.add_argument("overrides", nargs="*", help="config overrides key.path=value")
    ns = p.parse_args()
    overrides = [f"train.steps={ns.steps}", *ns.overrides]
    results = []
    with tempfile.TemporaryDirectory(prefix="mathrl-async-overlap-") as tmp:
        root = ns.run_root or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        if ns.workload == "small":
            overrides = [*SMALL, f"model.path={small_model(root)}", *overrides]
        for mode in ns.modes:
            results.append(run(mode, ns.threads, overrides, root / mode))
            print(json.dumps(results[-1]), flush=True)
    if ns.out is not None:
        ns.out.write_text(json.dumps({"workload": ns.workload, "threads": ns.threads, "overrides": [*DEFAULTS, *overrides], "results": results},
                                     indent=2))
    base = next((r["step_s"] for r in results if r["mode"] == "sync"), results[0]["step_s"])
    print(f"\n| mode ({ns.threads} cores) | s/step | ratio to sync | trainer waiting s | rollout s | train s "
          "| mean reward | held-out pass@1 start -> end | staleness |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        print(f"| {r['mode']} | {r['step_s']:.2f} | {base / r['step_s']:.2f}x | {r['wait_s']:.2f} | {r['rollout_s']:.2f} "
              f"| {r['train_s']:.2f} | {r['reward_mean']:.3f} | {r['pass1_start']:.3f} -> {r['pass1_end']:.3f} "
              f"| {r['staleness_mean']:.2f} |")


if __name__ == "__main__":
    main()
