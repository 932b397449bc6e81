"""The run directory: the one place that knows its layout, for `train` (writes) and `report`, `eval`,
`inspect` (read). What each file holds: docs/guide.md, "The run directory".

    <run_dir>/config.yaml, config.previous.yaml, config_history.jsonl, parent.json   the config and its changes
              metrics.jsonl, evals.jsonl, rollouts.jsonl, positions.jsonl             per step (docs/metrics.md)
              checkpoints/step_<N>/ (train/checkpoint.py), final/, summary.json, eval/

    run = RunDir("runs/x")
    run.metrics(), run.evals(), run.summary(), run.rollouts(step=3)

One process writes a run directory: `open_run_dir` takes an exclusive lock on `<run_dir>/.lock` (rank 0
under torchrun) and keeps it for the life of the process, or until the run ends; a second writer stops
before it writes anything, naming the holder's PID. Readers (`report`, `eval`, `inspect`) take no lock:
they read a run being written. Default names (`new_run_dir`) are the local time, with `-2`, `-3`, ... for
runs started in the same second.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import time
from pathlib import Path
from typing import Any, Iterator

from rich.console import Console

from mathrl.cache import FileLock, holder_pid, locks_unsupported

_STEP_DIR = re.compile(r"^step_(\d+)$")


class RunComplete(Exception):
    """The run directory already holds a finished run."""


class FinishedRunConfigChanged(ValueError):
    """The command of a finished run was rerun with a different config: it would train nothing."""


class RunDirBusy(RuntimeError):
    """Another process is writing the run directory."""


LOCK_NAME = ".lock"
HISTORY_NAME = "config_history.jsonl"
RUNS_ROOT = Path("runs")  # where runs go without --run-dir
_HELD: dict[Path, FileLock] = {}  # run directories this process writes, by absolute path


def lock_run_dir(path: str | Path) -> FileLock | None:
    """Take the writer's lock of the run directory `path` (created if missing) for this process; one
    this process holds already is returned as it is. Raises RunDirBusy, naming the holder's PID, when
    another process holds it; None when its file system has no file locks. Kept until
    `release_run_dir` or the end of the process."""
    key = Path(path).absolute()
    if key in _HELD:
        return _HELD[key]
    lock = FileLock(key / LOCK_NAME)
    try:
        if not lock.acquire(block=False):
            raise RunDirBusy(busy_message(Path(path), holder_pid(lock.path)))
    except OSError as e:
        if not locks_unsupported(e):
            raise
        return None
    _HELD[key] = lock
    return lock


def release_run_dir(path: str | Path) -> None:
    """Drop this process's writer lock of `path` (nothing when it holds none)."""
    lock = _HELD.pop(Path(path).absolute(), None)
    if lock is not None:
        lock.release()


def busy_message(path: Path, pid: int | None) -> str:
    """The one line of a second writer of the run directory `path` (`pid`: the holder's, when known)."""
    who = f"another mathrl process (pid {pid})" if pid else "another mathrl process"
    return f"run directory {path} is in use by {who}; wait for it or choose another --run-dir"


def run_dir_name(now: time.struct_time, n: int = 1) -> str:
    """The default name of a run started at local time `now`: `20250131-142501`; the `n`-th run
    started in the same second gets `-<n>` (`20250131-142501-2`), which sorts after it."""
    stamp = time.strftime("%Y%m%d-%H%M%S", now)
    return stamp if n == 1 else f"{stamp}-{n}"


def new_run_dir(root: str | Path = RUNS_ROOT, *, now: time.struct_time | None = None) -> Path:
    """A new, empty run directory under `root`, named by `run_dir_name`: created here (mkdir fails for
    a name that exists), so two runs started in the same second never share one."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    now = now or time.localtime()
    for n in itertools.count(1):
        path = root / run_dir_name(now, n)
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise AssertionError("unreachable")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a jsonl file ([] when it does not exist). A half-written last line (a run
    that is still writing, or was killed mid-write) is skipped; a bad line elsewhere is an error."""
    path = Path(path)
    if not path.exists():
        return []
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    rows = []
    for i, line in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break
            raise ValueError(f"{path}: line {i + 1} is not valid JSON") from None
    return rows


class RunDir:
    """Paths and readers/writers of one run directory. Creating one touches nothing on disk."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.config_path = self.path / "config.yaml"
        self.metrics_path = self.path / "metrics.jsonl"
        self.evals_path = self.path / "evals.jsonl"
        self.rollouts_path = self.path / "rollouts.jsonl"
        self.positions_path = self.path / "positions.jsonl"
        self.summary_path = self.path / "summary.json"
        self.parent_path = self.path / "parent.json"
        self.history_path = self.path / HISTORY_NAME
        self.checkpoints = self.path / "checkpoints"
        self.final = self.path / "final"
        self.sweep_path = self.path / "eval" / "results.json"

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    # ---- what is there ---------------------------------------------------------------------------
    def is_run(self) -> bool:
        """True when the directory holds a run's log (metrics, evaluations or a summary)."""
        return any(p.exists() for p in (self.metrics_path, self.evals_path, self.summary_path))

    def is_finished(self) -> bool:
        return self.summary_path.exists() and self.final.exists()

    def last_logged_step(self) -> int | None:
        """The highest step in metrics.jsonl (None: no row). Read leniently: a line cut by a kill or a
        Ctrl-C is skipped. Step 0 rows are the start's evaluation (and critic pretraining): no RL step."""
        if not self.metrics_path.exists():
            return None
        last = None
        for line in self.metrics_path.read_text(errors="replace").splitlines():
            try:
                step = int(json.loads(line)["step"])
            except (ValueError, KeyError, TypeError):
                continue
            last = step if last is None else max(last, step)
        return last

    def trained_nothing(self) -> bool:
        """No RL step was logged and no checkpoint completed: starting over loses nothing but the
        start's evaluation, which the new run makes again."""
        return (self.last_logged_step() or 0) < 1 and latest_checkpoint(self.checkpoints) is None

    def config_text(self) -> str | None:
        return self.config_path.read_text() if self.config_path.exists() else None

    def metrics(self) -> list[dict[str, Any]]:
        return read_jsonl(self.metrics_path)

    def evals(self) -> list[dict[str, Any]]:
        return read_jsonl(self.evals_path)

    def rollouts(self, *, step: int | None = None) -> Iterator[dict[str, Any]]:
        """rollouts.jsonl records in order (only those of `step` if given), read lazily."""
        if not self.rollouts_path.exists():
            return
        with self.rollouts_path.open() as f:
            for line in f:
                if line.strip():
                    record = json.loads(line)
                    if step is None or record.get("step") == step:
                        yield record

    def history(self) -> list[dict[str, Any]]:
        """config_history.jsonl's rows, oldest first ([]: the run kept its config from its first step)."""
        return read_jsonl(self.history_path)

    def summary(self) -> dict[str, Any] | None:
        return json.loads(self.summary_path.read_text()) if self.summary_path.exists() else None

    def sweep_results(self) -> dict[str, Any] | None:
        """`mathrl eval`'s results.json for this run (its default output directory), None without one or
        while its first write is under way (the file is rewritten after each checkpoint)."""
        try:
            return json.loads(self.sweep_path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def model_dirs(self) -> list[tuple[str, Path, int | None, bool]]:
        """(name, directory, step or None, is_final) of every model the run saved: checkpoints/step_*/
        by name, then final/. The step is trainer_state.json's "step"; without that file, the number
        in step_<N>, or None for final/."""
        found = []
        candidates = [d for d in sorted(self.checkpoints.glob("step_*")) if _STEP_DIR.fullmatch(d.name)]
        for d in candidates + [self.final]:
            if not (d / "config.json").exists():
                continue
            state = d / "trainer_state.json"
            step = None
            if state.exists():
                step = json.loads(state.read_text()).get("step")
            elif d.name != "final":
                step = int(_STEP_DIR.fullmatch(d.name).group(1))
            found.append((d.name, d, step, d.name == "final"))
        return found

    # ---- writing (rank 0 of a training run only) ------------------------------------------------
    def append_evals(self, step: int, results: dict) -> None:
        """One evals.jsonl row per eval set (`results`: set name -> EvalResult), first 5 samples kept;
        fields that are None (e.g. no reward components) are left out."""
        with self.evals_path.open("a") as f:
            for name, r in results.items():
                row = {"step": step, "set": name, **{k: v for k, v in r.__dict__.items() if k != "samples" and v is not None},
                       "samples": r.samples[:5]}
                f.write(json.dumps(row) + "\n")

    def append_rollouts(self, records: list[dict[str, Any]]) -> None:
        with self.rollouts_path.open("a") as f:
            for rec in records:
                f.write(json.dumps(rec) + "\n")

    def append_positions(self, record: dict[str, Any]) -> None:
        with self.positions_path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    def positions(self) -> list[dict[str, Any]]:
        """positions.jsonl rows: {"step", "value", "advantage", "count"}, lists over response positions."""
        return read_jsonl(self.positions_path)

    def append_history(self, step: int, changes: dict[str, tuple[Any, Any]], *, extended: bool) -> None:
        """Record that `changes` ({key: (old, new)}) apply from step `step` on (config_history.jsonl)."""
        row = {"step": step, "changes": {k: list(v) for k, v in changes.items()}, "extended": extended,
               "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        with self.history_path.open("a") as f:
            f.write(json.dumps(row) + "\n")

    def write_summary(self, summary: dict[str, Any]) -> None:
        self.summary_path.write_text(json.dumps(summary, indent=2))

    def write_parent(self, parent: Path, step: int) -> None:
        """Record the checkpoint a `train.init_from` run continues (and its run's config)."""
        parent_run = RunDir(parent.parent.parent)
        self.parent_path.write_text(json.dumps({
            "checkpoint": str(parent.resolve()), "step": step, "run_dir": str(parent_run.path.resolve()),
            "config": parent_run.config_text(),
        }, indent=2))

    def truncate_after(self, step: int) -> None:
        """Drop the log rows a killed run wrote after its checkpoint at `step`."""
        for path in (self.metrics_path, self.rollouts_path, self.evals_path, self.positions_path):
            truncate_jsonl(path, step)


def processes_note(processes: list[dict[str, Any]] | None) -> str:
    """How a run was spread over processes, from summary.json's "processes" (each {"first_step",
    "last_step", "wall_seconds"}): "" for a run one process ran, else e.g. "resumed 2x: steps 1-20
    13.0 min, 21-40 25.3 min, 41-50 13.7 min"."""
    if not processes or len(processes) < 2:
        return ""
    spans = ", ".join(f"{p['first_step']}-{p['last_step']} {p['wall_seconds'] / 60:.1f} min" for p in processes)
    return f"resumed {len(processes) - 1}x: steps {spans}"


def truncate_jsonl(path: Path, max_step: int) -> None:
    """Drop rows logged after `max_step` (by a run that was killed after its last checkpoint)."""
    path = Path(path)
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line).get("step", 0) <= max_step]
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    os.replace(tmp, path)


def complete_checkpoints(checkpoints_dir: Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint, oldest first; temporary or partial ones are ignored."""
    out = []
    if not Path(checkpoints_dir).is_dir():
        return out
    for p in Path(checkpoints_dir).iterdir():
        m = _STEP_DIR.match(p.name)
        if m and (p / "trainer_state.json").exists() and (p / "trainer_state.pt").exists():
            out.append((int(m.group(1)), p))
    return sorted(out)


def latest_checkpoint(checkpoints_dir: Path) -> Path | None:
    done = complete_checkpoints(checkpoints_dir)
    return done[-1][1] if done else None


def open_run_dir(path: str | Path | None, *, config_text: str, resume: bool, console: Console,
                 steps_key: str = "train.steps") -> tuple[RunDir, Path | None]:
    """(run directory, checkpoint to resume from or None) for a training run. Never overwrites a run
    silently: an existing run is resumed from its last complete checkpoint; with resume=False
    (`--no-resume`) its files are moved aside to `<run_dir>.replaced-<timestamp>` and a new run starts.
    `config_text` (the resolved config as YAML) is written to config.yaml. The directory is locked for
    this process first (`lock_run_dir`): a second writer stops here, before anything is written."""
    run = RunDir(path or new_run_dir())
    if lock_run_dir(run.path) is None:
        console.print(f"[yellow]warning:[/yellow] the file system of {run.path} has no file locks: nothing stops "
                      "another process from writing this run directory at the same time")
    try:
        return _open_locked(run, config_text=config_text, resume=resume, console=console, steps_key=steps_key)
    except BaseException:
        release_run_dir(run.path)
        raise


def _config_diff(old: str, new: str) -> dict[str, tuple[Any, Any]]:
    """`config_diff` of two config.yaml texts ({} when the old one is missing or they differ in
    formatting or comments only)."""
    if not old or old == new:
        return {}
    import yaml

    return config_diff(yaml.safe_load(old) or {}, yaml.safe_load(new) or {})


def config_diff(old: dict, new: dict, prefix: str = "") -> dict[str, tuple[Any, Any]]:
    """{dotted key: (old value, new value)} for every leaf that differs between two config trees (e.g.
    two config.yaml files loaded with yaml.safe_load), keys in the new tree's order; a key only one
    side has counts as a change, its missing side "<absent>"."""
    changes: dict[str, tuple[Any, Any]] = {}
    for key in list(new) + [k for k in old if k not in new]:
        a, b = old.get(key, "<absent>"), new.get(key, "<absent>")
        if isinstance(a, dict) and isinstance(b, dict):
            changes.update(config_diff(a, b, f"{prefix}{key}."))
        elif a != b:
            changes[f"{prefix}{key}"] = (a, b)
    return changes


def config_changes(old: dict, new: dict, prefix: str = "") -> list[str]:
    """`key: old -> new` for every leaf that differs between two config trees (`config_diff`)."""
    return describe_changes(config_diff(old, new, prefix))


def describe_changes(diff: dict[str, tuple[Any, Any]]) -> list[str]:
    return [f"{key}: {a!r} -> {b!r}" for key, (a, b) in diff.items()]


def _check_extension(run: RunDir, changed: dict[str, tuple[Any, Any]], last: list[tuple[int, Path]], steps_key: str) -> None:
    """Raise FinishedRunConfigChanged unless the finished `run` may be extended in place: a longer
    `steps_key` (train.steps) is its only change and its last complete checkpoint (`last`: complete_checkpoints) is
    of its last step, so the optimizer, schedule, data position and RNG go on from there."""
    steps = (run.summary() or {}).get("steps", "?")
    old_steps, new_steps = changed.get(steps_key, (None, None))
    longer = isinstance(old_steps, int) and isinstance(new_steps, int) and new_steps > old_steps
    if set(changed) == {steps_key} and longer and last and last[-1][0] == old_steps:
        return
    if set(changed) == {steps_key} and longer:
        why = (f"its last complete checkpoint is step {last[-1][0]}, not its last step {old_steps}" if last else
               "it kept no resumable checkpoint (save_every=0)")
        raise FinishedRunConfigChanged(
            f"run directory {run.path} holds a finished run ({steps} steps) that cannot be extended to {new_steps}: {why}; "
            f"nothing was trained. Train its weights further in a new directory with train.init_from={run.final} "
            "train.init_from_mode=restart (a fresh optimizer and schedule)")
    source = (f"train.init_from={last[-1][1]}" if last else
              f"train.init_from={run.final} train.init_from_mode=restart")
    raise FinishedRunConfigChanged(
        f"run directory {run.path} holds a finished run ({steps} steps) whose config differs "
        f"({'; '.join(describe_changes(changed))}); nothing was trained. Only a longer {steps_key} extends a finished "
        "run in place. Choose another --run-dir for the new config, --no-resume to start over in this one (the old "
        f"run is kept aside), or {source} in a new directory to train it further")


def _open_locked(run: RunDir, *, config_text: str, resume: bool, console: Console,
                 steps_key: str) -> tuple[RunDir, Path | None]:
    """open_run_dir once this process holds the run directory's lock."""
    has_run = run.metrics_path.exists()
    if has_run and not resume:
        aside = run.path.with_name(f"{run.path.name}.replaced-{time.strftime('%Y%m%d-%H%M%S')}")
        run.path.rename(aside)  # the lock moves with it: drop it, then lock the new directory
        (aside / LOCK_NAME).unlink(missing_ok=True)
        release_run_dir(run.path)
        lock_run_dir(run.path)
        console.print(f"--no-resume: the previous run was moved to {aside}")
        has_run = False
    checkpoint = None
    if has_run and not run.is_finished() and run.trained_nothing():
        # Stopped before its first step (Ctrl-C during the start's evaluation): the rerun starts over
        # in place; the rows of the start's evaluation are made again, so the old ones go.
        console.print(f"{run.path} holds no trained step: starting over")
        for log in (run.metrics_path, run.evals_path, run.rollouts_path):
            log.unlink(missing_ok=True)
        has_run = False
    if has_run:
        changed = _config_diff(run.config_text() or "", config_text)
        finished = run.is_finished()
        if finished and not changed:
            raise RunComplete(f"run directory {run.path} holds a finished run; use --no-resume to start over "
                              "(the old run is kept aside) or choose another --run-dir")
        last = complete_checkpoints(run.checkpoints)
        if finished:
            _check_extension(run, changed, last, steps_key)
        elif not last:
            raise FileExistsError(
                f"run directory {run.path} already holds a run, with no complete checkpoint to resume from; "
                "use --no-resume to start over (the old run is kept aside) or choose another --run-dir"
            )
        step, checkpoint = last[-1]
        old = run.config_text() or ""
        if old and old != config_text:
            from rich.markup import escape

            shown = escape("; ".join(describe_changes(changed)))
            if finished:  # the run is no longer finished: a kill from here on resumes, like any run
                console.print(f"[bold]extending[/bold] the finished run {run.path} from step {step} to "
                              f"{changed[steps_key][1]} ({shown}; recorded in {HISTORY_NAME})")
                run.summary_path.unlink()
            else:
                console.print(f"[yellow]warning:[/yellow] the config differs from the one {run.path} was started with "
                              f"({shown or 'formatting only'}); resuming with the new one (the old one is "
                              "kept as config.previous.yaml)")
            (run.path / "config.previous.yaml").write_text(old)
            if changed:
                run.append_history(step + 1, changed, extended=finished)
    run.path.mkdir(parents=True, exist_ok=True)
    run.config_path.write_text(config_text)
    return run, checkpoint
