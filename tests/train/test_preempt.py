"""SIGTERM is a preemption: the run ends its step, saves it, prints the resume line and exits 143; the
same command then resumes to the metrics of a run that was never stopped. Before the first step it
stops at once (the base model's build, the start's evaluation, the generators' start), saves nothing,
leaves no half-built cache entry, and the same command starts over. Also the time-based checkpoint
decision (train.save_every_minutes) and the SIGTERM handler itself.

Each run is a separate process (`python DRIVER ...` or `python -m mathrl.cli ...`), so the signal is a
real SIGTERM of a real run; the ones sent from outside wait for the line that says the phase began.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mathrl.run_dir import RunDir, latest_checkpoint
from mathrl.train.dist import Ranks
from mathrl.train.preempt import Preempted, StopSignal, Terminated, agree, time_save_due

DRIVER = r'''
import json, os, signal, sys
import torch
torch.set_num_threads(1)
from mathrl.cli import main
from mathrl.train import step

argv, term_step = json.loads(sys.argv[1]), int(sys.argv[2])
if term_step:  # SIGTERM in the middle of step K, inside its update
    real_update = step.update_policy
    def update_then_term(*args, step, **kwargs):
        if step == term_step:
            os.kill(os.getpid(), signal.SIGTERM)
        return real_update(*args, step=step, **kwargs)
    step.update_policy = update_then_term
sys.exit(main(argv))
'''

# train.save_every=10: no step-based checkpoint before the SIGTERM, so the one it writes is its own
ARGS = [
    "train", "base.steps=200", "base.max_digits=1", "data.arith.max_digits=1", "base.hidden_size=32",
    "base.intermediate_size=64", "base.num_layers=2", "base.num_heads=2", "base.num_kv_heads=1",
    "train.steps=4", "train.save_every=10", "rollout.prompts_per_step=4", "rollout.n=4",
    "train.mini_batch_size=8", "data.eval_size=4", "eval.n=2", "eval.every=3", "reward.num_workers=0",
    "algo.entropy.mode=adaptive", "algo.entropy.coef=0.001",
]


def run(tmp_path: Path, run_dir: Path, term_step: int = 0) -> subprocess.CompletedProcess:
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    env = {**os.environ, "MATHRL_CACHE": str(tmp_path / "cache")}
    argv = [*ARGS, "--run-dir", str(run_dir)]
    return subprocess.run([sys.executable, str(driver), json.dumps(argv), str(term_step)], env=env,
                          capture_output=True, text=True, timeout=600)


def training_rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("perf/") or k == "perf/skipped_steps"} for r in rows]


def assert_preempted(stopped: subprocess.CompletedProcess, run_dir: Path, step: int | None = None) -> int:
    """The stopped run exited 143 without a traceback, saved a checkpoint (of `step` when given) and
    ended on the resume line naming it; returns the checkpoint's step."""
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stderr and "KeyboardInterrupt" not in stopped.stderr, stopped.stderr
    checkpoint = latest_checkpoint(run_dir / "checkpoints")
    assert checkpoint is not None
    saved = int(checkpoint.name.removeprefix("step_"))
    assert step is None or saved == step
    last = [ln for ln in stopped.stderr.splitlines() if ln.strip()][-1]
    assert last == (f"mathrl: stopped by SIGTERM after step {saved}; rerun the same command to resume from step "
                    f"{saved} ({checkpoint})"), last
    return saved


@pytest.mark.slow
def test_sigterm_saves_the_step_exits_143_and_the_rerun_matches_an_uninterrupted_run(tmp_path):
    done = run(tmp_path, tmp_path / "uninterrupted")
    assert done.returncode == 0, done.stderr[-2000:]
    run_dir = tmp_path / "preempted"
    stopped = run(tmp_path, run_dir, term_step=2)
    assert_preempted(stopped, run_dir, step=2)  # step 2 ended, then was saved
    resumed = run(tmp_path, run_dir)  # the same command again
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert training_rows(run_dir) == training_rows(tmp_path / "uninterrupted")


def test_save_every_minutes_is_due_once_that_many_minutes_have_passed():
    clock = 1000.0  # seconds, as time.monotonic gives them
    assert not time_save_due(0, last_save=0.0, now=clock)  # 0: off
    assert not time_save_due(30, last_save=clock, now=clock + 29 * 60)
    assert time_save_due(30, last_save=clock, now=clock + 30 * 60)
    assert time_save_due(0.5, last_save=clock, now=clock + 31)


def test_one_process_agrees_with_itself():
    assert agree(True, False, Ranks()) == (True, False)
    assert agree(False, True, Ranks()) == (False, True)


def test_sigterm_inside_at_once_raises_there_and_a_recorded_one_raises_on_entry():
    with StopSignal() as stop:
        with pytest.raises(Terminated) as raised:
            with stop.at_once():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)  # never reached in full: the handler raises at the next bytecode
        assert raised.value.exit_code == 143 and stop.requested
    with StopSignal() as stop:
        os.kill(os.getpid(), signal.SIGTERM)  # outside at_once: recorded only
        assert stop.requested
        with pytest.raises(Terminated):
            with stop.at_once():
                pass


def test_sigterm_sets_the_flag_and_the_handler_is_restored():
    before = signal.getsignal(signal.SIGTERM)
    with StopSignal() as stop:
        assert not stop.requested
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # a second SIGTERM ends the process
    assert signal.getsignal(signal.SIGTERM) == before


def test_preempted_is_an_interrupt_that_exits_143():
    e = Preempted(3)
    assert isinstance(e, KeyboardInterrupt) and e.exit_code == 143 and not e.reported_by_rank_0
    assert Preempted(3, main=False).reported_by_rank_0


def test_the_launcher_passes_sigterm_on_to_torchrun():
    from mathrl.train.launch import forward_sigterm

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with forward_sigterm(child):
            os.kill(os.getpid(), signal.SIGTERM)  # this process lives on; the child gets it
            assert child.wait(timeout=30) == -signal.SIGTERM
    finally:
        if child.poll() is None:
            child.kill()


TORCHRUN_TRACEBACK = """Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/x/torch/distributed/elastic/multiprocessing/api.py", line 86, in _terminate_process_handler
    raise SignalException(f"Process {os.getpid()} got signal: {sigval}", sigval=sigval)
torch.distributed.elastic.multiprocessing.api.SignalException: Process 12021 got signal: 15
"""


def test_torchruns_own_signal_traceback_is_dropped_and_every_other_line_kept():
    from mathrl.train.launch import SignalTraceback

    other = 'Traceback (most recent call last):\n  File "a.py", line 1, in <module>\nValueError: a rank failed\n'
    lines = ["W1204 Received 15 death signal, shutting down workers\n", "mathrl: stopped by SIGTERM after step 3\n",
             *other.splitlines(keepends=True), *TORCHRUN_TRACEBACK.splitlines(keepends=True), "after\n"]
    filt = SignalTraceback()
    out = [o for line in lines for o in filt.feed(line)] + filt.flush()
    assert "".join(out) == "".join(lines[:2]) + other + "after\n"
    assert filt.dropped
    cut = SignalTraceback()  # a traceback cut off by the end of the stream is printed, not lost
    assert [o for line in other.splitlines(keepends=True)[:2] for o in cut.feed(line)] + cut.flush() == \
        other.splitlines(keepends=True)[:2] and not cut.dropped


def launch_two_ranks(tmp_path: Path, run_dir: Path, *, term_after: int | None = None) -> subprocess.CompletedProcess:
    """`mathrl train --nproc 2`; with term_after, SIGTERM to the launcher once step `term_after` is logged
    (a scheduler stops the job from outside, at whatever point the ranks have reached)."""
    import time

    env = {**os.environ, "MATHRL_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "mathrl.cli", *ARGS, "train.steps=6", "--nproc", "2", "--run-dir", str(run_dir)]
    job = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while term_after is not None and job.poll() is None:
        logged = run_dir / "metrics.jsonl"
        if logged.exists() and any(r.get("step", 0) >= term_after and "reward/mean" in r
                                   for r in map(json.loads, logged.read_text().splitlines())):
            job.send_signal(signal.SIGTERM)
            break
        time.sleep(0.05)
    out, err = job.communicate(timeout=600)
    return subprocess.CompletedProcess(argv, job.returncode, out, err)


@pytest.mark.slow
def test_sigterm_at_two_ranks_saves_exits_143_and_the_rerun_matches_an_uninterrupted_run(tmp_path):
    done = launch_two_ranks(tmp_path, tmp_path / "uninterrupted")
    assert done.returncode == 0, done.stderr[-2000:]
    run_dir = tmp_path / "preempted"
    stopped = launch_two_ranks(tmp_path, run_dir, term_after=2)
    if stopped.returncode == 0:  # the run ended before the signal reached it: nothing to check
        pytest.skip("the run finished before SIGTERM arrived")
    assert_preempted(stopped, run_dir)
    resumed = launch_two_ranks(tmp_path, run_dir)  # the same command again
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert training_rows(run_dir) == training_rows(tmp_path / "uninterrupted")


# ---- SIGTERM before the first step: it stops where it is, nothing is saved, the next run starts over ----
SMALL_BASE = ["base.steps=300", "base.max_digits=1", "base.hidden_size=32", "base.intermediate_size=64",
              "base.num_layers=2", "base.num_heads=2", "base.num_kv_heads=1"]
# the start's evaluation lasts seconds (64 problems x 32 samples), long enough to be found running
EVAL_ARGS = [*SMALL_BASE, "data.arith.max_digits=2", "data.eval_size=64", "eval.n=32", "train.steps=1",
             "rollout.prompts_per_step=4", "rollout.n=4", "train.mini_batch_size=8", "reward.num_workers=0"]
NOTHING_SAVED = "mathrl: stopped by SIGTERM before the first step; nothing was saved: rerun the same command to start over"


def term_at(tmp_path: Path, argv: list[str], marker: str, cache: Path, *, on_stderr: bool = False) -> tuple[int, list[str], list[str]]:
    """`mathrl <argv>` as a subprocess, SIGTERM as soon as a line of its output (`on_stderr`: of its
    stderr, where `mathrl base` reports) starts with `marker` (the phase it names has begun); (exit
    code, output lines, stderr lines). Output that never shows the marker fails the test."""
    env = {**os.environ, "MATHRL_CACHE": str(cache)}
    other = tmp_path / f"other-{len(list(tmp_path.glob('other-*')))}"
    with other.open("w") as rest:
        job = subprocess.Popen([sys.executable, "-m", "mathrl.cli", *argv], env=env, text=True,
                               stdout=rest if on_stderr else subprocess.PIPE, stderr=subprocess.PIPE if on_stderr else rest)
        watched, sent = [], False
        hung = threading.Timer(240, job.kill)  # a run that never exits (a child it waits for) fails, not hangs
        hung.start()
        try:
            for line in job.stderr if on_stderr else job.stdout:
                watched.append(line.rstrip("\n"))
                if not sent and line.startswith(marker):
                    job.send_signal(signal.SIGTERM)
                    sent = True
            code = job.wait(timeout=60)
        finally:
            hung.cancel()
    assert sent, f"{marker!r} never appeared:\n" + "\n".join(watched[-20:])
    unwatched = other.read_text().splitlines()
    return (code, unwatched, watched) if on_stderr else (code, watched, unwatched)


def mathrl(argv: list[str], cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "MATHRL_CACHE": str(cache)}
    return subprocess.run([sys.executable, "-m", "mathrl.cli", *argv], env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def small_base_cache(tmp_path_factory) -> Path:
    """A MATHRL_CACHE holding SMALL_BASE's base model, built once for the tests that stop a run after the build."""
    cache = tmp_path_factory.mktemp("cache")
    built = mathrl(["base", *SMALL_BASE], cache)
    assert built.returncode == 0, built.stderr[-3000:]
    return cache


def assert_stopped_before_the_first_step(code: int, out: list[str], err: list[str], run_dir: Path) -> None:
    """Exit 143 at once, one line on stderr saying that nothing was saved; no step, no checkpoint."""
    text = "\n".join(err)
    assert code == 143, text[-3000:]
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text
    assert [ln for ln in err if ln.strip()][-1] == NOTHING_SAVED
    assert not any(ln.startswith("RL step") for ln in out)
    assert latest_checkpoint(run_dir / "checkpoints") is None
    assert RunDir(run_dir).trained_nothing()


@pytest.mark.slow
def test_sigterm_during_the_base_models_build_leaves_no_half_written_cache_entry(tmp_path):
    from mathrl.model.tiny import is_built

    cache, run_dir = tmp_path / "cache", tmp_path / "run"
    argv = ["train", *EVAL_ARGS, "data.eval_size=4", "eval.n=2", "--run-dir", str(run_dir)]
    code, out, err = term_at(tmp_path, argv, "pretraining ", cache)  # the build's training loop is running
    assert_stopped_before_the_first_step(code, out, err, run_dir)
    # no entry, no temporary build directory, no lock file: cache.build_once's cleanup ran
    assert [p.relative_to(cache).as_posix() for p in cache.rglob("*")] == ["base"]
    again = mathrl(argv, cache)  # the same command builds the base model and trains
    assert again.returncode == 0, again.stderr[-3000:]
    assert "building the tiny base model" in again.stdout and "RL step 1/1" in again.stdout
    entries = [p for p in (cache / "base").iterdir()]
    assert len(entries) == 1 and is_built(entries[0]), entries


@pytest.mark.slow
def test_sigterm_stops_mathrl_base_during_the_build_and_caches_nothing(tmp_path):
    cache = tmp_path / "cache"
    code, out, err = term_at(tmp_path, ["base", *SMALL_BASE], "pretraining ", cache, on_stderr=True)
    assert code == 143, "\n".join(err)
    assert err[-1] == "mathrl: stopped by SIGTERM; mathrl base did not finish, nothing was cached (the next use builds the base model)"
    assert out == []  # no path printed
    assert [p.relative_to(cache).as_posix() for p in cache.rglob("*")] == ["base"]


@pytest.mark.slow
def test_sigterm_during_the_starts_evaluation_stops_it_and_the_same_command_starts_over(tmp_path, small_base_cache):
    cache, run_dir = small_base_cache, tmp_path / "run"
    argv = ["train", *EVAL_ARGS, "--run-dir", str(run_dir)]
    code, out, err = term_at(tmp_path, argv, "evaluating the base model", cache)
    assert_stopped_before_the_first_step(code, out, err, run_dir)
    again = mathrl(argv, cache)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "holds no trained step: starting over" in again.stdout and "RL step 1/1" in again.stdout


@pytest.mark.slow
def test_sigterm_while_the_generators_start_stops_the_run_and_ends_them(tmp_path, small_base_cache):
    """rollout.max_staleness=1: the start's evaluation (short here) and the wait for the generator's
    first batch (its model loading and first version) save nothing; SIGTERM ends either, and the
    generator with them."""
    cache, run_dir = small_base_cache, tmp_path / "run"
    argv = ["train", *EVAL_ARGS, "data.eval_size=4", "eval.n=2", "train.steps=2", "rollout.max_staleness=1",
            "--run-dir", str(run_dir)]
    code, out, err = term_at(tmp_path, argv, "generating while training", cache)
    assert_stopped_before_the_first_step(code, out, err, run_dir)
