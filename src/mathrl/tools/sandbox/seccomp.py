"""The seccomp filter bwrap installs before the model's code runs: the kernel state that outlives a
call, and the namespaces and mounts that could undo the sandbox's, are refused.

    program = seccomp_program()      -> bytes (a classic BPF program, `struct sock_filter[]`), or None
                                        on an architecture without a table below

Refused: keyrings, new namespaces (``clone3`` answers ENOSYS), mounts, ``bpf`` and kindred kernel
interfaces, socket families other than AF_UNIX/AF_INET/AF_INET6, file-system watches, memfd and
System V memory, other architectures' system calls. It only builds bytes; bwrap installs them.
Why each, and what the tests (tests/tools/test_tools_sandbox*.py) check: docs/tools.md, "Sandbox modes".
"""

from __future__ import annotations

import errno
import platform
import struct

__all__ = ["SOCKET_FAMILIES", "seccomp_program"]

# struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6] (little-endian here)
_NR, _ARCH, _ARG0_LOW = 0, 4, 16
_LD_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, ..., BPF_RET|K
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
_CLONE_NEW = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
_X32_BIT = 0x40000000
SOCKET_FAMILIES = {"AF_UNIX": 1, "AF_INET": 2, "AF_INET6": 10}
"""The only families ``socket`` and ``socketpair`` create inside the sandbox (the same numbers on every
architecture Linux runs on)."""
_SPECIAL = ("clone", "clone3", "socket", "socketpair")  # decided on their arguments, not refused outright

# arch -> (AUDIT_ARCH_*, {name: number})
_TABLES = {
    "x86_64": (0xC000003E, {
        "add_key": 248, "request_key": 249, "keyctl": 250, "unshare": 272, "setns": 308, "mount": 165,
        "umount2": 166, "pivot_root": 155, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
        "fsmount": 432, "fspick": 433, "mount_setattr": 442, "bpf": 321, "perf_event_open": 298,
        "userfaultfd": 323, "io_uring_setup": 425, "inotify_init": 253, "inotify_init1": 294, "fanotify_init": 300,
        "memfd_create": 319, "memfd_secret": 447, "shmget": 29,
        "clone": 56, "clone3": 435, "socket": 41, "socketpair": 53}),
    "aarch64": (0xC00000B7, {
        "add_key": 217, "request_key": 218, "keyctl": 219, "unshare": 97, "setns": 268, "mount": 40,
        "umount2": 39, "pivot_root": 41, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
        "fsmount": 432, "fspick": 433, "mount_setattr": 442, "bpf": 280, "perf_event_open": 241,
        "userfaultfd": 282, "io_uring_setup": 425, "inotify_init1": 26, "fanotify_init": 262,
        "memfd_create": 279, "memfd_secret": 447, "shmget": 194,
        "clone": 220, "clone3": 435, "socket": 198, "socketpair": 199}),
}


def seccomp_program(machine: str | None = None) -> bytes | None:
    """The filter for `machine` (default: this one's, `platform.machine()`), as bwrap's ``--seccomp``
    reads it; None where there is no table for it."""
    arch = _TABLES.get(machine or platform.machine())
    if arch is None:
        return None
    audit_arch, numbers = arch
    refused = [n for name, n in numbers.items() if name not in _SPECIAL]
    allow, eperm, enosys = ("ret", _ALLOW), ("ret", _ERRNO | errno.EPERM), ("ret", _ERRNO | errno.ENOSYS)
    program: list = [
        ("ld", _ARCH), ("jeq", audit_arch, None, "eperm"),
        ("ld", _NR),
        *([("jge", _X32_BIT, "eperm", None)] if audit_arch == 0xC000003E else []),  # x32 system calls
        ("jeq", numbers["clone3"], "enosys", None),
        *[("jeq", n, "eperm", None) for n in refused],
        ("jeq", numbers["socket"], "family", None),
        ("jeq", numbers["socketpair"], "family", None),
        ("jeq", numbers["clone"], None, "allow"),
        ("ld", _ARG0_LOW), ("jset", _CLONE_NEW, "eperm", "allow"),
        ("label", "family"), ("ld", _ARG0_LOW),  # the domain: an allow-list
        *[("jeq", family, "allow", None) for family in SOCKET_FAMILIES.values()],
        ("ret", _ERRNO | errno.EAFNOSUPPORT),
        ("label", "allow"), allow, ("label", "eperm"), eperm, ("label", "enosys"), enosys,
    ]
    return _assemble(program)


def _assemble(program: list) -> bytes:
    """`struct sock_filter` {u16 code; u8 jt; u8 jf; u32 k} for each instruction; jump targets are
    labels (None: the next instruction)."""
    labels, index = {}, 0
    for item in program:
        if item[0] == "label":
            labels[item[1]] = index
        else:
            index += 1
    out, index = [], 0
    for item in program:
        op = item[0]
        if op == "label":
            continue
        if op == "ld":
            out.append(struct.pack("=HBBI", _LD_ABS, 0, 0, item[1]))
        elif op == "ret":
            out.append(struct.pack("=HBBI", _RET, 0, 0, item[1]))
        else:
            code = {"jeq": _JEQ, "jge": _JGE, "jset": _JSET}[op]
            jt, jf = (0 if t is None else labels[t] - index - 1 for t in item[2:4])
            out.append(struct.pack("=HBBI", code, jt, jf, item[1]))
        index += 1
    return b"".join(out)
