"""`mathrl train --nproc N`: start N ranks of the same run on this machine with torchrun.

    mathrl train --nproc 2 train.steps=20 --run-dir runs/dp2
    # is: torchrun --standalone --nproc_per_node 2 -m mathrl.train train.steps=20 --run-dir runs/dp2

Threads: torchrun gives every rank the caller's OMP_NUM_THREADS unchanged. When it is unset, `launch_env`
sets it to the rank's share of the cores this process may use (cores / N, at least 1), instead of
torchrun's 1 and its banner; `launch` warns when the ranks' threads exceed the cores.

SIGTERM to `mathrl train --nproc N` is passed on to torchrun, which passes it to every rank: the ranks
agree to stop after the step in progress and save it (train/preempt.py), rank 0 prints the resume line,
and the job exits 143 like a single process. torchrun's traceback of the signal (SignalException) is left
out of the output, its other lines are kept. What else torchrun does with threads and signals:
docs/guide.md, "Many processes, many machines".
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator


def torchrun_command(nproc: int, args: list[str]) -> list[str]:
    """The torchrun command line of `nproc` local ranks running `python -m mathrl.train ARGS`."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
            "-m", "mathrl.train", *args]


def oversubscription(nproc: int, *, omp_num_threads: str | None, cpus: int) -> str | None:
    """A warning when `nproc` ranks of `omp_num_threads` torch threads each (torchrun's default: 1) need
    more than `cpus` cores, else None. Oversubscribed ranks wait for each other's threads at every
    collective, so the job runs slower than with fewer threads."""
    per_rank = int(omp_num_threads) if omp_num_threads and omp_num_threads.strip().isdigit() else 1
    if nproc * per_rank <= cpus:
        return None
    fix = (f"set OMP_NUM_THREADS={cpus // nproc} to give each rank its share" if nproc <= cpus
           else f"run at most {cpus} ranks here")
    return f"{nproc} ranks x OMP_NUM_THREADS={per_rank} = {nproc * per_rank} threads on {cpus} cores; {fix}"


def available_cpus() -> int:
    """Cores this process may run on (its affinity mask, e.g. a container's or taskset's limit)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def launch_env(nproc: int, environ: dict[str, str], *, cpus: int) -> dict[str, str]:
    """The ranks' environment: `environ` with OMP_NUM_THREADS set explicitly when it is not (module docstring)."""
    env = dict(environ)
    if not env.get("OMP_NUM_THREADS", "").strip():
        env["OMP_NUM_THREADS"] = str(max(1, cpus // nproc))
    return env


def launch(nproc: int, args: list[str]) -> int:
    """Run the job and return its exit status (torchrun stops every rank when one fails)."""
    cpus = available_cpus()
    env = launch_env(nproc, dict(os.environ), cpus=cpus)
    warning = oversubscription(nproc, omp_num_threads=env["OMP_NUM_THREADS"], cpus=cpus)
    if warning:
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    job = subprocess.Popen(torchrun_command(nproc, args), env=env, stderr=subprocess.PIPE, text=True, bufsize=1)
    quiet = SignalTraceback()
    pump = threading.Thread(target=_copy_lines, args=(job.stderr, quiet), daemon=True)
    pump.start()
    with forward_sigterm(job) as forwarded:
        code = job.wait()
    pump.join()
    if forwarded.sent and quiet.dropped:  # torchrun stopped on the SIGTERM it passed on: a preemption
        from mathrl.train.preempt import EXIT_PREEMPTED

        return EXIT_PREEMPTED
    return code


class SignalTraceback:
    """A line filter that drops a traceback ending in torchrun's `SignalException` (the signal torchrun
    got, which its ranks already handled) and passes every other line, other tracebacks included.
    `feed(line)` returns the lines to print now; `dropped` says whether such a traceback was seen."""

    def __init__(self) -> None:
        self._held: list[str] = []
        self.dropped = False

    def feed(self, line: str) -> list[str]:
        if not self._held:
            if line.startswith("Traceback (most recent call last):"):
                self._held = [line]
                return []
            return [line]
        self._held.append(line)
        if line.startswith((" ", "\t")) or not line.strip():
            return []  # inside the traceback
        held, self._held = self._held, []  # its last line: the exception
        if "SignalException" in line:
            self.dropped = True
            return []
        return held

    def flush(self) -> list[str]:
        held, self._held = self._held, []
        return held


def _copy_lines(stream, filt: SignalTraceback) -> None:
    for line in stream:
        for out in filt.feed(line):
            sys.stderr.write(out)
        sys.stderr.flush()
    for out in filt.flush():
        sys.stderr.write(out)
    sys.stderr.flush()


class Forwarded:
    """Whether `forward_sigterm` passed a SIGTERM on (`sent`)."""

    sent = False


@contextlib.contextmanager
def forward_sigterm(child: subprocess.Popen) -> Iterator[Forwarded]:
    """SIGTERM to this process (a scheduler's preemption) goes on to `child` (torchrun, which passes it
    to its ranks: they save their step and stop, train/preempt.py) instead of ending this process alone."""
    if threading.current_thread() is not threading.main_thread():
        yield Forwarded()
        return
    forwarded = Forwarded()

    def handle(signum, frame) -> None:
        forwarded.sent = True
        child.send_signal(signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, handle)
    try:
        yield forwarded
    finally:
        signal.signal(signal.SIGTERM, previous)
