"""Worker processes with a wall-clock timeout per call: what the answer verifier (`reward/verify.py`) and
the user tools (`tools/pool.py`) run in, because code that hangs in C or crashes the interpreter can
only be stopped by ending its process.

    pool = WorkerPool(functools.partial(start, ...), name="mathrl-verifier", size=4)
    replies = pool.map(messages, timeouts)   # from one thread: up to `size` messages in flight, input order
    reply = pool.call(message, timeout_s)    # from any thread: one worker for each call in flight
    pool.close()                             # no worker process is left when it returns

Each worker runs `serve`: it calls ``start()`` once (not part of any call's timeout), says ``("ready", info)``,
then answers every message with ``handle(message)``. A `Reply` is ``ok``, ``timeout``, ``crashed``, ``closed`` or
``unsent``; a killed or dead worker is replaced and the pool goes on; a worker that cannot even start raises
`WorkerStartError`. Workers are spawned, each with a private pipe (what each reply means, and why:
docs/architecture.md, "Worker processes"), so a script that starts a pool needs the
``if __name__ == "__main__":`` guard. Imports nothing of mathrl: every layer may use it.
"""

from __future__ import annotations

import collections
import multiprocessing
import multiprocessing.connection
import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal, NamedTuple

__all__ = ["Reply", "WorkerPool", "WorkerStartError", "serve"]

START_TIMEOUT_S = 120.0
"""How long a fresh worker may take to start (spawn, imports, ``start()``) before it counts as broken."""

Handler = Callable[[Any], Any]
Start = Callable[[], tuple[Handler, Any]]
"""Called once in each worker, picklable (a module-level function or a partial of one): returns the
handler of the worker's messages and the info its ready message carries to the parent."""


class Reply(NamedTuple):
    """What one message got from its worker (a tuple: cheap to make once per message)."""

    status: Literal["ok", "timeout", "crashed", "closed", "unsent"]
    value: Any = None
    """``ok``: the handler's answer."""
    exit_code: int | None = None
    """``crashed``: the worker process's exit code (negative: the signal that ended it)."""
    error: BaseException | None = None
    """``unsent``: why the message could not be sent (it does not pickle, or the worker died while idle)."""


class WorkerStartError(RuntimeError):
    """A worker did not start: it died (``reason="died"``, with its exit code), ran past the start
    timeout (``"timeout"``) or sent something other than its ready message (``"unexpected"``)."""

    def __init__(self, reason: Literal["died", "timeout", "unexpected"], *, exit_code: int | None = None,
                 start_timeout_s: float = START_TIMEOUT_S) -> None:
        self.reason, self.exit_code, self.start_timeout_s = reason, exit_code, start_timeout_s
        super().__init__({
            "died": f"died while starting (exit code {exit_code})",
            "timeout": f"did not start within {start_timeout_s:g} s",
            "unexpected": "sent something unexpected while starting",
        }[reason])


def serve(conn: multiprocessing.connection.Connection, start: Start) -> None:
    """A worker process: ``start()``, say ``("ready", info)``, then answer each message with
    ``handle(message)`` until ``None`` or a closed pipe."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the parent decides
    handle, info = start()
    conn.send(("ready", info))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return  # the parent went away
        if message is None:
            return
        conn.send(handle(message))


class _Worker:
    """One worker process, the parent's end of its private pipe, and the message it is working on."""

    def __init__(self, context: multiprocessing.context.BaseContext, start: Start, name: str,
                 start_timeout_s: float) -> None:
        self.conn, child = context.Pipe(duplex=True)
        self.process = context.Process(target=serve, args=(child, start), name=name, daemon=True)
        self.process.start()
        child.close()  # so that recv() in the parent sees EOF when the worker dies
        self.ready = False
        self.start_deadline = time.monotonic() + start_timeout_s
        self.item: int | None = None  # map(): the index of the message in flight
        self.item_deadline = 0.0

    def took_ready(self, message: object, on_ready: Callable[[Any], None] | None) -> None:
        """The worker's first message: its ready signal, or a `WorkerStartError`."""
        if not (isinstance(message, tuple) and len(message) == 2 and message[0] == "ready"):
            raise WorkerStartError("unexpected")
        self.ready = True
        if on_ready is not None:
            on_ready(message[1])

    def wait_ready(self, on_ready: Callable[[Any], None] | None, start_timeout_s: float) -> None:
        """Block until the worker is ready (at once if it is), else raise `WorkerStartError`."""
        if self.ready:
            return
        if not self.conn.poll(max(0.0, self.start_deadline - time.monotonic())):
            raise WorkerStartError("timeout", start_timeout_s=start_timeout_s)
        try:
            message = self.conn.recv()
        except (EOFError, OSError):
            raise WorkerStartError("died", exit_code=self.exit_code()) from None
        self.took_ready(message, on_ready)

    def stop(self, *, kill: bool) -> None:
        """Reap the process (SIGKILL first with `kill`: a worker stuck in C code may not honour SIGTERM)
        and close the pipe. Idempotent."""
        if kill:
            self.process.kill()
        self.process.join(timeout=5.0)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=5.0)
        self.conn.close()

    def exit_code(self) -> int | None:
        self.process.join(timeout=1.0)
        return self.process.exitcode


class WorkerPool:
    """Worker processes that each run `serve(start)`, with a timeout per message.

    start (`Start`): what each worker runs first; it returns its message handler and ready info. name: the
    processes' name (``ps``, ``multiprocessing.active_children``). size: the workers `map` keeps in flight; they
    start on its first call and are kept between calls; `call` starts a worker for each call in flight that
    finds none idle. start_timeout_s: how long a fresh worker may take to start (not part of any message's
    timeout). method: the start method (``spawn``: see the module docstring). on_ready: called in the parent
    with each worker's ready info as it starts. kill_idle_on_close: `close` kills idle workers instead of asking
    them to exit (for a user's code, which may leave threads behind that would hold the exit up).
    """

    def __init__(self, start: Start, *, name: str, size: int = 1, start_timeout_s: float = START_TIMEOUT_S,
                 method: str = "spawn", on_ready: Callable[[Any], None] | None = None,
                 kill_idle_on_close: bool = False) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"size must be an integer >= 1, got {size!r}")
        self.size = size
        self.start_timeout_s = float(start_timeout_s)
        self._start = start
        self._name = name
        self._on_ready = on_ready
        self._kill_idle = kill_idle_on_close
        self._context = multiprocessing.get_context(method)
        self._lock = threading.Lock()
        self._calls_done = threading.Condition(self._lock)  # close() waits on it for the calls in flight
        self._idle: list[_Worker] = []
        self._busy: set[_Worker] = set()
        self._starting = 0  # workers being started outside the lock
        self._closed = False

    # -- many messages from one thread -----------------------------------------------------------------

    def map(self, messages: Sequence[object | None], timeouts: Sequence[float]) -> list[Reply | None]:
        """Send each message (``None``: skip it, its reply is ``None``) to an idle worker, one at a time
        each, with ``timeouts[i]`` seconds counted from the send; replies in input order, never
        ``closed`` or ``unsent``. Raises `WorkerStartError` if a worker cannot start, RuntimeError if
        the pool is closed. On any exception (Ctrl-C included) the call's workers are stopped, so no
        stale reply can reach the next call."""
        workers = self._take_all()
        try:
            replies = self._run(workers, messages, timeouts)
        except BaseException:
            self._stop(workers)
            self._release(workers)
            raise
        self._give_back(workers)
        return replies

    def _run(self, workers: list[_Worker], messages: Sequence[object | None],
             timeouts: Sequence[float]) -> list[Reply | None]:
        replies: list[Reply | None] = [None] * len(messages)
        pending: collections.deque[int] = collections.deque(i for i, m in enumerate(messages) if m is not None)
        while pending or any(w.item is not None for w in workers):
            # -- send to idle workers -------------------------------------------------------------------
            for worker in list(workers):
                if not (pending and worker.ready and worker.item is None):
                    continue
                index = pending.popleft()
                try:
                    worker.conn.send(messages[index])
                except (OSError, ValueError):
                    # Died while idle: not this message's fault, so it goes back in the queue.
                    pending.appendleft(index)
                    self._replace(workers, worker, kill=True)
                    continue
                worker.item = index
                worker.item_deadline = time.monotonic() + timeouts[index]

            # -- wait for a reply, a death, or the nearest deadline -------------------------------------
            now = time.monotonic()
            deadlines = [w.item_deadline if w.ready else w.start_deadline for w in workers
                         if w.item is not None or not w.ready]
            wait_s = max(0.0, min(deadlines) - now) if deadlines else 1.0
            multiprocessing.connection.wait([w.conn for w in workers] + [w.process.sentinel for w in workers],
                                            timeout=wait_s)

            # -- collect ----------------------------------------------------------------------------------
            now = time.monotonic()
            for worker in list(workers):
                self._collect(workers, worker, replies, now)
        return replies

    def _collect(self, workers: list[_Worker], worker: _Worker, replies: list[Reply | None], now: float) -> None:
        """Take whatever ``worker`` has to say: its ready signal, a reply, its death, or its timeout."""
        message, got_message = None, False
        try:
            if worker.conn.poll():
                message, got_message = worker.conn.recv(), True
        except (EOFError, OSError):
            pass  # died; handled below

        if got_message:
            if not worker.ready:
                worker.took_ready(message, self._on_ready)
            elif worker.item is not None:
                replies[worker.item] = Reply("ok", message)
                worker.item = None
            return

        if not worker.process.is_alive():
            if not worker.ready:
                raise WorkerStartError("died", exit_code=worker.exit_code())
            if worker.item is not None:
                replies[worker.item] = Reply("crashed", exit_code=worker.exit_code())
                worker.item = None
            self._replace(workers, worker, kill=False)
            return

        if not worker.ready and now >= worker.start_deadline:
            raise WorkerStartError("timeout", start_timeout_s=self.start_timeout_s)
        if worker.item is not None and now >= worker.item_deadline:
            replies[worker.item] = Reply("timeout")
            worker.item = None
            self._replace(workers, worker, kill=True)

    def _replace(self, workers: list[_Worker], worker: _Worker, *, kill: bool) -> None:
        worker.stop(kill=kill)
        self._release([worker])
        fresh = self._new_worker()
        if fresh is None:
            raise RuntimeError("the worker pool is closed")
        workers[workers.index(worker)] = fresh

    # -- one message from any thread -------------------------------------------------------------------

    def call(self, message: object, timeout_s: float) -> Reply:
        """Send one message to a worker of its own (an idle one, else a fresh one, whose start-up is
        not part of `timeout_s`) and wait for its reply. Thread-safe: calls from several threads run at
        once. Raises `WorkerStartError` if the worker cannot start while the pool is open."""
        worker = self._take_one()
        if worker is None:
            return Reply("closed")
        try:
            worker.wait_ready(self._on_ready, self.start_timeout_s)
        except WorkerStartError:
            self._discard(worker)
            if self._closed:
                return Reply("closed")
            raise
        try:
            worker.conn.send(message)
        except Exception as e:  # does not pickle, or the worker died while idle
            self._discard(worker)
            return Reply("unsent", error=e)
        ready = multiprocessing.connection.wait([worker.conn, worker.process.sentinel], timeout=timeout_s)
        if worker.conn in ready:
            try:
                value = worker.conn.recv()
            except (EOFError, OSError):
                pass
            else:
                self._give_back([worker])
                return Reply("ok", value)
        if self._closed:
            self._discard(worker)
            return Reply("closed")
        if not ready:
            self._discard(worker)
            return Reply("timeout")
        code = worker.exit_code()
        self._discard(worker)
        return Reply("crashed", exit_code=code)

    # -- shutdown --------------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop every worker: a call in flight is killed and answered ``closed``; idle workers are asked
        to exit (killed with ``kill_idle_on_close``, or when still starting). Returns once no worker
        process is left. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            idle, self._idle = self._idle, []
            busy = list(self._busy)
        for worker in busy:
            worker.process.kill()  # whoever waits on it sees the process end, reaps it and returns
        if self._kill_idle:
            for worker in idle:
                worker.stop(kill=True)
        else:
            self._stop(idle)
        with self._calls_done:
            self._calls_done.wait_for(lambda: not self._busy and not self._starting)

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: modules may be gone already
            pass

    # -- the bookkeeping -------------------------------------------------------------------------------

    def _new_worker(self) -> _Worker | None:
        """A fresh worker, counted busy; None (and no process) if the pool is closed. It starts outside
        the lock (that takes a while), counted as starting, so that close() waits for it too."""
        with self._lock:
            if self._closed:
                return None
            self._starting += 1
        try:
            worker = _Worker(self._context, self._start, self._name, self.start_timeout_s)
        except BaseException:
            self._start_ended()
            raise
        with self._lock:
            if not self._closed:
                self._starting -= 1
                self._busy.add(worker)
                return worker
        worker.stop(kill=True)  # before close() may see it no longer starting
        self._start_ended()
        return None

    def _start_ended(self) -> None:
        with self._lock:
            self._starting -= 1
            self._calls_done.notify_all()

    def _take_all(self) -> list[_Worker]:
        """map()'s workers: the idle ones, then fresh ones up to `size`."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the worker pool is closed")
            workers, self._idle = self._idle[: self.size], self._idle[self.size:]
            self._busy.update(workers)
        try:
            while len(workers) < self.size:
                worker = self._new_worker()
                if worker is None:
                    raise RuntimeError("the worker pool is closed")
                workers.append(worker)
        except BaseException:
            self._stop(workers)
            self._release(workers)
            raise
        return workers

    def _take_one(self) -> _Worker | None:
        with self._lock:
            if self._closed:
                return None
            if self._idle:
                worker = self._idle.pop()
                self._busy.add(worker)
                return worker
        return self._new_worker()

    def _give_back(self, workers: list[_Worker]) -> None:
        with self._lock:
            if not self._closed:
                self._idle.extend(workers)
                self._busy.difference_update(workers)
                self._calls_done.notify_all()
                return
        for worker in workers:
            worker.stop(kill=True)
        self._release(workers)

    def _discard(self, worker: _Worker) -> None:
        worker.stop(kill=True)
        self._release([worker])

    def _release(self, workers: list[_Worker]) -> None:
        with self._lock:
            self._busy.difference_update(workers)
            self._calls_done.notify_all()

    @staticmethod
    def _stop(workers: list[_Worker]) -> None:
        """Ask every worker to exit first, then reap each, so that shutdown is not serial; busy or
        still-starting workers would not read the request soon, so they are killed."""
        for worker in workers:
            try:
                worker.conn.send(None)
            except (OSError, ValueError):
                pass
        for worker in workers:
            worker.stop(kill=worker.item is not None or not worker.ready)
