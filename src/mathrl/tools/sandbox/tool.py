"""The `python` tool: model-written code run in a fresh sandboxed interpreter, REPL-style.

    run_python("x = 3\\nx ** 2")                    -> ToolResult(text="9", status="ok", ...)
    run_python("while True: pass", timeout_s=1)    -> ToolResult(text="timeout: ...", status="timeout")
    python({"code": "print(2**10)"}, sandbox="bwrap")  -> "1024"    (the tool contract: str in, str out)
    sandbox_mode()                                 -> "bwrap"   (what sandbox="auto" uses on this machine)

Every call is a new `python -I -S -B` process in a temporary directory deleted afterwards, with
resource limits, a per-call memory bound and a wall-clock timeout, inside the sandbox the `sandbox`
kwarg names: ``bwrap`` (``auto``), ``unshare_unsafe`` or ``rlimit_unsafe`` (trusted code only); as
root it runs as an unprivileged uid of its own. `WarmSandboxes` starts sandboxes ahead of calls.
It starts and kills processes, makes and removes temporary directories, uid lock files, memory cgroups.
What the model reads, each mode, the limits, root, warm sandboxes and what each mode was tested to
stop: docs/tools.md, "The built-in tools and the python sandbox"; this package's other modules: its __init__.py.
"""

from __future__ import annotations

import collections
import functools
import logging
import os
import subprocess
import sys
import threading
import time

import mathrl.tools.sandbox.command as sandbox_command
from mathrl.tools.base import ToolResult
from mathrl.tools.sandbox.command import Call
from mathrl.tools.sandbox.memory import memory_bound, memory_covers
from mathrl.tools.sandbox.run import ROOT_UID_BASE, Prestarted, Refused, one_line, run_in_sandbox

__all__ = ["LIMIT_DEFAULTS", "ROOT_UID_BASE", "SANDBOX_MODES", "UNSAFE_MODES", "WarmSandboxes", "check_python_kwargs", "python",
           "run_python", "sandbox_mode", "sandbox_problem", "sandbox_works", "warm_sandboxes"]

log = logging.getLogger(__name__)

SANDBOX_MODES = ("auto", "bwrap", "unshare_unsafe", "rlimit_unsafe")
"""Values of the `sandbox` kwarg. ``auto`` is ``bwrap``, the one mode that isolates hostile code (see
`sandbox_mode`); the ``_unsafe`` ones run model code without a boundary around the host's files (and,
for rlimit, its network and processes), only for code you trust, with a warning once per process."""

UNSAFE_MODES = {"unshare_unsafe": "unshare", "rlimit_unsafe": "rlimit"}
"""The unsafe spellings and the mechanism each names (`Call.mode`)."""

LIMIT_DEFAULTS = {
    "cpu_s": 5.0,  # CPU seconds (RLIMIT_CPU); past it the call is a timeout
    "memory_mb": 512,  # per process: address space (RLIMIT_AS, MemoryError); per call: all processes together
    "max_processes": 32,  # processes and threads of the sandbox's user (RLIMIT_NPROC)
    "max_file_mb": 16,  # largest file written (RLIMIT_FSIZE); bwrap's /tmp holds TMPFS_FILES times it
    "max_open_files": 64,  # open file descriptors (RLIMIT_NOFILE)
    "max_files": 4096,  # files and directories in bwrap's /tmp (its inodes: kernel memory no size bound counts)
    "max_output_bytes": 65536,  # stdout + stderr kept; past it the program is killed
}
"""The sandbox's limits (kwargs of the `python` tool) and their defaults."""

OTHER_KWARGS = ("sandbox", "python", "audit_hook", "site_packages", "warm")
"""The `python` tool's other kwargs: the mode, the interpreter (default `sys.executable`), the
audit hook (None: on where there is no mount namespace), the interpreter's site-packages, and the
sandboxes a `ToolPool` keeps started ahead (`warm`, 0: none)."""


_PROBE_TIMEOUT_S = 60.0  # a mode's first-use check may wait this long on a loaded machine
_STDIN_CODE_BYTES = 60000  # code up to this size goes to a pre-started sandbox through its stdin pipe (64 KiB
# of buffer: the write never waits for the sandbox); longer code starts a sandbox of its own

# ---------------------------------------------------------------------------------------------------
# The tool
# ---------------------------------------------------------------------------------------------------


def python(args: str | dict, **kwargs) -> str:
    """The tool function (contract ``fn(args, **kwargs) -> str``): what the model reads.

    `args` is the code or ``{"code": str}``; kwargs are `run_python`'s (`timeout_s` included).
    """
    return run_python(args, **kwargs).text


def run_python(args: str | dict, *, timeout_s: float = 5.0, stop: threading.Event | None = None,
               prestarted: WarmSandboxes | None = None, **kwargs) -> ToolResult:
    """Run model-written code in a sandbox; never raises.

    args: the code, or ``{"code": str}``. timeout_s: wall-clock seconds, from the start of the subprocess (or,
    in a pre-started sandbox, from when the code is sent); then the group is killed. stop: when set (e.g. by
    `ToolPool.close`), the running program is killed and the call ends. prestarted: sandboxes started ahead
    (`WarmSandboxes`) to take this call's from; one started for these settings is used once and never again;
    without them, when none is ready, or for code over 60000 bytes, the sandbox starts now. kwargs: `sandbox`
    (`SANDBOX_MODES`), `python`, `audit_hook`, `site_packages`, `warm` (read by the `ToolPool`) and the limits
    of `LIMIT_DEFAULTS`.
    """
    start = time.perf_counter()
    try:
        code = _code_of(args)
        problems = check_python_kwargs(kwargs)
        if problems:
            return ToolResult(f"error: {problems[0]}", "error", time.perf_counter() - start)
        call = _resolve(kwargs)
        started = None
        if prestarted is not None and len(code.encode("utf-8", "replace")) <= _STDIN_CODE_BYTES:
            started = prestarted.take(call)
        outcome = started.run(code, timeout_s=timeout_s, stop=stop) if started is not None else None
        text, status = outcome or run_in_sandbox(code, call, timeout_s=timeout_s, stop=stop)
    except Refused as e:
        text, status = f"error: {e}", "error"
    except Exception as e:  # a broken host (no /tmp space, ...): still an observation, not a crash
        text, status = f"error: the sandbox failed: {type(e).__name__}: {one_line(str(e))}", "error"
    return ToolResult(text, status, time.perf_counter() - start)


def _code_of(args: str | dict) -> str:
    if isinstance(args, dict):
        if set(args) != {"code"} or not isinstance(args["code"], str):
            raise Refused('expected {"code": "<python>"}, got keys ' + ", ".join(map(repr, args)))
        return args["code"]
    if not isinstance(args, str):
        raise Refused(f"expected python code as a string, got {type(args).__name__}")
    return args


def check_python_kwargs(kwargs: dict) -> list[str]:
    """One-line reasons the `python` tool's kwargs are invalid (empty when they are fine)."""
    problems = []
    for key, value in kwargs.items():
        if key in LIMIT_DEFAULTS:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                problems.append(f"{key} must be a positive number, got {value!r}")
            elif key != "cpu_s" and value != int(value):
                problems.append(f"{key} must be a whole number, got {value!r}")
        elif key == "sandbox":
            if value in UNSAFE_MODES.values():
                problems.append(f"sandbox {value!r} does not isolate hostile code from the host's files"
                                f"{' and network' if value == 'rlimit' else ''}; use bwrap (auto), or spell it "
                                f"{value + '_unsafe'!r} to run model code without that boundary")
            elif value not in SANDBOX_MODES:
                problems.append(f"sandbox must be one of {', '.join(SANDBOX_MODES)}, got {value!r}")
        elif key == "python":
            if not isinstance(value, str) or not os.access(value, os.X_OK):
                problems.append(f"python={value!r} is not an executable file")
        elif key == "audit_hook":
            if value not in (None, True, False):
                problems.append(f"audit_hook must be true, false or null, got {value!r}")
        elif key == "site_packages":
            if not isinstance(value, bool):
                problems.append(f"site_packages must be true or false, got {value!r}")
        elif key == "warm":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                problems.append(f"warm must be a whole number of sandboxes >= 0, got {value!r}")
        else:
            problems.append(f"the python tool has no option {key!r}; options: "
                            f"{', '.join([*OTHER_KWARGS, *LIMIT_DEFAULTS])}")
    return problems


def _resolve(kwargs: dict) -> Call:
    interpreter = os.path.realpath(kwargs.get("python") or sys.executable)
    mode = kwargs.get("sandbox", "auto")
    if mode == "auto":
        try:
            mode = sandbox_mode(python=interpreter)
        except RuntimeError as e:
            raise Refused(str(e)) from None
    else:
        problem = sandbox_problem(mode, python=interpreter)
        if problem:
            raise Refused(f"sandbox {mode!r} does not work here: {problem}")
        if mode in UNSAFE_MODES:
            _warn_unsafe(mode)
            mode = UNSAFE_MODES[mode]
    hook = kwargs.get("audit_hook")
    limits = {k: kwargs.get(k, v) for k, v in LIMIT_DEFAULTS.items()}
    return Call(mode, interpreter, limits, mode != "bwrap" if hook is None else bool(hook),
                 site_packages=bool(kwargs.get("site_packages", False)))


@functools.lru_cache(maxsize=None)
def _warn_unsafe(mode: str) -> None:
    """Once per process and mode."""
    log.warning("python tool: sandbox=%s runs model-written code without isolation from the host's files%s; "
                "use it only for code you trust", mode, "" if mode == "unshare_unsafe" else ", network and processes")


# ---------------------------------------------------------------------------------------------------
# Which sandbox works here
# ---------------------------------------------------------------------------------------------------


def sandbox_works(mode: str, *, python: str | None = None) -> bool:
    """Whether `mode` runs ``print(1+1)`` here with `python` (default `sys.executable`); cached."""
    return sandbox_problem(mode, python=python) is None


def sandbox_problem(mode: str, *, python: str | None = None) -> str | None:
    """Why `mode` does not work here (one line), or None when it does. The first call per mode and
    interpreter runs ``print(1+1)`` through it (tens of milliseconds); later calls are cached."""
    if mode not in SANDBOX_MODES or mode == "auto":
        return f"not a sandbox mode: {mode!r} (choose {', '.join(SANDBOX_MODES[1:])})"
    return _probe(UNSAFE_MODES.get(mode, mode), os.path.realpath(python or sys.executable), os.geteuid())


@functools.lru_cache(maxsize=None)
def _probe(mode: str, interpreter: str, euid: int) -> str | None:
    tool = {"bwrap": "bwrap", "unshare": "unshare"}.get(mode)
    if tool and sandbox_command.binary(tool) is None:
        return f"{tool} is not installed (apt-get install {'bubblewrap' if tool == 'bwrap' else 'util-linux'})"
    if mode == "bwrap" and not _bwrap_is_recent():
        return "bubblewrap 0.8 or newer is needed (--size, --perms on --tmpfs and --dir, --disable-userns)"
    call = Call(mode, interpreter, dict(LIMIT_DEFAULTS), mode != "bwrap")
    try:
        text, status = run_in_sandbox("print(1+1)", call, timeout_s=_PROBE_TIMEOUT_S, stop=None)
    except Refused as e:
        text, status = f"error: {e}", "error"
    except Exception as e:
        text, status = f"error: {type(e).__name__}: {one_line(str(e))}", "error"
    if status == "ok" and text == "2":
        return None
    reason = one_line(text.removeprefix("error: ") or f"status {status}, no output")
    if euid == 0 and mode != "bwrap":
        reason += (f" (as root the code runs as uid {ROOT_UID_BASE}+, which must be able to read {interpreter}; "
                   "use sandbox=bwrap or python=/usr/bin/python3)")
    return reason


def sandbox_mode(*, python: str | None = None) -> str:
    """The mode ``sandbox="auto"`` uses with `python` (default `sys.executable`): ``bwrap``, the one
    mode that isolates hostile code; never an unsafe one. Logged once, with how a call's memory is
    bounded. Raises RuntimeError, one line naming what to install, when bwrap does not work here."""
    return _auto_mode(os.path.realpath(python or sys.executable))


@functools.lru_cache(maxsize=None)
def _auto_mode(python: str) -> str:
    problem = sandbox_problem("bwrap", python=python)
    if problem is None:
        log.info("python tool sandbox: bwrap; memory per call bounded by %s", memory_covers(memory_bound()))
        return "bwrap"
    raise RuntimeError(f"no safe python sandbox works here (bwrap: {problem}); install bubblewrap from the "
                       "distribution's packages (apt-get install bubblewrap, dnf install bubblewrap); "
                       "sandbox=unshare_unsafe or rlimit_unsafe run model code without isolation")


def _bwrap_is_recent() -> bool:
    """Whether bwrap has the options of 0.8 this module uses (its --help lists them)."""
    try:
        usage = subprocess.run([sandbox_command.binary("bwrap"), "--help"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return all(option in usage for option in ("--size", "--perms", "--disable-userns"))


# ---------------------------------------------------------------------------------------------------
# Sandboxes started ahead of their calls
# ---------------------------------------------------------------------------------------------------


class WarmSandboxes:
    """Sandboxes of one python tool started ahead of its calls (`ToolPool`, kwarg `warm` of the tool).

    `size` of them wait, each started with the tool's settings (mode, interpreter, limits, hook);
    `take` hands the oldest to a call, so that the call does not pay the interpreter's and the
    namespaces' start-up, and `refill` starts replacements (the `ToolPool` calls it once a call's
    result is delivered, so that no call waits for the start of another's sandbox). A sandbox runs
    exactly one call: no interpreter state, file or process of one call reaches the next. `close`
    kills those still waiting (`ToolPool.close` calls it)."""

    def __init__(self, kwargs: dict, size: int):
        kwargs = {k: v for k, v in kwargs.items() if k != "warm"}
        try:
            self.call: Call | None = _resolve(kwargs)
        except Refused:  # no working mode: every call says why (cold)
            self.call, size = None, 0
        self.size = size
        self.taken = 0  # calls served by a sandbox started ahead
        self._ready: collections.deque[Prestarted] = collections.deque()
        self._lock = threading.Lock()
        self._closed = False
        self.refill()

    def take(self, call: Call) -> Prestarted | None:
        """The oldest waiting sandbox when it was started for `call`'s settings, else None."""
        if call != self.call:
            return None
        with self._lock:
            if self._closed or not self._ready:
                return None
            self.taken += 1
            return self._ready.popleft()

    def refill(self) -> None:
        """Start sandboxes until `size` wait (each starts in the background: this returns once its
        process is spawned)."""
        while self.ready() < self.size and not self._closed:
            self._add()

    def ready(self) -> int:
        with self._lock:
            return len(self._ready)

    def _add(self) -> None:
        try:
            started = Prestarted(self.call)
        except Exception as e:  # a broken host: the calls start their own and report it
            log.debug("python tool: a sandbox could not be started ahead: %s", e)
            return
        with self._lock:
            if not self._closed and len(self._ready) < self.size:
                self._ready.append(started)
                return
        started.close()

    def close(self) -> None:
        """Kill the sandboxes still waiting, and start no more. Idempotent."""
        with self._lock:
            self._closed = True
            waiting = list(self._ready)
            self._ready.clear()
        for started in waiting:
            started.close()


def warm_sandboxes(kwargs: dict) -> WarmSandboxes | None:
    """The sandboxes a `ToolPool` keeps started for a python tool with these kwargs (None: `warm` 0)."""
    size = kwargs.get("warm", 0)
    return WarmSandboxes(kwargs, size) if size else None
