"""SIGTERM as a preemption, and the time-based checkpoint interval (train.save_every_minutes).

Schedulers (SLURM, Kubernetes, `timeout`, torchrun's agent) stop a job with SIGTERM, then SIGKILL.
Before the first step SIGTERM raises `Terminated` where the program is (`StopSignal.at_once`,
`terminate_at_once`): nothing is saved and the same command starts over. From the first step on it
only sets a flag (`StopSignal.requested`); between steps the ranks `agree` on it, the last completed
step is saved and `Preempted` is raised. Both are KeyboardInterrupts; the command line says what was
saved in one line and exits 143. It installs a SIGTERM handler; under torchrun, one all-reduce a step.
Behaviour and design: docs/guide.md, "Never lose a run".
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
