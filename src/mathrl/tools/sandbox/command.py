"""How the python tool's sandbox is started, per mode: the argv and Popen options that run the runner
(`runner.py`) under bwrap, unshare or nothing, and the settings of one call (`Call`).

    argv, options = command(call, work_dir=..., uid=None, stdin_code=False, seccomp_fd=None)

`MODE_ARGV` is keyed by mode (the mechanism, `Call.mode`: ``bwrap``, ``unshare``, ``rlimit``); each
entry wraps the runner's argv in what isolates it.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MODE_ARGV", "RUNNER_SOURCE", "TMPFS_FILES", "Call", "binary", "command", "rlimits", "tmpfs_bytes"]

RUNNER_SOURCE = Path(__file__).with_name("runner.py").read_text(encoding="utf-8")
"""The runner's text, passed to ``python -c`` (the sandbox does not mount the package)."""

TMPFS_FILES = 4
"""bwrap's writable /tmp is `TMPFS_FILES` x `max_file_mb`: the limit on all files together."""


@dataclass(frozen=True)
class Call:
    """One call's settings after checking: the mode resolved, limits as numbers."""

    mode: str
    python: str  # the interpreter, symlinks resolved
    limits: dict
    audit_hook: bool
    site_packages: bool = False  # the interpreter's site-packages importable (sympy, numpy): no -S


def command(call: Call, *, work_dir: Path, uid: int | None, stdin_code: bool = False,
            seccomp_fd: int | None = None) -> tuple[list[str], dict]:
    """The argv and Popen options that run the runner under `call.mode` (the code from stdin, or code.py)."""
    bwrap = call.mode == "bwrap"
    home = "/tmp" if bwrap else str(work_dir / "home")
    limits = ",".join(f"{name}={soft}:{hard}" for name, (soft, hard) in rlimits(call.limits).items())
    audit = "\n".join([home, *_readable_roots(call.python)]) if call.audit_hook else ""
    code = "-" if stdin_code else "/code.py" if bwrap else str(work_dir / "code.py")
    runner = [call.python, "-I", *([] if call.site_packages else ["-S"]), "-B", "-c", RUNNER_SOURCE,
              str(uid) if bwrap and uid is not None else "", code, limits, audit]
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": home}
    options: dict = {"env": env, "cwd": str(work_dir if bwrap else home)}
    if uid is not None and not bwrap:  # as root: start as the call's own unprivileged uid (thread-safe, no preexec)
        options.update(user=uid, group=uid, extra_groups=[])
    argv = MODE_ARGV[call.mode](call, runner, work_dir=work_dir, uid=uid, env=env, stdin_code=stdin_code,
                                seccomp_fd=seccomp_fd)
    return argv, options


def _bwrap_argv(call: Call, runner: list[str], *, work_dir: Path, uid: int | None, env: dict, stdin_code: bool,
                seccomp_fd: int | None) -> list[str]:
    seccomp = [] if seccomp_fd is None else ["--seccomp", str(seccomp_fd)]
    return [binary("bwrap"), *_bwrap_args(call, work_dir=work_dir, root=uid is not None, env=env,
                                          code_file=not stdin_code), *seccomp, *runner]


def _unshare_argv(call: Call, runner: list[str], **_) -> list[str]:
    # --map-current-user, not --map-root-user: the code is its own uid inside, without the
    # namespace's capabilities (umount2 of /proc would show the host's)
    return [binary("unshare"), "--user", "--map-current-user", "--net", "--pid", "--fork", "--kill-child",
            "--mount-proc", *runner]


def _rlimit_argv(call: Call, runner: list[str], **_) -> list[str]:
    return runner


MODE_ARGV = {"bwrap": _bwrap_argv, "unshare": _unshare_argv, "rlimit": _rlimit_argv}
"""mode -> fn(call, runner argv, *, work_dir, uid, env, stdin_code, seccomp_fd) -> the argv to start."""


def rlimits(limits: dict) -> dict:
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


def _bwrap_args(call: Call, *, work_dir: Path, root: bool, env: dict, code_file: bool = True) -> list[str]:
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
    args += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--size", str(tmpfs_bytes(call.limits)), "--tmpfs", "/tmp",
             *(["--ro-bind", str(work_dir / "code.py"), "/code.py"] if code_file else []),
             "--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/tmp", "--clearenv"]
    for key, value in env.items():
        args += ["--setenv", key, value]
    return args


def tmpfs_bytes(limits: dict) -> int:
    """The size of bwrap's /tmp: `TMPFS_FILES` x max_file_mb."""
    return int(limits["max_file_mb"]) * TMPFS_FILES << 20


def _readable_roots(interpreter: str) -> list[str]:
    """What the audit hook lets the code read: the interpreter's prefix and the system's libraries."""
    prefix = os.path.dirname(os.path.dirname(interpreter))
    return sorted({prefix, "/usr", "/lib", "/lib64", "/dev/null", "/dev/urandom", "/dev/zero", "/etc/localtime",
                   os.path.realpath("/usr"), os.path.realpath("/lib")})


def binary(name: str) -> str | None:
    """/usr/bin/<name> (the system's: PATH may point elsewhere), else the one on PATH."""
    return f"/usr/bin/{name}" if os.access(f"/usr/bin/{name}", os.X_OK) else shutil.which(name)
