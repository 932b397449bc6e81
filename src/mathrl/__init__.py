"""mathrl: reinforcement learning from verifiable rewards for math reasoning."""

import os

# OpenMP threads (torch's intra-op pool, libgomp) that wait at a barrier spin for at most 10000 turns,
# then sleep. libgomp's default (300000 turns) holds the cores so long that two runs on one machine each
# burn the cores the other needs (43x slower each, on 2 cores); sleeping at once (OMP_WAIT_POLICY=PASSIVE)
# makes a run alone twice as slow, since its thousands of small parallel regions each wake sleeping
# threads. 10000 cost a run alone 11% and two at once 3.6x (docs/performance.md, benchmarks/concurrent_runs.py).
# libgomp reads it once, when torch loads it: hence here, before any mathrl module imports torch; every
# process mathrl starts (torchrun ranks, generator, reward and tool workers) inherits it. A policy or spin
# count the user set is kept (OMP_WAIT_POLICY=ACTIVE: spin, for a machine the run has to itself).
if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["GOMP_SPINCOUNT"] = "10000"

__version__ = "0.1.0"


def debug() -> bool:
    """MATHRL_DEBUG=1 (any value but empty or 0): errors keep their tracebacks, and the libraries' own
    notices (vLLM's logs and progress bars, torch's C++ warnings, known third-party deprecation
    warnings) are shown instead of silenced."""
    return os.environ.get("MATHRL_DEBUG", "") not in ("", "0")
