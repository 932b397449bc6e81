"""Tests of mathrl.cache: file locks and cache entries built once while several builders race.

Threads stand in for processes here: `flock` locks belong to open files, so two threads that each open
the lock file exclude each other as two processes do. tests/model/test_tiny_base.py races real processes.

Run: python -m pytest tests/base/test_cache.py -q
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from mathrl.cache import FileLock, build_once, cache_root, holder_pid, lock_path, waiting_line


def complete(path: Path) -> bool:
    return (path / "done").exists()


def write_entry(tmp: Path, text: str = "built") -> None:
    (tmp / "data").write_text(text)
    (tmp / "done").write_text("")


def test_one_of_several_builders_builds_and_the_others_wait_then_use_it(tmp_path):
    # Bug story: two processes building the same base model into an empty cache raced; the second
    # died with "[Errno 39] Directory not empty" renaming its copy onto the first one's.
    entry, n = tmp_path / "base" / "key", 4
    builds, waits, results, errors = [], [], [], []
    all_waiting = threading.Event()
    start = threading.Barrier(n)

    def build(tmp: Path) -> None:
        builds.append(tmp)
        all_waiting.wait(timeout=30)  # the lock is held until every other builder waits on it
        write_entry(tmp)

    def on_wait(line: str) -> None:
        waits.append(line)
        if len(waits) == n - 1:
            all_waiting.set()

    def worker() -> None:
        start.wait()
        try:
            results.append(build_once(entry, build, is_complete=complete, on_wait=on_wait))
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == [] and results == [entry] * n
    assert len(builds) == 1 and all_waiting.is_set()
    assert len(waits) == n - 1 and all(w == waiting_line(entry, os.getpid()) for w in waits)
    assert (entry / "data").read_text() == "built"
    assert sorted(p.name for p in entry.parent.iterdir()) == ["key"]  # no temporary directory, no lock file


def test_a_complete_entry_is_used_without_building(tmp_path):
    entry = tmp_path / "key"
    entry.mkdir()
    write_entry(entry, "old")
    assert build_once(entry, lambda tmp: pytest.fail("built again"), is_complete=complete) == entry
    assert (entry / "data").read_text() == "old"


def test_a_failed_build_leaves_nothing_and_the_next_builder_builds(tmp_path):
    entry = tmp_path / "key"

    def fail(tmp: Path) -> None:
        (tmp / "data").write_text("half")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError, match="killed"):
        build_once(entry, fail, is_complete=complete)
    assert list(tmp_path.iterdir()) == []  # no entry, no temporary directory, the lock released
    assert build_once(entry, write_entry, is_complete=complete) == entry and complete(entry)


def test_what_killed_builds_left_is_replaced(tmp_path):
    # A build killed mid-write leaves <entry>.tmp-*; an old version could leave an incomplete entry.
    entry = tmp_path / "key"
    (tmp_path / "key.tmp-abc123").mkdir()
    entry.mkdir()
    (entry / "data").write_text("half")
    assert build_once(entry, write_entry, is_complete=complete) == entry
    assert (entry / "data").read_text() == "built" and sorted(p.name for p in tmp_path.iterdir()) == ["key"]


def test_an_entry_completed_by_a_writer_without_the_lock_is_kept(tmp_path):
    # First complete writer wins: if another writer renamed a complete entry into place while we built,
    # our rename fails on the non-empty target, and we use theirs.
    entry = tmp_path / "key"

    def build(tmp: Path) -> None:
        write_entry(tmp, "ours")
        entry.mkdir()
        write_entry(entry, "theirs")

    assert build_once(entry, build, is_complete=complete) == entry
    assert (entry / "data").read_text() == "theirs" and sorted(p.name for p in tmp_path.iterdir()) == ["key"]


def test_file_lock_excludes_a_second_holder_and_names_the_first(tmp_path):
    path = tmp_path / "x.lock"
    first, second = FileLock(path), FileLock(path)
    assert first.acquire(block=False) and holder_pid(path) == os.getpid()
    assert not second.acquire(block=False) and not second.held
    first.release()
    assert not path.exists()  # the holder deletes its lock file
    assert second.acquire(block=False)
    second.release()
    assert holder_pid(path) is None


def test_lock_file_sits_beside_the_entry():
    assert lock_path(Path("/c/base/tiny-arith-0123")) == Path("/c/base/tiny-arith-0123.lock")


def test_cache_root_follows_mathrl_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MATHRL_CACHE", str(tmp_path))
    assert cache_root() == tmp_path
    monkeypatch.delenv("MATHRL_CACHE")
    assert cache_root().name == "mathrl"


def test_without_file_locks_every_builder_builds_and_the_first_complete_one_wins(tmp_path, monkeypatch):
    # Some NFS and Lustre mounts have no flock: a build still works, renamed into place as before.
    import errno

    import mathrl.cache

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(mathrl.cache.fcntl, "flock", no_locks)
    entry = tmp_path / "key"
    assert build_once(entry, write_entry, is_complete=complete) == entry and complete(entry)
    assert build_once(entry, lambda tmp: pytest.fail("built again"), is_complete=complete) == entry


@pytest.mark.parametrize("umask, file_mode, dir_mode", [
    (0o022, 0o644, 0o755),  # the common default: others read, only the owner writes
    (0o002, 0o664, 0o775),  # a shared group's umask: the group writes too
    (0o077, 0o600, 0o700),  # a private umask stays private: the modes follow it, never widen it
])
def test_a_built_entry_has_the_modes_of_the_umask(tmp_path, umask, file_mode, dir_mode):
    # Bug story: the tiny base model's model.safetensors was 0600 and its directory 0700 (safetensors
    # writes through a private temporary file, mkdtemp makes a private directory): another user, or a
    # container with another uid, sharing $MATHRL_CACHE could not read it.
    import torch
    from safetensors.torch import save_file

    def build(tmp: Path) -> None:
        (tmp / "sub").mkdir()
        save_file({"w": torch.zeros(2)}, str(tmp / "sub" / "model.safetensors"))
        write_entry(tmp)

    old = os.umask(umask)
    try:
        entry = build_once(tmp_path / "base" / "key", build, is_complete=complete)
    finally:
        os.umask(old)
    modes = {p.relative_to(entry).as_posix(): p.stat().st_mode & 0o777 for p in [entry, *entry.rglob("*")]}
    assert modes == {".": dir_mode, "sub": dir_mode, "sub/model.safetensors": file_mode, "data": file_mode, "done": file_mode}
