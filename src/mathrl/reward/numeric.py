"""Exact values of plain numbers as answers write them: decimals, scientific notation, fractions,
mixed numbers. Each function returns ``None`` for anything else and never raises on model text.

Conventions (see `plain_number`): ``,`` ``,\\!`` ``{,}`` ``\\,`` between digit groups of three are
thousands separators when the first group has 1-3 digits and no leading zero; ``{,}`` before any other
group is a decimal comma (that is how LaTeX writes one); a bare comma before any other group
(``0,111``, ``1,22``) is not a number at all, so it is read as a list, never as 111 or 1.22.

    >>> plain_number("0,111") is None     # not thousands; a list or a decimal comma: ambiguous
    True
    >>> str(plain_number(r"3{,}14"))      # LaTeX's {,} is never a list separator
    '3.14'
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction

__all__ = [
    "MAX_NUMBER_CHARS",
    "answer_form",
    "decimal_comma_number",
    "mixed_number",
    "plain_number",
    "scientific_number",
    "simple_fraction",
]

MAX_NUMBER_CHARS = 10_000
"""Longer strings are never treated as plain numbers (the exact path would still be fast, but no
real answer is this long and the caller sends such answers to the bounded path)."""


_THOUSANDS_SEP = r"(?:,|,\\!|\{,\}|\\,|\\!|\\ | )"
_PLAIN = re.compile(
    r"(?P<sign>[+-]?)(?P<int>[1-9][0-9]{0,2}(?:" + _THOUSANDS_SEP + r"[0-9]{3})+|[0-9]+)?"
    r"(?:(?P<point>\.|\{,\})(?P<frac>[0-9]+))?"
)
_SEP = re.compile(_THOUSANDS_SEP)


def plain_number(text: str) -> Decimal | None:
    """Exact ``Decimal`` of a plain decimal number, or ``None`` if ``text`` is anything else.

    Accepts ``27``, ``27.0``, ``.5``, ``+3``, ``1,000``, ``11,\\!111``, ``1\\,000``, ``14{,}916`` and
    the LaTeX decimal comma ``3{,}14``. Rejects ``0,111`` and ``1,22`` (not groups of three after a
    non-zero lead: a list or a decimal comma, and we do not guess) and ``32, 349`` (a space after a
    comma separates list items)."""
    if len(text) > MAX_NUMBER_CHARS:
        return None
    text = text.strip()
    match = _PLAIN.fullmatch(text)
    if match is None or (match.group("int") is None and match.group("frac") is None):
        return None
    integer = _SEP.sub("", match.group("int") or "0")
    fraction = match.group("frac")
    try:
        return Decimal(match.group("sign") + integer + ("." + fraction if fraction else ""))
    except InvalidOperation:  # pragma: no cover - the regex admits only digits
        return None


_DECIMAL_COMMA = re.compile(r"([+-]?[0-9]+),([0-9]+)")


def decimal_comma_number(text: str) -> Decimal | None:
    """``1000,99`` -> 1000.99 and ``0,111`` -> 0.111: a comma between digits that cannot be a thousands
    separator (`plain_number` reads ``1,000``) is a decimal comma, as in most of Europe and in
    math-verify. ``None`` for anything else. Lists are told apart by the space after their commas
    (``1, 22``) and by the reference's form, which `equivalence` compares first."""
    if len(text) > 200:
        return None
    match = _DECIMAL_COMMA.fullmatch(text.strip())
    if match is None or plain_number(text) is not None:
        return None
    return Decimal(match.group(1) + "." + match.group(2))


_SCIENTIFIC = re.compile(r"([+-]?[0-9]+(?:\.[0-9]+)?)\s*(?:\\times|\\cdot|\*)\s*10\s*\^\s*(?:\{\s*([+-]?[0-9]{1,4})\s*\}|([0-9]))")


def scientific_number(text: str) -> Decimal | None:
    """``6.72 \\times 10^{-5}`` -> ``Decimal('0.0000672')`` exactly; ``None`` for anything else."""
    if len(text) > 200:
        return None
    match = _SCIENTIFIC.fullmatch(text.strip())
    if match is None:
        return None
    return Decimal(match.group(1)).scaleb(int(match.group(2) or match.group(3)))


_FRACTION = re.compile(
    r"(-?)\s*(?:\\[dtc]?frac\s*(?:\{\s*(-?[0-9]{1,30})\s*\}|([0-9]))\s*(?:\{\s*([0-9]{1,30})\s*\}|([0-9]))"
    r"|(-?[0-9]{1,30})\s*/\s*([0-9]{1,30}))"
)


def simple_fraction(text: str) -> Fraction | None:
    """``\\frac{3}{4}``, ``-\\dfrac{35}{9}``, ``\\frac34``, ``3/4`` -> the exact ``Fraction``; ``None``
    for anything else (a zero denominator included)."""
    if len(text) > 200:
        return None
    match = _FRACTION.fullmatch(text.strip())
    if match is None:
        return None
    sign, numerator, denominator = match.group(1), None, None
    if match.group(6) is not None:
        numerator, denominator = int(match.group(6)), int(match.group(7))
    else:
        numerator = int(match.group(2) or match.group(3))
        denominator = int(match.group(4) or match.group(5))
    if denominator == 0:
        return None
    value = Fraction(numerator, denominator)
    return -value if sign else value


_MIXED = re.compile(r"(-?)\s*([0-9]+)\s*\\[dt]?frac\s*(?:\{\s*([0-9]+)\s*\}|([0-9]))\s*(?:\{\s*([0-9]+)\s*\}|([0-9]))")


def mixed_number(text: str) -> Fraction | None:
    """``2\\frac{1}{2}`` -> 5/2 (a whole number followed by a proper fraction is a sum, as written in
    school answers, never the product 2 * 1/2); ``None`` for anything else."""
    if len(text) > 200:
        return None
    match = _MIXED.fullmatch(text.strip())
    if match is None:
        return None
    sign, whole = match.group(1), int(match.group(2))
    numerator = int(match.group(3) or match.group(4))
    denominator = int(match.group(5) or match.group(6))
    if not 0 < numerator < denominator:
        return None
    value = whole + Fraction(numerator, denominator)
    return -value if sign else value


def answer_form(text: str) -> str:
    """How an answer is written: "integer" (``12``, ``1,000``, ``-3``), "decimal" (``2.5``, ``3.0``,
    ``3{,}14``: a fractional part is written, even a zero one), "fraction" (``7/2``, ``\\frac{7}{2}``,
    ``3\\frac12``) or "other" (``0,111`` included: a list or a decimal comma, see `plain_number`).
    The written form, not the value: the integer-answer hack is answering ``3`` where the working gives
    ``2.5``, and ``3.0`` is not that."""
    text = text.strip().strip("$").strip()
    number = plain_number(text)
    if number is not None:
        return "decimal" if ("." in text or "{,}" in text) else "integer"
    if simple_fraction(text) is not None or mixed_number(text) is not None:
        return "fraction"
    return "other"
