"""The records of the tool contract, a leaf the tool modules share: `ToolResult` (one call's outcome),
`ToolSpec` (one configured tool), `Builtin` (a built-in tool and what its checks need)."""

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
    prestart: Callable[[dict], object] | None = None
    """Given a spec's kwargs: what a `ToolPool` starts ahead of the tool's calls and hands to `run` as
    ``prestarted=`` (an object with ``close()``), or None for nothing; the python tool's sandboxes."""

    def __call__(self, args: str | dict, **kwargs) -> str:
        return self.fn(args, **kwargs)
