"""Benchmark: the python tool's start-up cost per call, cold (a sandbox started for the call) and warm
(one started ahead, `WarmSandboxes`), in seconds of `print(1+1)` as the caller waits for it.

Each `--src` is a source tree of mathrl (its `src` folder); the trees run in turn, in a process of
their own each (PYTHONPATH set to the tree), `--rounds` times, so that two versions are measured side
by side on the same machine at the same load. A round is one warm-up call, then `--calls` cold calls
and `--calls` warm calls (before each warm call its sandbox is given `--settle` seconds, untimed, to
finish starting). It prints p50 and p95 of each round and the range over the rounds.

    python benchmarks/sandbox_startup.py --src /path/to/other/checkout/src --src src --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROUND = r"""
import json, statistics, sys, time
import mathrl
from mathrl.tools import run_python
from mathrl.tools.sandbox import WarmSandboxes

calls, settle, mode = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
kwargs = {"sandbox": mode}
assert run_python("print(1+1)", **kwargs).text == "2", "the sandbox does not work here"
cold, warm = [], []
for _ in range(calls):
    start = time.perf_counter()
    assert run_python("print(1+1)", **kwargs).text == "2"
    cold.append(time.perf_counter() - start)
stock = WarmSandboxes(kwargs, 1)
try:
    for _ in range(calls):
        stock.refill()
        time.sleep(settle)
        taken = stock.taken
        start = time.perf_counter()
        assert run_python("print(1+1)", prestarted=stock, **kwargs).text == "2"
        warm.append(time.perf_counter() - start)
        assert stock.taken == taken + 1, "the call did not run in the pre-started sandbox"
finally:
    stock.close()
print(json.dumps({"source": mathrl.__file__, "cold": cold, "warm": warm}))
"""


def percentiles(times: list[float]) -> tuple[float, float]:
    """(p50, p95) in milliseconds."""
    return statistics.median(times) * 1000, statistics.quantiles(times, n=20)[18] * 1000


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--src", action="append", required=True, help="a mathrl source tree (repeat to compare)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--calls", type=int, default=30)
    p.add_argument("--settle", type=float, default=0.3, help="seconds a warm sandbox gets to start, untimed")
    p.add_argument("--mode", default="bwrap")
    args = p.parse_args()
    seen: dict[str, dict[str, list[tuple[float, float]]]] = {src: {"cold": [], "warm": []} for src in args.src}
    for r in range(args.rounds):
        for src in args.src:
            env = {**os.environ, "PYTHONPATH": os.path.abspath(src), "OMP_NUM_THREADS": "1"}
            out = subprocess.run([sys.executable, "-c", ROUND, str(args.calls), str(args.settle), args.mode],
                                 env=env, capture_output=True, text=True, check=True)
            got = json.loads(out.stdout.strip().splitlines()[-1])
            for kind in ("cold", "warm"):
                p50, p95 = percentiles(got[kind])
                seen[src][kind].append((p50, p95))
                print(f"round {r + 1} {src} ({got['source']}): {kind} p50 {p50:5.1f} ms  p95 {p95:5.1f} ms", flush=True)
        time.sleep(0.1)
    print(f"\n{args.mode}, {args.rounds} rounds of {args.calls} calls; load average {os.getloadavg()[0]:.1f}")
    for src in args.src:
        cells = []
        for kind in ("cold", "warm"):
            p50s, p95s = [x[0] for x in seen[src][kind]], [x[1] for x in seen[src][kind]]
            cells.append(f"{kind} p50 {min(p50s):.0f}-{max(p50s):.0f} ms, p95 {min(p95s):.0f}-{max(p95s):.0f} ms")
        print(f"{src}: " + "; ".join(cells))


if __name__ == "__main__":
    main()
