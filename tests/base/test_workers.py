"""WorkerPool: replies in input order, a hang or a crash costs its worker (killed or found dead, then
replaced) and not the pool, a worker that cannot start raises, and close() leaves no process behind.
The verifier (tests/reward/test_reward.py) and the user tools (tests/tools/test_tools_pool.py) test the same
through their own texts.

Run: python -m pytest tests/base/test_workers.py -q
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import threading
import time

import pytest

from mathrl.workers import Reply, WorkerPool, WorkerStartError


def handle(offset: int, message: tuple):
    """Module level, so that spawned workers find it by name: echo, hang or exit on request."""
    kind, value = message
    if kind == "hang":
        time.sleep(600)
    if kind == "exit":
        os._exit(value)
    return value + offset


def start(offset: int = 0):
    return functools.partial(handle, offset), os.getpid()


def start_that_dies():
    os._exit(5)


def start_that_hangs():
    time.sleep(600)


def children(name: str) -> list:
    return [p for p in multiprocessing.active_children() if p.name == name]


@pytest.fixture(scope="module")
def pool():
    pids = []
    with WorkerPool(functools.partial(start, 100), name="test-workers", size=2, on_ready=pids.append) as p:
        p.ready_pids = pids
        yield p
    assert children("test-workers") == []


def test_map_replies_in_input_order(pool):
    # why: many messages over two workers finish out of order; replies line up with the messages,
    # and a None message is skipped (its reply is None)
    messages = [("echo", i) for i in range(30)] + [None]
    replies = pool.map(messages, [5.0] * len(messages))
    assert replies == [Reply("ok", i + 100) for i in range(30)] + [None]
    # each ready worker's start() info reached the parent (a slow second worker may not be ready yet)
    assert 1 <= len(pool.ready_pids) <= 2 and os.getpid() not in pool.ready_pids


def test_map_kills_a_hang_and_reports_a_crash_then_goes_on(pool):
    # why: a hang is killed at its own timeout while the others run; os._exit is a crash with its code
    replies = pool.map([("echo", 1), ("hang", 0), ("exit", 3), ("echo", 2)], [30.0, 0.5, 30.0, 30.0])
    assert replies == [Reply("ok", 101), Reply("timeout"), Reply("crashed", exit_code=3), Reply("ok", 102)]
    assert len(children("test-workers")) == 2  # both replaced
    assert pool.map([("echo", 7)], [30.0]) == [Reply("ok", 107)]


def test_call_from_threads(pool):
    # why: the tools call from their threads, one worker per call in flight; a call's failure is a Reply
    out = {}
    cases = {"ok": ("echo", 5), "timeout": ("hang", 0), "crashed": ("exit", 4)}
    threads = [threading.Thread(target=lambda k=k, m=m: out.setdefault(k, pool.call(m, 1.0 if k == "timeout" else 30.0)))
               for k, m in cases.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert out == {"ok": Reply("ok", 105), "timeout": Reply("timeout"), "crashed": Reply("crashed", exit_code=4)}
    unsent = pool.call(("echo", lambda: 0), 30.0)  # a lambda does not pickle
    assert unsent.status == "unsent" and unsent.error is not None
    assert pool.call(("echo", 6), 30.0) == Reply("ok", 106)


@pytest.mark.parametrize("start_fn, timeout_s, reason, exit_code", [
    (start_that_dies, 60.0, "died", 5),  # e.g. the main script lacks its __main__ guard
    (start_that_hangs, 1.0, "timeout", None),  # an overloaded machine
])
def test_a_worker_that_cannot_start_raises(start_fn, timeout_s, reason, exit_code):
    for use in ("map", "call"):
        with WorkerPool(start_fn, name="test-broken", start_timeout_s=timeout_s) as broken:
            with pytest.raises(WorkerStartError) as error:
                broken.map([("echo", 1)], [1.0]) if use == "map" else broken.call(("echo", 1), 1.0)
            assert (error.value.reason, error.value.exit_code) == (reason, exit_code), use
        assert children("test-broken") == []


def test_close_answers_calls_in_flight_and_leaves_no_process():
    # why: close() must not wait out a hung call, and no worker may outlive it
    pool = WorkerPool(start, name="test-close", size=2)
    pool.map([("echo", 0), ("echo", 0)], [60.0, 60.0])  # two idle workers
    out = []
    thread = threading.Thread(target=lambda: out.append(pool.call(("hang", 0), 60.0)))
    thread.start()
    time.sleep(1.0)  # the call hangs in one worker, the other is idle (or still starting: closed all the same)
    started = time.monotonic()
    pool.close()
    pool.close()  # idempotent
    thread.join(30)
    assert out == [Reply("closed")]
    assert time.monotonic() - started < 30.0
    assert children("test-close") == []
    assert pool.call(("echo", 1), 1.0) == Reply("closed")
    with pytest.raises(RuntimeError, match="closed"):
        pool.map([("echo", 1)], [1.0])
