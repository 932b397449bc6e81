"""The machine a run ran on: CPU model and type, the flags that change its numerics, threads, torch.

Two CPU types build different tiny base models from the same seed (their matmul kernels round
differently), so a result holds for the machine it came from; every run records it (summary.json,
each process of `processes`, and a comment at the top of config.yaml). Reads /proc/cpuinfo and torch;
touches nothing else.
"""

from __future__ import annotations

import platform
from pathlib import Path

# flags that pick different matmul kernels (bf16 and int8 tiles, AVX-512 with bf16)
FLAGS = ("amx_bf16", "amx_tile", "amx_int8", "avx512_bf16", "avx512f", "avx2")


def cpu_info(text: str | None = None) -> tuple[str, list[str]]:
    """(model name, the FLAGS it has) from /proc/cpuinfo's text (read when not given); the platform's
    processor string and no flags where there is no /proc/cpuinfo."""
    if text is None:
        path = Path("/proc/cpuinfo")
        text = path.read_text(errors="replace") if path.exists() else ""
    model, flags = "", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = set(value.split())
    return model or platform.processor() or platform.machine() or "unknown", [f for f in FLAGS if f in flags]


def cpu_type(model: str, flags: list[str]) -> str:
    """A short label that separates machines building different base models: the vendor's family,
    with "(AMX)" where the CPU has bf16 tiles (e.g. "Intel Xeon (AMX)", "AMD EPYC")."""
    words = model.replace("(R)", "").replace("(TM)", "").split()
    family = " ".join(w for w in words[:2] if w.lower() not in ("cpu", "processor")) or model
    return family + (" (AMX)" if "amx_bf16" in flags else "")


def describe_machine() -> dict:
    """{"cpu_model", "cpu_type", "cpu_flags", "threads", "torch"} of this process."""
    import torch

    model, flags = cpu_info()
    return {"cpu_model": model, "cpu_type": cpu_type(model, flags), "cpu_flags": flags,
            "threads": torch.get_num_threads(), "torch": torch.__version__}


def machine_comment(machine: dict) -> str:
    """The machine as YAML comment lines, for the top of config.yaml (comments: a resume ignores them)."""
    flags = " ".join(machine["cpu_flags"]) or "none of " + " ".join(FLAGS)
    return (f"# machine: {machine['cpu_model']} ({machine['cpu_type']}); flags: {flags}\n"
            f"# threads: {machine['threads']}; torch {machine['torch']}\n")
