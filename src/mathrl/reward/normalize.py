"""Pure rewriting rules for answer strings, applied before two answers are compared.

Each rule is a small function ``str -> str`` (or ``str -> value | None``) that never raises on model
text and does one thing; `equivalence.py` decides which to apply. The text comes from a policy under
optimisation, so every pattern runs in linear time, or on text capped at a few hundred characters
(the inequality patterns), and brace matching is one pass with a stack. Number conventions and
exact values live in `numeric.py`.

    >>> strip_units(r"15\\mbox{ cm}^2")
    '15'
"""

from __future__ import annotations

import re

__all__ = [
    "choice_letter",
    "expand_plus_minus",
    "inequality_to_interval",
    "split_top_level",
    "strip_answer_prose",
    "strip_delimiters",
    "strip_units",
    "strip_variable",
    "text_answer",
]


# ---------------------------------------------------------------------------------------------------
# Delimiters, prose and units
# ---------------------------------------------------------------------------------------------------

_MATH_DELIMITERS = re.compile(r"(?<!\\)(?:\\\(|\\\)|\\\[|\\\]|\\displaystyle|\\textstyle|\$)")
_SPACING = re.compile(r"(?<!\\)(?:\\[,;:! ]|\\q?quad(?![A-Za-z]))|~")
# Thousands separators written with spacing commands: `32,\! 349`, `1\,000`, `1\!000`.
_SPACED_THOUSANDS = re.compile(r"(?<=[0-9])(?:,\\!\s*|\\[,!]\s*|\{,\}\s*)(?=[0-9]{3}(?![0-9]))")


def strip_delimiters(text: str) -> str:
    """Drop math delimiters (``$``, ``\\(``, ``\\[``), spacing commands (``\\,`` ``\\;`` ``\\!``
    ``\\quad``), trailing sentence punctuation and redundant outer braces: ``{{2}}.`` -> ``2``.
    Escaped dollars (``\\$``) are kept: they are currency, handled by `strip_units`."""
    text = _MATH_DELIMITERS.sub(" ", text)
    text = _SPACED_THOUSANDS.sub(lambda m: "," if "," in m.group() else "", text)
    text = _SPACING.sub(" ", text).strip()
    text = text.rstrip(".;").strip()
    if text.startswith("{") and text.endswith("}"):
        text = _peel_braces(text)
    return text


def _peel_braces(text: str) -> str:
    """``{{x}}`` -> ``x``: remove outer brace pairs that enclose the whole text (``{a}{b}`` stays).
    One pass over the text (a stack of open braces; ``\\{`` ``\\}`` do not count), so 10,000 nested
    braces cost 10,000 steps, not 10,000 squared."""
    closing: dict[int, int] = {}
    stack: list[int] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2
            continue
        if char == "{":
            stack.append(i)
        elif char == "}" and stack:
            closing[stack.pop()] = i
        i += 1
    start, end = 0, len(text) - 1
    while start < end and text[start] == "{" and closing.get(start) == end:
        start += 1
        end -= 1
        while start < end and text[start].isspace():
            start += 1
        while end > start and text[end].isspace():
            end -= 1
    return text[start : end + 1]


_TEXT_COMMAND = r"\\(?:text|textnormal|textrm|textup|mbox|mathrm|textbf|mathbf|textit|operatorname)\s*"
_LEADING_PROSE = re.compile(
    _TEXT_COMMAND + r"\{\s*(?:the\s+)?(?:final\s+)?(?:answer|value|result)\s*(?:is|=|:)?\s*:?\s*\}\s*:?",
    re.IGNORECASE,
)
_TRAILING_REMARK = re.compile(_TEXT_COMMAND + r"\{\s*\([^{}]*\)\s*\}\s*$")
_APPROX = re.compile(r"\\approx|≈")


def strip_answer_prose(text: str) -> str:
    """Remove prose a model puts in the box around the answer: a leading ``\\text{The answer is }``,
    a trailing parenthesised remark ``\\text{ (after simplifying)}``, and an approximation after the
    exact value (``\\frac{\\sqrt3}{3} \\approx 0.577`` -> ``\\frac{\\sqrt3}{3}``)."""
    text = _LEADING_PROSE.sub("", text, count=1).strip()
    text = _TRAILING_REMARK.sub("", text).strip() or text
    parts = _APPROX.split(text, maxsplit=1)
    if len(parts) == 2 and parts[0].strip():
        text = parts[0].strip()
    return text


_UNIT_WORDS = (
    "units?", "square units?", "sq units?", "cm", "mm", "km", "m", "meters?", "metres?", "centimeters?",
    "kilometers?", "inches", "inch", "in", "feet", "foot", "ft", "yards?", "miles?", "mph",
    "seconds?", "sec", "s", "minutes?", "min", "hours?", "hrs?", "h", "days?", "weeks?", "years?",
    "dollars?", "cents?", "euros?", "pounds?", "lbs?", "kg", "g", "grams?", "ounces?", "oz",
    "degrees?", "liters?", "litres?", "gallons?", "cups?", "points?", "people", "students", "ways",
    "bolts", "boxes", "marbles", "apples", "cookies", "pages", "books",
    "square (?:inches|feet|meters|miles|units|cm|centimeters)", "cubic (?:inches|feet|meters|units|cm|centimeters)",
)
_UNIT_WORD = r"(?:" + "|".join(_UNIT_WORDS) + r")"
# A unit inside a text command, optionally squared/cubed: `\text{ cm}^2`, `\mbox{ inches}^2`.
_TEXT_UNIT = re.compile(
    _TEXT_COMMAND + r"\{\s*(?:[A-Za-z][A-Za-z .]*)\}\s*(?:\^\s*\{?[23]\}?)?\s*$"
)
# A bare unit word after a number: `5 cm`, `160 minutes`.
_BARE_UNIT = re.compile(r"(?<=[0-9}])\s*" + _UNIT_WORD + r"(?:\s*\^\s*\{?[23]\}?)?\s*$", re.IGNORECASE)
_DEGREES = re.compile(r"(?:\^\s*\{?\s*\\circ\s*\}?|°|\\degree(?![A-Za-z]))\s*")
_PERCENT = re.compile(r"(?:\\%|%|\\text\{\s*percent\s*\}|\bpercent\b)\s*$")
# No pattern here starts with `\s*` unanchored: on a long run of spaces that would be quadratic.
_DOLLAR = re.compile(r"^\s*(?:-\s*)?\\\$\s*|\\\$\s*$")


def strip_units(text: str) -> str:
    """Drop a trailing unit (``\\text{ cm}^2``, ``\\mbox{ inches}``, ``5 cm``), degree signs, a trailing
    percent sign and currency dollars, when a value remains: ``90^\\circ`` -> ``90``,
    ``10\\%`` -> ``10``, ``\\$1,000`` -> ``1,000``. Text that is only a word is left alone."""
    original = text
    text = _DEGREES.sub("", text)
    text = _PERCENT.sub("", text)
    negative = text.lstrip().startswith("-\\$")
    text = _DOLLAR.sub("", text).strip()
    if negative:
        text = "-" + text
    stripped = _TEXT_UNIT.sub("", text).strip()
    if stripped and stripped != text and not stripped.endswith(("=", "\\in")):
        text = stripped
    stripped = _BARE_UNIT.sub("", text).strip()
    if stripped:
        text = stripped
    return text if text else original


# `x =`, `f(2) =`, `a_{10} =`, `P(A) =`, `x_1 =`: a name, not an expression.
# A subscript's braces must be balanced: `\sum_{k=0}` is not the name `\sum_{k` assigned `0}...`.
_SUBSCRIPT = r"(?:_\{[A-Za-z0-9]+\}|_[A-Za-z0-9]+)"
_NAME = r"(?:[A-Za-z]" + _SUBSCRIPT + r"?'?|\\[A-Za-z]+" + _SUBSCRIPT + r"?)"
_ASSIGNMENT = re.compile(r"^\s*(" + _NAME + r"(?:\s*\([^()=]{0,40}\))?)\s*=(?!=)\s*")


def strip_variable(text: str) -> tuple[str | None, str]:
    """Split ``x = 3`` into (``"x"``, ``"3"``); no name before a single ``=`` gives (None, text).

    Only a *name* is removed (a letter with an optional subscript or prime, or a function applied to
    arguments such as ``f(2)``): ``x^2 = 9`` is an equation, not the value 9, and stays whole. The
    ``\\in`` of ``x \\in [0, 1]`` is treated the same way."""
    match = _ASSIGNMENT.match(text)
    if match is None:
        match = re.match(r"^\s*(" + _NAME + r")\s*\\in(?![A-Za-z])\s*", text)
    if match is None or match.end() == len(text):
        return None, text
    return match.group(1).replace(" ", ""), text[match.end():].strip()


# ---------------------------------------------------------------------------------------------------
# Structure: lists, plus-minus, inequalities
# ---------------------------------------------------------------------------------------------------

_LIST_WORDS = re.compile(
    r"\\text\{\s*(?:,\s*)?(?:and|or)\s*\}|(?<![A-Za-z\\])(?:and|or)(?![A-Za-z])"
)


def split_top_level(text: str) -> list[str]:
    """Split at commas (and the words "and"/"or") that are not inside brackets or braces.

    ``1, (2, 3), \\{4, 5\\}`` -> ``["1", "(2, 3)", "\\{4, 5\\}"]``. ``\\left(`` counts as ``(``. Only
    ``,`` separates; the LaTeX thousands forms ``{,}`` and ``,\\!`` never do, and neither does a comma
    between digit groups that `plain_number` reads as thousands (``1,000``)."""
    text = _LIST_WORDS.sub(",", text)
    parts: list[str] = []
    depth = 0
    start = 0
    i = 0
    while i < len(text):
        char = text[i]
        if char == "\\":
            if text.startswith("\\{", i) or text.startswith("\\left", i) and i + 5 < len(text) and text[i + 5] in "([.\\":
                depth += 1
            elif text.startswith("\\}", i) or text.startswith("\\right", i) and i + 6 < len(text) and text[i + 6] in ")].\\":
                depth -= 1
                i += 7 if text.startswith("\\right", i) else 2
                continue
            i += 6 if text.startswith("\\left", i) else 2
            continue
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "," and depth == 0 and not _is_thousands_comma(text, i):
            parts.append(text[start:i])
            start = i + 1
        i += 1
    parts.append(text[start:])
    parts = [p.strip() for p in parts]
    return [p for p in parts if p] if len(parts) > 1 else parts


_THOUSANDS_LEAD = re.compile(r"(?:^|[^0-9,.])([0-9,]+)$")


def _is_thousands_comma(text: str, i: int) -> bool:
    """Is the comma at ``text[i]`` inside a thousands number such as ``1,000,000`` (or ``,\\!``)?
    The digits before it must be a valid lead (1-3 digits, no leading zero, then groups of three) and
    exactly three digits must follow, with no space: ``0,111``, ``1,22`` and ``32, 349`` are lists."""
    if text.startswith(",\\!", i):
        return True
    if not re.match(r"[0-9]{3}(?![0-9])", text[i + 1 : i + 5]):
        return False
    lead = _THOUSANDS_LEAD.search(text[max(0, i - 40) : i])
    return bool(lead and re.fullmatch(r"[1-9][0-9]{0,2}(?:,[0-9]{3})*", lead.group(1)))


def expand_plus_minus(text: str) -> list[str]:
    """``1 \\pm \\sqrt{19}`` -> ``["1 + \\sqrt{19}", "1 - \\sqrt{19}"]``; ``\\pm 3`` -> ``["3", "-3"]``.
    Only one top-level ``\\pm`` is expanded; anything else comes back as ``[text]``."""
    if text.count("\\pm") != 1:
        return [text]
    before, after = text.split("\\pm")
    after = after.strip()
    if not after:
        return [text]
    before = before.strip()
    if not before:
        return [after, "-(" + after + ")"]
    return [f"{before} + ({after})", f"{before} - ({after})"]


_INEQ_OPS = {"<": "<", "\\lt": "<", ">": ">", "\\gt": ">", "\\le": "<=", "\\leq": "<=", "\\leqslant": "<=",
             "<=": "<=", "≤": "<=", "\\ge": ">=", "\\geq": ">=", "\\geqslant": ">=", ">=": ">=", "≥": ">="}
_OP = r"(<=|>=|\\leqslant|\\geqslant|\\leq|\\geq|\\le|\\ge|\\lt|\\gt|<|>|≤|≥)(?![A-Za-z])"
_VAR = r"([A-Za-z])"
_BOUND = r"([^<>=≤≥\\]*(?:\\(?!(?:leqslant|geqslant|leq|geq|le|ge|lt|gt)(?![A-Za-z]))[A-Za-z]+[^<>=≤≥\\]*)*)"
_DOUBLE = re.compile(r"^\s*" + _BOUND + r"\s*" + _OP + r"\s*" + _VAR + r"\s*" + _OP + r"\s*" + _BOUND + r"\s*$")
_SINGLE_LEFT = re.compile(r"^\s*" + _VAR + r"\s*" + _OP + r"\s*" + _BOUND + r"\s*$")
_SINGLE_RIGHT = re.compile(r"^\s*" + _BOUND + r"\s*" + _OP + r"\s*" + _VAR + r"\s*$")


def inequality_to_interval(text: str) -> str | None:
    """An inequality in one variable as LaTeX interval notation, or ``None``.

    ``-2 \\le x \\le 7`` -> ``[-2, 7]``; ``x > 2`` -> ``(2, \\infty)``; ``x \\le 0`` -> ``(-\\infty, 0]``;
    ``0 \\ge x`` -> ``(-\\infty, 0]``. A chain must run one way (``a < x < b`` or ``a > x > b``)."""
    if len(text) > 200:  # real inequalities are short; the bound patterns backtrack on long text
        return None
    match = _DOUBLE.match(text)
    if match:
        low, op1, _, op2, high = match.groups()
        op1, op2 = _INEQ_OPS[op1], _INEQ_OPS[op2]
        if not low.strip() or not high.strip():
            return None
        if op1[0] == "<" and op2[0] == "<":
            return _interval(low, op1 == "<=", high, op2 == "<=")
        if op1[0] == ">" and op2[0] == ">":
            return _interval(high, op2 == ">=", low, op1 == ">=")
        return None
    match = _SINGLE_LEFT.match(text)
    if match:
        _, op, bound = match.groups()
        op = _INEQ_OPS[op]
    else:
        match = _SINGLE_RIGHT.match(text)
        if match is None:
            return None
        bound, op, _ = match.groups()
        op = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}[_INEQ_OPS[op]]  # `a < x` is `x > a`
    if not bound.strip():
        return None
    if op[0] == ">":
        return _interval(bound, op == ">=", "\\infty", False)
    return _interval("-\\infty", False, bound, op == "<=")


def _interval(low: str, low_closed: bool, high: str, high_closed: bool) -> str:
    return ("[" if low_closed else "(") + low.strip() + ", " + high.strip() + ("]" if high_closed else ")")


# ---------------------------------------------------------------------------------------------------
# Words and choices
# ---------------------------------------------------------------------------------------------------

_TEXT_WRAPPER = re.compile(r"^" + _TEXT_COMMAND + r"\{(.*)\}$", re.DOTALL)
_ARTICLE = re.compile(r"^(?:an?|the)\s+", re.IGNORECASE)


def text_answer(text: str) -> str | None:
    """A word answer (``\\text{Evelyn}``, ``\\text{an ellipse}``, ``odd``) as a lower-case word without
    article; ``None`` when ``text`` is not only letters and spaces (numbers and math go elsewhere)."""
    inner = text.strip()
    match = _TEXT_WRAPPER.match(inner)
    if match:
        inner = match.group(1).strip()
    if not re.fullmatch(r"[A-Za-z][A-Za-z '\-]*", inner) or len(inner) < 2 or len(inner) > 100:
        return None
    word = _ARTICLE.sub("", inner.lower()).strip()
    return word or None


_CHOICE = re.compile(r"^\(?\s*([A-Z])\s*\)?$")


def choice_letter(text: str) -> str | None:
    """A multiple-choice letter: ``(C)``, ``\\text{(C)}``, ``\\textbf{C}``, ``\\mathrm{C}`` -> ``C``."""
    inner = text.strip()
    match = _TEXT_WRAPPER.match(inner)
    if match:
        inner = match.group(1).strip()
    match = _CHOICE.match(inner)
    return match.group(1) if match else None
