"""Run a tiny 2-rank job (`mathrl train --nproc 2`, gloo on CPU) many times in a row and check that
every run exits 0: a job that finished its work must never fail in its teardown.

    python scripts/stress_dist_exit.py                       # 20 runs under /tmp
    python scripts/stress_dist_exit.py --runs 50 --out runs/stress --omp-threads 2

Each run trains a few steps of the tiny base model (built once into OUT/cache) with a checkpoint every
step (sharded DCP saves), evaluates, saves the final model and exits. A run that exits otherwise keeps
its log (OUT/run_<i>.log) and its last lines are printed; the script exits 1 if any run failed.
The environment is the test suite's: OMP_NUM_THREADS per rank and TOKENIZERS_PARALLELISM=false.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TINY = [
    "base.steps=200", "base.max_digits=1", "data.arith.max_digits=1", "base.hidden_size=32",
    "base.intermediate_size=64", "base.num_layers=2", "base.num_heads=2", "base.num_kv_heads=1",
    "rollout.prompts_per_step=4", "rollout.n=4", "rollout.batch_size=8", "train.mini_batch_size=8",
    "data.eval_size=4", "eval.n=2", "eval.every=2", "reward.num_workers=0", "train.save_every=1",
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="how many jobs to run, one after another")
    parser.add_argument("--steps", type=int, default=2, help="RL steps per job")
    parser.add_argument("--nproc", type=int, default=2, help="ranks per job")
    parser.add_argument("--omp-threads", default="1", help="OMP_NUM_THREADS of each rank")
    parser.add_argument("--out", type=Path, default=None, help="folder for run directories and logs (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the run directories of jobs that exited 0")
    args = parser.parse_args()

    out = args.out or Path(tempfile.mkdtemp(prefix="mathrl-stress-"))
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "MATHRL_CACHE": str(out / "cache"), "OMP_NUM_THREADS": args.omp_threads,
           "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
    codes = []
    t_all = time.time()
    for i in range(args.runs):
        run, log = out / f"run_{i:03d}", out / f"run_{i:03d}.log"
        cmd = [sys.executable, "-m", "mathrl.cli", "train", *TINY, f"train.steps={args.steps}", "--run-dir", str(run),
               "--nproc", str(args.nproc)]
        t0 = time.time()
        with log.open("w") as f:
            code = subprocess.call(cmd, env=env, stdout=f, stderr=subprocess.STDOUT)
        finished = (run / "summary.json").is_file()
        codes.append(code if finished else f"{code} (no summary)")
        print(f"run {i + 1}/{args.runs}: exit {code}, summary {'written' if finished else 'MISSING'}, "
              f"{time.time() - t0:.1f}s", flush=True)
        if code != 0 or not finished:
            print("".join(log.read_text().splitlines(keepends=True)[-15:]), flush=True)
        elif not args.keep:
            shutil.rmtree(run)
            log.unlink()
    ok = codes.count(0)
    print(f"{ok}/{len(codes)} runs exited 0 in {time.time() - t_all:.0f}s ({out})")
    return 0 if ok == len(codes) else 1


if __name__ == "__main__":
    sys.exit(main())
