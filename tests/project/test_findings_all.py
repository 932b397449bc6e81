"""`python scripts/findings all`: the registry covers every grid of recipes/findings, --dry-run lists every
command, --only restricts; a tiny grid goes through runs and analyses end to end; `entropy-tokens` on
the checkpoints of its runs.

Run: python -m pytest tests/project/test_findings_all.py -q
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

from ablate import load_grid  # noqa: E402
from findings.pipeline import FINDINGS, build_jobs  # noqa: E402

GRIDS = sorted((REPO / "recipes" / "findings").glob("*.yaml"))
TINY = ["base.steps=20", "base.hidden_size=32", "base.intermediate_size=64", "base.num_layers=2", "base.num_heads=2",
        "base.num_kv_heads=1", "base.max_digits=1", "data.arith.max_digits=1", "data.eval_size=4", "eval.n=2",
        "rollout.prompts_per_step=2", "rollout.n=2", "train.mini_batch_size=4", "reward.num_workers=0",
        "rollout.max_new_tokens=16", "log.rollouts_per_step=0"]


def findings(*args: str, cache: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "MATHRL_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(REPO / "scripts" / "findings"), *args], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=timeout)


def test_every_findings_grid_is_in_the_registry() -> None:
    assert sorted(f.grid for f in FINDINGS if f.grid) == [g.stem for g in GRIDS]
    names = [a.name for f in FINDINGS for a in f.analyses]
    assert len(names) == len(set(names))  # one log file per analysis


@pytest.mark.slow
def test_dry_run_lists_every_run_and_analysis(tmp_path: Path) -> None:
    done = findings("all", "--dry-run", "--out", str(tmp_path / "runs"), "--fig-dir", str(tmp_path / "figs"),
                    cache=tmp_path / "cache")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    listed = {m.group(2): m.group(1) for line in lines if (m := re.match(r"\[(run|analysis) todo\] (\S+): ", line))}
    for grid in GRIDS:  # every variant of every grid, each once (shared runs such as grpo too)
        for v in load_grid(grid)[1]:
            assert listed.get(v.name) == "run", (grid.name, v.name)
    for f in FINDINGS:
        for step in f.runs:
            assert listed.get(step.name) == "run", step.name
        for a in f.analyses:
            assert listed.get(a.name) == "analysis", a.name
    runs = sum(kind == "run" for kind in listed.values())
    analyses = sum(kind == "analysis" for kind in listed.values())
    assert len(lines) == len(listed) + 1
    assert lines[-1] == f"{len(listed)} commands: {runs} runs (0 finished earlier), {analyses} analyses (0 up to date)"
    # the commands are the documented ones: a grid's curves, passk on the R1-Zero, SFT and R1 runs
    assert any(line.endswith(f"curves recipes/findings/dynamic_sampling.yaml --out {tmp_path / 'runs'} "
                             f"--fig {tmp_path / 'figs' / 'dynamic_sampling.png'} --x tokens") for line in lines)
    passk = next(line for line in lines if line.startswith("[analysis todo] passk:"))
    assert "--base tiny-arith" in passk and f"{tmp_path / 'runs' / 'r1_path_seed4'}" in passk
    assert not (tmp_path / "runs").exists() and not (tmp_path / "figs").exists()  # a dry run writes nothing


def test_only_restricts_and_brings_the_runs_an_analysis_reads(tmp_path: Path) -> None:
    jobs = build_jobs(FINDINGS, out=tmp_path, fig_dir=tmp_path, only=["ppo"], validate=False)
    ppo = load_grid(REPO / "recipes" / "findings" / "ppo.yaml")[1]
    assert [j.name for j in jobs] == [v.name for v in ppo] + ["curves_ppo", "positions_ppo"]
    assert jobs[-2].after == jobs[-1].after == {v.name for v in ppo}  # a grid file's analyses read all its runs
    # finding 6's curves read the R1-Zero runs of the entropy grid: they come along, its other runs do not
    jobs = {j.name: j for j in build_jobs(FINDINGS, out=tmp_path, fig_dir=tmp_path, only=["r1_path"], validate=False)}
    assert "grpo_seed4" in jobs and "clip_symmetric" not in jobs
    assert jobs["r1_path_seed2"].after == {"sft_seed2"} and jobs["sft_seed2"].after == {"reflective_traces"}
    assert {"grpo", "r1_path_seed0", "r1_zero_100steps_seed4"} <= jobs["curves_r1_path"].after
    with pytest.raises(ValueError, match="names no finding"):
        build_jobs(FINDINGS, out=tmp_path, fig_dir=tmp_path, only=["no_such"], validate=False)


def test_a_typo_in_a_grid_fails_before_anything_runs(tmp_path: Path) -> None:
    grid = tmp_path / "bad.yaml"
    grid.write_text("runs:\n  a: []\n  b: [algo.clip.eps_hihg=0.3]\n")
    done = findings("all", "--grids", str(grid), "--out", str(tmp_path / "runs"), "--fig-dir", str(tmp_path / "f"),
                    cache=tmp_path / "cache")
    assert done.returncode == 2 and "variant 'b'" in done.stderr and "algo.clip.eps_high" in done.stderr
    assert not (tmp_path / "runs").exists()


def test_a_failed_run_skips_what_needs_it_and_the_rest_goes_on(tmp_path: Path) -> None:
    import io

    from findings.pipeline import Job, run_jobs
    from rich.console import Console

    def job(name: str, code: str, kind: str = "run", after: tuple[str, ...] = ()) -> Job:
        return Job(name, [sys.executable, "-c", code], kind, tmp_path / f"{name}.log", set(after),
                   marker=tmp_path / f"{name}.done")

    (tmp_path / "kept.done").write_text("")  # finished earlier: not run again
    jobs = [job("kept", "raise SystemExit(3)"), job("ok", "print('ran ok')"), job("bad", "raise SystemExit(3)"),
            job("needs_bad", "print('never')", "analysis", ("ok", "bad")), job("needs_ok", "print('x')", "analysis", ("ok",))]
    out = io.StringIO()
    failed = run_jobs(jobs, parallel=2, console=Console(file=out, width=200), env=dict(os.environ), poll_s=0.05)
    assert failed == ["bad", "needs_bad"]
    text = out.getvalue()
    assert "run bad: exit 3" in text and "analysis needs_bad: skipped, it needs ['bad']" in text
    assert "analysis needs_ok: done in" in text and "kept" not in text
    assert (tmp_path / "ok.log").read_text() == "ran ok\n" and not (tmp_path / "needs_bad.log").exists()
    assert text.splitlines()[-1].startswith("findings 5/5 | ")  # every job counted: kept, done, failed, skipped


@pytest.fixture(scope="module")
def tiny_all(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """`all` on a grid of 2 runs of 2 steps (checkpoints kept at every step), 2 at once."""
    root = tmp_path_factory.mktemp("all")
    grid = root / "tiny.yaml"
    common = ", ".join([*TINY, "train.steps=2", "eval.every=1", "train.save_every=1", "train.keep_every=1"])
    grid.write_text(f"common: [{common}]\ncolumns: [actor/entropy, reward/accuracy]\n"
                    "runs:\n  sym: [algo.clip.eps_high=0.2]\n  higher: []\n")
    done = findings("all", "--grids", str(grid), "--out", str(root / "runs"), "--fig-dir", str(root / "figs"),
                    cache=root / "cache")
    return root, done


@pytest.mark.slow
def test_all_runs_a_tiny_grid_end_to_end(tiny_all) -> None:
    root, done = tiny_all
    assert done.returncode == 0, done.stdout + done.stderr
    for name in ("sym", "higher"):
        assert (root / "runs" / name / "summary.json").is_file()
        assert (root / "runs" / f"{name}.log").read_text()  # each run's output goes to its log
    assert (root / "figs" / "tiny.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (root / "figs" / "tiny.md").read_text().splitlines()[2].startswith("| sym | ")
    out = done.stdout
    assert out.splitlines()[0].startswith("3 commands, 0 done earlier")
    assert "run sym: done in" in out and "run higher: done in" in out and "analysis curves_tiny: done in" in out
    assert re.search(r"^findings 3/3 \| .* \| elapsed \d:\d\d:\d\d \| eta ", out, re.M)  # the progress line

    again = findings("all", "--grids", str(root / "tiny.yaml"), "--out", str(root / "runs"),
                     "--fig-dir", str(root / "figs"), cache=root / "cache")
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[0].startswith("3 commands, 3 done earlier")  # nothing reran
    assert "done in" not in again.stdout


@pytest.mark.slow
def test_entropy_tokens_reads_the_kept_checkpoints(tiny_all) -> None:
    root, done = tiny_all
    assert done.returncode == 0, done.stdout + done.stderr
    runs = [str(root / "runs" / n) for n in ("sym", "higher")]
    table = root / "tok.md"
    got = findings("entropy-tokens", *runs, "--steps", "0", "1", "2", "--limit", "4", "--k", "3", "--min-count", "1",
                   "--group", "both", "both", "--out", str(table), cache=root / "cache")
    assert got.returncode == 0, got.stderr
    lines = table.read_text().splitlines()
    assert lines[0] == ("| variant | previous token | token | step 0: entropy (count) | step 1: entropy (count) "
                        "| step 2: entropy (count) |")
    rows = [line.strip("| ").split(" | ") for line in lines[2:]]
    assert 3 <= len(rows) <= 9  # the union of three steps' top 3
    for row in rows:
        assert row[0] == "both"
        cells = [c for c in row[3:] if c != "—"]
        assert cells and all(re.fullmatch(r"\d+\.\d{3} \(\d+\)", c) for c in cells)
    # every step's checkpoint was sampled: step 0 from the run's base model, then checkpoints/step_000001, _000002
    assert got.stderr.count("step 0 (") == 2 and "checkpoints/step_000001" in got.stderr

    missing = findings("entropy-tokens", runs[0], "--steps", "0", "5", "--out", str(root / "x.md"), cache=root / "cache")
    assert missing.returncode == 2
    assert "has no checkpoint of step 5" in missing.stderr and "[0, 1, 2]" in missing.stderr
