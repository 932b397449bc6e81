"""Classes of escape that go through the kernel rather than the file system, against `bwrap` (the one
mode with a seccomp filter), cold and warm, each checked from outside the sandbox:

- sockets of a family the network namespace does not isolate (vsock shares the host's port space);
- memory that no process maps (a memfd written through its fd, a System V segment detached, a
  memfd_secret unmapped) and the kernel memory of many empty files, with the watchdog forced (no
  memory cgroup), where the sum of the processes' PSS cannot see them;
- file-system watches on the read-only interpreter prefix, which would show the host's reads.

Run: python -m pytest tests/tools/test_tools_sandbox_kernel.py -q
"""

from __future__ import annotations

import os
import random
import socket
import sys
import threading
import time

import pytest

from mathrl.tools import sandbox_problem
from mathrl.tools.sandbox import memory as sandbox_memory
from sandbox_helpers import interpreter_for, run_started

VMADDR_CID_ANY, VMADDR_CID_LOCAL, VMADDR_CID_HOST = 0xFFFFFFFF, 1, 2
AF_VSOCK, AF_PACKET, AF_NETLINK, AF_ALG = 40, 17, 16, 38  # the same on every Linux architecture


@pytest.fixture(scope="module")
def bwrap() -> dict:
    python = interpreter_for("bwrap")
    if python is None:
        pytest.skip(f"bwrap does not work here: {sandbox_problem('bwrap')}")
    return {"sandbox": "bwrap", "python": python, "audit_hook": False}  # the hook is not the boundary


@pytest.fixture(params=["cold", "warm"])
def start(request):
    return lambda code, **kwargs: run_started(request.param, code, **kwargs)


@pytest.fixture
def watchdog(monkeypatch):
    """No memory cgroup: the call's memory is bounded by the watchdog alone."""
    monkeypatch.setattr(sandbox_memory, "_cgroup_parent", lambda: None)


FAMILIES = r'''
import errno, socket, sys
port = int(sys.argv[1]) if len(sys.argv) > 1 else 0
def attempt(name, family, kind, address=None, connect=None):
    try:
        s = socket.socket(family, kind)
    except OSError as e:
        return print(name, "socket", errno.errorcode[e.errno])
    try:
        if address is not None:
            s.bind(address)
        if connect is not None:
            s.settimeout(1)
            s.connect(connect)
        print(name, "ok")
    except OSError as e:
        print(name, "then", errno.errorcode.get(e.errno, e.errno))
attempt("unix", socket.AF_UNIX, socket.SOCK_STREAM)
attempt("inet", socket.AF_INET, socket.SOCK_DGRAM)
attempt("inet6", socket.AF_INET6, socket.SOCK_DGRAM)
attempt("vsock_bind", 40, socket.SOCK_STREAM, address=(0xFFFFFFFF, port))
for cid in (1, 2):
    attempt(f"vsock_connect_{cid}", 40, socket.SOCK_STREAM, connect=(cid, port))
attempt("packet", 17, socket.SOCK_RAW)
attempt("netlink", 16, socket.SOCK_RAW)
attempt("alg", 38, socket.SOCK_SEQPACKET)
try:
    socket.socketpair(40)
    print("vsock_pair ok")
except OSError as e:
    print("vsock_pair socket", errno.errorcode[e.errno])
'''


def families(result) -> dict[str, str]:
    return {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in result.text.splitlines() if " " in line}


def test_only_unix_and_inet_sockets_are_created(bwrap, start):
    # vsock is not in the network namespace, and packet, netlink, alg, ... reach the host's kernel
    result = start(FAMILIES, timeout_s=30, **bwrap)
    seen = families(result)
    assert seen.get("unix") == seen.get("inet") == seen.get("inet6") == "ok", result.text
    for name in ("vsock_bind", "vsock_connect_1", "vsock_connect_2", "packet", "netlink", "alg", "vsock_pair"):
        assert seen.get(name) == "socket EAFNOSUPPORT", (name, result.text)


@pytest.fixture
def vsock_listener():
    """A vsock port the host holds and listens on, or a skip where this machine has no vsock transport."""
    if not os.path.exists("/dev/vsock"):
        pytest.skip("no vsock transport here (/dev/vsock): the host cannot hold a port for the code to find in use")
    rng = random.Random()
    for _ in range(20):
        s = socket.socket(AF_VSOCK, socket.SOCK_STREAM)
        try:
            s.bind((VMADDR_CID_ANY, rng.randrange(20000, 60000)))
            s.listen()
            break
        except OSError:
            s.close()
    else:
        pytest.skip("the vsock transport here lets this process bind no port")
    try:
        yield s
    finally:
        s.close()


def test_a_vsock_port_the_host_holds_is_out_of_reach(bwrap, start, vsock_listener):
    # in the host's vsock port space the code's bind of a port the host holds gives EADDRINUSE, and a
    # connect reaches the host's listener; from outside: no connection waits in the listener's backlog
    port = vsock_listener.getsockname()[1]
    code = f"import sys\nsys.argv[1:] = [{str(port)!r}]\n" + FAMILIES
    result = start(code, timeout_s=30, **bwrap)
    assert "EADDRINUSE" not in result.text, result.text
    assert families(result).get("vsock_bind") == "socket EAFNOSUPPORT", result.text
    vsock_listener.setblocking(False)
    with pytest.raises(BlockingIOError):
        vsock_listener.accept()


MEMFD = """import os
fds = [os.memfd_create('hold') for _ in range(20)]  # 15 MiB each: RLIMIT_FSIZE bounds a file, not 20
for fd in fds:
    for _ in range(15):
        os.write(fd, b'x' * (1 << 20))
print('held', sum(os.fstat(fd).st_size for fd in fds) >> 20, 'MiB', flush=True)
import time; time.sleep(1)
print('still held')
"""

SYSV = """import ctypes, time
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
for _ in range(2):
    seg = libc.shmget(0, 150 << 20, 0o1600)
    if seg < 0:
        raise OSError(ctypes.get_errno(), 'shmget refused')
    addr = libc.shmat(seg, None, 0)
    ctypes.memset(addr, 1, 150 << 20)
    libc.shmdt(ctypes.c_void_p(addr))
print('held 300 MiB detached', flush=True)
time.sleep(1)
print('still held')
"""

MEMFD_SECRET = """import ctypes, mmap, os, time
libc = ctypes.CDLL(None, use_errno=True)
fds = []
for _ in range(50):  # 6 MiB each, filled through a mapping that is then unmapped: the fd holds it
    fd = libc.syscall(447, 0)  # memfd_secret, the same number on x86_64 and aarch64
    if fd < 0:
        raise OSError(ctypes.get_errno(), 'memfd_secret refused')
    os.ftruncate(fd, 6 << 20)
    with mmap.mmap(fd, 6 << 20) as m:  # within RLIMIT_MEMLOCK while mapped
        m.write(b'x' * (6 << 20))
    fds.append(fd)
print('held', 6 * len(fds), 'MiB unmapped', flush=True)
time.sleep(1)
print('still held')
"""


@pytest.mark.parametrize("case, code", [("memfd", MEMFD), ("sysv detached", SYSV), ("memfd_secret", MEMFD_SECRET)],
                         ids=["memfd", "sysv detached", "memfd_secret"])
def test_memory_that_no_process_maps_is_refused_under_the_watchdog(bwrap, start, watchdog, case, code):
    # 300 MiB under memory_mb 256 that no process maps: the PSS the watchdog sums never sees it, so
    # the seccomp filter refuses to create it (a cgroup would charge it; here there is none)
    result = start(code, timeout_s=30, memory_mb=256, **bwrap)
    assert "held" not in result.text, result.text
    assert result.status == "error", result  # refused (PermissionError), or stopped by the watchdog


FILES = """import os
made = 0
try:
    for i in range(200000):
        open(f'/tmp/f{i}', 'w').close()
        made += 1
except OSError as e:
    print('refused at', made, e.errno)
print('made', made)
"""


@pytest.mark.parametrize("bound", ["as this machine gives", "watchdog"])
def test_empty_files_are_bounded_in_number(bwrap, start, monkeypatch, bound):
    # empty files cost no bytes of the tmpfs's size but about 1 KiB of kernel memory each (314 MiB for a
    # few hundred thousand); the call is stopped past max_files, with a cgroup and without one
    if bound == "watchdog":
        monkeypatch.setattr(sandbox_memory, "_cgroup_parent", lambda: None)
    result = start(FILES, timeout_s=60, memory_mb=96, max_files=2000, **bwrap)
    assert result.status == "error", result
    assert result.text.endswith("error: the program made more than 2000 files; it was stopped"), result.text
    assert "made 200000" not in result.text


def test_the_files_of_a_call_within_its_bounds_are_fine(bwrap, start, watchdog):
    # the tmpfs's bytes count towards memory_mb under the watchdog: 24 MiB of files under 128 MiB pass
    code = "for i in range(3):\n    open(f'/tmp/f{i}', 'wb').write(b'x' * (8 << 20))\nprint('wrote', i + 1)"
    result = start(code, timeout_s=30, memory_mb=128, **bwrap)
    assert (result.status, result.text) == ("ok", "wrote 3"), result


TMP_BYTES = """import time
for i in range(3):
    with open(f'/tmp/f{i}', 'wb') as f:
        for _ in range(15):
            f.write(b'x' * (1 << 20))
print('wrote 45 MiB', flush=True)
time.sleep(1)
print('held')
"""


def test_the_bytes_of_a_calls_tmp_count_under_the_watchdog(bwrap, start, watchdog):
    # 45 MiB of files under memory_mb 40: each file within max_file_mb, all within /tmp's size, and
    # the process itself small; only the bytes of its /tmp, added to the PSS, pass the limit
    result = start(TMP_BYTES, timeout_s=30, memory_mb=40, **bwrap)
    assert result.status == "error", result
    assert result.text.endswith("error: the program's processes together used more than 40 MiB of memory; "
                                "it was stopped"), result.text
    assert "held" not in result.text, result.text


WATCH = r"""import ctypes, os, select, time
libc = ctypes.CDLL(None, use_errno=True)
libc.fanotify_mark.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_uint64, ctypes.c_int, ctypes.c_char_p]
folder = os.path.dirname(os.__file__).encode()
fan = libc.syscall({fanotify}, 0xC00, 0)  # FAN_CLASS_NOTIF | FAN_REPORT_DFID_NAME: allowed unprivileged
print('fanotify', fan)
if fan >= 0:  # FAN_MARK_ADD, FAN_OPEN | FAN_EVENT_ON_CHILD, AT_FDCWD
    print('fanotify mark', libc.fanotify_mark(fan, 0x1, 0x20 | 0x08000000, -100, folder))
watches = [fan] if fan >= 0 else []
inits = [('inotify_init1', lambda: libc.inotify_init1(0))]
if {inotify_init} >= 0:  # the older call, where the architecture has it
    inits.append(('inotify_init', lambda: libc.syscall({inotify_init})))
for name, init in inits:
    fd = init()
    print(name, fd, flush=True)
    if fd >= 0:
        libc.inotify_add_watch(fd, folder, 0x1 | 0x20)  # IN_ACCESS | IN_OPEN
        watches.append(fd)
end = time.time() + 3
while watches and time.time() < end:
    for w in select.select(watches, [], [], 0.1)[0]:
        print(os.read(w, 65536))
"""


def test_no_watch_shows_the_hosts_reads_of_the_interpreter(bwrap, start):
    # the interpreter's prefix is the host's, read-only: an inotify watch on it sees every open by
    # another call or a host process, and so does an fanotify watch with the flags an unprivileged
    # process may use (fanotify_init(0, 0) needs CAP_SYS_ADMIN: the kernel refuses it anyway); the
    # host reads this.py (which no call imports) meanwhile
    import platform

    numbers = {"x86_64": (300, 253), "aarch64": (262, -1)}.get(platform.machine())  # fanotify_init, inotify_init
    if numbers is None:
        pytest.skip(f"no system-call number table for {platform.machine()}")
    stdlib = os.path.dirname(os.__file__) if bwrap["python"] == sys.executable else None
    if stdlib is None:
        pytest.skip("the sandbox's interpreter is not this process's: its standard library is elsewhere")
    out = {}
    call = threading.Thread(target=lambda: out.setdefault("r", start(WATCH.format(fanotify=numbers[0], inotify_init=numbers[1]), timeout_s=30, **bwrap)))
    call.start()
    while call.is_alive():
        with open(os.path.join(stdlib, "this.py"), "rb") as f:
            f.read()
        time.sleep(0.02)
    result = out["r"]
    assert "this.py" not in result.text, result.text
    assert "inotify_init1 -1" in result.text and "fanotify -1" in result.text, result.text
    assert numbers[1] < 0 or "inotify_init -1" in result.text, result.text


@pytest.mark.parametrize("bound, counted", [
    ("cgroup v1", "the call's processes, the files of its /tmp and the kernel's memory for them"),
    ("cgroup v2", "charged by the kernel"),
    ("watchdog", "the PSS of the call's processes plus the bytes of its /tmp, sampled every 50 ms"),
])
def test_the_log_says_what_each_bound_covers(bound, counted):
    # the start-up log line names the bound and what it counts; both bounds leave memfd and System V
    # shared memory to the filter, and the /tmp's files to the cap
    text = sandbox_memory.memory_covers(bound)
    assert text.startswith(bound + ": ") and counted in text
    assert "memfd and System V shared memory refused (seccomp)" in text and "max_files files" in text
