"""ToolPool: calls in parallel, each failure of a tool a ToolResult (never an exception), a pool that
keeps answering after its tools hang or crash, and the config check that names rollout.tools[i].

Run: python -m pytest tests/tools/test_tools_pool.py -q
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mathrl.tools import ToolPool, ToolResult, ToolSpec, check_tool_specs

PLUGINS = Path(__file__).resolve().parents[1] / "tool_plugins.py"


def user(name: str, function: str, **kw) -> ToolSpec:
    return ToolSpec(name, f"{PLUGINS}:{function}", **kw)


SPECS = [
    ToolSpec("python", "python"),
    ToolSpec("calc", "calculator", description="Exact arithmetic."),
    user("echo", "echo", kwargs={"prefix": "got"}),
    user("raises", "raises"),
    user("hangs", "hangs", timeout_s=1.0),
    user("exits", "exits"),
    user("segfaults", "segfaults"),
    user("number", "number"),
    user("add", "add"),
]


@pytest.fixture(scope="module")
def pool():
    with ToolPool(SPECS, workers=4) as p:
        yield p


CALLS = [
    # (tool, args, status, text, why)
    ("calc", "2**64", "ok", "18446744073709551616", "a built-in in the pool's thread"),
    ("python", "sum(range(10))", "ok", "45", "a built-in in its sandbox"),
    ("echo", "hi", "ok", "got: hi", "a user tool in a worker process, with the spec's kwargs"),
    ("add", {"a": 2, "b": 3}, "ok", "5", "a JSON call's arguments reach a user tool as the dict"),
    ("number", "x", "ok", "42", "a non-string result is str()-ed"),
    ("raises", "x", "error", "error: ValueError: bad input 'x' second line", "an exception is one line"),
    ("hangs", "x", "timeout", "timeout: the tool 'hangs' gave no result within 1 s and was stopped",
     "a hang is killed at the spec's timeout"),
    ("exits", "x", "error", "error: the tool 'exits' crashed (its process exited with code 3)", "os._exit"),
    ("segfaults", "x", "error", "error: the tool 'segfaults' crashed (its process exited with code -11)", "a segfault"),
    ("nope", "x", "error", "error: unknown tool 'nope'; tools: python, calc, echo, raises, hangs, exits, segfaults, "
     "number, add", "an unknown name is an observation, not an exception"),
    ("echo", "still here", "ok", "got: still here", "after a hang and two crashes the pool still answers"),
]


@pytest.mark.parametrize("tool, args, status, text, why", CALLS, ids=[f"{c[0]}-{c[2]}" for c in CALLS])
def test_calls(pool, tool, args, status, text, why):
    result = pool.call(tool, args)
    assert isinstance(result, ToolResult)
    assert (result.status, result.text) == (status, text), why
    assert result.seconds >= 0


def test_many_calls_in_parallel(pool):
    # why: rollouts submit a batch's calls at once; every future gets its own answer, in any mix
    futures = [(f"{i}*{i}", str(i * i), pool.submit("calc", f"{i}*{i}")) for i in range(40)]
    futures += [(f"print({i})", str(i), pool.submit("python", f"print({i})")) for i in range(8)]
    futures += [(f"{i}", f"got: {i}", pool.submit("echo", str(i))) for i in range(12)]
    futures += [("hang", None, pool.submit("hangs", "x"))]  # one slow call does not block the others
    for args, expected, future in futures:
        result = future.result()
        if expected is None:
            assert result.status == "timeout"
        else:
            assert (result.status, result.text) == ("ok", expected), args


def test_names_and_schemas(pool):
    # why: the schemas go to apply_chat_template(tools=...): built-ins declare their parameter, a user
    # tool its `parameters` attribute or one string "input", descriptions from the spec or the docstring
    assert pool.names() == [s.name for s in SPECS]
    schemas = {s["function"]["name"]: s for s in pool.schemas()}
    assert all(s["type"] == "function" for s in schemas.values())
    assert schemas["python"]["function"]["parameters"]["required"] == ["code"]
    assert schemas["calc"]["function"]["parameters"]["required"] == ["expression"]
    assert schemas["calc"]["function"]["description"] == "Exact arithmetic."
    assert schemas["echo"]["function"]["description"] == "Repeat the input."
    assert schemas["echo"]["function"]["parameters"] == {"type": "object", "properties": {"input": {"type": "string"}},
                                                         "required": ["input"]}
    assert schemas["add"]["function"]["parameters"]["required"] == ["a", "b"]


def test_close_is_idempotent_and_ends_running_calls():
    # why: close() kills a running sandbox (no waiting out its 60 s), answers queued calls, and a
    # second close() or a call after it is harmless
    pool = ToolPool([ToolSpec("python", "python", timeout_s=60), user("hangs", "hangs", timeout_s=60)], workers=2)
    running = [pool.submit("python", "while True: pass"), pool.submit("hangs", "x")]
    queued = pool.submit("python", "1")  # workers=2: waits for a thread
    pool.close()
    pool.close()
    for future in running + [queued]:
        result = future.result()
        assert result.status == "error" and "closed" in result.text, result
    after = pool.call("python", "1")
    assert (after.status, after.text) == ("error", "error: the tool pool is closed")


SPEC_PROBLEMS = [
    # (specs, problems, why)
    ([ToolSpec("python", "python"), ToolSpec("calc", "calculator")], [], "the built-ins, fine"),
    ([ToolSpec("t", "python"), ToolSpec("t", "calculator")],
     ["rollout.tools[1].name='t' is also rollout.tools[0]'s; give each tool its own name"], "duplicate names"),
    ([ToolSpec("t", "pyhton")],
     ["rollout.tools[0].fn='pyhton' is not a built-in tool (python, calculator) nor of the form "
      "package.module:function or path/file.py:function"], "a typo in a built-in's name"),
    ([ToolSpec("t", "no_such_module_xyz:f")],
     ["rollout.tools[0].fn: module 'no_such_module_xyz' does not import (ModuleNotFoundError: No module named "
      "'no_such_module_xyz')"], "a user function that does not import"),
    ([ToolSpec("t", f"{PLUGINS}:missing")], [f"rollout.tools[0].fn: module '{PLUGINS}' has no 'missing'"],
     "a missing function"),
    ([ToolSpec("t", f"{PLUGINS}:not_callable")], [f"rollout.tools[0].fn='{PLUGINS}:not_callable' is not callable"],
     "an attribute that is not a function"),
    ([ToolSpec("t", "calculator", timeout_s=0)], ["rollout.tools[0].timeout_s must be a number of seconds > 0, got 0"],
     "a zero timeout"),
    ([ToolSpec("t", "calculator", kwargs={"digits": 3})],
     ["rollout.tools[0].kwargs: the calculator takes no options; got digits"], "kwargs a built-in does not accept"),
    ([ToolSpec("t", "python", kwargs={"memory": 3})],
     ["rollout.tools[0].kwargs: the python tool has no option 'memory'; options: sandbox, python, audit_hook, site_packages, warm, cpu_s, "
      "memory_mb, max_processes, max_file_mb, max_open_files, max_files, max_output_bytes"], "an unknown sandbox option"),
    ([ToolSpec("t", "python", kwargs={"sandbox": "docker"})],
     ["rollout.tools[0].kwargs: sandbox must be one of auto, bwrap, unshare_unsafe, rlimit_unsafe, got 'docker'"], "an unknown mode"),
    ([ToolSpec("has space", "calculator")],
     ["rollout.tools[0].name='has space' must be 1 to 64 letters, digits, _ or -, the first a letter or _"],
     "chat templates' name rule"),
    ([ToolSpec("1calc", "calculator")],
     ["rollout.tools[0].name='1calc' must be 1 to 64 letters, digits, _ or -, the first a letter or _"],
     "a name starts with a letter or _, as the config has always asked"),
    ([{"name": "t", "fn": "python"}], ["rollout.tools[0] must be a ToolSpec (name, fn, kwargs, timeout_s, description), got dict"],
     "a raw mapping is the caller's bug, named"),
]


@pytest.mark.parametrize("specs, problems, why", SPEC_PROBLEMS, ids=[c[2] for c in SPEC_PROBLEMS])
def test_check_tool_specs(specs, problems, why):
    assert check_tool_specs(specs) == problems, why


def test_bad_specs_raise_at_construction():
    # why: config errors stop the run before any model loads, all of them in one line
    with pytest.raises(ValueError, match=r"rollout.tools\[1\].name='t' is also .*; rollout.tools\[1\].timeout_s"):
        ToolPool([ToolSpec("t", "python"), ToolSpec("t", "calculator", timeout_s=-1)])
    with pytest.raises(ValueError, match="workers must be an integer >= 1"):
        ToolPool([], workers=0)
