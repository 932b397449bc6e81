"""What the terminal shows: a progress bar with the key metrics of each step, and the final table.

On a terminal the bars redraw in place. When the output is not a terminal (piped, `nohup`, `tee`, a
scheduler's log file) a redrawn bar would show nothing until the run ends, so each bar prints plain
log lines instead, flushed as they are written: one per RL step, and one at least every
`PlainProgress.every_s` seconds for the smaller units of other bars. Consoles from `make_console`
never cut a line or a table at 80 columns when the output is not a terminal.

    console = make_console()                 # stdout; make_console(stderr=True) for status lines
    with make_progress(console, "eval") as bar:
        task = bar.add_task("eval", total=12, info="")
        bar.update(task, info="step_10 | arith | seed 0"); bar.advance(task)
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Column, Table

from mathrl.run_dir import processes_note

PIPE_WIDTH = 1000  # columns of a console whose output is not a terminal: wide enough never to cut a table


def make_console(*, stderr: bool = False) -> Console:
    """A Console on stdout (or stderr); when that stream is not a terminal, lines and tables keep their
    full width instead of being cut or wrapped at 80 columns."""
    console = Console(stderr=stderr)
    if not console.is_terminal:
        console = Console(stderr=stderr, width=PIPE_WIDTH, soft_wrap=True)
    return console


def plural(count: int, noun: str) -> str:
    """`1 sample`, `2 samples`: `count` and `noun`, with an s unless it is one."""
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _clock(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class PlainProgress:
    """The subset of `rich.progress.Progress` the bars here use, printing plain lines: one whenever a
    task advances and `every_s` seconds have passed since the last line (always for the first and the
    last unit), each with done/total, the task's info, elapsed time and the remaining-time estimate."""

    def __init__(self, console: Console, label: str, *, every_s: float = 30.0):
        self.console, self.label, self.every_s = console, label, every_s
        self._tasks: dict[int, dict] = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def add_task(self, description: str, *, total: int, completed: int = 0, **fields) -> int:
        task_id = len(self._tasks)
        self._tasks[task_id] = {"total": total, "completed": completed, "start_done": completed,
                                "t0": time.monotonic(), "last": float("-inf"), "first_at": None,
                                "fields": dict(fields)}
        return task_id

    def update(self, task_id: int, *, completed: int | None = None, advance: int = 0, **fields) -> None:
        task = self._tasks[task_id]
        task["fields"].update(fields)
        before = task["completed"]
        task["completed"] = (completed if completed is not None else before) + advance
        if task["completed"] != before:
            self._maybe_print(task)

    def advance(self, task_id: int, advance: int = 1) -> None:
        self.update(task_id, advance=advance)

    def _maybe_print(self, task: dict) -> None:
        now = time.monotonic()
        done, total = task["completed"], task["total"]
        first = done - task["start_done"] <= 1
        if not (first or done >= total or now - task["last"] >= self.every_s):
            return
        task["last"] = now
        elapsed = now - task["t0"]
        if task["first_at"] is None:
            task["first_at"] = now
        remaining = remaining_seconds(done - task["start_done"], total - done, elapsed, now - task["first_at"])
        eta = _clock(remaining) if remaining is not None else "?"
        info = " | ".join(str(v) if k == "info" else f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                          for k, v in task["fields"].items() if v != "")
        self.console.print(f"{self.label} {done}/{total}" + (f" | {info}" if info else "")
                           + f" | elapsed {_clock(elapsed)} | eta {eta}", markup=False, highlight=False)


def remaining_seconds(done: int, left: int, elapsed: float, since_first: float) -> float | None:
    """Seconds left for `left` units, at the mean time per unit of the `done` units counted since this bar started.

    The first unit carries the start-up (model loading, the step-0 evaluation), so once two units are
    done the mean is over the units after it (`since_first`: seconds since the first one ended). A
    mean over every unit so far moves little from one unit to the next, where a rate over the last few
    units jumps with each evaluation step and each change of load on the machine. None: no estimate yet.
    """
    if done >= 2 and since_first > 0:
        return left * since_first / (done - 1)
    return left * elapsed / done if done >= 1 and elapsed > 0 else None


def make_progress(console: Console, label: str, *fields: str, every_s: float = 30.0) -> Progress | PlainProgress:
    """A progress display for `console`: a rich bar on a terminal (the info text `{task.fields[info]}`
    last, cut with an ellipsis, so the times stay visible), plain log lines otherwise."""
    if not console.is_terminal:
        return PlainProgress(console, label, every_s=every_s)
    columns = [TextColumn(f"[bold]{label}"), BarColumn(bar_width=24), MofNCompleteColumn(), TimeElapsedColumn(),
               TimeRemainingColumn()]
    # the info text takes the width that is left (ratio=1 with expand=True) and is the one cut
    columns += [TextColumn(text, table_column=Column(ratio=1, no_wrap=True, overflow="ellipsis")) for text in fields
                or ("{task.fields[info]}",)]
    # rich estimates the speed over the last `speed_estimate_period` seconds (30 by default: a few RL
    # steps, so the remaining time jumped with every evaluation step); ten minutes smooths it
    return Progress(*columns, console=console, expand=True, speed_estimate_period=600.0)


class BuildProgress:
    """Progress of the tiny base model's pretraining."""

    def __init__(self, console: Console, total: int):
        self._progress = make_progress(console, "pretraining")
        self._task = self._progress.add_task("pretrain", total=total, info="")  # no loss is shown before the first step's

    def __enter__(self):
        self._progress.__enter__()
        return self

    def __exit__(self, *exc):
        return self._progress.__exit__(*exc)

    def update(self, step: int, total: int, loss: float) -> None:
        self._progress.update(self._task, completed=step, info=f"loss {loss:.3f}")


class StepProgress:
    """One bar for the RL steps; its text shows the latest reward, held-out pass@1, entropy and length.
    Not on a terminal: one plain line per step."""

    def __init__(self, console: Console, total: int, completed: int = 0):
        self.console = console
        self._progress = make_progress(console, "RL step", every_s=0.0)
        self._task = self._progress.add_task("rl", total=total, completed=completed, info="")

    def __enter__(self):
        self._progress.__enter__()
        return self

    def __exit__(self, *exc):
        return self._progress.__exit__(*exc)

    def note(self, text: str) -> None:
        if isinstance(self._progress, PlainProgress):  # a log gets the note as its own line
            self.console.print(text, markup=False, highlight=False)
        self._progress.update(self._task, info=text)

    def advance_empty(self) -> None:
        self._progress.update(self._task, advance=1, info="no group kept this step")

    def advance(self, metrics: dict[str, float], eval_metrics: dict[str, float]) -> None:
        held = [f"{k.split('/')[1]} {v:.3f}" for k, v in eval_metrics.items() if k.endswith("/pass@1")]
        info = (
            f"reward {metrics['reward/mean']:.3f} | eval pass@1 {', '.join(held)} | "
            f"entropy {metrics['actor/entropy']:.3f} | clip {metrics['actor/pg_clipfrac']:.3f} | "
            f"len {metrics['rollout/response_length']:.1f} | {metrics['perf/step_seconds']:.1f}s/step"
        )
        self._progress.update(self._task, advance=1, info=info)


def summary_table(base: dict, final: dict, *, wall_seconds: float, n: int, processes: list[dict] | None = None) -> Table:
    """Base vs final held-out scores; the title has the wall time (summed over a resumed run's processes,
    `processes`, and then each one's steps and minutes)."""
    resumed = processes_note(processes)
    table = Table(title=f"held-out results (n={n} samples per problem; wall time {wall_seconds / 60:.1f} min)",
                  caption=f"wall time over {len(processes)} processes, {resumed}" if resumed else None)
    table.add_column("set")
    table.add_column("metric")
    table.add_column("base", justify="right")
    table.add_column("final", justify="right")
    table.add_column("change", justify="right")
    for name, b in base.items():
        f = final[name]
        rows = [(f"pass@1 (avg@{n})", b.pass_at_1, f.pass_at_1)]
        rows += [(f"pass@{k}", b.pass_at_k[k], f.pass_at_k[k]) for k in b.pass_at_k if k > 1]
        rows += [(f"maj@{n}", b.maj_at_n, f.maj_at_n)]
        for metric, bv, fv in rows:
            table.add_row(name, metric, f"{bv:.3f}", f"{fv:.3f}", f"{fv - bv:+.3f}")
    return table
