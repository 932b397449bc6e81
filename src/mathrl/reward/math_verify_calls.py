"""math-verify as the equivalence checks call it (reward/equivalence.py): the parse of a reference and of
an answer (cached: parsing is most of a check's cost), the value comparison and the whole-answer check,
with math-verify's own timeout on a main thread, and the `Verdict` every rule returns.
"""

from __future__ import annotations

import functools
import threading
import time
from dataclasses import dataclass

from mathrl.reward.latex_parse import install_two_stage_parsing

__all__ = ["MAX_MATH_VERIFY_CHARS", "UnparsableReference", "Verdict", "gold_parses_agree", "math_verify_equal",
           "math_verify_whole"]

MAX_MATH_VERIFY_CHARS = 10_000
"""Longer answers are scored wrong without parsing. No real answer is this long, SymPy time grows
with length, and math-verify logs the whole input at WARNING level when it times out."""

_MATH_VERIFY_TIMEOUT_S = 5
"""math-verify's own SIGALRM timeout per parse/compare, used only on a main thread. It must be an int:
it is passed to ``signal.alarm``. Inside ``Verifier`` workers the outer kill usually fires first."""


class UnparsableReference(ValueError):
    """The reference answer (data, not model text) could not be parsed: a data problem to report."""


@dataclass(frozen=True)
class Verdict:
    equal: bool
    detail: str
    """Which rule decided: ``exact number``, ``list (in order)``, ``math-verify``, ..."""
    timed_out: bool = False
    """math-verify's own alarm fired (it swallows it and answers "not equal")."""
    final: bool = False
    """A rejection by a rule that outranks math-verify (see docs/evaluation.md, "What counts as
    equal"): the whole-answer math-verify check is not consulted."""
    asked: tuple[str, str] | None = None
    """The ``(answer, gold)`` that math-verify compared when its answer is this verdict: the
    whole-answer check does not ask it the same question again."""


def math_verify_equal(answer: str, gold: str, detail: str) -> Verdict:
    math_verify = _math_verify()

    if len(answer) > MAX_MATH_VERIFY_CHARS:
        return Verdict(False, f"answer over {MAX_MATH_VERIFY_CHARS} chars, not parsed")
    # math-verify guards parse/verify with signal.alarm, which raises ValueError off the main thread.
    # There we pass None (no inner timeout) and rely on the Verifier's process-level timeout.
    on_main_thread = threading.current_thread() is threading.main_thread()
    inner_timeout = _MATH_VERIFY_TIMEOUT_S if on_main_thread else None
    started = time.monotonic()

    def negative(reason: str) -> Verdict:
        # math-verify swallows its own timeouts (logs a warning, returns [] or False), so a timeout
        # would read as "wrong". Elapsed time is the only trace it leaves.
        if inner_timeout is not None and time.monotonic() - started >= 0.95 * inner_timeout:
            return Verdict(False, f"math-verify's own {inner_timeout} s alarm", timed_out=True)
        return Verdict(False, reason)

    try:
        parsed_gold = _parse_gold(gold, inner_timeout)
    except _NoParse:
        raise UnparsableReference(gold[:80]) from None
    target = _parse_answer(answer, inner_timeout)
    if not target:
        return negative("answer did not parse")
    if math_verify.verify(list(parsed_gold), list(target), timeout_seconds=inner_timeout):
        return Verdict(True, detail)
    verdict = negative(detail)
    return Verdict(False, verdict.detail, verdict.timed_out, asked=(answer, gold))


def math_verify_whole(answer: str, gold: str) -> Verdict:
    """math-verify on the whole answer and the whole reference, as its README calls it: the reference
    as ``$gold$`` (LaTeX and plain expressions), the answer as a box (LaTeX only: model text never
    reaches sympy's ``parse_expr``, which evaluates Python)."""
    math_verify = _math_verify()

    on_main_thread = threading.current_thread() is threading.main_thread()
    inner_timeout = _MATH_VERIFY_TIMEOUT_S if on_main_thread else None
    started = time.monotonic()
    parsed_gold = _parse_whole_gold(gold, inner_timeout)
    if not parsed_gold:
        return Verdict(False, "math-verify (whole): reference did not parse")
    target = _parse_answer(answer, inner_timeout)
    if target and math_verify.verify(list(parsed_gold), list(target), timeout_seconds=inner_timeout):
        return Verdict(True, "math-verify (whole answer)")
    timed_out = inner_timeout is not None and time.monotonic() - started >= 0.95 * inner_timeout
    return Verdict(False, "math-verify (whole answer)", timed_out=timed_out)


def _math_verify():
    """math-verify, imported here so that `import mathrl.reward` stays cheap (workers import it while
    warming up), with its LaTeX parser made two-stage: the same trees, faster (`latex_parse`)."""
    import math_verify

    install_two_stage_parsing()
    return math_verify


# Parsing is most of the cost of a check (ANTLR, about 40 ms for a tuple on a slow core), so parses
# are kept. References: a reference is checked against the rollout.n samples of its problem. Answers:
# a small window, for an answer that reaches math-verify twice in one check (its value when the
# structured comparison rejects it, then the whole answer) or in samples scored one after another.
# A parse that comes back empty (no match, or math-verify's own timeout) raises `_NoParse`, which
# lru_cache does not keep, so it is tried again next time exactly as without the caches.


class _NoParse(Exception):
    """math-verify found nothing to parse (or its alarm fired while parsing)."""


@functools.lru_cache(maxsize=4096)
def _parse_whole_gold(gold: str, inner_timeout: int | None) -> tuple:
    """The reference as math-verify's README parses it, ``$gold$``: for the whole-answer check."""
    math_verify = _math_verify()

    return tuple(math_verify.parse("$" + gold + "$", parsing_timeout=inner_timeout))


@functools.lru_cache(maxsize=4096)
def _parse_gold(gold: str, inner_timeout: int | None) -> tuple:
    """The reference for a value comparison. Raises `_NoParse` when math-verify finds nothing."""
    math_verify = _math_verify()

    # A braced reference is re-boxed whole so math-verify's extractor takes all of it.
    parsed = math_verify.parse("\\boxed{" + gold + "}", parsing_timeout=inner_timeout)
    if not parsed:
        raise _NoParse(gold[:80])
    return tuple(parsed)


@functools.lru_cache(maxsize=4096)
def gold_parses_agree(gold: str) -> bool:
    """Whether ``\\boxed{gold}`` (the value comparison's reading) and ``$gold$`` (the whole-answer
    check's) parse to the same expressions, down to symbol assumptions and float precision."""
    import sympy

    inner_timeout = _MATH_VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    try:
        boxed = _parse_gold(gold, inner_timeout)
    except _NoParse:
        return False
    whole = _parse_whole_gold(gold, inner_timeout)
    try:
        return [_exact_form(item, sympy) for item in boxed] == [_exact_form(item, sympy) for item in whole]
    except Exception:  # an expression srepr cannot print: not shown to agree
        return False


def _exact_form(item, sympy) -> tuple[str, str]:
    return (type(item).__name__, item if isinstance(item, str) else sympy.srepr(item))


def _parse_answer(answer: str, inner_timeout: int | None) -> tuple:
    """Model text as a box, LaTeX only (model text never reaches sympy's ``parse_expr``, which
    evaluates Python); ``()`` when math-verify finds nothing."""
    try:
        return _parsed_answer(answer, inner_timeout)
    except _NoParse:
        return ()


@functools.lru_cache(maxsize=16)
def _parsed_answer(answer: str, inner_timeout: int | None) -> tuple:
    math_verify = _math_verify()

    parsed = math_verify.parse(
        "\\boxed{" + answer + "}",
        extraction_config=[math_verify.LatexExtractionConfig()],
        parsing_timeout=inner_timeout,
    )
    if not parsed:
        raise _NoParse(answer[:80])
    return tuple(parsed)
