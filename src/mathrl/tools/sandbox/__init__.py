"""The `python` tool: model-written code run in a fresh sandboxed interpreter, REPL-style.

    run_python("x = 3\\nx ** 2")                    -> ToolResult(text="9", status="ok", ...)
    python({"code": "print(2**10)"}, sandbox="bwrap")  -> "1024"    (the tool contract: str in, str out)
    sandbox_mode()                                 -> "bwrap"   (what sandbox="auto" uses on this machine)

This package is the tool's public face; its modules, by concern (what each mode holds: docs/tools.md,
"The built-in tools and the python sandbox"):

    tool.py      the tool: its options and limits, the modes and which works here, sandboxes started ahead
    command.py   how each mode starts the runner (bwrap's mounts and namespaces, unshare, plain); a call's settings
    run.py       one call: its directory and uid (as root), the process, output caps, deadline, kill, the outcome
    runner.py    the first code the sandboxed interpreter runs (its text, passed to ``python -c``)
    memory.py    a call's memory bounded across its processes: a memory cgroup, else a PSS watchdog
    seccomp.py   bwrap's seccomp filter: no keyrings, namespaces or mounts for model code
"""

from mathrl.tools.sandbox.tool import (
    LIMIT_DEFAULTS,
    ROOT_UID_BASE,
    SANDBOX_MODES,
    UNSAFE_MODES,
    WarmSandboxes,
    check_python_kwargs,
    python,
    run_python,
    sandbox_mode,
    sandbox_problem,
    sandbox_works,
    warm_sandboxes,
)

__all__ = ["LIMIT_DEFAULTS", "ROOT_UID_BASE", "SANDBOX_MODES", "UNSAFE_MODES", "WarmSandboxes", "check_python_kwargs", "python",
           "run_python", "sandbox_mode", "sandbox_problem", "sandbox_works", "warm_sandboxes"]
