"""Tools a model calls inside its reasoning during rollouts: a calculator and a python sandbox built in,
and the user's own functions, run in parallel with a timeout per call.

    from mathrl.tools import ToolPool, ToolSpec
    with ToolPool([ToolSpec("python", "python"), ToolSpec("calc", "calculator", timeout_s=1.0)]) as pool:
        result = pool.call("python", "sum(range(10))")      # ToolResult(text="45", status="ok", ...)
        futures = [pool.submit("calc", e) for e in ("1/3", "2**100")]
        schemas = pool.schemas()                            # for tokenizer.apply_chat_template(tools=...)

Model output and model-written code are hostile input: a tool never raises into the caller. Every failure is a
`ToolResult` whose `text` is one line the model reads (``error: ...``, ``timeout: ...``) and whose `status` says which
(``ok`` | ``error`` | ``timeout``), for the metrics. A tool function, built-in or the user's, is ``my_tool(args: str |
dict, **kwargs) -> str`` (args: a code block's body, or a JSON tool call's arguments; kwargs: the spec's kwargs).
Modules: `calculator` (exact arithmetic, no eval), `sandbox` (model-written python in a subprocess under bubblewrap, or for trusted
code the unsafe unshare and rlimit modes: docs/tools.md), `pool` (`ToolPool`, `check_tool_specs`), `base` (records), `builtins`.
"""

from __future__ import annotations

from mathrl.tools.base import Builtin, Status, ToolResult, ToolSpec
from mathrl.tools.builtins import BUILTIN_TOOLS
from mathrl.tools.calculator import calculate
from mathrl.tools.pool import ToolPool, check_tool_specs, tool_schemas
from mathrl.tools.sandbox import SANDBOX_MODES, WarmSandboxes, python, run_python, sandbox_mode, sandbox_problem, sandbox_works

__all__ = ["BUILTIN_TOOLS", "SANDBOX_MODES", "Builtin", "Status", "ToolPool", "ToolResult", "ToolSpec", "calculate",
           "WarmSandboxes", "check_tool_specs", "tool_schemas", "python", "run_python", "sandbox_mode", "sandbox_problem",
           "sandbox_works"]
