"""SIGTERM as a preemption, and the time-based checkpoint interval (train.save_every_minutes).

Schedulers (SLURM preemption, Kubernetes, `timeout`, torchrun's agent) stop a job with SIGTERM, then
SIGKILL after a grace period. During an RL run SIGTERM only sets a flag (`StopSignal`); the loop
looks at it between steps, so no checkpoint is ever written from inside a signal handler:

  1. the step in progress runs to its end (seconds on a CPU, minutes on a large GPU model: a grace
     period shorter than one step ends in the SIGKILL, and the run resumes from its last checkpoint),
  2. the ranks agree on the flag (`agree`: one small all-reduce at the step boundary, which every rank
     reaches, so the checkpoint's collectives never wait for a rank that stopped),
  3. the last completed step is saved if it is not already (not while updates are being skipped, and
     not when checkpoints are off: train.save_every=0 and train.save_every_minutes=0),
  4. `Preempted` is raised: a KeyboardInterrupt, so every teardown treats it as Ctrl-C; the command
     line prints the same resume line and exits 143 (128 + SIGTERM).

The first SIGTERM restores the default action: a second one ends the process at once.
"""

from __future__ import annotations

import signal
import threading

EXIT_PREEMPTED = 143  # 128 + SIGTERM, what a shell reports for a process SIGTERM ended


class Preempted(KeyboardInterrupt):
    """SIGTERM stopped the run between steps, after the checkpoint of its last completed step."""

    exit_code = EXIT_PREEMPTED

    def __init__(self, step: int, *, main: bool = True) -> None:
        super().__init__(f"stopped by SIGTERM after step {step}")
        self.step = step
        self.reported_by_rank_0 = not main  # under torchrun rank 0 alone prints the resume line


class StopSignal:
    """A SIGTERM handler that records the request (`requested`) for the loop to act on between steps.
    Installed only from the main thread (where Python runs signal handlers); the previous handler
    comes back when the `with` block ends."""

    def __init__(self) -> None:
        self.requested = False
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

    def _handle(self, signum, frame) -> None:
        """Record the request; a second SIGTERM then ends the process at once (the default action)."""
        self.requested = True
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


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
