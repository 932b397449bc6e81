"""One run directory, one writer (src/mathrl/run_dir.py): the writer's lock, what a second writer sees,
what a killed holder leaves, and default names that never collide.

A second `mathrl train` on a locked directory runs in a child process: it must stop in one line before
any model work (a few seconds: the imports). The other cases are library calls.

Run: python -m pytest tests/base/test_run_dir_lock.py -q
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from rich.console import Console

from mathrl.cache import FileLock, holder_pid
from mathrl.run_dir import (
    LOCK_NAME,
    RunComplete,
    RunDirBusy,
    lock_run_dir,
    new_run_dir,
    open_run_dir,
    release_run_dir,
    run_dir_name,
)

SRC = Path(__file__).resolve().parents[2] / "src"
TINY = ["base.steps=2", "base.hidden_size=16", "base.intermediate_size=32", "base.num_layers=1", "base.num_heads=2",
        "base.num_kv_heads=1", "train.steps=6", "data.eval_size=4"]
NOW = time.strptime("20250131-142501", "%Y%m%d-%H%M%S")


def _files(path: Path) -> dict[str, bytes]:
    """Every file under `path` but the lock file, with its bytes."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file() and p.name != LOCK_NAME}


def _quiet() -> Console:
    return Console(file=io.StringIO(), width=1000)


@pytest.fixture
def started_run(tmp_path) -> Path:
    """A run directory holding a run that was stopped after step 2 (its checkpoint resumes it)."""
    run = tmp_path / "run"
    (run / "checkpoints" / "step_000002").mkdir(parents=True)
    for name in ("trainer_state.json", "trainer_state.pt"):
        (run / "checkpoints" / "step_000002" / name).write_text('{"step": 2}')
    (run / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    (run / "config.yaml").write_text("seed: 0\n")
    return run


@pytest.mark.slow
def test_a_second_train_on_a_run_directory_in_use_stops_in_one_line(started_run, tmp_path):
    # Bug story: two `mathrl train ... --run-dir D` started a second apart both wrote D's metrics.jsonl,
    # checkpoints and final/, and both exited 0: D held 4 step rows instead of 6.
    before = _files(started_run)
    lock_run_dir(started_run)
    try:
        env = {**os.environ, "MATHRL_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
        t0 = time.time()
        proc = subprocess.run([sys.executable, "-m", "mathrl.cli", "train", *TINY, "--run-dir", str(started_run)],
                              env=env, capture_output=True, text=True, timeout=300)
        elapsed = time.time() - t0
    finally:
        release_run_dir(started_run)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert lines == [f"mathrl: error: run directory {started_run} is in use by another mathrl process (pid {os.getpid()}); "
                     "wait for it or choose another --run-dir"], proc.stderr
    assert _files(started_run) == before  # nothing written, nothing resumed
    assert not (tmp_path / "cache").exists(), f"the second writer built a model ({elapsed:.0f} s)"


def test_the_lock_goes_with_a_holder_that_is_killed(tmp_path):
    run = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom mathrl.run_dir import lock_run_dir\nlock_run_dir(sys.argv[1])\n"
         "print('locked', flush=True)\ntime.sleep(120)\n", str(run)],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(SRC)})
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunDirBusy, match=rf"in use by another mathrl process \(pid {holder.pid}\)"):
            lock_run_dir(run)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    assert holder.returncode == -signal.SIGKILL
    assert (run / LOCK_NAME).exists()  # a killed holder leaves its file, not its lock
    lock_run_dir(run)
    try:
        assert holder_pid(run / LOCK_NAME) == os.getpid()
    finally:
        release_run_dir(run)
    assert not (run / LOCK_NAME).exists()


def test_open_run_dir_holds_the_lock_and_refusing_releases_it(started_run):
    _, checkpoint = open_run_dir(started_run, config_text="seed: 0\n", resume=True, console=_quiet())
    assert checkpoint == started_run / "checkpoints" / "step_000002"
    try:
        assert not FileLock(started_run / LOCK_NAME).acquire(block=False)  # another writer is kept out
        open_run_dir(started_run, config_text="seed: 0\n", resume=True, console=_quiet())  # this process may reopen it
    finally:
        release_run_dir(started_run)
    (started_run / "final").mkdir()
    (started_run / "summary.json").write_text("{}")
    with pytest.raises(RunComplete):
        open_run_dir(started_run, config_text="seed: 0\n", resume=True, console=_quiet())
    assert not (started_run / LOCK_NAME).exists()  # a refused open holds nothing and leaves no file


def test_no_resume_locks_the_new_directory_not_the_one_moved_aside(started_run):
    run, checkpoint = open_run_dir(started_run, config_text="seed: 1\n", resume=False, console=_quiet())
    try:
        assert checkpoint is None and run.config_text() == "seed: 1\n"
        (aside,) = started_run.parent.glob("run.replaced-*")
        assert not (aside / LOCK_NAME).exists() and (aside / "metrics.jsonl").exists()
        assert not FileLock(started_run / LOCK_NAME).acquire(block=False)
    finally:
        release_run_dir(started_run)


def test_readers_take_no_lock(started_run, tmp_path):
    # `mathrl report` (and eval, inspect) read a run that is being written: the writer's lock does not stop them.
    from mathrl.analysis.report import build_report

    writer = FileLock(started_run / LOCK_NAME)
    assert writer.acquire(block=False)
    try:
        assert build_report([started_run], tmp_path / "r.html", pngs=False).exists()
    finally:
        writer.release()
    for room in ("analysis", "evaluation"):  # only training opens a run directory for writing
        for path in (SRC / "mathrl" / room).rglob("*.py"):
            assert "open_run_dir" not in path.read_text() and "lock_run_dir" not in path.read_text(), path


def test_default_names_of_runs_started_in_the_same_second_differ(tmp_path):
    # Bug story: the default run directory was runs/%Y%m%d-%H%M%S, and an existing run there is resumed:
    # two runs started in the same second wrote one directory.
    made = [new_run_dir(tmp_path, now=NOW) for _ in range(3)]
    assert [p.name for p in made] == ["20250131-142501", "20250131-142501-2", "20250131-142501-3"]
    assert all(p.is_dir() and not any(p.iterdir()) for p in made)
    later = run_dir_name(time.strptime("20250131-142502", "%Y%m%d-%H%M%S"))
    assert sorted([later, *(p.name for p in made)]) == [*(p.name for p in made), later]


def test_default_names_made_at_once_differ(tmp_path):
    made, start = [], threading.Barrier(4)

    def make() -> None:
        start.wait()
        made.append(new_run_dir(tmp_path, now=NOW))

    threads = [threading.Thread(target=make) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(made) == len(set(made)) == 4


def test_a_file_system_without_locks_gets_a_warning_not_an_error(started_run, monkeypatch):
    import errno

    import mathrl.cache

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(mathrl.cache.fcntl, "flock", no_locks)
    console = _quiet()
    _, checkpoint = open_run_dir(started_run, config_text="seed: 0\n", resume=True, console=console)
    assert checkpoint is not None and "has no file locks" in console.file.getvalue()
    release_run_dir(started_run)
