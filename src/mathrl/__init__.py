"""mathrl: reinforcement learning from verifiable rewards for math reasoning."""

__version__ = "0.1.0"


def debug() -> bool:
    """MATHRL_DEBUG=1 (any value but empty or 0): errors keep their tracebacks, and the libraries' own
    notices (vLLM's logs and progress bars, torch's C++ warnings, known third-party deprecation
    warnings) are shown instead of silenced."""
    import os

    return os.environ.get("MATHRL_DEBUG", "") not in ("", "0")
