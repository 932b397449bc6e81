"""Is an extracted answer equivalent to the reference? Structure first, then values.

    >>> answers_equal("(4, 10, -2)", "(10, 4, -2)").equal   # a tuple compares in order
    False
    >>> answers_equal("2, 3", "(2, 3)").equal               # an answer may drop a tuple's parentheses
    True

The reference's form decides how lists compare (the answer does not get to choose): a tuple or interval
in order, brackets included (an interval answer may be an inequality, ``-2 \\le x \\le 7``); a set the
reference says is one (``\\{a, b\\}``, ``a \\pm b``) as a multiset; anything else is one value. Values compare
exactly: plain decimals with ``Decimal``, mixed numbers as fractions, everything else with math-verify
(LaTeX -> SymPy), a decimal answer turned into the exact fraction it writes so that a rounded ``0.333``
never equals ``\\frac{1}{3}``. Unions, matrices and relations between expressions go to math-verify whole.
Every rule with its evidence: docs/evaluation.md, "What counts as equal (the answer checker)".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from mathrl.reward.extract import reference_answer
from mathrl.reward.math_verify_calls import (
    MAX_MATH_VERIFY_CHARS,
    UnparsableReference,
    Verdict,
    gold_parses_agree,
    math_verify_equal,
    math_verify_whole,
)
from mathrl.reward.normalize import (
    choice_letter,
    expand_plus_minus,
    inequality_to_interval,
    split_top_level,
    strip_answer_prose,
    strip_delimiters,
    strip_units,
    strip_variable,
    text_answer,
)
from mathrl.reward.numeric import (
    decimal_comma_number,
    mixed_number,
    plain_number,
    scientific_number,
    simple_fraction,
)

__all__ = ["MAX_MATH_VERIFY_CHARS", "UnparsableReference", "Verdict", "answers_equal", "value_equal"]

MAX_LIST_ITEMS = 64
"""Lists longer than this are not compared item by item (each item may cost a SymPy parse)."""

# ---------------------------------------------------------------------------------------------------
# Cleaning and structure
# ---------------------------------------------------------------------------------------------------

_UNICODE = (("−", "-"), ("∞", "\\infty"), ("×", "\\times"), ("·", "\\cdot"), ("π", "\\pi"), ("√", "\\sqrt"))
# `\text{13}` and `\text{A,B}` are a number and a list of letters that happen to be set in text mode.
_TEXT_NUMBER = re.compile(r"^\\(?:text|textnormal|mbox|mathrm|textbf)\s*\{\s*(-?[0-9][0-9.,]*|[A-Z](?:\s*,\s*[A-Z])+)\s*\}$")


# `\\le` (a backslash doubled by escaping twice, as in JSON written from a Python repr) is `\le`:
# a line break followed by letters never occurs in an answer. Matrices keep their row breaks.
_DOUBLED_COMMAND = re.compile(r"\\\\(?=[A-Za-z])")
_ASCII_RELATIONS = ((">=", "\\geq "), ("<=", "\\leq "), ("!=", "\\neq "))
# Math segments inside prose: `$...$`, `$$...$$`, `\(...\)`, `\[...\]` (an escaped `\$` is currency).
_MATH_SEGMENT = re.compile(
    r"(?<!\\)\$\$(.+?)(?<!\\)\$\$|(?<!\\)\$(.+?)(?<!\\)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.DOTALL
)
_PROSE_WORD = re.compile(r"(?<![\\A-Za-z])(?!(?:and|or)(?![A-Za-z]))[A-Za-z]{2,}")  # and/or join answers


def final_expression(text: str) -> str:
    """The math of a box that holds prose: ``Answer \\( 9 \\)`` -> ``9``, ``the largest $n$ is $34$``
    -> ``34``. When words stand outside the math delimiters, the last math segment is the answer (as
    math-verify reads a response); text without prose outside its delimiters is returned as it is."""
    if len(text) > 2_000 or ("$" not in text and "\\(" not in text and "\\[" not in text):
        return _prose_number(text)
    segments = list(_MATH_SEGMENT.finditer(text))
    if not segments:
        return text
    outside = _MATH_SEGMENT.sub(" ", text)
    if not _PROSE_WORD.search(outside):
        return text
    last = segments[-1]
    tail = _NUMBER_TOKEN.findall(text[last.end():])
    if tail:  # "the largest $n$ is 34": the number after the last formula is the answer
        return tail[-1].strip()
    return next(group for group in last.groups() if group is not None).strip()


# A number as prose writes it: `34`, `1,000.99`, `-2.5` (thousands and decimal separators inside).
_NUMBER_TOKEN = re.compile(r"[-+]?[0-9](?:[0-9,. ]*[0-9])?")


def _prose_number(text: str) -> str:
    """``the number is not 10 which is 1,000.99€`` -> ``1,000.99``: a box of plain prose (three words
    or more, no LaTeX command, no math delimiter) is answered by its last number."""
    if len(text) > 2_000 or "\\" in text or "$" in text or len(_PROSE_WORD.findall(text)) < 3:
        return text
    numbers = _NUMBER_TOKEN.findall(text)
    return numbers[-1].strip() if numbers else text


def _clean(text: str) -> str:
    for before, after in _UNICODE:
        text = text.replace(before, after)
    if "\\\\" in text and "\\begin" not in text:
        text = _DOUBLED_COMMAND.sub(lambda _: "\\", text)
    for before, after in _ASCII_RELATIONS:
        text = text.replace(before, after)
    text = final_expression(text)
    text = strip_answer_prose(strip_delimiters(text))
    text = strip_delimiters(text)
    match = _TEXT_NUMBER.match(text)
    return match.group(1) if match else text


@dataclass(frozen=True)
class _Shape:
    kind: str  # "tuple" (ordered, with brackets), "set" (unordered), "whole" (math-verify), "value"
    items: tuple[str, ...]
    brackets: str = ""  # for tuples: "()", "[)", ...


_OPEN = re.compile(r"^(?:\\left\s*)?([(\[])")
_CLOSE = re.compile(r"(?:\\right\s*)?([)\]])$")
_WHOLE_MARKERS = ("\\begin", "\\cup", "\\cap", "\\setminus", "\\mathbb")
_SET_OPEN = re.compile(r"^(?:\\left\s*)?\\\{")
_SET_CLOSE = re.compile(r"(?:\\right\s*)?\\\}$")


def _shape(text: str) -> _Shape:
    if any(marker in text for marker in _WHOLE_MARKERS):
        return _Shape("whole", (text,))
    opened, closed = _OPEN.match(text), _CLOSE.search(text)
    if opened and closed and _encloses(text, opened.end() - 1, closed.start(1)):
        items = split_top_level(text[opened.end() : closed.start()])
        if len(items) >= 2:
            return _Shape("tuple", tuple(items), opened.group(1) + closed.group(1))
    opened, closed = _SET_OPEN.match(text), _SET_CLOSE.search(text)
    if opened and closed:
        inner = text[opened.end() : closed.start()]
        if "\\{" not in inner:
            return _Shape("set", tuple(_expanded(split_top_level(inner))))
    items = split_top_level(text)
    if len(items) >= 2:
        if _LIST_WORD.search(text) or ";" in text or all(_OPEN.match(item) for item in items) or _one_name(items):
            return _Shape("set", tuple(_expanded(items)))
        return _Shape("list", tuple(part for item in items for part in expand_plus_minus(item)))
    expanded = expand_plus_minus(text)
    if len(expanded) == 2:
        return _Shape("set", tuple(expanded))
    return _Shape("value", (text,))


_LIST_WORD = re.compile(r"(?<![A-Za-z\\])(?:and|or)(?![A-Za-z])")


def _one_name(items: list[str]) -> bool:
    """``x = 1, x = 2`` or ``a = 4, -8, -10``: the values of one variable, a set of solutions."""
    names = {strip_variable(item)[0] for item in items}
    first = strip_variable(items[0])[0]
    return first is not None and names <= {first, None} and (len(names) == 1 or not any(
        strip_variable(item)[0] for item in items[1:]))


def _expanded(items: list[str]) -> list[str]:
    return [part for item in items for part in expand_plus_minus(strip_variable(item)[1])]


def _encloses(text: str, open_index: int, close_index: int) -> bool:
    """True if the bracket at ``open_index`` is closed only at ``close_index`` (so ``(1,2)\\cdot(3,4)``
    is not one tuple). Any closing bracket type counts: ``[0, 1)`` is one interval."""
    depth = 0
    for i in range(open_index, close_index + 1):
        char = text[i]
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
            if depth == 0 and i != close_index:
                return False
    return depth == 0


# ---------------------------------------------------------------------------------------------------
# Comparison
# ---------------------------------------------------------------------------------------------------


def answers_equal(answer: str, gold: str) -> Verdict:
    """Compare an extracted answer with the reference (both LaTeX-ish strings). Pure; may raise only
    on programming errors (the caller turns exceptions into an ``error`` verdict).

    The structured comparison (`_structured_equal`) decides first. When it rejects by a rule that
    does not outrank math-verify (``Verdict.final`` false), math-verify compares the whole answer
    with the whole reference as its README does, and its "equal" stands: mathrl never rejects what
    math-verify accepts, except by a rule documented in docs/evaluation.md with a test."""
    if len(answer) > MAX_MATH_VERIFY_CHARS:
        return Verdict(False, f"answer over {MAX_MATH_VERIFY_CHARS} chars, not parsed", final=True)
    if "\\boxed" in gold or "\\fbox" in gold:  # a whole solution, or several boxes: its final answer
        gold = reference_answer(gold) or gold
    verdict = _structured_equal(answer, gold)
    if verdict.equal or verdict.final or verdict.timed_out:
        return verdict
    if verdict.asked == (answer, gold) and gold_parses_agree(gold):
        # The structured comparison ended in math-verify on these very strings, with the same parse of
        # the gold: the whole-answer check would repeat that comparison and get the same "no".
        return verdict
    whole = math_verify_whole(answer, gold)
    if whole.equal or whole.timed_out:
        return whole
    return verdict


def _structured_equal(answer: str, gold: str) -> Verdict:
    answer, gold = _clean(answer), _clean(gold)
    if not answer:
        return Verdict(False, "empty answer", final=True)

    # Fast exact path first: most math-RL references are integers.
    answer_number, gold_number = _number(strip_units(answer)), _number(strip_units(gold))
    if answer_number is not None and gold_number is not None:
        if answer_number != gold_number and _percent_match(answer, answer_number, gold, gold_number):
            return Verdict(True, "percent as a fraction of one")
        # Two decimals that differ are final unless they agree to math-verify's 6 decimal places.
        close = round(answer_number, 6) == round(gold_number, 6)
        return Verdict(answer_number == gold_number, "exact number", final=not close)

    names = _strip_names(answer, gold)
    if isinstance(names, Verdict):
        return names
    answer_rest, gold_rest = names
    gold_shape = _shape(gold_rest)
    if gold_shape.kind == "list" and gold_rest != gold:
        # `a = 4, -8, -10`: a list of values of one named variable is its set of solutions.
        gold_shape = _Shape("set", tuple(_expanded(list(gold_shape.items))))

    if gold_shape.kind in ("tuple", "whole"):
        interval = inequality_to_interval(answer_rest)
        if interval is not None:
            answer_rest = interval
    elif gold_shape.kind == "value" and _OPEN.match(answer_rest):
        interval = inequality_to_interval(gold_rest)
        if interval is not None:
            gold_rest, gold_shape = interval, _shape(interval)
    answer_shape = _shape(answer_rest)

    if gold_shape.kind == "whole" or answer_shape.kind == "whole":
        if gold_shape.kind != answer_shape.kind and "\\begin" not in gold_rest + answer_rest:
            return math_verify_equal(answer_rest, gold_rest, "union or set")
        return math_verify_equal(answer_rest, gold_rest, "math-verify (whole)")
    if gold_shape.kind == "tuple":
        return _compare_tuple(answer_shape, gold_shape)
    if gold_shape.kind == "list":
        return _compare_list(answer_shape, gold_shape)
    if gold_shape.kind == "set":
        return _compare_set(answer_shape, gold_shape)
    if answer_shape.kind != "value":
        # Final for a number: math-verify pays the degenerate interval `[10, 10]` for 10.
        return Verdict(False, f"a {answer_shape.kind} of {len(answer_shape.items)} for a single value",
                       final=_exact_value(strip_units(gold_rest)) is not None)
    return value_equal(answer_rest, gold_rest)


def _compare_tuple(answer: _Shape, gold: _Shape) -> Verdict:
    if answer.kind == "tuple":
        if answer.brackets != gold.brackets:
            return Verdict(False, f"brackets {answer.brackets} for {gold.brackets}")
    elif not (answer.kind in ("set", "list") and gold.brackets == "()" and len(answer.items) == len(gold.items)):
        return Verdict(False, f"a {answer.kind} for a tuple")
    if len(answer.items) != len(gold.items):
        return Verdict(False, f"{len(answer.items)} items for {len(gold.items)}")
    if len(gold.items) > MAX_LIST_ITEMS:
        return Verdict(False, f"over {MAX_LIST_ITEMS} items, not compared")
    for answer_item, gold_item in zip(answer.items, gold.items):
        verdict = value_equal(answer_item, gold_item)
        if not verdict.equal:
            return Verdict(False, "list (in order): " + verdict.detail, verdict.timed_out)
    return Verdict(True, "list (in order)")


def _compare_list(answer: _Shape, gold: _Shape) -> Verdict:
    """A bare comma list in the reference (``10, 4, -2``) is compared in order: a reference cannot say
    whether its order is the answer (``a, b, c`` of a system) or not (all roots), and a set reading
    would pay a wrong ordered answer. The answer may write it bare, as a tuple ``( )`` or in braces."""
    if answer.kind == "tuple" and answer.brackets != "()":
        return Verdict(False, f"brackets {answer.brackets} for a list", final=True)
    if answer.kind == "value" or len(answer.items) != len(gold.items):
        # Final: math-verify reads both as sets, so `3, 3, 5, 7` would pass for `3, 5, 7`.
        return Verdict(False, f"{len(answer.items)} items for {len(gold.items)}", final=True)
    if len(gold.items) > MAX_LIST_ITEMS:
        return Verdict(False, f"over {MAX_LIST_ITEMS} items, not compared", final=True)
    for answer_item, gold_item in zip(answer.items, gold.items):
        verdict = value_equal(answer_item, gold_item)
        if not verdict.equal:
            unordered = _compare_set(_Shape("set", answer.items), _Shape("set", gold.items))
            if unordered.equal:
                return Verdict(False, "list: the same items in another order", final=True)
            return Verdict(False, "list (in order): " + verdict.detail, verdict.timed_out)
    return Verdict(True, "list (in order)")


def _compare_set(answer: _Shape, gold: _Shape) -> Verdict:
    if answer.kind == "tuple":
        return Verdict(False, "a tuple for a set of solutions")
    if answer.kind not in ("set", "list") or len(answer.items) != len(gold.items):
        return Verdict(False, f"{len(answer.items)} items for {len(gold.items)}")
    if len(gold.items) > MAX_LIST_ITEMS:
        return Verdict(False, f"over {MAX_LIST_ITEMS} items, not compared")
    unmatched = list(gold.items)
    for answer_item in answer.items:
        for index, gold_item in enumerate(unmatched):
            verdict = value_equal(answer_item, gold_item)
            if verdict.timed_out:
                return Verdict(False, "set: " + verdict.detail, True)
            if verdict.equal:
                del unmatched[index]
                break
        else:
            return Verdict(False, f"set: {answer_item[:40]!r} matches no remaining item")
    return Verdict(True, "set (any order)")


_RELATION = re.compile(r"=|<|>|\\[lg]eq?(?![A-Za-z])|\\[lg]t(?![A-Za-z])|\\neq?(?![A-Za-z])|≤|≥")


def value_equal(answer: str, gold: str) -> Verdict:
    """One value against one value: units, words, choices, numbers, then math-verify."""
    answer, gold = _clean(answer), _clean(gold)
    names = _strip_names(answer, gold)
    if isinstance(names, Verdict):
        return names
    answer, gold = names
    with_units = answer, gold
    answer, gold = strip_delimiters(strip_units(answer)), strip_delimiters(strip_units(gold))
    if not answer:
        return Verdict(False, "empty answer")
    values = _exact_value(answer), _exact_value(gold)
    if None not in values and _percent_match(with_units[0], values[0], with_units[1], values[1]):
        return Verdict(True, "percent as a fraction of one")

    letter = choice_letter(gold)
    if letter is not None and choice_letter(answer) is not None:
        return Verdict(choice_letter(answer) == letter, "choice letter")
    word = text_answer(gold) if ("\\" in gold or len(gold) >= 3) else None
    if word is not None:
        return Verdict(text_answer(answer) == word, "word")

    exact = _exact_value(answer), _exact_value(gold)
    if exact[0] is not None and exact[1] is not None:
        return Verdict(exact[0] == exact[1], "exact number")
    relation = _RELATION.search(answer)
    if relation and not _RELATION.search(gold):
        # Final when an unknown stands left of it (`x^2 = 9` for 9: math-verify takes the right side,
        # which pays `x^2 = 9` when the question asks for x); `5 + 6 = 11` is left to math-verify.
        return Verdict(False, "a relation for a value", final=bool(_letters(answer[: relation.start()])))
    verdict = math_verify_equal(_as_exact_latex(answer), _as_exact_latex(gold), "math-verify")
    if verdict.equal and _letters(answer) != _letters(gold) and _letters(answer).lower() == _letters(gold).lower():
        return Verdict(False, "variables differ in case", final=True)
    return verdict


def _number(text: str):
    """A plain decimal (``1,000``, ``1 000``), or one written with a decimal comma that cannot be a
    thousands separator (``1000,99``, ``0,111``); ``None`` for anything else."""
    number = plain_number(text)
    return number if number is not None else decimal_comma_number(text)


def _exact_value(text: str) -> Fraction | None:
    number = plain_number(text)
    if number is None:
        number = scientific_number(text)
    if number is not None:
        return Fraction(number)
    fraction = simple_fraction(text)
    return fraction if fraction is not None else mixed_number(text)


_PERCENT_END = re.compile(r"(?:\\%|%|percent)\s*\}?\s*$")


def _percent_match(answer: str, answer_value, gold: str, gold_value) -> bool:
    """``50\\%`` is both "50" (the number of percent a question asks for) and 0.5: a side written with
    a percent sign also matches the other side's value times 100."""
    if _PERCENT_END.search(gold) and answer_value * 100 == gold_value:
        return True
    return bool(_PERCENT_END.search(answer)) and gold_value * 100 == answer_value


def _strip_names(answer: str, gold: str) -> tuple[str, str] | Verdict:
    """Drop ``x =`` from both sides (``x = 3`` vs ``3``). Names that differ make the answer wrong; an
    answer's name is kept when the reference is an equation without one (``y = 2x`` vs ``2x - y = 0``)."""
    gold_name, gold_rest = strip_variable(gold)
    answer_name, answer_rest = strip_variable(answer)
    if gold_name and answer_name and gold_name != answer_name:
        return Verdict(False, f"answer names {answer_name}, the reference {gold_name}")
    if answer_name and not gold_name and "=" in gold:
        answer_rest = answer
    return answer_rest, gold_rest


def _as_exact_latex(text: str) -> str:
    """``0.333`` -> ``\\frac{333}{1000}`` and ``2\\frac{1}{2}`` -> ``\\frac{5}{2}``, so that SymPy compares
    the exact value written, not a float rounded to some digits."""
    value = _exact_value(text)
    if value is None:
        return text
    if value.denominator == 1:
        return str(value.numerator)
    return f"\\frac{{{value.numerator}}}{{{value.denominator}}}"


_COMMAND = re.compile(r"\\[A-Za-z]+")


def _letters(text: str) -> str:
    """The variable letters of an expression, sorted (command names such as ``\\frac`` removed)."""
    return "".join(sorted(set(re.findall(r"[A-Za-z]", _COMMAND.sub("", text)))))
