"""scripts/gpu_check.sh --dry-run: every check of the GPU script runs on the CPU with tiny sizes, so a
benchmark flag, a config field or a metric the script reads cannot break unnoticed until the next GPU run."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def check_names() -> list[str]:
    """Every check the script defines: `check NAME ...` lines and `report NAME ...` lines."""
    text = SCRIPT.read_text()
    names = re.findall(r"^\s*(?:check|report) (\w+) ", text, flags=re.M)
    return list(dict.fromkeys(n for n in names if n != '"$name"'))


@pytest.mark.slow
def test_dry_run_passes_and_prints_one_line_per_check(tmp_path: Path) -> None:
    proc = subprocess.run(["bash", str(SCRIPT), "--dry-run", str(tmp_path / "out")], capture_output=True, text=True,
                          timeout=600)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    names = check_names()
    assert {"env", "deps", "base", "train", "update_mfu", "resume", "workload", "rollout_engines", "sampler_speed",
            "entropy_memory", "lora", "vllm", "disagg"} <= set(names)
    for name in names:
        line = next((x for x in lines if x.split()[:1] == [name]), None)
        assert line is not None, f"no line for check {name}:\n{proc.stdout}"
        assert line.split()[1] in ("ok", "skip"), line
    # the numbers the GPU run is for are printed
    assert re.search(r"^train .*logprob mismatch \d", proc.stdout, flags=re.M)
    assert re.search(r"^update_mfu .*tokens/s", proc.stdout, flags=re.M)
    assert re.search(r"^resume .*resumed at step \d", proc.stdout, flags=re.M)
    assert re.search(r"^disagg .*staleness max 1", proc.stdout, flags=re.M)
    assert (tmp_path / "out" / "train.log").is_file() and list((tmp_path / "out" / "train" / "ranks").rglob("stdout.log"))
    assert lines[-1].startswith("0 failed")
