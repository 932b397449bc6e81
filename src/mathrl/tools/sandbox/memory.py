"""A call's memory, bounded across all its processes: a memory cgroup where one is writable, else a
watchdog on the total proportional set size (PSS) of the call's processes and the bytes of its /tmp.

    memory = CallMemory(512 << 20, cgroup=True, tmpfs=(64 << 20, 4096))  # the cgroup, or the watchdog
    argv = memory.wrap(argv)                      # the sandbox's process joins the cgroup before it execs
    memory.exceeded(pid)                          # polled while the call runs: "", "memory" or "files"
    memory.close()                                # removes the cgroup (once the call's processes are gone)
    memory_bound()                                # "cgroup v1", "cgroup v2" or "watchdog": what this machine gives

The cgroup is a child of this process's own memory cgroup, with the limit on memory (and swap) set; its
out-of-memory count tells the call it happened. The watchdog sums the PSS of the sandbox's process tree
(``/proc/<pid>/task/*/children``) each time the call's wait wakes (at most every 50 ms). Memory no process
maps is refused by the sandbox's seccomp filter (`seccomp.py`), and the inodes of bwrap's /tmp are capped
at a number of files by the same poll. What each bound covers, and how the /tmp is read from another mount
namespace: docs/tools.md, "Memory per call".
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
import time
from pathlib import Path

__all__ = ["CallMemory", "memory_bound", "memory_covers", "tree_pss"]

log = logging.getLogger(__name__)

_counter = itertools.count()


class CallMemory:
    """One call's memory bound (see the module's docstring). `cgroup` False: the watchdog only."""

    def __init__(self, limit_bytes: int, *, cgroup: bool = True, tmpfs: tuple[int, int] | None = None):
        self.limit = int(limit_bytes)
        self.tmpfs = tmpfs  # (bytes, files) of the sandbox's /tmp (None: it has none of its own)
        self._inside: int | None = None  # a pid of the call's tree in the sandbox's mount namespace
        self.path: Path | None = None
        self.how = "watchdog"
        parent = _cgroup_parent() if cgroup else None
        if parent is not None:
            version, folder = parent
            path = folder / f"mathrl-py-{os.getpid()}-{next(_counter)}"
            try:
                path.mkdir()
                _set_limit(version, path, self.limit)
                self.path, self.how = path, f"cgroup {version}"
            except OSError as e:
                log.debug("python tool: no memory cgroup for this call (%s); the watchdog bounds it", e)
                with contextlib.suppress(OSError):
                    path.rmdir()

    def wrap(self, argv: list[str]) -> list[str]:
        """`argv`, started so that its process joins the cgroup before it execs (it must run as the
        user who may write the cgroup: this process's)."""
        if self.path is None:
            return argv
        return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.path / "cgroup.procs"), *argv]

    def exceeded(self, pid: int) -> str:
        """What the call passed, "" for nothing: "memory" (the cgroup's out-of-memory kills, or the
        watchdog's sum over `pid`, its descendants and its /tmp) or "files" (its /tmp's inodes)."""
        tmp = self._tmp(pid) if self.tmpfs is not None else None
        if tmp is not None and tmp.f_files - tmp.f_ffree > self.tmpfs[1]:
            return "files"
        if self.path is not None:
            return "memory" if _oom_kills(self.path) > 0 else ""
        held = (tmp.f_blocks - tmp.f_bfree) * tmp.f_frsize if tmp is not None else 0
        return "memory" if tree_pss(pid) + held > self.limit else ""

    def _tmp(self, pid: int) -> os.statvfs_result | None:
        """statvfs of the sandbox's /tmp, or None while no process of the tree is inside it yet."""
        for _ in range(2):
            if self._inside is None:
                self._inside = _inside_process(pid)
                if self._inside is None:
                    return None
            try:
                tmp = os.statvfs(f"/proc/{self._inside}/root/tmp")
            except OSError:  # that process is gone: look again
                self._inside = None
                continue
            if tmp.f_blocks * tmp.f_frsize != self.tmpfs[0]:  # not mounted yet: the host's /tmp
                self._inside = None
                return None
            return tmp
        return None

    def close(self) -> None:
        """Remove the cgroup; its processes must have been killed (a few tries while they exit)."""
        if self.path is None:
            return
        for _ in range(400):
            try:
                self.path.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:  # EBUSY while the last of them exit
                time.sleep(0.005)
        else:
            log.debug("python tool: the memory cgroup %s could not be removed", self.path)
        self.path = None


def memory_bound() -> str:
    """How a call's memory is bounded on this machine: ``cgroup v1``, ``cgroup v2`` or ``watchdog``."""
    parent = _cgroup_parent()
    return "watchdog" if parent is None else f"cgroup {parent[0]}"


def memory_covers(bound: str) -> str:
    """What `bound` (`memory_bound()`'s answer) counts of a bwrap call, and what the sandbox refuses or
    caps instead, in words for the log."""
    counted = ("the call's processes, the files of its /tmp and the kernel's memory for them, charged by the kernel"
               if bound.startswith("cgroup") else
               "the PSS of the call's processes plus the bytes of its /tmp, sampled every 50 ms")
    return (f"{bound}: {counted}; memfd and System V shared memory refused (seccomp); /tmp at most "
            "4 x max_file_mb and max_files files")


def tree_pss(pid: int) -> int:
    """Bytes of PSS of `pid` and its descendants (0 for those gone). PSS shares a page among the
    processes that map it, so forked children are not counted twice."""
    total, seen, todo = 0, set(), [pid]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        total += _pss(p)
        todo.extend(_children(p))
    return total


def _inside_process(pid: int) -> int | None:
    """A process of `pid`'s tree in another mount namespace than this process's (the sandbox's), or None."""
    try:
        own = os.readlink("/proc/self/ns/mnt")
    except OSError:
        return None
    seen, todo = set(), [pid]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{p}/ns/mnt") != own:
                return p
        todo.extend(_children(p))
    return None


def _children(pid: int) -> list[int]:
    found = []
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/children") as f:
                found += [int(c) for c in f.read().split()]
    return found


def _pss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) << 10
    except (OSError, ValueError):
        pass
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


@functools.lru_cache(maxsize=None)
def _cgroup_parent() -> tuple[str, Path] | None:
    """("v1" | "v2", the folder of this process's memory cgroup) where a child can be made and given a
    limit here, else None. Checked once per process with a probe child."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f]
        mounts = _cgroup_mounts()
    except OSError:
        return None
    candidates = []
    for hierarchy, controllers, path in lines:
        if "memory" in controllers.split(",") and "v1" in mounts:
            candidates.append(("v1", mounts["v1"] / path.lstrip("/")))
        elif hierarchy == "0" and "v2" in mounts:
            candidates.append(("v2", mounts["v2"] / path.lstrip("/")))
    for version, folder in candidates:
        probe = folder / f"mathrl-py-probe-{os.getpid()}"
        try:
            probe.mkdir()
        except OSError:
            continue
        try:
            _set_limit(version, probe, 64 << 20)
            return version, folder
        except OSError:
            continue
        finally:
            with contextlib.suppress(OSError):
                probe.rmdir()
    return None


def _cgroup_mounts() -> dict[str, Path]:
    """{"v1": the memory hierarchy's mount, "v2": the unified hierarchy's}, as mounted here."""
    mounts = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            sep = fields.index("-")
            fstype, options = fields[sep + 1], fields[sep + 3].split(",")
            if fields[3] != "/":
                continue  # a bind of a sub-tree: paths in /proc/self/cgroup are not relative to it
            if fstype == "cgroup" and "memory" in options:
                mounts.setdefault("v1", Path(fields[4]))
            elif fstype == "cgroup2":
                mounts.setdefault("v2", Path(fields[4]))
    return mounts


def _set_limit(version: str, path: Path, limit: int) -> None:
    if version == "v1":
        (path / "memory.limit_in_bytes").write_text(str(limit))
        with contextlib.suppress(OSError):  # only where swap accounting is on
            (path / "memory.memsw.limit_in_bytes").write_text(str(limit))
    else:
        (path / "memory.max").write_text(str(limit))
        for name, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
            with contextlib.suppress(OSError):
                (path / name).write_text(value)


def _oom_kills(path: Path) -> int:
    """The cgroup's out-of-memory kills (v1: memory.oom_control; v2: memory.events), or failures to
    charge where the kernel does not count kills."""
    for name in ("memory.events", "memory.oom_control"):
        try:
            text = (path / name).read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    with contextlib.suppress(OSError, ValueError):
        return int((path / "memory.failcnt").read_text())
    return 0
