"""Files that several mathrl processes may write at once: exclusive file locks, and cache entries
keyed by a hash that are built once.

    with FileLock(path / ".lock"):           # waits for the holder; FileLock(...).acquire(block=False) does not
        ...
    build_once(cache_root() / "base" / key, build, is_complete=lambda p: (p / "model.safetensors").exists())

A lock is `flock` on a lock file: the kernel drops it when its process ends, however it ends, and the
holder's PID in the file names it to whoever finds it taken. `build_once` locks `<entry>.lock` beside the
entry: the first process builds into a temporary directory and renames it into place; the others print one
line, wait, and use the finished entry. How the lock file is reused and deleted: docs/guide.md, "Never lose
a run" (the caches).

Imports nothing of mathrl: every layer may use it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


def cache_root() -> Path:
    """Where mathrl caches what it builds: $MATHRL_CACHE, else the user cache directory."""
    if os.environ.get("MATHRL_CACHE"):
        return Path(os.environ["MATHRL_CACHE"])
    import platformdirs

    return Path(platformdirs.user_cache_dir("mathrl"))


class FileLock:
    """An exclusive `flock` on the file `path` (created when missing), held until `release()`, the end
    of a `with` block, or the end of the process. Not reentrant: a second FileLock on the same path
    waits for the first, in this process too."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, *, block: bool = True) -> bool:
        """Take the lock (waiting for the holder when `block`); False when it is taken and not `block`."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while self._fd is None:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if block else fcntl.LOCK_NB))
            except BlockingIOError:
                os.close(fd)
                return False
            except BaseException:
                os.close(fd)
                raise
            if _same_file(fd, self.path):
                self._fd = fd
            else:  # the holder deleted (or moved) the file between our open and our lock: start over
                os.close(fd)
        pid = f"{os.getpid()}\n".encode()
        os.pwrite(self._fd, pid, 0)
        os.ftruncate(self._fd, len(pid))
        return True

    def release(self) -> None:
        """Delete the lock file (when it is still ours) and drop the lock; nothing when not held."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            if _same_file(fd, self.path):
                self.path.unlink()
        finally:
            os.close(fd)

    def __enter__(self) -> FileLock:
        self.acquire(block=True)
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _same_file(fd: int, path: Path) -> bool:
    """True when `path` still names the file open as `fd`."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


def locks_unsupported(error: OSError) -> bool:
    """True for the error of `flock` on a file system that has no file locks (some NFS and Lustre mounts)."""
    return error.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)


def holder_pid(path: str | Path, *, wait_s: float = 2.0) -> int | None:
    """The PID written into the lock file `path` by its holder, which writes it just after it took the
    lock: read again for up to wait_s while the file is still empty (None: no file, or nothing written)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return int(Path(path).read_text().strip())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.02)


def lock_path(entry: Path) -> Path:
    """The lock file of a cache entry: `<entry>.lock` beside it."""
    return entry.with_name(entry.name + ".lock")


def waiting_line(entry: Path, pid: int | None) -> str:
    """The line printed while another process builds `entry`."""
    who = f"another mathrl process (pid {pid})" if pid else "another mathrl process"
    return f"{who} is building {entry}; waiting for it"


def _print_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def build_once(entry: str | Path, build: Callable[[Path], None], *, is_complete: Callable[[Path], bool],
               on_wait: Callable[[str], None] | None = None) -> Path:
    """`entry`, built by `build(tmp)` into a new temporary directory beside it unless it is complete
    already, then renamed into place, so no process ever sees it half-written. One process builds an
    entry at a time: another one finds `<entry>.lock` held, passes one line to `on_wait` (default:
    stderr), waits, and then uses the finished entry. The builder first removes what killed builds
    left (an incomplete entry, `<entry>.tmp-*` directories). If a writer that takes no lock renamed a
    complete entry into place first, that one is kept and ours discarded."""
    entry = Path(entry)
    if is_complete(entry):
        return entry
    lock = FileLock(lock_path(entry))
    locked = _lock_or_wait(lock, entry, on_wait)
    try:
        if is_complete(entry):  # built while we waited
            return entry
        if locked:
            _remove_leftovers(entry)
        tmp = Path(tempfile.mkdtemp(prefix=entry.name + ".tmp-", dir=entry.parent))
        try:
            build(tmp)
            _install(tmp, entry, is_complete)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # gone after a rename; a failed build's leftovers otherwise
    finally:
        lock.release()
    return entry


def _lock_or_wait(lock: FileLock, entry: Path, on_wait: Callable[[str], None] | None) -> bool:
    """Take `lock`, waiting (after one line to `on_wait`) while another process holds it. False when the
    file system has no file locks: then every process builds, and the first complete one wins (`_install`)."""
    try:
        if not lock.acquire(block=False):
            (on_wait or _print_line)(waiting_line(entry, holder_pid(lock.path)))
            lock.acquire(block=True)
    except OSError as e:
        if not locks_unsupported(e):
            raise
        return False
    return True


def _remove_leftovers(entry: Path) -> None:
    """Remove an incomplete `entry` and the temporary directories of builds that were killed (the
    caller holds the entry's lock, so no build is writing them)."""
    for tmp in entry.parent.glob(entry.name + ".tmp-*"):
        shutil.rmtree(tmp, ignore_errors=True)
    if entry.is_dir():
        shutil.rmtree(entry)
    elif entry.exists():
        entry.unlink()


def process_umask() -> int:
    """This process's umask, read without changing it (Linux's /proc; elsewhere set and restored at once)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def umask_modes(path: str | Path) -> None:
    """Give `path` and everything under it the modes a plain open() and mkdir() give under the process
    umask (0o666 and 0o777 less the umask; 0o644 and 0o755 under umask 022), as torch.save does:
    `tempfile.mkdtemp` makes 0o700 directories and safetensors writes 0o600 files, which another user,
    or a container with another uid, could not read. Called before a directory is renamed into place."""
    mask = process_umask()
    path = Path(path)
    for p in [path, *path.rglob("*")]:
        if p.is_symlink():
            continue
        p.chmod((0o777 if p.is_dir() else 0o666) & ~mask)


def _install(tmp: Path, entry: Path, is_complete: Callable[[Path], bool]) -> None:
    """Rename the built `tmp` to `entry` (its modes those of the umask, `umask_modes`); an entry that
    another writer completed first is kept."""
    umask_modes(tmp)
    try:
        os.replace(tmp, entry)
    except OSError:
        if not is_complete(entry):
            raise
