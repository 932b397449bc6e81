"""Each class of escape from the python tool's sandbox, in every mode that works on this machine, in a
sandbox started for the call and in one started ahead of it, each checked from outside the sandbox:
the host's files, processes, sockets, System V IPC objects and /dev/shm after the call, and the
output of a later call.

`bwrap` (the only mode ``auto`` picks) must hold every class. The ``_unsafe`` modes hold the classes
in `HELD`; for the others the test skips with the reason, which is what docs/tools.md states for them.

Run: python -m pytest tests/tools/test_tools_sandbox_classes.py -q
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass

import pytest

from mathrl.tools import run_python, sandbox_problem
from mathrl.tools.sandbox import memory as sandbox_memory
from sandbox_helpers import MODES, interpreter_for, run_started

ROOT = os.geteuid() == 0

NO_MOUNT_NS = "no mount namespace: the code sees the host's world-readable files and world-writable directories"
HELD = {
    # class -> {unsafe mode: None (held) or why not}
    "stdlib bypass of the hook": {"unshare_unsafe": NO_MOUNT_NS, "rlimit_unsafe": NO_MOUNT_NS + ", and its network"},
    "dir_fd walk and /dev/shm": {"unshare_unsafe": NO_MOUNT_NS, "rlimit_unsafe": NO_MOUNT_NS},
    "cleanup": {"unshare_unsafe": None, "rlimit_unsafe": None},
    "leftover process": {"unshare_unsafe": None, "rlimit_unsafe": None if ROOT else
                         "as a normal user the code runs as that user: a setsid child outlives the call"},
    "root in a namespace": {"unshare_unsafe": None, "rlimit_unsafe": "no pid namespace: the host's /proc is visible"},
    "memory per call": {"unshare_unsafe": None, "rlimit_unsafe": None},
    "keyring": {"unshare_unsafe": "no seccomp filter: a uid's keyring outlives the call",
                "rlimit_unsafe": "no seccomp filter: a uid's keyring outlives the call"},
    "disk written": {"unshare_unsafe": "the host's disk: bounded per file, and in total only by the wall clock",
                     "rlimit_unsafe": "the host's disk: bounded per file, and in total only by the wall clock"},
}


@pytest.fixture(params=MODES)
def mode(request) -> dict:
    python = interpreter_for(request.param)
    if python is None:
        pytest.skip(f"sandbox {request.param!r} does not work here: {sandbox_problem(request.param)}")
    return {"sandbox": request.param, "python": python, "audit_hook": False}  # the hook is not the boundary


@pytest.fixture(params=["cold", "warm"])
def start(request):
    return lambda code, **kwargs: run_started(request.param, code, **kwargs)


def held_or_skip(mode: dict, name: str) -> None:
    why = HELD[name].get(mode["sandbox"])
    if why:
        pytest.skip(f"{mode['sandbox']} does not hold this: {why}")


@dataclass
class Host:
    """What a case's code aims at, outside the sandbox."""

    tag: str  # in every name a case creates
    folder: str  # a world-readable, world-writable directory of the host's (0777, not sticky)
    secret_file: str  # world-readable, in a world-readable directory
    secret: str
    tcp: socket.socket  # listening on 127.0.0.1
    unix_path: socket.socket  # listening at folder/sock (mode 0777)
    unix_abstract: socket.socket  # listening at an abstract address
    sibling: subprocess.Popen  # a process whose command line holds the tag


@pytest.fixture
def host():
    tag = f"mathrl-escape-{uuid.uuid4().hex[:12]}"
    folder = tempfile.mkdtemp(prefix=tag)
    os.chmod(folder, 0o777)
    secret = uuid.uuid4().hex
    secret_file = os.path.join(folder, "secret.txt")
    with open(secret_file, "w") as f:
        f.write(secret)
    os.chmod(secret_file, 0o644)
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen()
    unix_path = socket.socket(socket.AF_UNIX)
    unix_path.bind(os.path.join(folder, "sock"))
    os.chmod(os.path.join(folder, "sock"), 0o777)
    unix_path.listen()
    unix_abstract = socket.socket(socket.AF_UNIX)
    unix_abstract.bind("\0" + tag)
    unix_abstract.listen()
    sibling = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", tag])
    try:
        yield Host(tag, folder, secret_file, secret, tcp, unix_path, unix_abstract, sibling)
    finally:
        sibling.kill()
        sibling.wait()
        for s in (tcp, unix_path, unix_abstract):
            s.close()
        subprocess.run(["rm", "-rf", folder])
        for extra in (f"/tmp/{tag}", f"/var/tmp/{tag}", f"/dev/shm/{tag}"):
            subprocess.run(["rm", "-rf", extra])
        if SHM_KEY in sysv_shm_keys():  # left by a mode that does not hold it: not for the next test to see
            subprocess.run(["ipcrm", "-M", str(SHM_KEY)], capture_output=True)


def accepted(server: socket.socket) -> bool:
    """Whether anything connected to `server` (a completed connection waits in its backlog)."""
    server.setblocking(False)
    try:
        conn, _ = server.accept()
    except BlockingIOError:
        return False
    conn.close()
    return True


def sysv_shm_keys() -> set[int]:
    with open("/proc/sysvipc/shm") as f:
        return {int(line.split()[0]) for line in f.readlines()[1:]}


def processes_with(tag: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if tag.encode() in f.read():
                        found.append(int(entry))
                with open(f"/proc/{entry}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                        found.pop()
            except (OSError, IndexError):
                pass
    return found


def gone(tag: str, sibling: int, wait_s: float = 10.0) -> list[int]:
    deadline = time.monotonic() + wait_s
    while (left := [p for p in processes_with(tag) if p != sibling]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def no_trace_on_host(host: Host) -> None:
    """Nothing a case tried to leave is on the host, and nothing connected to its listeners."""
    for path in (f"/tmp/{host.tag}", f"/var/tmp/{host.tag}", f"/dev/shm/{host.tag}", os.path.join(host.folder, "left")):
        assert not os.path.exists(path), f"{path} was written from the sandbox"
    for server in (host.tcp, host.unix_path, host.unix_abstract):
        assert not accepted(server), f"the sandbox connected to {server.getsockname()!r}"
    assert SHM_KEY not in sysv_shm_keys(), "a System V shared-memory segment was left"
    assert host.sibling.poll() is None


SHM_KEY = 0x6D61746C  # "matl"

# Run by an interpreter started through _posixsubprocess (no audit event, no hook in the child)
ESCAPE = r'''
import ctypes, os, socket, sys
tag, folder, secret_file, port = sys.argv[1:5]
def attempt(name, fn):
    try:
        print(name, "->", fn(), flush=True)
    except Exception as e:
        print(name, "refused:", type(e).__name__, flush=True)
def write(path):
    with open(path, "w") as f:
        f.write("x")
    return "written"
attempt("tmp", lambda: write("/tmp/" + tag))
attempt("var_tmp", lambda: write("/var/tmp/" + tag))
attempt("host_dir", lambda: write(folder + "/left"))
attempt("read", lambda: open(secret_file).read())
attempt("tcp", lambda: socket.create_connection(("127.0.0.1", int(port)), timeout=2) and "connected")
def unix(address):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(2)
    s.connect(address)
    return "connected"
attempt("unix", lambda: unix(folder + "/sock"))
attempt("abstract", lambda: unix("\0" + tag))
libc = ctypes.CDLL(None, use_errno=True)
attempt("sysv_shm", lambda: libc.shmget(%d, 4096, 0o1666))
''' % SHM_KEY


def test_stdlib_bypass_of_the_hook(mode, start, host):
    # the hook (on here, as each mode's default) cannot see an interpreter started by
    # multiprocessing.util.spawnv_passfds; the boundary has to hold without it
    held_or_skip(mode, "stdlib bypass of the hook")
    code = (f"import multiprocessing.util as u, os, sys\n"
            f"args = [sys.executable, '-I', '-S', '-c', {ESCAPE!r}, {host.tag!r}, {host.folder!r}, "
            f"{host.secret_file!r}, '{host.tcp.getsockname()[1]}']\n"
            f"pid = u.spawnv_passfds(os.fsencode(sys.executable), [os.fsencode(a) for a in args], [1, 2])\n"
            f"os.waitpid(pid, 0)\nprint('done')")
    result = start(code, timeout_s=30, **{**mode, "audit_hook": None})
    assert "sysv_shm" in result.text, result  # the child ran (its last attempt printed)
    assert host.secret not in result.text
    assert "connected" not in result.text, result.text
    no_trace_on_host(host)


def test_dir_fd_walk_and_dev_shm(mode, start, host):
    # os.open("..", dir_fd=...) chains reach the sandbox's / (the hook's path rules cannot see dir_fd),
    # and _posixshmem writes to /dev/shm without an open() event
    held_or_skip(mode, "dir_fd walk and /dev/shm")
    relative = host.secret_file.lstrip("/")
    code = ("import os, _posixshmem\nfd = os.open('.', os.O_RDONLY)\nfor _ in range(40):\n"
            "    fd = os.open('..', os.O_RDONLY, dir_fd=fd)\n"
            f"try:\n    print(os.read(os.open({relative!r}, os.O_RDONLY, dir_fd=fd), 100))\n"
            "except OSError as e:\n    print('refused', e.errno)\n"
            f"try:\n    _posixshmem.shm_open('/{host.tag}', os.O_CREAT | os.O_RDWR, 0o600)\n    print('shm created')\n"
            "except OSError as e:\n    print('shm refused', e.errno)")
    result = start(code, timeout_s=30, **{**mode, "audit_hook": None})
    assert host.secret not in result.text, result.text
    no_trace_on_host(host)


def test_cleanup_cannot_be_defeated(mode, start, host, monkeypatch):
    # a tree 1200 deep (shutil.rmtree would recurse past the limit) and a rename of the code's own
    # directory away from the cleanup: the call still answers, and nothing of it is left
    held_or_skip(mode, "cleanup")
    parent = tempfile.mkdtemp(prefix="mathrl-test-")
    os.chmod(parent, 0o711)
    monkeypatch.setattr(tempfile, "tempdir", parent)
    escaped = os.path.join(host.folder, "moved")
    code = ("import os\nhome = os.getcwd()\nfor _ in range(1200):\n    os.mkdir('d')\n    os.chdir('d')\n"
            f"for src in (home, os.path.dirname(home)):\n    try:\n        os.rename(src, {escaped!r})\n"
            "        print('renamed', src)\n    except OSError as e:\n        print('rename refused', e.errno)\n"
            "print('deep')")
    try:
        result = start(code, timeout_s=60, **mode)
        assert result.status == "ok" and result.text.endswith("deep"), result
        assert "renamed" not in result.text, result.text
        assert os.listdir(parent) == []
        assert not os.path.exists(escaped)
    finally:
        subprocess.run(["rm", "-rf", parent])


LEFTOVER = r'''
import ctypes, os, sys, time
tag = sys.argv[1]
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
os.setsid()
me = os.getuid()
end = time.time() + 8
while time.time() < end:  # inject into every process of this uid, and kill the rest
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if os.stat("/proc/" + entry).st_uid != me:
                continue
            pidfd = os.pidfd_open(int(entry))
            fd = libc.syscall(438, pidfd, 1, 0)  # pidfd_getfd: the process's stdout
            if fd >= 0:
                os.write(fd, b"INJECTED by an earlier call's leftover process\n")
        except OSError:
            pass
    time.sleep(0.005)
'''


def test_a_leftover_process_reaches_no_later_call(mode, start, host):
    # a setsid'ed grandchild that outlives its call and injects into the next call's stdout
    held_or_skip(mode, "leftover process")
    code = (f"import multiprocessing.util as u, os, sys\n"
            f"args = [sys.executable, '-I', '-S', '-c', {LEFTOVER!r}, {host.tag!r}]\n"
            f"u.spawnv_passfds(os.fsencode(sys.executable), [os.fsencode(a) for a in args], [])\n"
            f"print('started')")
    first = start(code, timeout_s=30, **mode)
    assert first.status == "ok", first
    later = run_python("import time\ntime.sleep(0.5)\nprint('clean')", timeout_s=30, **mode)
    assert (later.status, later.text) == ("ok", "clean"), later
    assert gone(host.tag, host.sibling.pid) == []


def test_the_code_is_not_root_where_it_could_unmount(mode, start, host):
    # umount2("/proc") would show the host's /proc (every process's command line) in a namespace where
    # the code had the capability
    held_or_skip(mode, "root in a namespace")
    code = ("import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "print('umount', libc.umount2(b'/proc', 2), ctypes.get_errno())\n"
            "print('unshare', libc.unshare(0x10000000 | 0x00020000), ctypes.get_errno())\n"
            "for p in os.listdir('/proc'):\n    try:\n        print(open(f'/proc/{p}/cmdline', 'rb').read())\n"
            "    except Exception:\n        pass")
    result = start(code, timeout_s=30, **mode)
    assert host.tag not in result.text, "the host's processes are visible"
    assert result.text.splitlines()[0].startswith("umount -1"), result.text


HOG = """import os, time
children = []
for _ in range(6):
    pid = os.fork()
    if pid == 0:
        block = bytearray(300 << 20)
        for i in range(0, len(block), 4096):
            block[i] = 1
        time.sleep(20)
        os._exit(0)
    children.append(pid)
for pid in children:
    os.waitpid(pid, 0)
print('held 1.8 GiB')
"""


@pytest.mark.parametrize("bound", ["as this machine gives", "watchdog"])
def test_memory_is_bounded_per_call(mode, start, host, bound, monkeypatch):
    # six children of 300 MiB each, under memory_mb 512: each process is within its own limit, the
    # call is not
    held_or_skip(mode, "memory per call")
    if bound == "watchdog":
        monkeypatch.setattr(sandbox_memory, "_cgroup_parent", lambda: None)
    elif sandbox_memory.memory_bound() == "watchdog":
        pytest.skip("no writable memory cgroup here: the watchdog variant covers it")
    result = start(HOG, timeout_s=60, memory_mb=512, **mode)
    assert result.status == "error", result
    assert result.text.endswith("error: the program's processes together used more than 512 MiB of memory; "
                                "it was stopped"), result.text
    assert "held" not in result.text


def test_no_keyring_state_reaches_the_next_call(mode, start, host):
    # a uid's kernel keyring outlives its processes, and calls may share a uid
    held_or_skip(mode, "keyring")
    add = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n"
           f"print(libc.syscall({_nr('add_key')}, b'user', b'{host.tag}', b'{host.secret}', 32, ctypes.c_int(-4)))")
    search = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n"
              f"key = libc.syscall({_nr('keyctl')}, 10, ctypes.c_int(-4), b'user', b'{host.tag}', 0)\n"
              f"buf = ctypes.create_string_buffer(64)\n"
              f"print(key, libc.syscall({_nr('keyctl')}, 11, ctypes.c_long(key), buf, 64), buf.value)")
    first = start(add, timeout_s=30, **mode)
    second = start(search, timeout_s=30, **mode)
    assert first.text.startswith("-1"), first  # add_key refused
    assert host.secret not in second.text, second


def _nr(name: str) -> int:
    import platform

    return {"x86_64": {"add_key": 248, "keyctl": 250}, "aarch64": {"add_key": 217, "keyctl": 219}}[platform.machine()][name]


def test_the_disk_written_is_bounded(mode, start, host):
    # 16 files of 16 MiB: each within the file limit; all together stopped by bwrap's /tmp size
    held_or_skip(mode, "disk written")
    code = ("import os\nwritten = 0\nfor i in range(16):\n    try:\n        with open(f'f{i}', 'wb') as f:\n"
            "            f.write(b'x' * ((16 << 20) - 1))\n        written += 1\n    except OSError as e:\n"
            "        print('refused at file', i, e.errno)\n        break\nprint(written)")
    before = os.statvfs(tempfile.gettempdir())
    result = start(code, timeout_s=60, **mode)
    after = os.statvfs(tempfile.gettempdir())
    assert "refused at file" in result.text, result.text
    assert int(result.text.splitlines()[-1]) <= 4, result.text  # 4 x max_file_mb
    # nothing of it on the host's disk (within 8 MiB of other activity)
    assert (before.f_bfree - after.f_bfree) * before.f_frsize < 8 << 20
