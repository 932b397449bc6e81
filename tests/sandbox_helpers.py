"""What the sandbox test files share: the interpreter a mode can run, and a call started cold or warm
(tests/tools/test_tools_sandbox.py, tests/tools/test_tools_sandbox_classes.py,
tests/tools/test_tools_sandbox_kernel.py; scripts/sandbox_probe.py runs their classes)."""

from __future__ import annotations

import os
import sys

from mathrl.tools import run_python, sandbox_works
from mathrl.tools.sandbox import WarmSandboxes

MODES = ("bwrap", "unshare_unsafe", "rlimit_unsafe")


def interpreter_for(mode: str) -> str | None:
    """sys.executable, else /usr/bin/python3: as root, the unsafe modes run the code as an
    unprivileged uid, which cannot read an interpreter under /root (bwrap binds it in)."""
    for python in (sys.executable, "/usr/bin/python3"):
        if os.access(python, os.X_OK) and sandbox_works(mode, python=python):
            return python
    return None


def run_started(how: str, code, **kwargs):
    """Run `code` in a sandbox started now ("cold"), or ahead of the call ("warm": a `WarmSandboxes` of
    one, started with the call's settings; checks that the pre-started sandbox ran it)."""
    if how == "cold":
        return run_python(code, **kwargs)
    stock = WarmSandboxes({k: v for k, v in kwargs.items() if k != "timeout_s"}, 1)
    try:
        assert stock.ready() == 1
        result = run_python(code, prestarted=stock, **kwargs)
        assert stock.taken == 1, "the call did not run in the pre-started sandbox"
    finally:
        stock.close()
    return result
