"""scripts/gpu_check.sh --dry-run: every check of the GPU script runs on the CPU with tiny sizes, so a
benchmark flag, a config field or a metric the script reads cannot break unnoticed until the next GPU run.
The cheap tests run the script with --budget 0 (no check runs): the time limits, the device call and the
choice of the output directory."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
DEVICE_CALL = 'device call: command="bash scripts/gpu_check.sh --report \\"$OUT\\"" carry=[".gpu_wheels"] timeout_s=480'


def check_names() -> list[str]:
    """Every check the script defines: `check NAME ...` lines and `report NAME ...` lines."""
    text = SCRIPT.read_text()
    names = re.findall(r"^\s*(?:check|report) (\w+) ", text, flags=re.M)
    return list(dict.fromkeys(n for n in names if n != '"$name"'))


def run_script(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHON": sys.executable})


def limits(text: str) -> tuple[int, int, dict[str, int]]:
    """(sum, budget, {check: limit}) from the script's `per-check limits sum to ...` line."""
    m = re.search(r"^per-check limits sum to (\d+) s against a budget of (\d+) s \((.*)\)$", text, flags=re.M)
    assert m, text
    each = {name: int(s) for name, s in (part.rsplit(" ", 1) for part in m.group(3).split(", "))}
    return int(m.group(1)), int(m.group(2)), each


def test_limits_fit_the_gpu_budget_and_help_names_the_device_call() -> None:
    proc = run_script("--help")
    assert proc.returncode == 0, proc.stderr
    total, budget, each = limits(proc.stdout)
    assert total == sum(each.values()) < budget <= 450  # 8 minutes on the GPU with room for the summary
    assert set(each) == set(check_names()) - {"vllm"}
    assert f"the limits sum to {total} s" in proc.stdout.replace("\n", " ")  # the header says the same
    assert proc.stdout.splitlines()[-1] == DEVICE_CALL
    assert "timeout_s=480" in proc.stdout and re.search(r"default 450 s on the GPU", proc.stdout)


def test_output_goes_outside_the_checkout_or_into_a_fresh_subdirectory(tmp_path: Path) -> None:
    proc = run_script("--dry-run", "--budget", "0")  # no check runs: only the directory is chosen
    default = Path(re.search(r"^output: (.*)$", proc.stdout, flags=re.M).group(1))
    assert proc.stdout.splitlines()[0] == DEVICE_CALL
    assert default.is_dir() and not default.is_relative_to(ROOT)
    default.rmdir()
    out = tmp_path / "out"
    first = run_script("--dry-run", "--budget", "0", str(out))
    assert re.search(rf"^output: {re.escape(str(out))}$", first.stdout, flags=re.M)  # new: used as it is
    (out / "train.log").write_text("an earlier run's log\n")
    seen = set()
    for _ in range(2):  # not empty: a new timestamped subdirectory each time, the earlier files untouched
        proc = run_script("--dry-run", "--budget", "0", str(out))
        got = Path(re.search(r"^output: (.*)$", proc.stdout, flags=re.M).group(1))
        assert got.resolve().parent == out.resolve() and got.name.startswith("run-") and got not in seen
        assert proc.stdout.splitlines()[-1].endswith(f"logs in {got}")
        seen.add(got)
    assert (out / "train.log").read_text() == "an earlier run's log\n"
    assert "gpu_check_out/" in (ROOT / ".gitignore").read_text().splitlines()


@pytest.mark.slow
def test_dry_run_passes_and_prints_one_line_per_check(tmp_path: Path) -> None:
    # the folder already holds the leftovers of a finished run (run directories with a summary and a final
    # model): a rerun into it must not find them ("holds a finished run") nor report their numbers
    out = tmp_path / "out"
    for name in ("train", "lora", "disagg", "resume"):
        run = out / name / "run"
        (run / "final").mkdir(parents=True)
        (run / "metrics.jsonl").write_text('{"step": 1, "perf/step_seconds": 1.0}\n')
        (run / "summary.json").write_text("{}\n")
    (out / "train.log").write_text("an earlier run's log\n")
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    report = tmp_path / "report"
    proc = run_script("--dry-run", "--report", str(report), str(out), timeout=600)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert lines[0] == DEVICE_CALL
    total, budget, _ = limits(proc.stdout)
    assert total < budget
    names = check_names()
    assert {"env", "deps", "base", "train", "update_mfu", "resume", "workload", "memory_plan", "rollout_engines",
            "sampler_speed", "entropy_memory", "lora", "vllm", "disagg"} <= set(names)
    for name in names:
        line = next((x for x in lines if x.split()[:1] == [name]), None)
        assert line is not None, f"no line for check {name}:\n{proc.stdout}"
        assert line.split()[1] in ("ok", "skip"), line
    # the numbers the GPU run is for are printed
    assert re.search(r"^train .*logprob mismatch \d", proc.stdout, flags=re.M)
    assert re.search(r"^update_mfu .*tokens/s", proc.stdout, flags=re.M)
    assert re.search(r"^resume .*resumed at step \d", proc.stdout, flags=re.M)
    assert re.search(r"^disagg .*generator on cpu .*weights over gloo.*staleness max 1", proc.stdout, flags=re.M)
    assert re.search(r"^memory_plan .*plan [\d.]+ GiB .*measured .* [\d.]+ GiB: ratio [\d.]+", proc.stdout, flags=re.M)
    assert re.search(r"^lora .*logprob mismatch \d", proc.stdout, flags=re.M)
    assert lines[-1].startswith("0 failed")
    # a fresh subdirectory; the earlier run's files are as they were
    run_dir = Path(re.search(r"^output: (.*)$", proc.stdout, flags=re.M).group(1))
    assert run_dir.resolve().parent == out.resolve() and run_dir.name.startswith("run-")
    assert all(p.read_bytes() == data for p, data in before.items())
    assert "holds a finished run" not in (run_dir / "train.log").read_text()
    assert (run_dir / "train.log").is_file() and list((run_dir / "train" / "ranks").rglob("stdout.log"))
    # the report: what was printed, and the logs and metrics without model weights
    assert (report / "gpu_check.txt").read_text() == proc.stdout
    with tarfile.open(report / "gpu_check.tar.gz") as tar:
        members = tar.getnames()
    assert "./train.log" in members and "./train/run/metrics.jsonl" in members and "./workload.json" in members
    assert not [m for m in members if m.endswith((".safetensors", ".pt", ".bin"))]
