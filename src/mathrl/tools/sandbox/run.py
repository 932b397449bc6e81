"""One run of model code in the python tool's sandbox: the call's temporary directory and uid, the
process started (`command.py`), its output read with caps and deadlines, its memory watched
(`memory.py`), whatever is left of it killed, and the outcome as the model reads it.

    text, status = run_in_sandbox(code, call, timeout_s=5.0, stop=None)
    started = Prestarted(call); started.run(code, timeout_s=5.0, stop=None)   # started ahead of its call
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import selectors
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from mathrl.tools.sandbox.command import Call, command, tmpfs_bytes
from mathrl.tools.sandbox.memory import CallMemory
from mathrl.tools.sandbox.seccomp import seccomp_program

__all__ = ["ROOT_UID_BASE", "Prestarted", "Refused", "one_line", "run_in_sandbox"]

log = logging.getLogger(__name__)

ROOT_UID_BASE = 65000
"""As root, a call's code runs as uid/gid ROOT_UID_BASE + slot (slot < ROOT_UID_SLOTS): Debian's
reserved 65000-65533 range, below 65536 so that a container's 64 Ki user-namespace map holds it."""
ROOT_UID_SLOTS = 500
_last_slot = -1  # the slot this process claimed last (`_claimed_uid`)

_GRACE_S = 0.5  # after the program exits: how long its escaped descendants may keep the pipes open
_POLL_S = 0.05  # how often the wait for output also checks the process, the deadline, memory and `stop`


class Refused(Exception):
    """A call that cannot run, with the one-line reason the model (or the log) reads."""


def one_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def run_in_sandbox(code: str, call: Call, *, timeout_s: float, stop: threading.Event | None) -> tuple[str, str]:
    """(text, status) of running `code` under `call`'s mode and limits, in a sandbox started now."""
    with contextlib.ExitStack() as stack:
        work_dir, uid = _workspace(stack, call, code=code)
        memory = _call_memory(stack, call, uid)
        proc = _start(call, work_dir, uid, memory, stdin_code=False)
        return _finish(proc, call, uid, memory, timeout_s=timeout_s, stop=stop)


def _workspace(stack: contextlib.ExitStack, call: Call, *, code: str | None) -> tuple[Path, int | None]:
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


def _call_memory(stack: contextlib.ExitStack, call: Call, uid: int | None) -> CallMemory:
    """The call's memory bound: a cgroup when the sandbox's first process runs as this process's user
    (bwrap; the unsafe modes start as the call's uid when root), else the watchdog."""
    memory = CallMemory(int(call.limits["memory_mb"]) << 20, cgroup=call.mode == "bwrap" or uid is None,
                        tmpfs=(tmpfs_bytes(call.limits), int(call.limits["max_files"])) if call.mode == "bwrap" else None)
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


def _start(call: Call, work_dir: Path, uid: int | None, memory: CallMemory, *, stdin_code: bool) -> subprocess.Popen:
    """The sandbox's process: its runner reads the code from work_dir/code.py, or from its stdin."""
    with contextlib.ExitStack() as stack:
        seccomp_fd = None
        if call.mode == "bwrap" and (program := seccomp_program()) is not None:
            seccomp_fd = os.memfd_create("mathrl-seccomp", os.MFD_CLOEXEC)
            stack.callback(os.close, seccomp_fd)
            os.write(seccomp_fd, program)
            os.lseek(seccomp_fd, 0, os.SEEK_SET)
        argv, options = command(call, work_dir=work_dir, uid=uid, stdin_code=stdin_code, seccomp_fd=seccomp_fd)
        try:
            return subprocess.Popen(memory.wrap(argv), stdin=subprocess.PIPE if stdin_code else subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                    close_fds=True, pass_fds=() if seccomp_fd is None else (seccomp_fd,), **options)
        except OSError as e:
            raise Refused(f"cannot start the sandbox: {e}") from None


def _finish(proc: subprocess.Popen, call: Call, uid: int | None, memory: CallMemory, *, timeout_s: float,
            stop: threading.Event | None) -> tuple[str, str]:
    """Wait for the program (its output capped, its memory watched, the deadline `timeout_s` from
    now), then kill whatever of it is left; (text, status)."""
    try:
        stdout, stderr, ended = _collect(proc, deadline=time.monotonic() + timeout_s,
                                         cap=int(call.limits["max_output_bytes"]), stop=stop,
                                         over_limit=lambda: memory.exceeded(proc.pid))
        if ended == "exit" and memory.path is not None and memory.exceeded(proc.pid) == "memory":
            ended = "memory"  # a process the kernel stopped at the cgroup's limit
    finally:
        _end(proc, call, uid)
    return _outcome(proc.returncode, stdout, stderr, ended, call, timeout_s)


def _end(proc: subprocess.Popen, call: Call, uid: int | None) -> None:
    """Kill the sandbox's process group (and as root in rlimit mode every process of its uid); close its pipes."""
    _kill_group(proc)
    if uid is not None and call.mode == "rlimit":
        _kill_uid(uid)
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()


class Prestarted:
    """One sandbox started ahead of its call: its runner has started python inside the sandbox, set
    the limits and waits on its stdin for the code. It runs one call, then it and its temporary
    directory are gone."""

    def __init__(self, call: Call):
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


def _collect(proc: subprocess.Popen, *, deadline: float, cap: int, stop: threading.Event | None,
             over_limit=lambda: "") -> tuple[bytes, bytes, str]:
    """Read stdout and stderr until the program has exited and both pipes are closed. Returns them
    (each cut to `cap` bytes) and how the wait ended: ``exit``, ``timeout``, ``output`` (more than
    `cap` bytes in all), ``memory`` or ``files`` (what `over_limit()`, asked at most every _POLL_S,
    names) or ``stopped``.
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
                if passed := over_limit():
                    return result(passed)
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


def _outcome(returncode: int | None, stdout: bytes, stderr: bytes, ended: str, call: Call,
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
    if ended == "files":
        return ((f"{output}\n" if output else "") + f"error: the program made more than "
                f"{int(call.limits['max_files'])} files; it was stopped"), "error"
    number = _signal_of(returncode if returncode is not None else -signal.SIGKILL, call.mode)
    if number == signal.SIGXCPU:
        return f"timeout: the code used more than {call.limits['cpu_s']:g} s of CPU and was stopped", "timeout"
    if number is not None:
        name = signal.Signals(number).name if number in signal.Signals._value2member_map_ else f"signal {number}"
        return (f"{output}\n" if output else "") + f"error: the program was killed by {name}", "error"
    if returncode == 0:
        return output, "ok"
    return output or f"error: the program exited with code {returncode}", "error"


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
        raise Refused(f"{folder} must be a directory of root's with mode 0700")
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
    raise Refused(f"all {ROOT_UID_SLOTS} sandbox uids are in use")
