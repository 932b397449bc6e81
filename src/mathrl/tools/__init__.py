"""Tools a model calls inside its reasoning during rollouts: a calculator and a python sandbox built in,
and the user's own functions, run in parallel with a timeout per call.

    from mathrl.tools import ToolPool, ToolSpec
    with ToolPool([ToolSpec("python", "python"), ToolSpec("calc", "calculator", timeout_s=1.0)]) as pool:
        result = pool.call("python", "sum(range(10))")      # ToolResult(text="45", status="ok", ...)
        futures = [pool.submit("calc", e) for e in ("1/3", "2**100")]
        schemas = pool.schemas()                            # for tokenizer.apply_chat_template(tools=...)

Model output and model-written code are hostile input: a tool never raises into the caller. Every
failure is a `ToolResult` whose `text` is one line the model reads (``error: ...``, ``timeout: ...``)
and whose `status` says which (``ok`` | ``error`` | ``timeout``), for the metrics.

A tool function's contract (built-ins and the user's alike)::

    def my_tool(args: str | dict, **kwargs) -> str:
        ...   # args: a code block's body, or a JSON tool call's arguments; kwargs: the spec's kwargs

Modules: `calculator` (exact arithmetic, no eval), `sandbox` (model-written python in a subprocess
under bubblewrap, unshare or resource limits alone; `sandbox_mode()` says which), `pool` (`ToolPool`,
`check_tool_specs`). docs/tools.md says what each sandbox mode guarantees.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Literal

Status = Literal["ok", "error", "timeout"]


@dataclass(frozen=True)
class ToolResult:
    """What one tool call gave the model to read, and how it ended."""

    text: str
    """The observation body: the tool's output, or a one-line ``error: ...`` / ``timeout: ...``."""
    status: Status
    """``ok``, ``error`` (the tool or the model's input failed) or ``timeout`` (killed at its limit)."""
    seconds: float
    """Wall time of the call, from when it started running (queueing in the pool not counted)."""


@dataclass(frozen=True)
class ToolSpec:
    """One entry of the tools a rollout offers (config ``rollout.tools[i]``)."""

    name: str
    """The name the model calls it by: letters, digits, ``_`` and ``-`` (chat templates' rule), unique."""
    fn: str
    """A built-in (``python``, ``calculator``) or ``package.module:function`` / ``path/file.py:function``."""
    kwargs: dict = field(default_factory=dict)
    """Keyword arguments passed to the function (for ``python``: the sandbox's limits)."""
    timeout_s: float = 5.0
    """Wall-clock seconds per call; past it the call is killed and its status is ``timeout``."""
    description: str = ""
    """The tool's description in the chat template's schema (default: the built-in's, or the first
    paragraph of the user function's docstring)."""


@dataclass(frozen=True)
class Builtin:
    """A built-in tool: callable by the tool contract, plus what the pool and the config check need."""

    fn: Callable[..., str]
    """The contract function ``fn(args, **kwargs) -> str``."""
    run: Callable[..., ToolResult]
    """The same call with its status: ``run(args, *, timeout_s, stop, **kwargs) -> ToolResult``."""
    parameter: str
    """The JSON argument that holds the call's body (``code``, ``expression``)."""
    parameter_description: str
    description: str
    """For the chat template's tool schema."""
    check_kwargs: Callable[[dict], list[str]]
    """One-line reasons a spec's kwargs are invalid for this tool."""

    def __call__(self, args: str | dict, **kwargs) -> str:
        return self.fn(args, **kwargs)


# The modules below import ToolResult from here, so it is defined before they load.
# The calculator's function keeps a private name here: `mathrl.tools.calculator` stays the module.
from mathrl.tools.calculator import FUNCTIONS, calculate, calculator as _calculator  # noqa: E402
from mathrl.tools.sandbox import (SANDBOX_MODES, check_python_kwargs, python, run_python, sandbox_mode,  # noqa: E402
                                  sandbox_problem, sandbox_works)

BUILTIN_TOOLS: dict[str, Builtin] = {
    "python": Builtin(
        fn=python, run=run_python, parameter="code",
        parameter_description="Python code (standard library only); the value of a final expression is shown.",
        description="Run Python code in a fresh sandbox and read its output (stdout, stderr, the value of "
                    "the last expression, or the last line of an error).",
        check_kwargs=check_python_kwargs),
    "calculator": Builtin(
        fn=_calculator, run=calculate, parameter="expression",
        parameter_description="One arithmetic expression: numbers, + - * / // % **, parentheses and "
                              + ", ".join(FUNCTIONS) + ".",
        description="Evaluate one arithmetic expression exactly (integers of any size, exact fractions).",
        check_kwargs=lambda kwargs: [f"the calculator takes no options; got {', '.join(map(str, kwargs))}"] if kwargs else []),
}
"""The built-in tools by the name a `ToolSpec.fn` gives them."""

from mathrl.tools.pool import ToolPool, check_tool_specs, tool_schemas  # noqa: E402

__all__ = ["BUILTIN_TOOLS", "SANDBOX_MODES", "Builtin", "Status", "ToolPool", "ToolResult", "ToolSpec", "calculate",
           "check_tool_specs", "tool_schemas", "python", "run_python", "sandbox_mode", "sandbox_problem", "sandbox_works"]

from mathrl.registry import TOOLS as _TOOLS  # noqa: E402

for _name, _builtin in BUILTIN_TOOLS.items():  # rollout.tools[].fn names a built-in through the registry
    _TOOLS.register(_name, _builtin, replace=True)
