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

import logging
import os
import time

from rich.console import Console
from rich.markup import escape
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


class StartupLog(logging.Handler):
    """Prints the info lines of mathrl's loggers (`logging.getLogger("mathrl....")`: what a run decided,
    e.g. the python tool's sandbox) on `console`, each line once: held until `end_startup()` prints
    them as one block, then printed as they come. Warnings are printed at once (`warning: ...`).
    Third-party loggers are not touched (the CLI sets transformers' to errors only)."""

    def __init__(self, console: Console, level: int = logging.INFO):
        super().__init__(level)
        self.console, self.held, self.seen, self.holding = console, [], set(), True

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if text in self.seen:
            return
        self.seen.add(text)
        if record.levelno >= logging.WARNING:
            self.console.print(f"[yellow]warning:[/yellow] {escape(text)}", highlight=False)
        elif self.holding:
            self.held.append(text)
        else:
            self.console.print(text, markup=False, highlight=False)

    def end_startup(self) -> None:
        if self.held:
            self.console.print("\n".join(self.held), markup=False, highlight=False)
        self.held, self.holding = [], False


def install_startup_log(console: Console, *, quiet: bool = False) -> StartupLog | None:
    """Show mathrl's log lines on `console` (`StartupLog`); `quiet` (`-q`): warnings only. Rank 0 only
    under torchrun (RANK), where the other ranks' lines would repeat its own."""
    if os.environ.get("RANK", "0") != "0":
        return None
    logger = logging.getLogger("mathrl")
    for old in [h for h in logger.handlers if isinstance(h, StartupLog)]:
        logger.removeHandler(old)
    handler = StartupLog(console, logging.WARNING if quiet else logging.INFO)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)  # (with a handler here, logging's last resort no longer prints mathrl's warnings again)
    return handler


def end_startup() -> None:
    """Print the held start-up lines as one block (nothing where no StartupLog is installed)."""
    for handler in logging.getLogger("mathrl").handlers:
        if isinstance(handler, StartupLog):
            handler.end_startup()


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


def make_progress(console: Console, label: str, *fields: str, every_s: float = 30.0, bar: bool = True) -> Progress | PlainProgress:
    """A progress display for `console`: a rich bar on a terminal (the info text `{task.fields[info]}`
    last, cut with an ellipsis, so the times stay visible), plain log lines otherwise. `bar=False`
    leaves out the bar itself (done/total stays), for a narrow terminal."""
    if not console.is_terminal:
        return PlainProgress(console, label, every_s=every_s)
    columns = [TextColumn(f"[bold]{label}"), *([BarColumn(bar_width=24)] if bar else []), MofNCompleteColumn(),
               TimeElapsedColumn(), TimeRemainingColumn()]
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


NARROW = 120  # a terminal narrower than this gets the compact step line (`StepProgress`)


def fit_fields(fields: list[str], room: int) -> str:
    """`fields` (highest priority first) joined by " | ", leaving out the lowest-priority ones until the
    line fits `room` columns; the first is always kept (the bar cuts it with an ellipsis if need be)."""
    for count in range(len(fields), 1, -1):
        line = " | ".join(fields[:count])
        if len(line) <= room:
            return line
    return fields[0] if fields else ""


class StepProgress:
    """One bar for the RL steps; its text shows the latest reward, held-out pass@1, entropy, clip
    fraction, response length and seconds per step, in that priority. On a terminal narrower than
    `NARROW` columns (80) the bar graphic goes, the names shorten, and the lowest-priority fields are
    left out until the line fits: reward, pass@1 (once evaluated), entropy and clip stay at 80 columns.
    Not on a terminal: one plain line per step, every field."""

    def __init__(self, console: Console, total: int, completed: int = 0):
        self.console = console
        self.compact = console.is_terminal and console.width < NARROW
        self._progress = make_progress(console, "RL step", every_s=0.0, bar=not self.compact)
        self._task = self._progress.add_task("rl", total=total, completed=completed, info="")
        # what the other columns take: label, done/total, elapsed and remaining times, the gaps between columns
        self._room = console.width - (len("RL step") + 2 * len(str(total)) + 1 + 7 + 7 + 4 + 1)

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
        held = {k.split("/")[1]: v for k, v in eval_metrics.items() if k.endswith("/pass@1")}
        if not self.compact:
            info = (
                f"reward {metrics['reward/mean']:.3f} | eval pass@1 {', '.join(f'{k} {v:.3f}' for k, v in held.items())} | "
                f"entropy {metrics['actor/entropy']:.3f} | clip {metrics['actor/pg_clipfrac']:.3f} | "
                f"len {metrics['rollout/response_length']:.1f} | {metrics['perf/step_seconds']:.1f}s/step"
            )
        else:
            fields = [f"rew {metrics['reward/mean']:.3f}"]
            fields += [f"p@1 {'/'.join(f'{v:.3f}' for v in held.values())}"] if held else []
            fields += [f"ent {metrics['actor/entropy']:.3f}", f"clip {metrics['actor/pg_clipfrac']:.3f}",
                       f"len {metrics['rollout/response_length']:.1f}", f"{metrics['perf/step_seconds']:.1f}s/step"]
            info = fit_fields(fields, self._room)
        self._progress.update(self._task, advance=1, info=info)


def summary_table(base: dict, final: dict, *, wall_seconds: float, n: int, processes: list[dict] | None = None) -> Table:
    """Base vs final held-out scores; the title has the wall time (summed over a resumed run's processes,
    `processes`, and then each one's steps and minutes)."""
    resumed = processes_note(processes)
    table = Table(title=f"held-out results (n={plural(n, 'sample')} per problem; wall time {wall_seconds / 60:.1f} min)",
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
