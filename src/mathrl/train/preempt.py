"""SIGTERM as a preemption, and the time-based checkpoint interval (train.save_every_minutes).

Schedulers (SLURM preemption, Kubernetes, `timeout`, torchrun's agent) stop a job with SIGTERM, then
SIGKILL after a grace period. A run stops promptly wherever the signal finds it, in one of two ways:

- Before the first step (the base model's build, model loading, vLLM's start, the generator
  processes' start, the start's evaluation, the wait for the generators' first batch) there is
  nothing to save and no safe point to wait for: SIGTERM raises `Terminated` where the program is
  (`StopSignal.at_once`, and `terminate_at_once` for the whole command line before that), and the
  teardown of each `with`/`finally` block takes it, as a Ctrl-C: a cache entry being built is never
  renamed into place and its temporary directory and lock are removed (cache.py), generator
  processes are ended, and the run directory holds no checkpoint, so the same command starts over.
- From the first step on SIGTERM only sets a flag (`StopSignal.requested`); the loop looks at it
  between steps, so no checkpoint is ever written from inside a signal handler:

  1. the step in progress runs to its end (seconds on a CPU, minutes on a large GPU model: a grace
     period shorter than one step ends in the SIGKILL, and the run resumes from its last checkpoint),
  2. the ranks agree on the flag (`agree`: one small all-reduce at the step boundary, which every rank
     reaches, so the checkpoint's collectives never wait for a rank that stopped),
  3. the last completed step is saved if it is not already (not while updates are being skipped, and
     not when checkpoints are off: train.save_every=0 and train.save_every_minutes=0),
  4. `Preempted` (a `Terminated`) is raised.

Both are KeyboardInterrupts, so every teardown treats them as Ctrl-C; the command line prints one line
that says what was saved (nothing, or the checkpoint the same command resumes from) and exits 143
(128 + SIGTERM). A due evaluation after a step belongs to that step: it finishes before the stop.

The first SIGTERM restores the default action: a second one ends the process at once.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

EXIT_PREEMPTED = 143  # 128 + SIGTERM, what a shell reports for a process SIGTERM ended


class Terminated(KeyboardInterrupt):
    """SIGTERM stopped the command where it was, before anything was saved (`at_once`)."""

    exit_code = EXIT_PREEMPTED

    def __init__(self, message: str = "stopped by SIGTERM", *, main: bool = True) -> None:
        super().__init__(message)
        self.reported_by_rank_0 = not main  # under torchrun rank 0 alone prints the line


class Preempted(Terminated):
    """SIGTERM stopped the run between steps, after the checkpoint of its last completed step."""

    def __init__(self, step: int, *, main: bool = True) -> None:
        super().__init__(f"stopped by SIGTERM after step {step}", main=main)
        self.step = step


def _raise_terminated(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process during the teardown
    raise Terminated()


@contextlib.contextmanager
def terminate_at_once() -> Iterator[None]:
    """SIGTERM raises `Terminated` wherever the main thread is, inside the block (the command line's
    default for every verb; a run's `StopSignal` takes over from the first step). Elsewhere than the
    main thread (where Python runs signal handlers) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class StopSignal:
    """A SIGTERM handler that records the request (`requested`) for the loop to act on between steps,
    or, inside `with stop.at_once():`, raises `Terminated` where the program is. Installed only from
    the main thread (where Python runs signal handlers); the previous handler comes back when the
    `with` block ends."""

    def __init__(self, *, main: bool = True) -> None:
        self.requested = False
        self.main = main  # rank 0 (under torchrun the others leave the line to it)
        self._at_once = False
        self._previous = None
        self._installed = False

    def __enter__(self) -> StopSignal:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
            self._installed = True
        return self

    def __exit__(self, *exc) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous)
            self._installed = False

    @contextlib.contextmanager
    def at_once(self) -> Iterator[None]:
        """A phase with nothing to save and no safe point (a build, a start, the start's evaluation):
        SIGTERM inside it, or one recorded before it, raises `Terminated` at once."""
        if self.requested:
            raise Terminated(main=self.main)
        before, self._at_once = self._at_once, True
        try:
            yield
        finally:
            self._at_once = before

    def _handle(self, signum, frame) -> None:
        """Record the request; a second SIGTERM then ends the process at once (the default action).
        Inside `at_once`, stop here."""
        self.requested = True
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if self._at_once:
            raise Terminated(main=self.main)


def time_save_due(minutes: float, *, last_save: float, now: float) -> bool:
    """Whether train.save_every_minutes asks for a checkpoint: `minutes` (0: never) have passed since
    `last_save` (seconds on the same clock as `now`)."""
    return minutes > 0 and now - last_save >= minutes * 60


def agree(stop: bool, time_due: bool, ranks) -> tuple[bool, bool]:
    """(stop, time_due) the same on every rank: a stop any rank was asked for, and rank 0's time-based
    decision (the clocks of the ranks differ). A collective under torchrun: every rank calls it."""
    if not ranks.distributed:
        return stop, time_due
    from mathrl.train.dist import all_reduce_sums

    sums = all_reduce_sums({"stop": float(stop), "time_due": float(time_due and ranks.main)})
    return sums["stop"] > 0, sums["time_due"] > 0
