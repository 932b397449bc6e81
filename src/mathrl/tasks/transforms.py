"""Rewrite training problems so that every gold answer is an integer (the DAPO transform).

DAPO-Math-17K (Yu et al. 2025, DAPO, §3.5 of arXiv v1) asks for a derived integer instead of an
answer that is hard to compare: \\frac{m}{n} -> m + n, k\\sqrt{m} -> k + m, integers kept, the rest
dropped and counted by reason. Answers are parsed by anchored regexes (no eval, no SymPy); pure
functions on problem records.

    report = integer_answer_transform(problems)          # config data.transform: integer_answer
    report.problems, report.converted, report.dropped, report.dropped_reasons, report.examples

WARNING: it teaches the model to always answer with an integer. The forms recognised, the exact
wording and the warning: docs/tricks.md, "Problems: transforms and curriculum".
Tests: ``python -m pytest tests/tasks/test_transforms.py -q``.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from mathrl.tasks.base import Problem

__all__ = [
    "FRACTION_SUFFIX",
    "SQRT_SUFFIX",
    "TransformExample",
    "TransformReport",
    "integer_answer_transform",
    "parse_integer_answer",
]

FRACTION_SUFFIX = (
    "The answer is in the form \\frac{m}{n}, where gcd(m, n) = 1. Please provide the value of m + n."
)
SQRT_SUFFIX = (
    "The answer is in the form k\\sqrt{m}, where k and m are positive integers and m is square-free. "
    "Please provide the value of k + m."
)
SEPARATOR = "\n\n"  # between the original question and the appended sentence

# Drop reasons (stable keys of TransformReport.dropped_reasons).
NOT_SUPPORTED = "not an integer, fraction or k\\sqrt{m}"
NEGATIVE = "negative fraction or radical"
ZERO_DENOMINATOR = "zero denominator"

# Bounded digit counts keep int() far from Python's 4300-digit limit and square-free extraction
# (trial division up to sqrt(radicand)) cheap.
_INT = r"\d{1,40}"
_RADICAND = r"\d{1,9}"
_SPACING = re.compile(r"\\[!,;: ]")
# A \frac argument: {digits} or, in the shorthand \frac12, one bare digit.
_FRAC_ARG = rf"(?:\{{\s*({_INT})\s*\}}|(\d))"
# Thousands separators as the verifier reads them (groups of exactly three digits: "1,000").
_INTEGER_RE = re.compile(r"([-+]?)\s*(\d{1,3}(?:,\d{3}){1,12}|\d{1,40})(?:\.0*)?")
_FRAC_RE = re.compile(rf"(-?)\s*\\[dt]?frac\s*{_FRAC_ARG}\s*{_FRAC_ARG}")
_SLASH_RE = re.compile(rf"(-?)\s*({_INT})\s*/\s*({_INT})")
_SQRT_RE = re.compile(rf"(-?)\s*(?:({_INT})\s*(?:\\cdot\s*)?)?\\sqrt\s*(?:\{{\s*({_RADICAND})\s*\}}|(\d))")


@dataclass(frozen=True)
class TransformExample:
    """One converted or dropped problem, for logs and reports."""

    id: str
    answer: str
    """The original gold answer."""
    new_answer: str | None
    """The integer answer; None when the problem was dropped."""
    note: str
    """The appended sentence ("" when none), or the drop reason."""


@dataclass
class TransformReport:
    """Result of ``integer_answer_transform``: the kept problems and what happened to the rest."""

    problems: list[Problem]
    """Converted and unchanged problems, in input order."""
    converted: int = 0
    """Problems whose answer was a fraction or radical (question rewritten, answer m + n / k + m),
    or a fraction / radical equal to an integer (answer replaced, question unchanged)."""
    unchanged: int = 0
    """Problems whose answer already was an integer (its text canonicalised: "12.0" -> "12")."""
    dropped: int = 0
    dropped_reasons: dict[str, int] = field(default_factory=dict)
    examples: list[TransformExample] = field(default_factory=list)
    """Up to ``max_examples`` converted and up to ``max_examples`` dropped problems."""


def parse_integer_answer(answer: str) -> tuple[str, str, str] | tuple[None, None, str]:
    """Classify one gold answer. Returns ``(kind, integer_answer, suffix)`` with kind one of
    ``"integer"`` (already an integer; suffix ""), ``"converted"`` (suffix is the sentence to
    append, "" when the value itself is an integer, e.g. \\frac{4}{2}); or ``(None, None, reason)``
    when the answer cannot be converted. Never raises on any string.
    """
    text = _SPACING.sub("", answer).replace("{,}", ",").strip()  # 1{,}000 is LaTeX for 1,000
    if len(text) >= 2 and text[0] == "$" and text[-1] == "$":
        text = text.strip("$").strip()
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")

    if m := _INTEGER_RE.fullmatch(text):
        value = int(m.group(2).replace(",", "")) * (-1 if m.group(1) == "-" else 1)
        return "integer", str(value), ""

    if (m := _FRAC_RE.fullmatch(text)) or (m := _SLASH_RE.fullmatch(text)):
        groups = [g for g in m.groups()[1:] if g is not None]  # the two integers, in order
        num, den = int(groups[0]), int(groups[1])
        if den == 0:
            return None, None, ZERO_DENOMINATOR
        if m.group(1) == "-" and num != 0:
            return None, None, NEGATIVE
        g = math.gcd(num, den)
        num, den = num // g, den // g
        if den == 1:  # \frac{4}{2}: the value is an integer already, nothing to ask for
            return "converted", str(num), ""
        return "converted", str(num + den), FRACTION_SUFFIX

    if m := _SQRT_RE.fullmatch(text):
        k = int(m.group(2)) if m.group(2) is not None else 1
        radicand = int(m.group(3) if m.group(3) is not None else m.group(4))
        if m.group(1) == "-" and k != 0 and radicand != 0:
            return None, None, NEGATIVE
        square, free = _split_square(radicand)
        k *= square  # k\sqrt{s^2 f} = (k s)\sqrt{f}
        if k == 0 or free <= 1:  # 0, or \sqrt{9} = 3: an integer
            return "converted", str(k * free), ""  # free is 0 or 1 here
        return "converted", str(k + free), SQRT_SUFFIX

    return None, None, NOT_SUPPORTED


def integer_answer_transform(problems: Sequence[Problem], *, max_examples: int = 5) -> TransformReport:
    """The DAPO integer-answer transform over a problem list (see the module docstring).

    Converted problems get the sentence appended to their question (after a blank line), the new
    integer answer, and ``meta["original_answer"]`` / ``meta["transform"] = "integer_answer"``.
    Inputs are never modified (``Problem`` is frozen; converted ones are copies).

    problems: the training problems; max_examples: how many converted and how many dropped problems to keep in
    ``examples``. -> a ``TransformReport``.
    """
    report = TransformReport(problems=[])
    reasons: Counter[str] = Counter()
    shown: Counter[str] = Counter()
    for p in problems:
        kind, new_answer, note = parse_integer_answer(p.answer)
        if kind is None:
            reasons[note] += 1
            if shown["dropped"] < max_examples:
                shown["dropped"] += 1
                report.examples.append(TransformExample(p.id, p.answer, None, note))
            continue
        if kind == "integer":
            report.unchanged += 1
            report.problems.append(p if new_answer == p.answer else dataclasses.replace(p, answer=new_answer))
            continue
        report.converted += 1
        question = p.question.rstrip() + SEPARATOR + note if note else p.question
        meta = {**p.meta, "original_answer": p.answer, "transform": "integer_answer"}
        report.problems.append(dataclasses.replace(p, question=question, answer=new_answer, meta=meta))
        if shown["converted"] < max_examples:
            shown["converted"] += 1
            report.examples.append(TransformExample(p.id, p.answer, new_answer, note))
    report.dropped = sum(reasons.values())
    report.dropped_reasons = dict(reasons)
    return report


def _split_square(n: int) -> tuple[int, int]:
    """n = s^2 * f with f square-free; returns (s, f). n is at most 9 digits (trial division)."""
    s, f, p = 1, n, 2
    while p * p <= f:
        while f % (p * p) == 0:
            f //= p * p
            s *= p
        p += 1
    return s, f
