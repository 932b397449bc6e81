"""User tools of the tool pool's tests (tests/tools/test_tools_pool.py), loaded by file path in the pool's
worker processes the way a user's module is. Each one misbehaves in its own way."""

from __future__ import annotations

import os
import time


def echo(args, *, prefix: str = "echo"):
    """Repeat the input.

    The first paragraph is the schema's description; this one is not."""
    return f"{prefix}: {args}"


def raises(args):
    raise ValueError(f"bad input {args!r}\nsecond line")


def hangs(args):
    time.sleep(100)
    return "never"


def exits(args):
    os._exit(3)


def segfaults(args):
    import ctypes

    ctypes.string_at(0)  # reads address 0: SIGSEGV


def number(args):
    """A non-string result: the pool str()s it."""
    return 6 * 7


def add(args):
    return str(args["a"] + args["b"])


add.parameters = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                  "required": ["a", "b"]}

not_callable = 3


class EchoPool:
    """A tool pool (not a tool) for engine and teacher tests: it answers every call at once with
    `[name:args]`, in no time, with `status` (ok by default), and keeps the calls it got in `calls`."""

    def __init__(self, status: str = "ok"):
        self.status, self.calls = status, []

    def submit(self, name, args):
        from concurrent.futures import Future
        from types import SimpleNamespace

        self.calls.append((name, args))
        f = Future()
        f.set_result(SimpleNamespace(text=f"[{name}:{args}]", status=self.status, seconds=0.0))
        return f

    def close(self):
        pass
