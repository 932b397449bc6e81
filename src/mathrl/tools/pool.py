"""`ToolPool`: the tools of a rollout, called in parallel with a timeout per call; and the config check.

    with ToolPool(specs, workers=4) as pool:
        futures = [pool.submit(call.name, call.args) for call in calls]   # Future[ToolResult] each
        observations = [f.result().text for f in futures]

Built-ins run in the pool's threads: ``python`` waits there on its sandboxed subprocess (which the
timeout kills), ``calculator`` computes there (bounded by its digit caps). A user's tool (an import
path) runs in a worker *process* (`mathrl.workers.WorkerPool.call`; spawned, one call at a time each):
a hang or a crash (``os._exit``, a segfault) costs that process, which is killed at the call's timeout
or found dead and replaced, and the call's result says ``timeout`` or ``error``; the pool goes on.

Never raises for what a tool or the model does: an unknown tool name, an exception, a non-string
result (str()-ed), a hang and a crash are all `ToolResult`s. Only a bad config raises, at
construction (`check_tool_specs`), before any model is loaded.
"""

from __future__ import annotations

import functools
import inspect
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from mathrl.config import tool_entry_problems
from mathrl.registry import load_callable
from mathrl.tools.base import ToolResult, ToolSpec
from mathrl.tools.builtins import BUILTIN_TOOLS
from mathrl.tools.sandbox.tool import sandbox_mode, sandbox_problem
from mathrl.workers import WorkerPool, WorkerStartError

__all__ = ["MAX_TEXT_CHARS", "ToolPool", "check_tool_specs"]

MAX_TEXT_CHARS = 65536
"""A user tool's result is cut to this many characters (the python tool has its own byte cap)."""
MAX_ERROR_CHARS = 300
"""An exception's one-line message is cut to this many characters."""
_WORKER_START_TIMEOUT_S = 120.0
"""How long a fresh worker may take to start and import the user's tools (not part of a call's timeout)."""
_DEFAULT_PARAMETERS = {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}


# ---------------------------------------------------------------------------------------------------
# Config check
# ---------------------------------------------------------------------------------------------------


def check_tool_specs(specs: list[ToolSpec]) -> list[str]:
    """One-line problems of the tool specs, each naming its ``rollout.tools[i]`` field; empty when fine:
    the config's rules (`config.tool_entry_problems`), which import every user function, so a typo in a
    module path fails at construction and not in the middle of a rollout."""
    wrong = [f"rollout.tools[{i}] must be a ToolSpec (name, fn, kwargs, timeout_s, description), got {type(s).__name__}"
             for i, s in enumerate(specs) if not isinstance(s, ToolSpec)]
    return wrong or tool_entry_problems([(s.name, s.fn, s.kwargs, s.timeout_s) for s in specs])


# ---------------------------------------------------------------------------------------------------
# User tools: worker processes
# ---------------------------------------------------------------------------------------------------


def _one_line(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _call_user_tool(fn, args, kwargs: dict) -> tuple[str, str]:
    """(status, text) of one call of a user's tool function, in its worker process."""
    try:
        value = fn(args, **kwargs)
        text = value if isinstance(value, str) else str(value)
        return "ok", text[:MAX_TEXT_CHARS]
    except BaseException as e:  # SystemExit too: a tool's sys.exit is its error, not the worker's end
        return "error", _one_line(f"error: {type(e).__name__}: {e}")


def _handle(functions: dict, message: tuple) -> tuple[str, str]:
    """A worker's answer to ``(ref, args, kwargs)``: ``(status, text)``."""
    ref, args, kwargs = message
    fn = functions.get(ref)
    if fn is None or isinstance(fn, BaseException):
        return "error", _one_line(f"error: the tool {ref!r} does not import here: {fn}")
    return _call_user_tool(fn, args, kwargs)


def _start_worker(refs: tuple[str, ...]) -> tuple[Callable, None]:
    """A worker's start (`mathrl.workers.serve`): import the user's tools (one that does not import is
    its calls' error), then answer with `_handle`."""
    functions = {}
    for ref in refs:
        try:
            functions[ref] = load_callable(ref)
        except BaseException as e:
            functions[ref] = e
    return functools.partial(_handle, functions), None


# ---------------------------------------------------------------------------------------------------
# The pool
# ---------------------------------------------------------------------------------------------------


def tool_schemas(specs: list[ToolSpec]) -> list[dict]:
    """The tools as OpenAI / Hugging Face function schemas, for ``apply_chat_template(tools=...)``.

    A built-in declares its one string parameter (``code``, ``expression``). A user function
    declares its JSON-schema ``parameters`` as an attribute of the function if it has one, else one
    string parameter ``input`` (the call's arguments reach the function as that dict); its
    description is the spec's, else the first paragraph of its docstring.
    """
    out = []
    for spec in specs:
        name = spec.name
        if spec.fn in BUILTIN_TOOLS:
            builtin = BUILTIN_TOOLS[spec.fn]
            parameters = {"type": "object", "required": [builtin.parameter], "properties": {
                builtin.parameter: {"type": "string", "description": builtin.parameter_description}}}
            description = spec.description or builtin.description
        else:
            fn = load_callable(spec.fn)
            declared = getattr(fn, "parameters", None)
            parameters = declared if isinstance(declared, dict) else _DEFAULT_PARAMETERS
            description = spec.description or (inspect.getdoc(fn) or "").split("\n\n")[0].replace("\n", " ")
        out.append({"type": "function", "function": {"name": name, "description": description, "parameters": parameters}})
    return out


class ToolPool:
    """Runs tool calls in parallel with a timeout per call.

    specs: the tools (`ToolSpec`), checked by `check_tool_specs`, and a python tool's sandbox checked to work
    here; workers: the calls in flight at once (threads; user tools also get up to this many processes). Raises
    ValueError naming ``rollout.tools[i]`` on a problem with a spec or its sandbox.
    """

    def __init__(self, specs: list[ToolSpec], *, workers: int = 4):
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
        problems = check_tool_specs(specs) or _sandbox_problems(specs)
        if problems:
            raise ValueError("; ".join(problems))
        self._specs = {spec.name: spec for spec in specs}
        self._user_refs = tuple(sorted({s.fn for s in specs if s.fn not in BUILTIN_TOOLS}))
        # User tools: a worker process for each call in flight, spawned (forking a trainer with threads
        # can deadlock); a user's code may leave threads behind, so close() kills idle workers too.
        self._workers = WorkerPool(functools.partial(_start_worker, self._user_refs), name="mathrl-tool",
                                   size=workers, start_timeout_s=_WORKER_START_TIMEOUT_S, kill_idle_on_close=True)
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="mathrl-tool")
        self._stop = threading.Event()  # set by close(): running sandboxes are killed
        self._lock = threading.Lock()
        self._pending: set[Future] = set()
        self._closed = False
        self._prestarted = {}  # tool name -> what its built-in starts ahead of its calls (python: `warm` sandboxes)
        for spec in specs:
            builtin = BUILTIN_TOOLS.get(spec.fn)
            if builtin is not None and builtin.prestart is not None:
                started = builtin.prestart(spec.kwargs)
                if started is not None:
                    self._prestarted[spec.name] = started

    # -- public ------------------------------------------------------------------------------------

    def submit(self, name: str, args: str | dict) -> Future:
        """Start a call; the Future's result is its `ToolResult` (never an exception)."""
        out: Future = Future()
        spec = self._specs.get(name) if isinstance(name, str) else None
        if spec is None:
            out.set_result(ToolResult(f"error: unknown tool {_one_line(repr(name), 80)}; tools: "
                                      f"{', '.join(self._specs)}", "error", 0.0))
            return out
        with self._lock:
            if self._closed:
                out.set_result(_closed_result())
                return out
            self._pending.add(out)
            self._executor.submit(self._run, out, spec, args)
        return out

    def call(self, name: str, args: str | dict) -> ToolResult:
        """`submit` and wait."""
        return self.submit(name, args).result()

    def names(self) -> list[str]:
        return list(self._specs)

    def schemas(self) -> list[dict]:
        """The tools as OpenAI / Hugging Face function schemas (`tool_schemas`)."""
        return tool_schemas(list(self._specs.values()))

    def close(self) -> None:
        """Kill running sandboxes and workers, and answer calls not yet run with an error. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._stop.set()
        self._workers.close()  # a call waiting on a worker sees its process end and returns
        self._executor.shutdown(wait=True, cancel_futures=True)
        for started in self._prestarted.values():
            started.close()  # the sandboxes still waiting for a call
        with self._lock:
            for future in self._pending:
                if not future.done():
                    future.set_result(_closed_result())
            self._pending.clear()

    def __enter__(self) -> ToolPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: modules may be gone already
            pass

    # -- internals ---------------------------------------------------------------------------------

    def _run(self, out: Future, spec: ToolSpec, args: str | dict) -> None:
        with self._lock:
            if out.done() or not out.set_running_or_notify_cancel():
                self._pending.discard(out)
                return
        start = time.perf_counter()
        try:
            if spec.fn in BUILTIN_TOOLS:
                extra = {"prestarted": self._prestarted[spec.name]} if spec.name in self._prestarted else {}
                result = BUILTIN_TOOLS[spec.fn].run(args, timeout_s=spec.timeout_s, stop=self._stop, **extra, **spec.kwargs)
            else:
                result = self._call_user(spec, args)
        except BaseException as e:  # a bug of ours: still an observation, and the pool goes on
            result = ToolResult(_one_line(f"error: {type(e).__name__}: {e}"), "error", time.perf_counter() - start)
        with self._lock:
            self._pending.discard(out)
        out.set_result(result)
        if spec.name in self._prestarted and not self._stop.is_set():
            self._prestarted[spec.name].refill()  # after the result: no call waits for another's start-up

    def _call_user(self, spec: ToolSpec, args: str | dict) -> ToolResult:
        start = time.perf_counter()
        try:
            reply = self._workers.call((spec.fn, args, spec.kwargs), spec.timeout_s)
        except WorkerStartError as e:  # a worker's start-up is not part of the call's timeout
            if self._stop.is_set():
                return _closed_result()
            return ToolResult(f"error: the tool worker {e}", "error", time.perf_counter() - start)
        seconds = time.perf_counter() - start
        if reply.status == "ok":
            return ToolResult(reply.value[1], reply.value[0], seconds)
        if reply.status == "unsent":  # unpicklable args, or the worker died while idle
            return ToolResult(_one_line(f"error: the call could not be sent to the tool: {reply.error}"), "error",
                              seconds)
        if reply.status == "closed" or self._stop.is_set():
            return _closed_result()
        if reply.status == "timeout":
            return ToolResult(f"timeout: the tool {spec.name!r} gave no result within {spec.timeout_s:g} s "
                              "and was stopped", "timeout", seconds)
        return ToolResult(f"error: the tool {spec.name!r} crashed (its process exited with code {reply.exit_code})",
                          "error", seconds)


def _closed_result() -> ToolResult:
    return ToolResult("error: the tool pool is closed", "error", 0.0)


def _sandbox_problems(specs: list[ToolSpec]) -> list[str]:
    """Each python tool's sandbox must work here: an explicit mode, or at least one for ``auto``."""
    problems = []
    for i, spec in enumerate(specs):
        if spec.fn != "python":
            continue
        mode, interpreter = spec.kwargs.get("sandbox", "auto"), spec.kwargs.get("python")
        if mode == "auto":
            try:
                sandbox_mode(python=interpreter)
            except RuntimeError as e:
                problems.append(f"rollout.tools[{i}]: {e}")
        elif (problem := sandbox_problem(mode, python=interpreter)) is not None:
            problems.append(f"rollout.tools[{i}].kwargs.sandbox={mode!r} does not work here: {problem}")
    return problems
