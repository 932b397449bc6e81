"""The python tool's sandbox: REPL-style output, and hostile code in every sandbox mode that works on
this machine (bwrap, unshare_unsafe, rlimit_unsafe; the others skip with the reason). The classes of
escape each mode is claimed to hold are in tests/tools/test_tools_sandbox_classes.py.

Each hostile case runs with the mode's default audit hook, and again with the hook off where this
setting has a boundary that does not depend on the hook (the hook is defence in depth: native code can
bypass it), so that what docs/tools.md claims for each mode is what these tests saw.

Run: python -m pytest tests/tools/test_tools_sandbox.py -q
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import tracemalloc
import uuid
from dataclasses import dataclass, field
from typing import Callable

import pytest

from mathrl.tools import BUILTIN_TOOLS, run_python, sandbox_mode, sandbox_problem, sandbox_works
from mathrl.tools.sandbox import WarmSandboxes, check_python_kwargs
from sandbox_helpers import MODES, interpreter_for, run_started

ROOT = os.geteuid() == 0


@pytest.fixture(params=MODES)
def mode(request) -> dict:
    """The kwargs that select one working mode (and an interpreter it can run)."""
    python = interpreter_for(request.param)
    if python is None:
        pytest.skip(f"sandbox {request.param!r} does not work here: {sandbox_problem(request.param)}")
    return {"sandbox": request.param, "python": python}


@pytest.fixture(params=["cold", "warm"])
def start(request):
    """How the call's sandbox starts: now ("cold"), or ahead of the call ("warm")."""
    return lambda code, **kwargs: run_started(request.param, code, **kwargs)


def marked_processes(marker: str) -> list[int]:
    """PIDs of the host's processes whose command line contains `marker`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


def wait_until_gone(marker: str, wait_s: float = 10.0) -> list[int]:
    """The processes with `marker` still alive after waiting for them (killing and reaping are async)."""
    deadline = time.monotonic() + wait_s
    while (left := marked_processes(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


# ---------------------------------------------------------------------------------------------------
# What the model reads
# ---------------------------------------------------------------------------------------------------

REPL = [
    # (args, status, text, why)
    ("x = 3\nx ** 2", "ok", "9", "REPL: the value of a final expression is shown"),
    ("print('a')\n'b'", "ok", "a\n'b'", "the value is shown as the REPL shows it (repr) after the prints"),
    ("print(1)", "ok", "1", "a final print is not shown twice (print returns None)"),
    ("x = 5", "ok", "", "no output, no value: empty text, status ok"),
    ("for i in range(3):\n    print(i)", "ok", "0\n1\n2", "a final compound statement is just run"),
    ("import sys\nsys.stderr.write('warn\\n')\nprint('out')", "ok", "out\nwarn", "stdout, then stderr"),
    ("import fractions\nfractions.Fraction(1, 3) + 1", "ok", "Fraction(4, 3)", "the standard library is there"),
    ({"code": "2 + 2"}, "ok", "4", "a JSON tool call's arguments"),
    ("1/0", "error", "ZeroDivisionError: division by zero", "an exception: its traceback's last line only"),
    ("print('before')\nraise ValueError('bad')", "error", "before\nValueError: bad", "the output before an exception is kept"),
    ("x = (", "error", "SyntaxError: '(' was never closed (<code>, line 1)", "a syntax error names the line"),
    ("import sys\nsys.exit(3)", "error", "error: the program exited with code 3", "a silent non-zero exit says its code"),
    ("import numpy", "error", "ModuleNotFoundError: No module named 'numpy'", "-S: no site-packages, standard library only"),
    (42, "error", "error: expected python code as a string, got int", "a non-string body is the call's error"),
    ({"source": "1"}, "error", "error: expected {\"code\": \"<python>\"}, got keys 'source'", "the wrong key is named"),
]


@pytest.mark.parametrize("args, status, text, why", REPL, ids=[str(c[0])[:25] for c in REPL])
def test_repl_output(mode, args, status, text, why):
    result = run_python(args, timeout_s=30, **mode)
    assert (result.status, result.text) == (status, text), why


def test_environment_and_temporary_directory(mode, start, monkeypatch):
    # why: the code sees only PATH, LANG and HOME (its fresh cwd), and its directory is gone afterwards
    parent = tempfile.mkdtemp(prefix="mathrl-test-")
    os.chmod(parent, 0o711)  # as root the code's uid must be able to cross it
    monkeypatch.setattr(tempfile, "tempdir", parent)
    try:
        code = "import os\nprint(sorted(os.environ))\nprint(os.getcwd() == os.environ['HOME'])\nopen('f', 'w').write('x')"
        result = start(code, timeout_s=30, **mode)
        assert result.text.splitlines()[0] in ("['HOME', 'LANG', 'PATH']", "['HOME', 'LANG', 'PATH', 'PWD']"), result.text
        assert result.text.splitlines()[1] == "True"
        assert os.listdir(parent) == []
    finally:
        os.rmdir(parent)


def test_cpu_limit(mode, start):
    # why: CPU time is bounded apart from the wall clock (a call can be slow while the CPU is busy)
    result = start("while True: pass", timeout_s=60, cpu_s=1, **mode)
    assert result.status == "timeout"
    assert result.text == "timeout: the code used more than 1 s of CPU and was stopped"


# ---------------------------------------------------------------------------------------------------
# Hostile code
# ---------------------------------------------------------------------------------------------------


@dataclass
class Context:
    """What a hostile case's code and checks refer to."""

    target: str  # a path in the test's tmp_path: nothing may create it
    marker: str  # in the command line of the processes a case starts
    port: int  # a listening socket of the test process
    secret: str  # in the test process's environment
    sibling: subprocess.Popen  # a process of the test's user that must survive


@dataclass
class Case:
    name: str
    code: str  # formatted with the Context's fields
    statuses: tuple[str, ...]
    check: Callable[[str, Context], None] = lambda text, ctx: None
    kwargs: dict = field(default_factory=dict)
    why: str = ""
    needs: str = ""  # which boundary stops it without the audit hook: "files", "network", "processes"


def nothing_created(text: str, ctx: Context) -> None:
    assert not os.path.exists(ctx.target), text


def no_secret(text: str, ctx: Context) -> None:
    assert ctx.secret not in text


def no_process_left(text: str, ctx: Context) -> None:
    assert wait_until_gone(ctx.marker) == []


def bounded_fork_bomb(text: str, ctx: Context) -> None:
    assert text.count("+") < 16, f"{text.count('+')} processes: more than max_processes"
    assert wait_until_gone(ctx.marker) == []
    assert subprocess.run(["true"]).returncode == 0  # the host can still start processes


def output_bounded(text: str, ctx: Context) -> None:
    assert len(text.encode()) <= 65536 + 100
    assert text.endswith("error: output exceeded 65536 bytes; the program was stopped")


def host_unharmed(text: str, ctx: Context) -> None:
    assert ctx.sibling.poll() is None, "a process of the test's user was killed"  # and we are still here


SLEEPER = "import os, sys\nos.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(100)', '{marker}'])"

HOSTILE = [
    Case("infinite loop", "import os, sys\ntry:\n    if os.fork() == 0:\n        exec({sleeper!r})\nexcept PermissionError:\n"
         "    pass\nwhile True:\n    pass", ("timeout",), no_process_left, {"timeout_s": 1},
         why="the wall clock stops it, and its child (left in the group, or in the pid namespace) dies too",
         needs="processes"),
    Case("fork bomb", "import os, sys\nbomb = '''\nimport os, time\nfirst = os.getpid()\nfor _ in range(10):\n    try:\n"
         "        if os.fork() == 0:\n            print('+', flush=True)\n    except OSError:\n        pass\n"
         "time.sleep(1 if os.getpid() == first else 100)\n'''\nos.execv(sys.executable, [sys.executable, '-c', bomb, '{marker}'])",
         ("ok", "error", "timeout"), bounded_fork_bomb, {"timeout_s": 20, "max_processes": 16},
         why="2**10 processes unbounded; RLIMIT_NPROC (as an unprivileged uid) keeps it under 16, and the rest die with the call",
         needs="processes"),
    Case("memory hog", "x = bytearray(2 * 1024 ** 3)", ("error",), lambda text, ctx: None, {"memory_mb": 256},
         why="RLIMIT_AS: the allocation fails inside the sandbox"),
    Case("100 MB of output", "import sys\nchunk = 'x' * 65536\nfor _ in range(1600):\n    sys.stdout.write(chunk)",
         ("error",), output_bounded, {"timeout_s": 30}, why="the parent keeps 64 KiB and kills the writer"),
    Case("write outside", "open({target!r}, 'w').write('x')", ("error",), nothing_created,
         why="the test's directory is outside the sandbox (not mounted, or not the code's uid's)", needs="files"),
    Case("parent's environment", "import os\nprint(dict(os.environ))\nfor p in os.listdir('/proc'):\n    try:\n"
         "        print(open(f'/proc/{{p}}/environ', 'rb').read())\n    except Exception:\n        pass",
         ("ok", "error"), no_secret, why="a stripped environment, and other processes' environ unreadable",
         needs="environ"),
    Case("network", "import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=5)\n'connected'",
         ("error",), lambda text, ctx: None, why="its own network namespace has no route to the host's loopback",
         needs="network"),
    Case("os.system", "import os\nos.system('touch {target}')", ("ok", "error"), nothing_created,
         why="a shell is no way out: the same boundary holds for the commands it runs", needs="files"),
    Case("ctypes kill", "import ctypes, os\nlibc = ctypes.CDLL(None)\nlibc.kill(-1, 9)\nlibc.kill(os.getppid(), 9)\n'alive'",
         ("ok", "error"), host_unharmed,
         why="kill(-1) and kill(parent) through libc reach only the sandbox (pid namespace, or a uid of its own)",
         needs="processes"),
]


def boundary_without_hook(mode: str, needs: str) -> str | None:
    """None when the kernel stops this kind of case in `mode` here, else why the hook is all there is."""
    if mode == "bwrap" or not needs:
        return None
    if needs == "network":
        return None if mode == "unshare_unsafe" else "rlimit has no network isolation: only the audit hook refuses sockets"
    if ROOT:
        return None  # the code runs as an unprivileged uid of its own
    if mode == "unshare_unsafe" and needs in ("processes", "environ"):
        return None  # its pid namespace (and /proc) holds only the sandbox's processes
    return f"{mode} as a normal user runs the code as that user: only the audit hook stops it"


@pytest.fixture
def context(tmp_path, monkeypatch):
    secret = f"secret-{uuid.uuid4().hex}"
    monkeypatch.setenv("MATHRL_TEST_SECRET", secret)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        sibling = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        try:
            yield Context(str(tmp_path / "escaped"), f"mathrl-marker-{uuid.uuid4().hex}", server.getsockname()[1],
                          secret, sibling)
        finally:
            sibling.kill()
            sibling.wait()


@pytest.mark.parametrize("hook", ["default hook", "no hook"])
@pytest.mark.parametrize("case", HOSTILE, ids=[c.name for c in HOSTILE])
def test_hostile(mode, case, hook, context, start):
    kwargs = {"timeout_s": 10, **case.kwargs}
    if hook == "no hook":
        if mode["sandbox"] == "bwrap":
            pytest.skip("bwrap runs without the hook by default: the other variant is this one")
        reason = boundary_without_hook(mode["sandbox"], case.needs)
        if reason:
            pytest.skip(reason)
        kwargs["audit_hook"] = False
    ctx = context
    code = case.code.format(target=ctx.target, marker=ctx.marker, port=ctx.port, sleeper=SLEEPER.format(marker=ctx.marker))
    if case.name == "memory hog":
        result = start(code, **mode, **kwargs)
    else:
        tracemalloc.start()
        try:
            result = start(code, **mode, **kwargs)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 8 << 20, f"the parent held {peak} bytes"  # the output is capped, not buffered
    assert result.status in case.statuses, (case.why, result)
    assert "connected" not in result.text, case.why
    case.check(result.text, ctx)
    assert ctx.sibling.poll() is None, "the host's processes are untouched"


# ---------------------------------------------------------------------------------------------------
# Modes and options
# ---------------------------------------------------------------------------------------------------


def test_auto_mode_is_bwrap_or_one_line_naming_what_to_install(monkeypatch):
    # why: auto never picks a mode that does not isolate hostile code; without bubblewrap the run stops
    # at start-up with one line that says what to install
    from mathrl.tools.sandbox import command as sandbox_command
    from mathrl.tools.sandbox import tool as sandbox_module

    if sandbox_works("bwrap"):
        assert sandbox_mode() == "bwrap"
        assert run_python("1 + 1").text == "2"
    sandbox_module._auto_mode.cache_clear()
    sandbox_module._probe.cache_clear()
    monkeypatch.setattr(sandbox_command, "binary", lambda name: None)  # as on a machine without bubblewrap
    try:
        with pytest.raises(RuntimeError) as error:
            sandbox_mode()
        assert str(error.value) == (
            "no safe python sandbox works here (bwrap: bwrap is not installed (apt-get install bubblewrap)); install "
            "bubblewrap from the distribution's packages (apt-get install bubblewrap, dnf install bubblewrap); "
            "sandbox=unshare_unsafe or rlimit_unsafe run model code without isolation")
        assert "\n" not in str(error.value)
    finally:
        sandbox_module._auto_mode.cache_clear()
        sandbox_module._probe.cache_clear()


def test_unknown_mode_is_a_reason_not_a_crash():
    # why: a config or probe with a typo gets a one-line reason
    assert "not a sandbox mode" in sandbox_problem("docker")
    result = run_python("1", sandbox="docker")
    assert (result.status, result.text) == (
        "error", "error: sandbox must be one of auto, bwrap, unshare_unsafe, rlimit_unsafe, got 'docker'")


@pytest.mark.parametrize("old", ["rlimit", "unshare"])
def test_a_mode_without_isolation_needs_its_unsafe_spelling(old):
    # why: choosing a mode that does not hold hostile code is explicit
    problems = check_python_kwargs({"sandbox": old})
    assert len(problems) == 1 and f"spell it '{old}_unsafe'" in problems[0], problems


KWARGS = [
    # (kwargs, problem or None, why)
    ({}, None, "defaults are fine"),
    ({"sandbox": "rlimit_unsafe", "cpu_s": 0.5, "memory_mb": 64, "max_processes": 4}, None, "every limit can be lowered"),
    ({"cpu_s": 0}, "cpu_s must be a positive number, got 0", "a zero limit would refuse everything"),
    ({"memory_mb": 1.5}, "memory_mb must be a whole number, got 1.5", "byte counts are whole"),
    ({"max_processes": True}, "max_processes must be a positive number, got True", "a bool is not a count"),
    ({"timeout_s": 3}, "the python tool has no option 'timeout_s'", "the timeout is the spec's field, not a kwarg"),
    ({"python": "/nonexistent/python"}, "python='/nonexistent/python' is not an executable file", "checked before use"),
    ({"warm": 4}, None, "sandboxes a ToolPool starts ahead"),
    ({"warm": -1}, "warm must be a whole number of sandboxes >= 0, got -1", "a count"),
]


@pytest.mark.parametrize("kwargs, problem, why", KWARGS, ids=[str(c[0])[:40] for c in KWARGS])
def test_check_python_kwargs(kwargs, problem, why):
    problems = check_python_kwargs(kwargs)
    if problem is None:
        assert problems == [], why
    else:
        assert len(problems) == 1 and problems[0].startswith(problem), (why, problems)


def test_stop_event_ends_the_call():
    # why: ToolPool.close sets it; a running sandbox is killed and the call says why
    import threading

    stop = threading.Event()
    stop.set()
    result = run_python("while True: pass", timeout_s=60, stop=stop)
    assert (result.status, result.text) == ("error", "error: the tool pool was closed during the call")


def test_contract_function_and_registry():
    # why: the registry entry is callable by the tool contract fn(args, **kwargs) -> str
    assert BUILTIN_TOOLS["python"]("6 * 7") == "42"
    assert BUILTIN_TOOLS["python"].parameter == "code"


def test_site_packages_makes_the_interpreters_packages_importable():
    # Qwen2.5-Math's tool code imports sympy; without site_packages the sandbox has the standard library only
    pytest.importorskip("sympy")
    from mathrl.tools import run_python, sandbox_mode

    try:
        mode = sandbox_mode()
    except RuntimeError as e:  # no mode works on this machine (the other tests skip their modes alike)
        pytest.skip(str(e))
    assert run_python("import sympy", sandbox=mode).status == "error"
    got = run_python("import sympy\nsympy.factorint(360)", sandbox=mode, site_packages=True, memory_mb=1024, timeout_s=30)
    assert (got.status, got.text) == ("ok", "{2: 3, 3: 2, 5: 1}")


# ---------------------------------------------------------------------------------------------------
# Sandboxes started ahead (kwarg warm)
# ---------------------------------------------------------------------------------------------------


def descendants(pid: int) -> list[int]:
    """The living processes below `pid` (zombies not counted), from /proc."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                parents[int(entry)] = int(fields[1])
    found, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def test_a_prestarted_sandbox_runs_one_call_and_nothing_of_it_reaches_the_next(mode):
    # why: an interpreter is never reused: a call's variables, files, cwd and children are gone before
    # the next call, which runs in a sandbox of its own started ahead
    stock = WarmSandboxes(mode, 1)
    try:
        first = run_python("import os\nsecret = 41\nopen('left', 'w').write('x')\nos.getpid()", prestarted=stock,
                           timeout_s=30, **mode)
        stock.refill()
        second = run_python("import os\nprint(os.listdir('.'))\nprint(globals().get('secret'))\nos.getpid()",
                            prestarted=stock, timeout_s=30, **mode)
        assert stock.taken == 2 and first.status == second.status == "ok", (first, second)
        assert second.text.splitlines()[:2] == ["[]", "None"]
        if mode["sandbox"] == "rlimit_unsafe":  # (bwrap and unshare give each sandbox a pid namespace of its own)
            assert first.text != second.text.splitlines()[2]  # another process
    finally:
        stock.close()


def test_settings_other_than_the_stocks_start_their_own_sandbox(mode):
    # why: a sandbox started with one tool's limits must not run a call with other limits
    stock = WarmSandboxes(mode, 1)
    try:
        result = run_python("import resource\nresource.getrlimit(resource.RLIMIT_NPROC)[0]", prestarted=stock,
                            timeout_s=30, max_processes=7, **mode)
        assert (result.text, stock.taken) == ("7", 0)
    finally:
        stock.close()


def test_a_pool_with_warm_sandboxes_leaves_no_process_behind(mode):
    # why: the sandboxes waiting for calls are processes of the trainer's; closing the pool ends them
    from mathrl.tools import ToolPool, ToolSpec

    before = set(descendants(os.getpid()))  # (other tests' helpers may still run in this process)

    def ours() -> set[int]:
        return set(descendants(os.getpid())) - before

    pool = ToolPool([ToolSpec("python", "python", kwargs={**mode, "warm": 3}, timeout_s=30)], workers=2)
    results = [f.result() for f in [pool.submit("python", f"{i} * 2") for i in range(6)]]
    assert [r.text for r in results] == [str(2 * i) for i in range(6)]
    assert pool._prestarted["python"].taken >= 1
    assert ours(), "the refilled sandboxes wait"
    pool.close()
    deadline = time.monotonic() + 10
    while ours() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ours() == set()


# ---------------------------------------------------------------------------------------------------
# The runner, as a program of its own (no sandbox around it)
# ---------------------------------------------------------------------------------------------------


def run_runner(tmp_path, code: str, *, limits: str = "RLIMIT_CORE=0:0", audit: str = "") -> subprocess.CompletedProcess:
    from mathrl.tools.sandbox import runner as sandbox_runner

    (tmp_path / "code.py").write_text(code)
    return subprocess.run([sys.executable, "-I", "-S", "-B", sandbox_runner.__file__, "", str(tmp_path / "code.py"),
                           limits, audit], capture_output=True, text=True, cwd=tmp_path, timeout=60)


def test_the_runner_is_a_program_of_its_own(tmp_path):
    # why: the runner is a module, linted and run as code; its arguments are the limits, the code and
    # the hook, and what it prints is what the model reads
    done = run_runner(tmp_path, "x = 6\nx * 7")
    assert (done.returncode, done.stdout, done.stderr) == (0, "42\n", "")
    done = run_runner(tmp_path, "import resource\nresource.getrlimit(resource.RLIMIT_NOFILE)",
                      limits="RLIMIT_NOFILE=17:17,RLIMIT_CORE=0:0")
    assert done.stdout == "(17, 17)\n", done
    done = run_runner(tmp_path, "print('a')\n1/0")
    assert (done.returncode, done.stdout, done.stderr) == (1, "a\n", "ZeroDivisionError: division by zero\n")


def test_the_runners_hook_refuses_what_it_names(tmp_path):
    home = str(tmp_path)
    audit = "\n".join([home, os.path.dirname(os.path.dirname(os.path.realpath(sys.executable))), "/usr", "/lib"])
    for code, refused in [("import subprocess\nsubprocess.run(['true'])", "_posixsubprocess"),
                          ("import multiprocessing.util", "_posixsubprocess"),
                          ("import fractions, decimal, math", None),
                          ("import _posixshmem", "_posixshmem"),
                          ("import socket\nsocket.socket()", "socket.__new__"),
                          ("open('/etc/hostname')", "reading '/etc/hostname'"),
                          ("open('inside.txt', 'w').write('x')", None)]:
        done = run_runner(tmp_path, code, audit=audit)
        if refused is None:
            assert done.returncode == 0, (code, done.stderr)
        else:
            assert done.returncode == 1 and "PermissionError" in done.stderr and refused in done.stderr, (code, done.stderr)
