"""Two runs on one machine: seconds per RL step of one `mathrl train` alone and of two started at once,
under libgomp's default wait (waiting threads spin 300000 turns), mathrl's (10000 turns) and PASSIVE (none).

    # the measurement: an otherwise idle machine; up to ~25 min (the unset arm's two runs may take the whole cap),
    # plus the default base model's build when it is not cached yet
    python benchmarks/concurrent_runs.py --steps 10 --cap-s 900 --out benchmarks/results/concurrent_runs_cpu.json
    # a check that it runs (not a measurement): a small base model and task, 3 steps
    python benchmarks/concurrent_runs.py --steps 3 --cap-s 150 base.steps=200 base.max_digits=2 data.arith.max_digits=2

Arms (`--policies`), each started as `mathrl train` starts (its own run directory and MATHRL_CACHE, no
thread settings unless --threads):
- unset:   libgomp's default, as before mathrl set a policy: the run's interpreter imports torch before
           mathrl (libgomp reads its environment once, when torch loads it) and then removes the spin
           count mathrl set (the default run's only child, its reward worker, does no torch work);
- default: mathrl's (mathrl/__init__.py sets GOMP_SPINCOUNT=10000 unless a policy or spin count is set:
           waiting threads spin 10000 turns, then sleep);
- passive: OMP_WAIT_POLICY=PASSIVE set by the user (waiting threads sleep at once);
- active:  OMP_WAIT_POLICY=ACTIVE set by the user (threads spin for as long as they wait).
Each arm runs one run alone, then two at once. The base model is built (or found) first, in --cache
(default: mathrl's own cache), and copied into every run's cache, so that only training is timed.

A run that has not finished --cap-s seconds after its start is reported with the steps it had logged
then (the step in progress is not counted; its wall time is the cap), and gets SIGTERM.

Per run: the steps done, seconds per RL step (the mean of perf/step_seconds over the steps after the
first, which includes warm-up; the first alone when it is the only one) and the process's wall time
(start-up and the evaluations at the start and the end included). Per arm, "two / alone" is the mean
s/step of the two concurrent runs over the s/step of the run alone; "alone vs unset" is the arm's s/step
alone over the unset arm's. --threads N sets OMP_NUM_THREADS=N for every run (default: unset, torch's
own choice: the cores). The load average before each arm is printed: other jobs make every number noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

from mathrl.cache import cache_root
from mathrl.train.launch import available_cpus

# the default run with a lighter evaluation (32 problems, 1 sample, at the start and the end only) and no
# checkpoints: the timing is of the RL steps
DEFAULTS = ["data.eval_size=32", "eval.n=1", "eval.every=1000", "train.save_every=0"]
# the interpreter of an `unset` run: torch (libgomp) loads before mathrl sets the policy, which it then removes
UNSET_DRIVER = ("import os, sys\nimport torch\nimport mathrl\n"
                "os.environ.pop('GOMP_SPINCOUNT', None)\nfrom mathrl.cli import main\nsys.exit(main())\n")


def run_env(policy: str, cache: Path, threads: int | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env.update(MATHRL_CACHE=str(cache), CUDA_VISIBLE_DEVICES="")
    if policy in ("active", "passive"):
        env["OMP_WAIT_POLICY"] = policy.upper()
    if threads is not None:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    return env


def command(policy: str, args: list[str]) -> list[str]:
    if policy == "unset":
        return [sys.executable, "-c", UNSET_DRIVER, *args]
    return [sys.executable, "-m", "mathrl.cli", *args]


def build_base(cache: Path, base_overrides: list[str]) -> Path:
    """The base model's cache entry (built now when missing); returns the folder that holds it."""
    env = {**os.environ, "MATHRL_CACHE": str(cache)}
    done = subprocess.run([sys.executable, "-m", "mathrl.cli", "base", *base_overrides], env=env, capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise SystemExit(f"mathrl base failed:\n{done.stderr[-3000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def prepare(name: str, root: Path, entry: Path) -> Path:
    """A run's own cache, holding a copy of the base model's entry."""
    shutil.copytree(entry, root / name / "cache" / "base" / entry.name)
    return root / name / "cache"


def start(policy: str, name: str, root: Path, cache: Path, overrides: list[str], threads: int | None) -> dict:
    """One `mathrl train` with its own run directory and cache."""
    run_dir = root / name / "run"
    log = open(root / name / "log", "w")  # closed in wait_all()
    proc = subprocess.Popen(command(policy, ["train", *DEFAULTS, *overrides, "--run-dir", str(run_dir)]),
                            env=run_env(policy, cache, threads), stdout=log, stderr=subprocess.STDOUT)
    return {"name": name, "proc": proc, "log": log, "run_dir": run_dir, "t0": time.time()}


def step_times(run_dir: Path) -> list[float]:
    """perf/step_seconds of every step logged so far."""
    path = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    return [r["perf/step_seconds"] for r in rows if "perf/step_seconds" in r]


def wait_all(jobs: list[dict], *, cap_s: float, steps: int) -> list[dict]:
    """Wait for `jobs`, started together, until the cap; the steps of a run still going then are read at
    the cap (the step in progress is not counted), and it gets SIGTERM (SIGKILL 30 s later)."""
    deadline = min(job["t0"] for job in jobs) + cap_s
    for job in jobs:
        job["wall_s"], job["capped"] = None, False
    while any(job["wall_s"] is None for job in jobs) and time.time() < deadline:
        for job in jobs:
            if job["wall_s"] is None and job["proc"].poll() is not None:
                job["wall_s"], job["step_s"] = time.time() - job["t0"], step_times(job["run_dir"])
        time.sleep(0.2)
    for job in jobs:
        if job["wall_s"] is None:
            job["wall_s"], job["step_s"], job["capped"] = cap_s, step_times(job["run_dir"]), True
            job["proc"].send_signal(signal.SIGTERM)
    out = []
    for job in jobs:
        try:
            job["proc"].wait(timeout=30)
        except subprocess.TimeoutExpired:
            job["proc"].kill()
            job["proc"].wait()
        job["log"].close()
        if job["proc"].returncode not in (0, 143) and not job["capped"]:
            tail = Path(job["log"].name).read_text(errors="replace").splitlines()[-15:]
            raise SystemExit(f"{job['name']}: exited with {job['proc'].returncode}:\n" + "\n".join(tail))
        timed = job["step_s"][1:] or job["step_s"]
        out.append({"run": job["name"], "steps_done": len(job["step_s"]), "steps": steps, "capped": job["capped"],
                    "step_s": statistics.mean(timed) if timed else float("nan"), "wall_s": job["wall_s"]})
    return out


def arm(policy: str, root: Path, entry: Path, overrides: list[str], *, steps: int, cap_s: float,
        threads: int | None) -> list[dict]:
    out = []
    for together in (1, 2):
        names = [f"{policy}-{together}x-{i}" for i in range(together)]
        caches = [prepare(name, root, entry) for name in names]  # before either starts
        jobs = [start(policy, name, root, cache, overrides, threads) for name, cache in zip(names, caches)]
        for r in wait_all(jobs, cap_s=cap_s, steps=steps):
            out.append({"policy": policy, "at_once": together, **r})
            print(json.dumps(out[-1]), flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--policies", nargs="+", choices=["unset", "default", "passive", "active"],
                   default=["unset", "default", "passive"])
    p.add_argument("--steps", type=int, default=10, help="RL steps per run (the first is not timed)")
    p.add_argument("--cap-s", type=float, default=900, help="seconds a run may take before it is stopped (SIGTERM)")
    p.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS of every run (default: unset)")
    p.add_argument("--cache", type=Path, default=None, help="where the base model is built or found (default: mathrl's cache)")
    p.add_argument("--run-root", type=Path, default=None, help="keep the run directories and logs here")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    p.add_argument("overrides", nargs="*", help="config overrides key.path=value (base.* ones also build the base model)")
    ns = p.parse_args()
    overrides = [f"train.steps={ns.steps}", *ns.overrides]
    print(f"{platform.processor() or platform.machine()}, {available_cpus()} cores; torch {version('torch')}; "
          f"threads per run: {ns.threads or 'torch default'}; overrides: {' '.join([*DEFAULTS, *overrides])}", flush=True)
    entry = build_base(ns.cache or cache_root(), [o for o in ns.overrides if o.startswith("base.")])
    results, loads = [], {}
    with tempfile.TemporaryDirectory(prefix="mathrl-concurrent-") as tmp:
        root = ns.run_root or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        for policy in ns.policies:
            loads[policy] = os.getloadavg()[0]
            print(f"{policy}: load average {loads[policy]:.2f} before it", flush=True)
            results += arm(policy, root, entry, overrides, steps=ns.steps, cap_s=ns.cap_s, threads=ns.threads)
    if ns.out is not None:
        ns.out.write_text(json.dumps({"cores": available_cpus(), "threads": ns.threads, "overrides": [*DEFAULTS, *overrides],
                                      "load_before": loads, "results": results}, indent=2))
    alone = {r["policy"]: r["step_s"] for r in results if r["at_once"] == 1}
    print(f"\n| policy ({available_cpus()} cores) | runs at once | steps done | s/step | wall s |")
    print("| --- | --- | --- | --- | --- |")
    for r in results:
        done = f"{r['steps_done']} of {r['steps']}" + (f" (capped at {ns.cap_s:g} s)" if r["capped"] else "")
        print(f"| {r['policy']} | {r['at_once']} | {done} | {r['step_s']:.2f} | {r['wall_s']:.0f} |")
    print("\n| policy | two at once / alone (s/step) | alone vs unset alone |")
    print("| --- | --- | --- |")
    for policy in ns.policies:
        two = statistics.mean(r["step_s"] for r in results if r["policy"] == policy and r["at_once"] == 2)
        vs = f"{alone[policy] / alone['unset']:.3f}x" if "unset" in alone else "-"
        print(f"| {policy} | {two / alone[policy]:.2f}x | {vs} |")


if __name__ == "__main__":
    main()
