"""Exact values for the calculator tool (tools/calculator.py parses; this module computes and prints).

Values are exact: numbers are `fractions.Fraction` (decimal literals too: ``0.1 + 0.2`` is exactly
``0.3``), so integers stay Python ints of any size and ``/`` is exact. Only `sqrt` of a non-square
and a power with a fractional exponent whose result is irrational give a float, marked ``≈``.

How a result is printed (`format_value`):
* an integer: its digits (``1333332``);
* a fraction whose decimal expansion ends within `MAX_EXACT_DECIMALS` places: that decimal (``3.5``, ``0.125``): exact, as ``print(7/2)``;
* any other fraction: reduced, then its value to 12 significant digits (``1/3 ≈ 0.333333333333``);
* a float: ``≈`` and 12 significant digits (``≈ 1.41421356237``).

Bounded: every intermediate numerator and denominator has at most `MAX_DIGITS` decimal digits, and a
power or a factorial is refused *before* it is computed when its result would exceed that, so
``9**9**9`` is ``error: result too large (more than 10000 digits)`` at once, not a hang.
"""

from __future__ import annotations

import math
from decimal import Decimal, localcontext
from fractions import Fraction
from typing import Callable

__all__ = ["FUNCTIONS", "MAX_DIGITS", "CalcError", "Value", "binary", "checked", "format_value", "number", "power"]

MAX_DIGITS = 10_000
"""Largest numerator or denominator, in decimal digits, of any value the calculator computes."""
MAX_LITERAL_DIGITS = 4_000
"""Longest number literal (Python refuses int(str) beyond 4300 digits by default)."""
MAX_EXACT_DECIMALS = 20
"""A terminating fraction is printed as an exact decimal when it has at most this many places."""
SIGNIFICANT_DIGITS = 12
"""Digits of the approximate value printed after ``≈``."""

_LOG10_2 = math.log10(2)
_TOO_LARGE = 10 ** MAX_DIGITS  # the smallest integer with more than MAX_DIGITS digits

Value = Fraction | float


class CalcError(Exception):
    """A one-line reason the expression has no value (the text after ``error: ``)."""


# ---------------------------------------------------------------------------------------------------
# Arithmetic with bounds
# ---------------------------------------------------------------------------------------------------


def _digits(n: int) -> int:
    """An upper bound on the decimal digits of |n| (cheap: from the bit length)."""
    return int(n.bit_length() * _LOG10_2) + 1


def checked(value: Value) -> Value:
    """`value` as a Fraction (or a finite float); `CalcError` when it exceeds `MAX_DIGITS`."""
    if isinstance(value, float):
        if not math.isfinite(value):
            raise CalcError("result too large")
        return value
    if isinstance(value, int):
        value = Fraction(value)
    if abs(value.numerator) >= _TOO_LARGE or value.denominator >= _TOO_LARGE:
        raise CalcError(f"result too large (more than {MAX_DIGITS} digits)")
    return value


def number(literal: str) -> Fraction:
    """A number literal as an exact Fraction ("0.1" is 1/10, "1e3" is 1000)."""
    if literal.endswith("_") or "__" in literal or "_." in literal or "._" in literal:
        raise CalcError(f"invalid number {literal!r}")
    text = literal.replace("_", "")
    mantissa, _, exponent = text.lower().partition("e")
    if len(mantissa) > MAX_LITERAL_DIGITS or len(exponent) > 7 or (exponent and abs(int(exponent)) > MAX_DIGITS):
        raise CalcError(f"number literal too long: {literal[:20]}...")
    whole, _, frac = mantissa.partition(".")
    value = Fraction(int(whole or "0") * 10 ** len(frac) + int(frac or "0"), 10 ** len(frac))
    if exponent:
        value *= Fraction(10) ** int(exponent)
    return checked(value)


def binary(op: str, a: Value, b: Value) -> Value:
    """a op b for op in * / // %, exact and checked."""
    if op == "*":
        return checked(a * b)
    if b == 0:
        raise CalcError("division by zero")
    if op == "/":
        return checked(a / b)
    if op == "//":
        return checked(a // b)
    return checked(a % b)


def power(base: Value, exponent: Value) -> Value:
    """base ** exponent, refused before computing when the result would exceed `MAX_DIGITS`.

    An integer exponent is exact. A fractional exponent p/q is exact when base is a rational q-th
    power (``8**(1/3)`` is 2, ``4**0.5`` is 2), else a float; a negative base then has no real value.
    """
    if isinstance(exponent, Fraction) and exponent.denominator == 1 and isinstance(base, Fraction):
        n = exponent.numerator
        if base == 0 and n < 0:
            raise CalcError("division by zero (0 to a negative power)")
        # floor(log2) of the larger part: at most half the true size, so the refusal is never wrong
        # and what passes it is at most twice the limit, computed in milliseconds, then checked
        bits = max(abs(base.numerator).bit_length(), base.denominator.bit_length()) - 1
        if abs(n) * bits * _LOG10_2 > MAX_DIGITS:
            raise CalcError(f"result too large (more than {MAX_DIGITS} digits)")
        return checked(base ** n)
    if isinstance(base, Fraction) and isinstance(exponent, Fraction) and base >= 0 and exponent.denominator <= 1000:
        root = _exact_root(base, exponent.denominator)
        if root is not None:
            return power(root, Fraction(exponent.numerator))
    if base < 0 and not (isinstance(exponent, float) and exponent.is_integer()):
        raise CalcError("a negative number to a fractional power has no real value")
    try:
        result = float(base) ** float(exponent)
    except OverflowError:
        raise CalcError("result too large") from None
    return checked(result)


def _exact_root(x: Fraction, q: int) -> Fraction | None:
    """The rational q-th root of x >= 0 when there is one, else None."""
    roots = [_int_root(x.numerator, q), _int_root(x.denominator, q)]
    return None if None in roots else Fraction(roots[0], roots[1])


def _int_root(n: int, q: int) -> int | None:
    if n < 2:
        return n
    guess = round(n ** (1 / q)) if n.bit_length() < 1000 else _nth_root_newton(n, q)
    for r in (guess - 1, guess, guess + 1):
        if r >= 0 and r ** q == n:
            return r
    return None


def _nth_root_newton(n: int, q: int) -> int:
    """floor(n ** (1/q)) for big n, by integer Newton iteration (floats overflow there)."""
    x = 1 << (n.bit_length() // q + 1)
    while True:
        y = ((q - 1) * x + n // x ** (q - 1)) // q
        if y >= x:
            return x
        x = y


# ---------------------------------------------------------------------------------------------------
# Functions
# ---------------------------------------------------------------------------------------------------


def _integer(x: Value, name: str) -> int:
    if isinstance(x, Fraction) and x.denominator == 1:
        return x.numerator
    raise CalcError(f"{name} takes integers, got {format_value(x)}")


def _arity(name: str, args: tuple, low: int, high: int | None = None) -> None:
    high = low if high is None else high
    if not low <= len(args) <= (high if high >= 0 else len(args)):
        want = f"{low}" if low == high else f"{low} to {high}" if high >= 0 else f"at least {low}"
        raise CalcError(f"{name} takes {want} argument{'s' if want != '1' else ''}, got {len(args)}")


def _abs(*args):
    _arity("abs", args, 1)
    return abs(args[0])


def _round(*args):
    _arity("round", args, 1, 2)
    if len(args) == 1:
        return Fraction(round(args[0]))
    places = _integer(args[1], "round's second argument")
    if abs(places) > MAX_DIGITS:
        raise CalcError(f"round to at most {MAX_DIGITS} places")
    return round(args[0], places)


def _min(*args):
    _arity("min", args, 1, -1)
    return min(args)


def _max(*args):
    _arity("max", args, 1, -1)
    return max(args)


def _sqrt(*args):
    _arity("sqrt", args, 1)
    if args[0] < 0:
        raise CalcError("sqrt of a negative number")
    return power(args[0], Fraction(1, 2))


def _gcd(*args):
    _arity("gcd", args, 1, -1)
    return Fraction(math.gcd(*(_integer(a, "gcd") for a in args)))


def _lcm(*args):
    _arity("lcm", args, 1, -1)
    result = 1
    for a in args:
        result = math.lcm(result, _integer(a, "lcm"))
        checked(Fraction(result))
    return Fraction(result)


def _log10_factorial(n: int) -> float:
    return math.lgamma(n + 1) / math.log(10)


def _factorial(*args):
    _arity("factorial", args, 1)
    n = _integer(args[0], "factorial")
    if n < 0:
        raise CalcError("factorial of a negative number")
    if _log10_factorial(n) > MAX_DIGITS:
        raise CalcError(f"result too large (more than {MAX_DIGITS} digits)")
    return Fraction(math.factorial(n))


def _comb(*args):
    _arity("comb", args, 2)
    n, k = (_integer(a, "comb") for a in args)
    if n < 0 or k < 0:
        raise CalcError("comb takes non-negative integers")
    if k > n:
        return Fraction(0)
    k = min(k, n - k)
    if _log10_factorial(n) - _log10_factorial(k) - _log10_factorial(n - k) > MAX_DIGITS or k > 10 ** 6:
        raise CalcError(f"result too large (more than {MAX_DIGITS} digits)")
    return Fraction(math.comb(n, k))


FUNCTIONS: dict[str, Callable[..., Value]] = {
    "abs": _abs, "round": _round, "min": _min, "max": _max, "sqrt": _sqrt,
    "gcd": _gcd, "lcm": _lcm, "factorial": _factorial, "comb": _comb,
}
"""The functions an expression may call (also as ``math.<name>``); integer-only ones say so."""


# ---------------------------------------------------------------------------------------------------
# Printing
# ---------------------------------------------------------------------------------------------------


def format_value(value: Value) -> str:
    """The printed form of a value (rules in the module docstring)."""
    if isinstance(value, float):
        return f"≈ {value:.{SIGNIFICANT_DIGITS}g}"
    if value.denominator == 1:
        return _int_str(value.numerator)
    places = _terminating_places(value.denominator)
    if places is not None and places <= MAX_EXACT_DECIMALS:
        scaled = abs(value.numerator) * (10 ** places // value.denominator)
        digits = str(scaled).rjust(places + 1, "0")
        return f"{'-' if value < 0 else ''}{digits[:-places]}.{digits[-places:]}"
    return f"{_int_str(value.numerator)}/{_int_str(value.denominator)} ≈ {_approx(value):g}"


def _terminating_places(denominator: int) -> int | None:
    """Decimal places of p/denominator when only 2s and 5s divide the denominator, else None."""
    twos = (denominator & -denominator).bit_length() - 1
    rest = denominator >> twos
    fives = 0
    while rest % 5 == 0:
        rest //= 5
        fives += 1
    return max(twos, fives) if rest == 1 else None


def _approx(value: Fraction) -> Decimal:
    """p/q to `SIGNIFICANT_DIGITS` digits, from an integer of a few more digits than that (so neither
    p nor q, up to `MAX_DIGITS` digits long, is ever converted to a Decimal or a float whole)."""
    p, q = abs(value.numerator), value.denominator
    shift = SIGNIFICANT_DIGITS + 3 - (_digits(p) - _digits(q))
    scaled = p * 10 ** shift // q if shift >= 0 else p // (q * 10 ** -shift)
    with localcontext() as ctx:
        ctx.prec = SIGNIFICANT_DIGITS
        approx = +Decimal(scaled).scaleb(-shift)
    return -approx if value < 0 else approx


def _int_str(n: int) -> str:
    """str(n) for any n within `MAX_DIGITS`, split in chunks so Python's 4300-digit int-to-str limit
    (3.11+) does not apply and the process-wide setting is left alone."""
    if n < 0:
        return "-" + _int_str(-n)
    if n.bit_length() < 12_000:  # < 3612 digits: below the limit
        return str(n)
    chunk = 10 ** 3000
    high, low = divmod(n, chunk)
    return _int_str(high) + str(low).rjust(3000, "0")
