"""Score a completion against a reference answer: 1.0 if its final boxed answer is equivalent, else 0.0.

Two layers, both of which never raise on model text:

* ``verify_one(completion, reference, boxed=...)`` checks one pair in the calling process: the box
  policy (`extract.final_answers`) picks the answer, `equivalence.answers_equal` compares it (exact
  decimals, lists by the reference's form, then math-verify: LaTeX -> SymPy).
* ``Verifier`` runs ``verify_one`` in persistent worker processes with a wall-clock timeout per item,
  because SymPy can hang or blow up on adversarial expressions (``10^{10^{10}}``, deep nesting) and
  math-verify's own SIGALRM timeout only works in a main thread and cannot interrupt C code.
  ``Verifier.call`` runs reward functions (``reward.functions``, see `reward.functions`) in the same
  workers, one batch per call, with the same kind of timeout (`call_reward_function`).

Usage::

    with Verifier(num_workers=4, timeout_s=5.0, boxed="all") as verifier:
        results = verifier.score(completions, references)   # list[RewardResult], input order
    rewards = [r.score for r in results]

Reasons (``RewardResult.reason``): ``correct``, ``wrong``, ``no_answer`` (no box, an unterminated final
box or an empty box), ``timeout`` (the worker was killed after ``timeout_s``), ``error`` (an exception,
a crashed worker, or a reference that is empty or cannot be parsed).
"""

from __future__ import annotations

import collections
import functools
import math
import multiprocessing
import multiprocessing.connection
import numbers
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from mathrl.reward.equivalence import UnparsableReference, answers_equal
from mathrl.reward.extract import BOX_POLICIES, BoxPolicy, extract_boxed, final_answers
from mathrl.reward.latex_parse import install_two_stage_parsing

__all__ = ["CHECKERS", "DEFAULT_BOX_POLICY", "CallResult", "FunctionCall", "RewardResult", "Reason", "Verifier",
           "call_reward_function", "math_verify_plain", "verify_one"]

CHECKERS: tuple[str, ...] = ("mathrl", "math-verify")
"""``mathrl``: the extractor and rules of this package (docs/evaluation.md). ``math-verify``: plain
math-verify, ``verify(parse("$" + reference + "$"), parse(completion))`` with its defaults, exactly."""

Reason = Literal["correct", "wrong", "no_answer", "timeout", "error"]

MAX_COMPLETION_CHARS = 1_000_000
"""Completions are cut to their last this-many characters before extraction or sending to a worker."""

DEFAULT_BOX_POLICY: BoxPolicy = "all"
"""The final answer's boxes, joined as one answer (``\\boxed{1}, \\boxed{2}`` is ``1, 2``). Not
hackable by boxing candidates: the joined list must equal the reference exactly."""

_WORKER_START_TIMEOUT_S = 120.0
"""How long a fresh worker may take to import SymPy/math-verify before we give up (slow shared CPUs)."""


@dataclass(frozen=True)
class RewardResult:
    """The score of one completion and why it got it."""

    score: float
    """1.0 if the extracted answer equals the reference, else 0.0."""
    extracted: str | None
    """The answer that was scored (the final box, or the final boxes joined); ``None`` if there was none."""
    reason: Reason
    """One of ``correct``, ``wrong``, ``no_answer``, ``timeout``, ``error``."""
    detail: str = ""
    """Short human text: which path decided, or the exception name for ``error``."""


# ---------------------------------------------------------------------------------------------------
# In-process check
# ---------------------------------------------------------------------------------------------------


def _sanitize(text: str) -> str:
    """Replace lone surrogates (text decoded with ``errors='surrogateescape'``) so every later step,
    from regexes to pipes to log handlers, sees valid UTF-8. Type errors surface here, not deep inside."""
    if not isinstance(text, str):
        raise TypeError(f"expected str, got {type(text).__name__}")
    return text.encode("utf-8", errors="replace").decode("utf-8")


def _verify(completion: str, reference: str, boxed: BoxPolicy) -> RewardResult:
    completion = _sanitize(completion[-MAX_COMPLETION_CHARS:])
    reference = _sanitize(reference)

    answers = final_answers(completion, boxed, max_chars=MAX_COMPLETION_CHARS)
    if answers is None:
        return RewardResult(0.0, None, "no_answer", "no closed \\boxed{...}")
    answers = [answer for answer in answers if answer]
    if not answers:
        return RewardResult(0.0, "", "no_answer", "empty \\boxed{}")
    if not reference.strip():
        return RewardResult(0.0, answers[-1], "error", "empty reference")

    timed_out = None
    for answer in reversed(answers):  # one answer except under boxed="any"
        try:
            verdict = answers_equal(answer, reference)
        except UnparsableReference:
            return RewardResult(0.0, answer, "error", "reference did not parse")
        if verdict.equal:
            return RewardResult(1.0, answer, "correct", verdict.detail)
        if verdict.timed_out and timed_out is None:
            timed_out = RewardResult(0.0, answer, "timeout", verdict.detail)
    if timed_out is not None:
        return timed_out
    return RewardResult(0.0, answers[-1], "wrong", verdict.detail)


def math_verify_plain(completion: str, reference: str) -> RewardResult:
    """Plain math-verify as its README calls it, on the whole completion with its default extraction
    (LaTeX and plain expressions; the latter hands text to sympy's ``parse_expr``: run it in
    ``Verifier`` workers). Never raises."""
    import math_verify

    try:
        gold = math_verify.parse("$" + reference + "$")
        equal = bool(math_verify.verify(gold, math_verify.parse(completion)))
    except Exception as e:
        return RewardResult(0.0, None, "error", type(e).__name__)
    except BaseException as e:
        if type(e).__name__ == "TimeoutException":
            return RewardResult(0.0, None, "timeout", "math-verify alarm")
        raise
    return RewardResult(1.0 if equal else 0.0, None, "correct" if equal else "wrong", "plain math-verify")


def verify_one(
    completion: str, reference: str, *, boxed: BoxPolicy = DEFAULT_BOX_POLICY, checker: str = "mathrl"
) -> RewardResult:
    """Score one completion against its reference in this process. Never raises.

    ``boxed`` picks the boxes that make the answer (see `mathrl.reward.extract.final_answers`): the
    final answer's boxes joined as one (``all``, default), the last box (``last``), or any box
    (``any``, hackable: evaluation of third-party outputs only). There is no wall-clock bound beyond
    math-verify's own SIGALRM timeouts (main thread only): use ``Verifier`` for model text.
    ``checker="math-verify"`` scores with plain math-verify instead (`math_verify_plain`; ``boxed``
    does not apply).
    """
    if checker == "math-verify":
        return math_verify_plain(_sanitize(completion[-MAX_COMPLETION_CHARS:]), _sanitize(reference))
    try:
        return _verify(completion, reference, boxed)
    except Exception as e:  # a reward must never take down training
        return RewardResult(0.0, None, "error", type(e).__name__)
    except BaseException as e:
        # math-verify's TimeoutException derives from BaseException; its SIGALRM can land just
        # outside math-verify's own try block. KeyboardInterrupt and SystemExit still propagate.
        if type(e).__name__ == "TimeoutException":
            return RewardResult(0.0, None, "timeout", "math-verify alarm")
        raise


# ---------------------------------------------------------------------------------------------------
# Reward functions (reward.functions): one call scores one batch of samples
# ---------------------------------------------------------------------------------------------------

RewardValue = float | dict[str, float]


@dataclass(frozen=True)
class FunctionCall:
    """One call of a reward function on a batch of samples, run by `Verifier.call`."""

    ref: str  # "package.module:function" or "path/to/file.py:function" (`mathrl.registry.load_callable`)
    kwargs: dict
    batch: dict  # prompts, responses, fields, tokens: lists of one entry per sample
    timeout_s: float


@dataclass(frozen=True)
class CallResult:
    """What a call gave: ``ok`` with one value per sample (``None`` where the value was not a finite
    number or a dict with a finite ``score``), or ``error`` / ``timeout`` with no values."""

    status: Literal["ok", "error", "timeout"]
    values: list[RewardValue | None] | None
    detail: str = ""


_FUNCTIONS: dict[str, Callable] = {}  # a worker's loaded functions, by reference


def _finite(x: object) -> float | None:
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _reward_value(value: object) -> RewardValue | None:
    """A float, or a dict of named floats with a ``score``; None for anything else (NaN included)."""
    if isinstance(value, dict):
        named = {str(k): _finite(v) for k, v in value.items()}
        if named.get("score") is None or any(v is None for v in named.values()):
            return None
        return named
    return _finite(value)


def call_reward_function(ref: str, kwargs: dict, batch: dict) -> CallResult:
    """``fn(prompts=..., responses=..., fields=..., tokens=..., **kwargs)`` for the function named by
    `ref`, checked to return one float (or dict of named floats with a ``score``) per sample. Never
    raises: an exception is ``error`` with its name and message."""
    try:
        fn = _FUNCTIONS.get(ref)
        if fn is None:
            from mathrl.registry import load_callable

            fn = _FUNCTIONS[ref] = load_callable(ref)
        out = fn(prompts=batch["prompts"], responses=batch["responses"], fields=batch["fields"],
                 tokens=batch["tokens"], **kwargs)
        values = list(out)
    except Exception as e:
        return CallResult("error", None, f"{type(e).__name__}: {e}"[:300])
    except BaseException as e:  # math-verify's alarm, raised from inside a user's function
        if type(e).__name__ == "TimeoutException":
            return CallResult("timeout", None, "math-verify alarm")
        raise
    if len(values) != len(batch["responses"]):
        return CallResult("error", None, f"returned {len(values)} values for {len(batch['responses'])} samples")
    checked = [_reward_value(v) for v in values]
    bad = next((v for v, c in zip(values, checked) if c is None), None)
    detail = "" if bad is None else f"not a finite float or a dict with a finite 'score': {str(bad)[:80]}"
    return CallResult("ok", checked, detail)


# ---------------------------------------------------------------------------------------------------
# Worker processes
# ---------------------------------------------------------------------------------------------------

ItemFn = Callable[[str, str], RewardResult]


def _encode(text: str) -> bytes:
    # Pickle would carry lone surrogates, but replacing them here means the worker and the results
    # see exactly what verify_one would see in-process.
    return text.encode("utf-8", errors="replace")


def _warm_up(fast_latex: bool) -> bool | None:
    """Run one check, and with `fast_latex` (the mathrl checker) install math-verify's two-stage LaTeX
    parsing (`latex_parse`; it imports latex2sympy2 and SymPy), so that a worker's first item does not
    pay those imports inside its timeout. Returns whether LaTeX parses SLL-first here (None: the plain
    math-verify checker, which parses as math-verify does)."""
    verify_one("\\boxed{\\frac{1}{2}}", "0.5")
    return install_two_stage_parsing() if fast_latex else None


def _worker_main(conn: multiprocessing.connection.Connection, item_fn: ItemFn, fast_latex: bool) -> None:
    """Loop of a worker process: say ``("ready", latex fast parse)`` once warmed up, then receive
    ``(completion, reference)`` as UTF-8 bytes and send back a ``RewardResult``; ``None`` or a closed
    pipe ends it."""
    # Ctrl-C goes to the whole process group; let the parent decide, instead of N tracebacks.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    conn.send(("ready", _warm_up(fast_latex)))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return  # parent went away
        if message is None:
            return
        if message[0] == "call":  # a reward function's batch (Verifier.call)
            conn.send(call_reward_function(*message[1:]))
            continue
        completion, reference = (part.decode("utf-8") for part in message)
        try:
            result = item_fn(completion, reference)
        except Exception as e:  # only a custom item_fn can get here; verify_one never raises
            result = RewardResult(0.0, None, "error", type(e).__name__)
        conn.send(result)


class _Worker:
    """One worker process, the parent's end of its private pipe, and the item it is working on.

    A private pipe per worker (rather than a shared queue) means killing a hung worker can never
    leave a lock held or a half-written message in a channel other workers use.
    """

    def __init__(self, context: multiprocessing.context.BaseContext, item_fn: ItemFn, fast_latex: bool) -> None:
        self.conn, child_conn = context.Pipe(duplex=True)
        self.process = context.Process(
            target=_worker_main, args=(child_conn, item_fn, fast_latex), name="mathrl-verifier", daemon=True
        )
        self.process.start()
        child_conn.close()  # so that recv() in the parent sees EOF when the child dies
        self.ready = False
        self.start_deadline = time.monotonic() + _WORKER_START_TIMEOUT_S
        self.item: int | None = None  # index into the current score() call
        self.item_deadline = 0.0

    def stop(self, *, kill: bool) -> None:
        if kill:
            self.process.kill()  # SIGKILL: a worker stuck in C code may not honour SIGTERM promptly
        self.process.join(timeout=5.0)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=5.0)
        self.conn.close()

    def exit_detail(self) -> str:
        self.process.join(timeout=1.0)
        return f"worker exited with code {self.process.exitcode}"


class Verifier:
    """Scores (completion, reference) pairs in worker processes with a per-item wall-clock timeout.

    Workers are started lazily on the first ``score`` call and reused. Each item is sent to an idle
    worker (up to ``num_workers`` in flight); a worker that takes longer than ``timeout_s`` on an item
    is killed and replaced, and that item gets ``reason="timeout"``. A worker that dies is replaced
    and its item gets ``reason="error"``. Results come back in input order.

    Workers use the ``spawn`` start method: the parent has torch loaded with its thread pools, and
    forking a multi-threaded process can deadlock the child. Spawned children re-import the main
    script, so a script that creates a Verifier needs the ``if __name__ == "__main__":`` guard.

    Args:
        num_workers: worker processes; 0 runs ``verify_one`` in-process (no timeout; for debugging).
        timeout_s: wall-clock seconds allowed per item, counted from when it is sent to a worker.
        boxed: box policy, ``all`` (default), ``last`` or ``any`` (see ``verify_one``; config
            ``reward.boxed``).
        checker: ``mathrl`` (default) or ``math-verify`` (plain math-verify; config ``reward.checker``).
        _item_fn: testing hook. A picklable module-level ``(completion, reference) -> RewardResult``
            that workers call instead of ``verify_one``, e.g. one that hangs on a marked input.

    Not thread-safe across concurrent ``score`` calls on one instance (a lock serialises them).
    """

    def __init__(
        self,
        *,
        num_workers: int = 1,
        timeout_s: float = 5.0,
        boxed: BoxPolicy = DEFAULT_BOX_POLICY,
        checker: str = "mathrl",
        _item_fn: ItemFn | None = None,
    ) -> None:
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0 (0 = in-process), got {num_workers}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s}")
        if boxed not in BOX_POLICIES:
            raise ValueError(f"boxed must be one of {', '.join(BOX_POLICIES)}, got {boxed!r}")
        if checker not in CHECKERS:
            raise ValueError(f"checker must be one of {', '.join(CHECKERS)}, got {checker!r}")
        self.num_workers = num_workers
        self.timeout_s = float(timeout_s)
        self.boxed = boxed
        # A partial of a module-level function pickles by name, so spawned workers can receive it.
        self._item_fn: ItemFn = _item_fn if _item_fn is not None else functools.partial(verify_one, boxed=boxed, checker=checker)
        self._fast_latex = checker == "mathrl"  # plain math-verify parses as math-verify does
        self._context = multiprocessing.get_context("spawn")
        self._workers: list[_Worker] = []
        self._latex_fast_parse: bool | None = None
        self._lock = threading.Lock()
        self._closed = False

    # -- public ------------------------------------------------------------------------------------

    @property
    def latex_fast_parse(self) -> bool | None:
        """Whether math-verify's LaTeX parsing goes SLL-first where the checks run (`latex_parse`): False
        when latex2sympy2's or ANTLR's private API did not fit the patch there and it fell back to the
        slower stock parsing (the scores are the same). None for the plain math-verify checker, and with
        workers until one has started (the first `score` or `call`). With ``num_workers=0`` the patch is
        installed in this process when asked."""
        if not self._fast_latex:
            return None
        if self.num_workers == 0:
            return install_two_stage_parsing()
        return self._latex_fast_parse

    def score(self, completions: Sequence[str], references: Sequence[str]) -> list[RewardResult]:
        """Score each completion against the reference at the same index; never raises on model text.

        Raises ``ValueError`` if the lengths differ, ``RuntimeError`` if the Verifier is closed or a
        worker cannot even start (a broken environment, not a bad completion).
        """
        if len(completions) != len(references):
            raise ValueError(
                f"got {len(completions)} completions but {len(references)} references; "
                "pass one reference per completion"
            )
        with self._lock:
            if self._closed:
                raise RuntimeError("Verifier is closed; create a new one")
            if self.num_workers == 0:
                return [_call_in_process(self._item_fn, c, r) for c, r in zip(completions, references)]
            return self._score_in_workers(completions, references)

    def call(self, calls: Sequence[FunctionCall]) -> list[CallResult]:
        """Run each reward-function call (one batch of samples) in a worker, with its own timeout;
        results in input order. Never raises for what the function does: an exception, a wrong
        return value, a crash or a timeout is the call's ``CallResult`` (see `call_reward_function`)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("Verifier is closed; create a new one")
            if self.num_workers == 0:
                return [call_reward_function(c.ref, c.kwargs, c.batch) for c in calls]
            messages = [("call", c.ref, c.kwargs, c.batch) for c in calls]
            try:
                return self._dispatch(messages, [None] * len(calls), [c.timeout_s for c in calls],
                                      lambda index, reason, detail: CallResult(reason, None, detail))
            except BaseException:
                self._stop_all()  # as in _score_in_workers: no stale results for the next call
                raise

    def close(self) -> None:
        """Stop all workers. Safe to call twice."""
        with self._lock:
            self._closed = True
            self._stop_all()

    def __enter__(self) -> Verifier:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: modules may already be torn down
            pass

    # -- internals ---------------------------------------------------------------------------------

    def _stop_all(self) -> None:
        workers, self._workers = self._workers, []
        for worker in workers:  # ask all to exit first, then wait, so shutdown is not serial
            try:
                worker.conn.send(None)
            except (OSError, ValueError):
                pass
        for worker in workers:
            # Busy or still importing workers would not read the request soon: kill them.
            worker.stop(kill=worker.item is not None or not worker.ready)

    def _replace(self, worker: _Worker, *, kill: bool) -> None:
        worker.stop(kill=kill)
        self._workers[self._workers.index(worker)] = _Worker(self._context, self._item_fn, self._fast_latex)

    def _score_in_workers(
        self, completions: Sequence[str], references: Sequence[str]
    ) -> list[RewardResult]:
        try:
            return self._run_items(completions, references)
        except BaseException:
            # Ctrl-C or a worker that cannot start: workers may still hold items of this call, whose
            # results would land in the next call's slots. Drop them all; the next call restarts.
            self._stop_all()
            raise

    def _run_items(
        self, completions: Sequence[str], references: Sequence[str]
    ) -> list[RewardResult]:
        results: list[RewardResult | None] = [None] * len(completions)
        messages: list[tuple | None] = [None] * len(completions)
        for index, (completion, reference) in enumerate(zip(completions, references)):
            if isinstance(completion, str) and isinstance(reference, str):
                messages[index] = (_encode(completion[-MAX_COMPLETION_CHARS:]), _encode(reference))
            else:  # e.g. None from a broken pipeline: report it rather than crash a worker
                results[index] = RewardResult(0.0, None, "error", "TypeError: not a str")

        def failed(index: int, reason: Reason, detail: str) -> RewardResult:
            return RewardResult(0.0, _safe_extract(completions[index]), reason, detail)

        return self._dispatch(messages, results, [self.timeout_s] * len(messages), failed)

    def _dispatch(self, messages: list, results: list, timeouts: Sequence[float],
                  failed: Callable[[int, Reason, str], object]) -> list:
        """Send every message that has no result yet to the workers, one at a time each, and fill
        `results` with their answers; `failed(index, reason, detail)` is the result of an item whose
        worker ran past its timeout (reason ``timeout``) or died (``error``)."""
        while len(self._workers) < self.num_workers:
            self._workers.append(_Worker(self._context, self._item_fn, self._fast_latex))

        pending: collections.deque[int] = collections.deque(i for i, r in enumerate(results) if r is None)
        while pending or any(w.item is not None for w in self._workers):
            # -- dispatch to idle workers ----------------------------------------------------------
            for worker in list(self._workers):
                if not (pending and worker.ready and worker.item is None):
                    continue
                index = pending.popleft()
                try:
                    worker.conn.send(messages[index])
                except (OSError, ValueError):
                    # Died while idle: not this item's fault, so requeue it.
                    pending.appendleft(index)
                    self._replace(worker, kill=True)
                    continue
                worker.item = index
                worker.item_deadline = time.monotonic() + timeouts[index]

            # -- wait for a result, a death, or the nearest deadline -------------------------------
            now = time.monotonic()
            deadlines = [w.item_deadline if w.ready else w.start_deadline for w in self._workers
                         if w.item is not None or not w.ready]
            wait_s = max(0.0, min(deadlines) - now) if deadlines else 1.0
            waitables = [w.conn for w in self._workers] + [w.process.sentinel for w in self._workers]
            multiprocessing.connection.wait(waitables, timeout=wait_s)

            # -- collect ---------------------------------------------------------------------------
            now = time.monotonic()
            for worker in list(self._workers):
                self._collect(worker, results, now, timeouts, failed)

        assert all(r is not None for r in results), "every item gets a result"
        return results

    def _collect(
        self,
        worker: _Worker,
        results: list,
        now: float,
        timeouts: Sequence[float],
        failed: Callable[[int, Reason, str], object],
    ) -> None:
        """Take whatever ``worker`` has to say: ready signal, a result, its death, or its timeout."""
        message = None
        got_message = False
        try:
            if worker.conn.poll():
                message = worker.conn.recv()
                got_message = True
        except (EOFError, OSError):
            pass  # died; handled below via is_alive

        if got_message:
            if not worker.ready:
                worker.ready = isinstance(message, tuple) and message[0] == "ready"
                if worker.ready and self._fast_latex:  # every worker must parse SLL-first for True
                    self._latex_fast_parse = bool(message[1]) and self._latex_fast_parse is not False
            elif worker.item is not None:
                results[worker.item] = message
                worker.item = None
            return

        if not worker.process.is_alive():
            if not worker.ready:
                raise RuntimeError(
                    f"a verifier worker died while starting ({worker.exit_detail()}). Workers are "
                    "spawned: the main script must guard its code with `if __name__ == '__main__':`, "
                    "and `python -c 'import mathrl.reward, math_verify'` must work"
                )
            if worker.item is not None:
                results[worker.item] = failed(worker.item, "error", worker.exit_detail())
                worker.item = None
            self._replace(worker, kill=False)
            return

        if not worker.ready and now >= worker.start_deadline:
            raise RuntimeError(
                f"a verifier worker did not start within {_WORKER_START_TIMEOUT_S:.0f} s; "
                "the machine may be overloaded"
            )
        if worker.item is not None and now >= worker.item_deadline:
            results[worker.item] = failed(
                worker.item, "timeout", f"no result within {timeouts[worker.item]:g} s; worker killed"
            )
            worker.item = None
            self._replace(worker, kill=True)


def _safe_extract(completion: str) -> str | None:
    """The answer, for the logs of an item whose worker hung or died (extraction is linear-time)."""
    return extract_boxed(_sanitize(completion[-MAX_COMPLETION_CHARS:]), max_chars=MAX_COMPLETION_CHARS)


def _call_in_process(item_fn: ItemFn, completion: str, reference: str) -> RewardResult:
    """num_workers=0 path: same contract as a worker, minus the timeout."""
    try:
        return item_fn(completion, reference)
    except Exception as e:
        return RewardResult(0.0, None, "error", type(e).__name__)
