"""mathrl: reinforcement learning from verifiable rewards for math reasoning."""

import os

# OpenMP threads (torch's intra-op pool, libgomp) that wait at a barrier sleep instead of spinning. Spinning
# threads hold their cores while they wait, so two runs on one machine each burn the cores the other needs
# and both go far slower than twice one alone (docs/performance.md, benchmarks/concurrent_runs.py).
# libgomp reads the variable once, when torch loads it: hence here, before any mathrl module imports torch;
# every process mathrl starts (torchrun ranks, generator, reward and tool workers) inherits it. A value
# the user set (OMP_WAIT_POLICY=ACTIVE: spin, for a machine the run has to itself) is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"


def debug() -> bool:
    """MATHRL_DEBUG=1 (any value but empty or 0): errors keep their tracebacks, and the libraries' own
    notices (vLLM's logs and progress bars, torch's C++ warnings, known third-party deprecation
    warnings) are shown instead of silenced."""
    return os.environ.get("MATHRL_DEBUG", "") not in ("", "0")
