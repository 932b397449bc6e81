"""The `python` tool: model-written code run in a fresh sandboxed interpreter, REPL-style.

    run_python("x = 3\\nx ** 2")                    -> ToolResult(text="9", status="ok", ...)
    run_python("1/0")                              -> ToolResult(text="ZeroDivisionError: division by zero", status="error")
    run_python("while True: pass", timeout_s=1)    -> ToolResult(text="timeout: ...", status="timeout")
    python({"code": "print(2**10)"}, sandbox="bwrap")  -> "1024"    (the tool contract: str in, str out)
    sandbox_mode()                                 -> "bwrap"   (what sandbox="auto" uses on this machine)

What the model reads (like Qwen2.5-Math's tool-integrated executor, and a Python REPL):

* the code's stdout, then its stderr, trailing whitespace removed;
* if the last statement is an expression, its value as the REPL shows it (``repr``, nothing for
  ``None``, so a final ``print(...)`` is not printed twice);
* on an uncaught exception, the output so far and then only the exception's last traceback line
  (``ZeroDivisionError: division by zero``); the frames name the runner, not the model's code, and
  cost tokens;
* at most `max_output_bytes` of output: past it the program is killed and an ``error: output
  exceeded ...`` line ends the text (100 MB of prints costs 64 KiB of memory, never disk);
* ``timeout: ...`` alone when the wall-clock `timeout_s` or the CPU limit `cpu_s` ran out.

Every call is a new process (`python -I -S -B`: no environment variables, no site-packages, no
bytecode written; the standard library only) in a fresh temporary directory that is its cwd and HOME
and is deleted afterwards, with stdin from /dev/null, a stripped environment (PATH, LANG, HOME),
resource limits (CPU seconds, address space, processes, file size, open files, no core files) and a
wall-clock timeout that kills its whole process group. Around that, the sandbox (kwarg `sandbox`):

* ``bwrap`` (what ``auto`` picks; `sandbox_mode`): bubblewrap. New mount, pid, network, ipc and uts
  namespaces; the system directories and the interpreter's prefix read-only, a size-limited tmpfs as
  /tmp (the cwd), a read-only /dev, nothing else of the host's files; no network; a seccomp filter
  (`sandbox_seccomp`) that refuses keyrings, new namespaces and mounts; the whole sandbox dies with
  its pid 1. Where bwrap does not work, ``auto`` is a one-line error that says what to install.
* ``unshare_unsafe``: ``unshare --user --map-current-user --net --pid --fork --kill-child
  --mount-proc``: no network, its own pid namespace (killing it kills every descendant; ``kill(-1)``
  reaches only the sandbox), the code without capabilities, but the host's file system as the user
  the code runs as. Not a boundary for hostile code: only for code you trust (a warning says so once).
* ``rlimit_unsafe``: the plain subprocess with its limits, and no isolation beyond the user it runs as.
  An audit hook (`sys.addaudithook`) refuses sockets, subprocesses, ``os.system``, signals, ctypes and
  file access outside the temporary directory and the interpreter's files; defence in depth, not a
  boundary (native code, and interpreters the standard library starts without an audit event, ignore it).

The audit hook is on by default in the two modes without a mount namespace (``audit_hook=None``).

In every mode a call's memory is bounded across all its processes (`sandbox_memory.CallMemory`: a
memory cgroup where one is writable, else a watchdog on their total PSS), and its temporary directory
is removed without recursion and cannot be renamed away by the code.

Running as root: the kernel does not apply RLIMIT_NPROC to uid 0, so a fork bomb would not be
bounded. As root, the code therefore runs as an unprivileged uid of its own (`ROOT_UID_BASE` and
up, one per concurrent call on the machine, claimed with a lock file, consecutive calls of a process
on different uids): in ``bwrap`` the runner drops to it inside the sandbox (bwrap keeps only
CAP_SETUID/CAP_SETGID for that), in the other modes the subprocess starts as it.
``rlimit_unsafe`` then also kills every process of that uid after the call, from this process. The
interpreter must be readable by that uid in the unsafe modes (a python under /root is not: use
``bwrap``, or ``python=/usr/bin/python3``); `sandbox_problem` says so.

Started ahead (`WarmSandboxes`, kwarg `warm` of a `ToolPool`'s python tool): the same sandbox and
runner, started before its call with the limits set, waiting on its stdin for the code; it runs one
call and is killed with its directory like any other, so a call pays neither the interpreter's nor
the namespaces' start-up (7 ms a call instead of 25-35 ms with bwrap) and no call's state reaches
another's.

docs/tools.md lists what each mode was tested to stop, and the start-up cost of each.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import fcntl
import functools
import logging
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from mathrl.tools.base import ToolResult
from mathrl.tools.sandbox_memory import CallMemory, memory_bound
from mathrl.tools.sandbox_seccomp import seccomp_program

__all__ = ["LIMIT_DEFAULTS", "ROOT_UID_BASE", "SANDBOX_MODES", "UNSAFE_MODES", "WarmSandboxes", "check_python_kwargs", "python",
           "run_python", "sandbox_mode", "sandbox_problem", "sandbox_works", "warm_sandboxes"]

log = logging.getLogger(__name__)

SANDBOX_MODES = ("auto", "bwrap", "unshare_unsafe", "rlimit_unsafe")
"""Values of the `sandbox` kwarg. ``auto`` is ``bwrap``, the one mode that isolates hostile code (see
`sandbox_mode`); the ``_unsafe`` ones run model code without a boundary around the host's files (and,
for rlimit, its network and processes), only for code you trust, with a warning once per process."""

UNSAFE_MODES = {"unshare_unsafe": "unshare", "rlimit_unsafe": "rlimit"}
"""The unsafe spellings and the mechanism each names (`_Call.mode`)."""

LIMIT_DEFAULTS = {
    "cpu_s": 5.0,  # CPU seconds (RLIMIT_CPU); past it the call is a timeout
    "memory_mb": 512,  # per process: address space (RLIMIT_AS, MemoryError); per call: all processes together
    "max_processes": 32,  # processes and threads of the sandbox's user (RLIMIT_NPROC)
    "max_file_mb": 16,  # largest file written (RLIMIT_FSIZE); bwrap's /tmp holds TMPFS_FILES times it
    "max_open_files": 64,  # open file descriptors (RLIMIT_NOFILE)
    "max_output_bytes": 65536,  # stdout + stderr kept; past it the program is killed
}
"""The sandbox's limits (kwargs of the `python` tool) and their defaults."""

OTHER_KWARGS = ("sandbox", "python", "audit_hook", "site_packages", "warm")
"""The `python` tool's other kwargs: the mode, the interpreter (default `sys.executable`), the
audit hook (None: on where there is no mount namespace), the interpreter's site-packages, and the
sandboxes a `ToolPool` keeps started ahead (`warm`, 0: none)."""

TMPFS_FILES = 4
"""bwrap's writable /tmp is `TMPFS_FILES` x `max_file_mb`: the limit on all files together."""

ROOT_UID_BASE = 65000
"""As root, a call's code runs as uid/gid ROOT_UID_BASE + slot (slot < ROOT_UID_SLOTS): Debian's
reserved 65000-65533 range, below 65536 so that a container's 64 Ki user-namespace map holds it."""
ROOT_UID_SLOTS = 500
_last_slot = -1  # the slot this process claimed last (`_claimed_uid`)

_GRACE_S = 0.5  # after the program exits: how long its escaped descendants may keep the pipes open
_POLL_S = 0.05  # how often the wait for output also checks the process, the deadline and `stop`
_PROBE_TIMEOUT_S = 60.0  # a mode's first-use check may wait this long on a loaded machine
_STDIN_CODE_BYTES = 60000  # code up to this size goes to a pre-started sandbox through its stdin pipe (64 KiB
# of buffer: the write never waits for the sandbox); longer code starts a sandbox of its own


# ---------------------------------------------------------------------------------------------------
# The runner: the first code the sandboxed interpreter runs, before the model's
# ---------------------------------------------------------------------------------------------------

_RUNNER = r'''
import sys
def _prepare():
    import os, resource, _signal
    drop_to, code_path, limits, audit = sys.argv[1:5]
    # The CPU limit's SIGXCPU, as an exit code the parent recognises. A handler rather than the
    # default action because a pid namespace's init (the code, under unshare) ignores default-action
    # signals; the hard limit's SIGKILL a second later is the enforcement either way.
    _signal.signal(_signal.SIGXCPU, lambda *_: os._exit(128 + _signal.SIGXCPU))
    if drop_to:  # bwrap as root kept CAP_SETUID/CAP_SETGID for this only
        os.setgroups([])
        os.setgid(int(drop_to))
        os.setuid(int(drop_to))
    for item in limits.split(","):  # set here: inside the user namespace, and once the uid is dropped
        name, soft, hard = item.replace("=", ":").split(":")
        resource.setrlimit(getattr(resource, name), (int(soft), int(hard)))
    if code_path == "-":  # a pre-started sandbox: it waits here, limits set, until the parent sends the code
        source = sys.stdin.buffer.read().decode("utf-8", "replace")  # EOF (the parent gone): nothing to run
    else:
        with open(code_path, encoding="utf-8", errors="replace") as f:
            source = f.read()
    sys.argv = [""]
    if audit:
        _install_hook(*audit.split("\n", 1))
    return source
def _install_hook(home, readable):
    import os
    readable = readable.split("\n")
    deny = {"os.system", "os.exec", "os.spawn", "os.posix_spawn", "os.fork", "os.forkpty", "subprocess.Popen",
            "os.kill", "os.killpg", "signal.pthread_kill", "socket.__new__", "socket.connect", "socket.bind",
            "socket.sendto", "socket.sendmsg", "socket.getaddrinfo", "ctypes.dlopen", "ctypes.dlsym",
            "ctypes.cdata", "ctypes.call_function", "sys.remote_exec"}
    writes = {"os.remove", "os.rmdir", "os.mkdir", "os.rename", "os.link", "os.symlink", "os.chmod", "os.chown",
              "os.truncate", "os.utime", "os.mkfifo", "os.mknod", "os.setxattr", "os.removexattr", "os.chflags",
              "shutil.rmtree", "shutil.copyfile", "shutil.move"}
    reads = {"os.listdir", "os.scandir", "glob.glob", "os.chdir"}
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
    own_proc = ("/proc/self", "/proc/thread-self", "/proc/%d" % os.getpid())
    realpath, fsdecode = os.path.realpath, os.fsdecode
    def under(path, roots):
        if isinstance(path, int):
            return True  # an fd: it was opened under these rules
        path = realpath(fsdecode(path))
        return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)
    def readable_path(path):
        if isinstance(path, int):
            return True
        path = realpath(fsdecode(path))
        if path == "/proc" or path.startswith("/proc/"):  # its own entries only: others' environ, cmdline
            return path == "/proc" or under(path, own_proc)
        return under(path, [home, *readable])
    def hook(event, args):
        if event in deny or (event == "import" and args[0] in ("ctypes", "_ctypes")):
            raise PermissionError(f"{event} is not allowed in this sandbox")
        if event == "open":
            path, mode, flags = args
            writing = (mode and any(c in mode for c in "wax+")) or (flags or 0) & write_flags
            if not (under(path, [home, "/dev/null"]) if writing else readable_path(path)):
                raise PermissionError(f"{'writing' if writing else 'reading'} {path!r} is not allowed in this sandbox")
        elif event in writes or event in reads:
            paths = [a for a in args[:2] if isinstance(a, (str, bytes, os.PathLike))] or [args[0]]
            allowed = (lambda p: under(p, [home])) if event in writes else readable_path
            if not all(allowed(p) for p in paths):
                raise PermissionError(f"{event} {paths[0]!r} is not allowed in this sandbox")
    sys.addaudithook(hook)
def _run(source):
    import _ast  # the C module: importing ast (and traceback, json, re) would double the start-up time
    scope = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        body = compile(source, "<code>", "exec", _ast.PyCF_ONLY_AST).body
        last = body[-1:] if body and isinstance(body[-1], _ast.Expr) else []
        exec(compile(_ast.Module(body[: len(body) - len(last)], []), "<code>", "exec"), scope)
        if last:  # REPL: the value of a final expression is shown (repr; None is not)
            exec(compile(_ast.Interactive(last), "<code>", "single"), scope)
    except SystemExit:
        raise
    except BaseException as e:
        try:
            sys.stdout.flush()
        except BaseException:
            pass
        if isinstance(e, SyntaxError):
            line = f"{type(e).__name__}: {e}"
        else:
            import traceback
            line = traceback.format_exception_only(type(e), e)[-1].rstrip("\n")
        sys.stderr.write(line + "\n")
        sys.exit(1)
_run(_prepare())
'''


# ---------------------------------------------------------------------------------------------------
# The tool
# ---------------------------------------------------------------------------------------------------


def python(args: str | dict, **kwargs) -> str:
    """The tool function (contract ``fn(args, **kwargs) -> str``): what the model reads.

    `args` is the code or ``{"code": str}``; kwargs are `run_python`'s (`timeout_s` included).
    """
    return run_python(args, **kwargs).text


@dataclass(frozen=True)
class _Call:
    """One call's settings after checking: the mode resolved, limits as numbers."""

    mode: str
    python: str  # the interpreter, symlinks resolved
    limits: dict
    audit_hook: bool
    site_packages: bool = False  # the interpreter's site-packages importable (sympy, numpy): no -S


def run_python(args: str | dict, *, timeout_s: float = 5.0, stop: threading.Event | None = None,
               prestarted: WarmSandboxes | None = None, **kwargs) -> ToolResult:
    """Run model-written code in a sandbox; never raises.

    Args:
        args: the code, or ``{"code": str}``.
        timeout_s: wall-clock seconds, from the start of the subprocess (or, in a pre-started sandbox,
            from when the code is sent); then the group is killed.
        stop: when set (e.g. by `ToolPool.close`), the running program is killed and the call ends.
        prestarted: sandboxes started ahead (`WarmSandboxes`) to take this call's from; one started for
            these settings is used once and never again. Without them, when none is ready, or for code
            over 60000 bytes, the sandbox starts now.
        kwargs: `sandbox` (`SANDBOX_MODES`), `python`, `audit_hook`, `site_packages`, `warm` (read by
            the `ToolPool`) and the limits of `LIMIT_DEFAULTS`.
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
        text, status = outcome or _run_in_sandbox(code, call, timeout_s=timeout_s, stop=stop)
    except _Refused as e:
        text, status = f"error: {e}", "error"
    except Exception as e:  # a broken host (no /tmp space, ...): still an observation, not a crash
        text, status = f"error: the sandbox failed: {type(e).__name__}: {_one_line(str(e))}", "error"
    return ToolResult(text, status, time.perf_counter() - start)


class _Refused(Exception):
    """A call that cannot run, with the one-line reason the model (or the log) reads."""


def _code_of(args: str | dict) -> str:
    if isinstance(args, dict):
        if set(args) != {"code"} or not isinstance(args["code"], str):
            raise _Refused('expected {"code": "<python>"}, got keys ' + ", ".join(map(repr, args)))
        return args["code"]
    if not isinstance(args, str):
        raise _Refused(f"expected python code as a string, got {type(args).__name__}")
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


def _resolve(kwargs: dict) -> _Call:
    interpreter = os.path.realpath(kwargs.get("python") or sys.executable)
    mode = kwargs.get("sandbox", "auto")
    if mode == "auto":
        try:
            mode = sandbox_mode(python=interpreter)
        except RuntimeError as e:
            raise _Refused(str(e)) from None
    else:
        problem = sandbox_problem(mode, python=interpreter)
        if problem:
            raise _Refused(f"sandbox {mode!r} does not work here: {problem}")
        if mode in UNSAFE_MODES:
            _warn_unsafe(mode)
            mode = UNSAFE_MODES[mode]
    hook = kwargs.get("audit_hook")
    limits = {k: kwargs.get(k, v) for k, v in LIMIT_DEFAULTS.items()}
    return _Call(mode, interpreter, limits, mode != "bwrap" if hook is None else bool(hook),
                 site_packages=bool(kwargs.get("site_packages", False)))


@functools.lru_cache(maxsize=None)
def _warn_unsafe(mode: str) -> None:
    """Once per process and mode."""
    log.warning("python tool: sandbox=%s runs model-written code without isolation from the host's files%s; "
                "use it only for code you trust", mode, "" if mode == "unshare_unsafe" else ", network and processes")


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


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
    if tool and _binary(tool) is None:
        return f"{tool} is not installed (apt-get install {'bubblewrap' if tool == 'bwrap' else 'util-linux'})"
    if mode == "bwrap" and not _bwrap_is_recent():
        return "bubblewrap 0.8 or newer is needed (--size, --perms on --tmpfs and --dir, --disable-userns)"
    call = _Call(mode, interpreter, dict(LIMIT_DEFAULTS), mode != "bwrap")
    try:
        text, status = _run_in_sandbox("print(1+1)", call, timeout_s=_PROBE_TIMEOUT_S, stop=None)
    except _Refused as e:
        text, status = f"error: {e}", "error"
    except Exception as e:
        text, status = f"error: {type(e).__name__}: {_one_line(str(e))}", "error"
    if status == "ok" and text == "2":
        return None
    reason = _one_line(text.removeprefix("error: ") or f"status {status}, no output")
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
        log.info("python tool sandbox: bwrap; memory per call bounded by %s", memory_bound())
        return "bwrap"
    raise RuntimeError(f"no safe python sandbox works here (bwrap: {problem}); install bubblewrap from the "
                       "distribution's packages (apt-get install bubblewrap, dnf install bubblewrap); "
                       "sandbox=unshare_unsafe or rlimit_unsafe run model code without isolation")


def _bwrap_is_recent() -> bool:
    """Whether bwrap has the options of 0.8 this module uses (its --help lists them)."""
    try:
        usage = subprocess.run([_binary("bwrap"), "--help"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return all(option in usage for option in ("--size", "--perms", "--disable-userns"))


def _binary(name: str) -> str | None:
    """/usr/bin/<name> (the system's: PATH may point elsewhere), else the one on PATH."""
    return f"/usr/bin/{name}" if os.access(f"/usr/bin/{name}", os.X_OK) else shutil.which(name)


# ---------------------------------------------------------------------------------------------------
# One run
# ---------------------------------------------------------------------------------------------------


def _run_in_sandbox(code: str, call: _Call, *, timeout_s: float, stop: threading.Event | None) -> tuple[str, str]:
    """(text, status) of running `code` under `call`'s mode and limits, in a sandbox started now."""
    with contextlib.ExitStack() as stack:
        work_dir, uid = _workspace(stack, call, code=code)
        memory = _call_memory(stack, call, uid)
        proc = _start(call, work_dir, uid, memory, stdin_code=False)
        return _finish(proc, call, uid, memory, timeout_s=timeout_s, stop=stop)


def _workspace(stack: contextlib.ExitStack, call: _Call, *, code: str | None) -> tuple[Path, int | None]:
    """A fresh temporary directory (its `home` is the code's cwd and HOME; `code.py` holds `code`
    unless the code comes through stdin) and, as root, a claimed uid; `stack` releases both.

    The directory stays this process's (mode 0711 as root): only `home` is the code's uid's (in the
    modes that run on the host's files), so the code cannot rename its directory away from the
    cleanup, which removes it without recursion (`_remove_tree`)."""
    root = os.geteuid() == 0
    work_dir = Path(tempfile.mkdtemp(prefix="mathrl-py-"))
    stack.callback(_remove_tree, work_dir)
    uid = stack.enter_context(_claimed_uid(root))
    home = work_dir / "home"
    home.mkdir()
    if code is not None:
        code_file = work_dir / "code.py"
        code_file.write_text(code, encoding="utf-8", errors="replace")  # a lone surrogate from JSON: U+FFFD
        code_file.chmod(0o644)
    if uid is not None and call.mode != "bwrap":
        work_dir.chmod(0o711)
        os.chown(home, uid, uid)
    return work_dir, uid


def _call_memory(stack: contextlib.ExitStack, call: _Call, uid: int | None) -> CallMemory:
    """The call's memory bound: a cgroup when the sandbox's first process runs as this process's user
    (bwrap; the unsafe modes start as the call's uid when root), else the watchdog."""
    memory = CallMemory(int(call.limits["memory_mb"]) << 20, cgroup=call.mode == "bwrap" or uid is None)
    stack.callback(memory.close)
    return memory


def _remove_tree(path: Path) -> None:
    """Remove `path` and everything in it, however deep (coreutils' rm walks with file descriptors;
    shutil.rmtree recurses and fails past about a thousand levels), also where the code took its own
    permissions away."""
    for attempt in range(2):
        done = subprocess.run(["rm", "-rf", "--one-file-system", "--", str(path)], stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={"PATH": "/usr/bin:/bin"})
        if done.returncode == 0 or not path.exists():
            return
        if attempt == 0:  # a directory the code made unreadable (possible when it runs as this user)
            subprocess.run(["chmod", "-R", "u+rwx", "--", str(path)], stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={"PATH": "/usr/bin:/bin"})
    log.warning("python tool: could not remove %s", path)


def _start(call: _Call, work_dir: Path, uid: int | None, memory: CallMemory, *, stdin_code: bool) -> subprocess.Popen:
    """The sandbox's process: its runner reads the code from work_dir/code.py, or from its stdin."""
    with contextlib.ExitStack() as stack:
        seccomp_fd = None
        if call.mode == "bwrap" and (program := seccomp_program()) is not None:
            seccomp_fd = os.memfd_create("mathrl-seccomp", os.MFD_CLOEXEC)
            stack.callback(os.close, seccomp_fd)
            os.write(seccomp_fd, program)
            os.lseek(seccomp_fd, 0, os.SEEK_SET)
        argv, options = _command(call, work_dir=work_dir, uid=uid, stdin_code=stdin_code, seccomp_fd=seccomp_fd)
        try:
            return subprocess.Popen(memory.wrap(argv), stdin=subprocess.PIPE if stdin_code else subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                    close_fds=True, pass_fds=() if seccomp_fd is None else (seccomp_fd,), **options)
        except OSError as e:
            raise _Refused(f"cannot start the sandbox: {e}") from None


def _finish(proc: subprocess.Popen, call: _Call, uid: int | None, memory: CallMemory, *, timeout_s: float,
            stop: threading.Event | None) -> tuple[str, str]:
    """Wait for the program (its output capped, its memory watched, the deadline `timeout_s` from
    now), then kill whatever of it is left; (text, status)."""
    try:
        stdout, stderr, ended = _collect(proc, deadline=time.monotonic() + timeout_s,
                                         cap=int(call.limits["max_output_bytes"]), stop=stop,
                                         over_memory=lambda: memory.exceeded(proc.pid))
        if ended == "exit" and memory.exceeded(proc.pid):  # a process the kernel stopped at the limit
            ended = "memory"
    finally:
        _end(proc, call, uid)
    return _outcome(proc.returncode, stdout, stderr, ended, call, timeout_s)


def _end(proc: subprocess.Popen, call: _Call, uid: int | None) -> None:
    """Kill the sandbox's process group (and as root in rlimit mode every process of its uid); close its pipes."""
    _kill_group(proc)
    if uid is not None and call.mode == "rlimit":
        _kill_uid(uid)
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()


# ---------------------------------------------------------------------------------------------------
# Sandboxes started ahead of their calls
# ---------------------------------------------------------------------------------------------------


class _Prestarted:
    """One sandbox started ahead of its call: its runner has started python inside the sandbox, set
    the limits and waits on its stdin for the code. It runs one call, then it and its temporary
    directory are gone."""

    def __init__(self, call: _Call):
        self.call = call
        self._stack = contextlib.ExitStack()
        try:
            self.work_dir, self.uid = _workspace(self._stack, call, code=None)
            self.memory = _call_memory(self._stack, call, self.uid)
            self.proc = _start(call, self.work_dir, self.uid, self.memory, stdin_code=True)
        except BaseException:
            self._stack.close()
            raise
        self._ended = False

    def run(self, code: str, *, timeout_s: float, stop: threading.Event | None) -> tuple[str, str] | None:
        """(text, status) of `code`, or None when the sandbox died while it waited (start another)."""
        try:
            try:
                self.proc.stdin.write(code.encode("utf-8", "replace"))  # <= 60000 bytes: fits the pipe
                self.proc.stdin.close()
            except OSError:  # BrokenPipeError: it is gone
                return None
            self._ended = True
            try:
                return _finish(self.proc, self.call, self.uid, self.memory, timeout_s=timeout_s, stop=stop)
            finally:
                self._stack.close()
        finally:
            self.close()

    def close(self) -> None:
        """Kill it unused (or after its call) and delete its directory. Idempotent."""
        if not self._ended:
            self._ended = True
            _end(self.proc, self.call, self.uid)
        self._stack.close()


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
            self.call: _Call | None = _resolve(kwargs)
        except _Refused:  # no working mode: every call says why (cold)
            self.call, size = None, 0
        self.size = size
        self.taken = 0  # calls served by a sandbox started ahead
        self._ready: collections.deque[_Prestarted] = collections.deque()
        self._lock = threading.Lock()
        self._closed = False
        self.refill()

    def take(self, call: _Call) -> _Prestarted | None:
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
            started = _Prestarted(self.call)
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


def _limits(limits: dict) -> dict:
    """resource.RLIMIT_* name -> (soft, hard), as the runner sets them."""
    cpu = max(1, int(-(-limits["cpu_s"] // 1)))  # whole seconds, rounded up
    return {
        "RLIMIT_CPU": (cpu, cpu + 1),  # SIGXCPU at the soft limit, SIGKILL a second later
        "RLIMIT_AS": (int(limits["memory_mb"]) << 20,) * 2,
        "RLIMIT_NPROC": (int(limits["max_processes"]),) * 2,
        "RLIMIT_FSIZE": (int(limits["max_file_mb"]) << 20,) * 2,
        "RLIMIT_NOFILE": (int(limits["max_open_files"]),) * 2,
        "RLIMIT_CORE": (0, 0),
    }


def _command(call: _Call, *, work_dir: Path, uid: int | None, stdin_code: bool = False,
             seccomp_fd: int | None = None) -> tuple[list[str], dict]:
    """The argv and Popen options that run the runner under `call.mode` (the code from stdin, or code.py)."""
    bwrap = call.mode == "bwrap"
    home = "/tmp" if bwrap else str(work_dir / "home")
    limits = ",".join(f"{name}={soft}:{hard}" for name, (soft, hard) in _limits(call.limits).items())
    audit = "\n".join([home, *_readable_roots(call.python)]) if call.audit_hook else ""
    code = "-" if stdin_code else "/code.py" if bwrap else str(work_dir / "code.py")
    runner = [call.python, "-I", *([] if call.site_packages else ["-S"]), "-B", "-c", _RUNNER, str(uid) if bwrap and uid is not None else "", code,
              limits, audit]
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": home}
    options: dict = {"env": env, "cwd": str(work_dir if bwrap else home)}
    if uid is not None and not bwrap:  # as root: start as the call's own unprivileged uid (thread-safe, no preexec)
        options.update(user=uid, group=uid, extra_groups=[])
    if bwrap:
        seccomp = [] if seccomp_fd is None else ["--seccomp", str(seccomp_fd)]
        return [_binary("bwrap"), *_bwrap_args(call, work_dir=work_dir, root=uid is not None, env=env,
                                               code_file=not stdin_code), *seccomp, *runner], options
    if call.mode == "unshare":
        # --map-current-user, not --map-root-user: the code is its own uid inside, without the
        # namespace's capabilities (umount2 of /proc would show the host's)
        return [_binary("unshare"), "--user", "--map-current-user", "--net", "--pid", "--fork", "--kill-child",
                "--mount-proc", *runner], options
    return runner, options


def _bwrap_args(call: _Call, *, work_dir: Path, root: bool, env: dict, code_file: bool = True) -> list[str]:
    if root:
        # Without a user namespace, as root: the code must run as a real unprivileged uid for
        # RLIMIT_NPROC to apply (a user namespace would map it back to uid 0); the runner drops to it.
        namespaces = ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
                      "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        namespaces = ["--unshare-all", "--unshare-user", "--disable-userns"]
    args = [*namespaces, "--die-with-parent", "--new-session", "--ro-bind", "/usr", "/usr"]
    for path in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for path in ("/etc/alternatives", "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime"):
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    prefix = os.path.dirname(os.path.dirname(call.python))  # <prefix>/bin/python3.x
    if not (prefix == "/usr" or prefix.startswith("/usr/")):
        # bwrap would create the missing parents with the host's modes (/root: 0700), which the
        # dropped uid could not cross: create them 0755 (empty: only the prefix is bound inside)
        parents = [str(p) for p in reversed(Path(prefix).parents) if str(p) != "/"]
        for parent in parents:
            args += ["--perms", "0755", "--dir", parent]
        args += ["--ro-bind", prefix, prefix]
    tmpfs_bytes = int(call.limits["max_file_mb"]) * TMPFS_FILES << 20
    args += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--size", str(tmpfs_bytes), "--tmpfs", "/tmp",
             *(["--ro-bind", str(work_dir / "code.py"), "/code.py"] if code_file else []),
             "--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/tmp", "--clearenv"]
    for key, value in env.items():
        args += ["--setenv", key, value]
    return args


def _readable_roots(interpreter: str) -> list[str]:
    """What the audit hook lets the code read: the interpreter's prefix and the system's libraries."""
    prefix = os.path.dirname(os.path.dirname(interpreter))
    return sorted({prefix, "/usr", "/lib", "/lib64", "/dev/null", "/dev/urandom", "/dev/zero", "/etc/localtime",
                   os.path.realpath("/usr"), os.path.realpath("/lib")})


def _collect(proc: subprocess.Popen, *, deadline: float, cap: int, stop: threading.Event | None,
             over_memory=lambda: False) -> tuple[bytes, bytes, str]:
    """Read stdout and stderr until the program has exited and both pipes are closed. Returns them
    (each cut to `cap` bytes) and how the wait ended: ``exit``, ``timeout``, ``output`` (more than
    `cap` bytes in all), ``memory`` (`over_memory()`, asked at most every _POLL_S) or ``stopped``.
    A program that closes its pipes early still gets its time."""
    out, err = proc.stdout.fileno(), proc.stderr.fileno()
    buffers = {out: bytearray(), err: bytearray()}
    total = 0
    exited_at = None
    memory_checked = 0.0

    def result(ended: str) -> tuple[bytes, bytes, str]:
        return bytes(buffers[out]), bytes(buffers[err]), ended

    with selectors.DefaultSelector() as selector, _exit_fd(proc) as exit_fd:
        for fd in (out, err, exit_fd):
            if fd is not None:
                selector.register(fd, selectors.EVENT_READ)
        while True:
            now = time.monotonic()
            if stop is not None and stop.is_set():
                return result("stopped")
            if now >= deadline:
                return result("timeout")
            if exited_at is None and now - memory_checked >= _POLL_S:
                memory_checked = now
                if over_memory():
                    return result("memory")
            if exited_at is None and _exited(proc):
                exited_at = now
                _kill_group(proc)  # descendants left in its group would hold the pipes open
            if exited_at is not None and (not (selector.get_map().keys() & {out, err}) or now - exited_at > _GRACE_S):
                return result("exit")  # (past the grace: a descendant that left the group holds a pipe)
            for key, _ in selector.select(timeout=min(_POLL_S, deadline - now)):
                if key.fd == exit_fd:
                    selector.unregister(exit_fd)  # noticed by _exited on the next turn
                    continue
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fd)
                    continue
                total += len(chunk)
                buffers[key.fd] += chunk[: max(0, cap - len(buffers[key.fd]))]
                if total > cap:
                    return result("output")


@contextlib.contextmanager
def _exit_fd(proc: subprocess.Popen):
    """A pidfd of the child (readable once it exits) so the wait wakes at its exit, or None where the
    kernel has none (the wait then notices the exit within _POLL_S)."""
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        yield None
        return
    try:
        yield fd
    finally:
        os.close(fd)


def _exited(proc: subprocess.Popen) -> bool:
    """Whether the child has exited, without reaping it: until it is reaped its pid, which is also its
    group's id, cannot be reused, so `_kill_group` cannot hit another process's group."""
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the call's process group (its session: start_new_session), then reap the child."""
    if proc.returncode is not None:
        return  # reaped already, and its group killed before that
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5.0)


def _kill_uid(uid: int) -> None:
    """Kill every process of `uid` (root, rlimit mode), also those that left the process group with
    setsid, from this process (as root: nothing of the uid's can stop it), pass after pass until a pass
    finds none (a process forking meanwhile is bounded by RLIMIT_NPROC). The uid is this call's alone."""
    for _ in range(100):
        found = _processes_of(uid)
        if not found:
            return
        for pid in found:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)
    log.warning("python tool: processes of uid %d were still starting after 100 passes of SIGKILL", uid)


def _processes_of(uid: int) -> list[int]:
    """The live (not zombie) processes whose real, effective or saved uid is `uid`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except (OSError, ValueError):
            continue
        if uid in map(int, fields.get("Uid", "").split()[:3]) and not fields.get("State", "").strip().startswith("Z"):
            found.append(int(entry))
    return found


def _signal_of(returncode: int, mode: str) -> int | None:
    """The signal that ended the program: Popen's negative code, bwrap's 128 + signal, or the runner's
    128 + SIGXCPU (its handler's exit code; see _RUNNER)."""
    if returncode < 0:
        return -returncode
    if (mode == "bwrap" and 128 < returncode < 128 + 65) or returncode == 128 + signal.SIGXCPU:
        return returncode - 128
    return None


def _outcome(returncode: int | None, stdout: bytes, stderr: bytes, ended: str, call: _Call,
             timeout_s: float) -> tuple[str, str]:
    cap = int(call.limits["max_output_bytes"])
    output = (stdout + stderr)[:cap].decode("utf-8", errors="replace").rstrip()
    if ended == "stopped":
        return "error: the tool pool was closed during the call", "error"
    if ended == "timeout":
        return f"timeout: the code ran longer than {timeout_s:g} s and was stopped", "timeout"
    if ended == "output":
        return f"{output}\nerror: output exceeded {cap} bytes; the program was stopped", "error"
    if ended == "memory":
        return ((f"{output}\n" if output else "") + f"error: the program's processes together used more than "
                f"{int(call.limits['memory_mb'])} MiB of memory; it was stopped"), "error"
    number = _signal_of(returncode if returncode is not None else -signal.SIGKILL, call.mode)
    if number == signal.SIGXCPU:
        return f"timeout: the code used more than {call.limits['cpu_s']:g} s of CPU and was stopped", "timeout"
    if number is not None:
        name = signal.Signals(number).name if number in signal.Signals._value2member_map_ else f"signal {number}"
        return (f"{output}\n" if output else "") + f"error: the program was killed by {name}", "error"
    if returncode == 0:
        return output, "ok"
    return output or f"error: the program exited with code {returncode}", "error"


# ---------------------------------------------------------------------------------------------------
# As root: one unprivileged uid per concurrent call on the machine
# ---------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _claimed_uid(root: bool):
    """Yield a uid no other call on this machine is using (None when not root): RLIMIT_NPROC counts
    per uid, so a fork bomb in one call must not use up another's processes, and kill(-1) in one
    must not reach another. A lock file per uid, held for the call, in a directory only root uses."""
    if not root:
        yield None
        return
    # Machine-wide, whatever TMPDIR says: /run (root's, cleared at boot) where there is one
    folder = Path("/run" if os.access("/run", os.W_OK) else "/tmp") / "mathrl-sandbox-uids"
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=0o700)
    info = os.lstat(folder)
    if not (os.path.isdir(folder) and not os.path.islink(folder) and info.st_uid == 0 and info.st_mode & 0o077 == 0):
        raise _Refused(f"{folder} must be a directory of root's with mode 0700")
    # The search starts after the slot last claimed here, so that consecutive calls of this process
    # take different uids (a uid is free again only once its call ended and every process of it is gone)
    global _last_slot
    for slot in (_last_slot + 1 + i for i in range(ROOT_UID_SLOTS)):
        uid = ROOT_UID_BASE + slot % ROOT_UID_SLOTS
        fd = os.open(folder / str(uid), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                continue
            raise
        _last_slot = slot % ROOT_UID_SLOTS
        try:
            yield uid
        finally:
            os.close(fd)  # releases the lock
        return
    raise _Refused(f"all {ROOT_UID_SLOTS} sandbox uids are in use")
