"""Score a completion against a reference answer: 1.0 if its final boxed answer is equivalent, else 0.0.
Two layers, both of which never raise on model text:
* ``verify_one(completion, reference, boxed=...)`` checks one pair in the calling process: the box policy
  (`extract.final_answers`) picks the answer, `equivalence.answers_equal` compares it.
* ``Verifier`` runs ``verify_one`` in persistent worker processes with a wall-clock timeout per item, because
  SymPy can hang or blow up on adversarial expressions (``10^{10^{10}}``, deep nesting) and math-verify's own
  SIGALRM timeout only works in a main thread and cannot interrupt C code. ``Verifier.call`` runs reward
  functions (`reward.functions`) in the same workers, one batch per call, with the same kind of timeout.

    with Verifier(num_workers=4, timeout_s=5.0, boxed="all") as verifier:
        results = verifier.score(completions, references)   # list[RewardResult], input order

``RewardResult.reason``: ``correct``, ``wrong``, ``no_answer`` (no box, an unterminated final box or an empty
box), ``timeout`` (the worker was killed after ``timeout_s``), ``error`` (an exception, a crashed worker, or a
reference that is empty or cannot be parsed).
"""

from __future__ import annotations

import functools
import math
import numbers
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from mathrl.reward.equivalence import UnparsableReference, answers_equal
from mathrl.reward.extract import BOX_POLICIES, BoxPolicy, extract_boxed, final_answers
from mathrl.reward.latex_parse import install_two_stage_parsing
from mathrl.workers import Reply, WorkerPool, WorkerStartError

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


def _handle(item_fn: ItemFn, message: tuple) -> RewardResult | CallResult:
    """A worker's answer to ``(completion, reference)`` as UTF-8 bytes, or to ``("call", ref, kwargs,
    batch)``, a reward function's batch (`Verifier.call`)."""
    if message[0] == "call":
        return call_reward_function(*message[1:])
    completion, reference = (part.decode("utf-8") for part in message)
    try:
        return item_fn(completion, reference)
    except Exception as e:  # only a custom item_fn can get here; verify_one never raises
        return RewardResult(0.0, None, "error", type(e).__name__)


def _start_worker(item_fn: ItemFn, fast_latex: bool) -> tuple[Callable, bool | None]:
    """A worker's start (`mathrl.workers.serve`): warm up, then answer with `_handle`; its ready info
    says whether LaTeX parses SLL-first there."""
    return functools.partial(_handle, item_fn), _warm_up(fast_latex)


class _AllFast:
    """The ready info of the Verifier's workers: whether LaTeX parses SLL-first in every one started so
    far (None before the first)."""

    def __init__(self) -> None:
        self.value: bool | None = None

    def __call__(self, fast: bool | None) -> None:
        self.value = bool(fast) and self.value is not False


class Verifier:
    """Scores (completion, reference) pairs in worker processes with a per-item wall-clock timeout.

    Workers (`mathrl.workers.WorkerPool`) are started lazily on the first ``score`` call and reused.
    Each item is sent to an idle worker (up to ``num_workers`` in flight); a worker that takes longer
    than ``timeout_s`` on an item is killed and replaced, and that item gets ``reason="timeout"``. A
    worker that dies is replaced and its item gets ``reason="error"``. Results come back in input order.

    Workers use the ``spawn`` start method: the parent has torch loaded with its thread pools, and
    forking a multi-threaded process can deadlock the child. Spawned children re-import the main
    script, so a script that creates a Verifier needs the ``if __name__ == "__main__":`` guard.

    num_workers: worker processes, 0 runs ``verify_one`` in-process (no timeout; for debugging); timeout_s:
    wall-clock seconds allowed per item, counted from when it is sent to a worker; boxed: the box policy,
    ``all`` (default), ``last`` or ``any`` (see ``verify_one``; config ``reward.boxed``); checker: ``mathrl``
    (default) or ``math-verify`` (plain math-verify; config ``reward.checker``); _item_fn: a testing hook, a
    picklable module-level ``(completion, reference) -> RewardResult`` that workers call instead of
    ``verify_one``, e.g. one that hangs on a marked input.

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
        self._all_fast = _AllFast()  # not a bound method: the pool must hold no reference to the Verifier
        self._pool = None if num_workers == 0 else WorkerPool(
            functools.partial(_start_worker, self._item_fn, self._fast_latex), name="mathrl-verifier",
            size=num_workers, start_timeout_s=_WORKER_START_TIMEOUT_S,
            on_ready=self._all_fast if self._fast_latex else None)
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
        return self._all_fast.value

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
            if self._pool is None:
                return [_call_in_process(self._item_fn, c, r) for c, r in zip(completions, references)]
            return self._score_in_workers(completions, references)

    def call(self, calls: Sequence[FunctionCall]) -> list[CallResult]:
        """Run each reward-function call (one batch of samples) in a worker, with its own timeout;
        results in input order. Never raises for what the function does: an exception, a wrong
        return value, a crash or a timeout is the call's ``CallResult`` (see `call_reward_function`)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("Verifier is closed; create a new one")
            if self._pool is None:
                return [call_reward_function(c.ref, c.kwargs, c.batch) for c in calls]
            replies = self._map([("call", c.ref, c.kwargs, c.batch) for c in calls], [c.timeout_s for c in calls])
            return [reply.value if reply.status == "ok" else _failed_call(reply, call.timeout_s)
                    for call, reply in zip(calls, replies)]

    def close(self) -> None:
        """Stop all workers. Safe to call twice."""
        with self._lock:
            self._closed = True
            if self._pool is not None:
                self._pool.close()

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

    def _map(self, messages: list, timeouts: list[float]) -> list[Reply | None]:
        """The pool's `map`, with a worker that cannot start said in the Verifier's words. On any
        exception the pool has stopped this call's workers (no stale results for the next call), and
        the next call restarts them."""
        try:
            return self._pool.map(messages, timeouts)
        except WorkerStartError as e:
            if e.reason == "died":
                raise RuntimeError(
                    f"a verifier worker died while starting (worker exited with code {e.exit_code}). Workers are "
                    "spawned: the main script must guard its code with `if __name__ == '__main__':`, "
                    "and `python -c 'import mathrl.reward, math_verify'` must work"
                ) from e
            if e.reason == "timeout":
                raise RuntimeError(
                    f"a verifier worker did not start within {_WORKER_START_TIMEOUT_S:.0f} s; "
                    "the machine may be overloaded"
                ) from e
            raise RuntimeError(f"a verifier worker {e}") from e

    def _score_in_workers(
        self, completions: Sequence[str], references: Sequence[str]
    ) -> list[RewardResult]:
        results: list[RewardResult | None] = [None] * len(completions)
        messages: list[tuple | None] = [None] * len(completions)
        for index, (completion, reference) in enumerate(zip(completions, references)):
            if isinstance(completion, str) and isinstance(reference, str):
                messages[index] = (_encode(completion[-MAX_COMPLETION_CHARS:]), _encode(reference))
            else:  # e.g. None from a broken pipeline: report it rather than crash a worker
                results[index] = RewardResult(0.0, None, "error", "TypeError: not a str")

        for index, reply in enumerate(self._map(messages, [self.timeout_s] * len(messages))):
            if reply is None:
                continue
            if reply.status == "ok":
                results[index] = reply.value
            else:
                reason, detail = _failure(reply, self.timeout_s)
                results[index] = RewardResult(0.0, _safe_extract(completions[index]), reason, detail)
        return results


def _failed_call(reply: Reply, timeout_s: float) -> CallResult:
    reason, detail = _failure(reply, timeout_s)
    return CallResult(reason, None, detail)


def _failure(reply: Reply, timeout_s: float) -> tuple[Reason, str]:
    """(reason, detail) of an item whose worker ran past its timeout (``timeout``) or died (``error``)."""
    if reply.status == "timeout":
        return "timeout", f"no result within {timeout_s:g} s; worker killed"
    return "error", f"worker exited with code {reply.exit_code}"


def _safe_extract(completion: str) -> str | None:
    """The answer, for the logs of an item whose worker hung or died (extraction is linear-time)."""
    return extract_boxed(_sanitize(completion[-MAX_COMPLETION_CHARS:]), max_chars=MAX_COMPLETION_CHARS)


def _call_in_process(item_fn: ItemFn, completion: str, reference: str) -> RewardResult:
    """num_workers=0 path: same contract as a worker, minus the timeout."""
    try:
        return item_fn(completion, reference)
    except Exception as e:
        return RewardResult(0.0, None, "error", type(e).__name__)
