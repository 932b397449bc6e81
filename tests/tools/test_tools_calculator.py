"""The calculator tool: exact values, Python's precedence, bounded work, one-line errors, never raises.

Run: python -m pytest tests/tools/test_tools_calculator.py -q
"""

from __future__ import annotations

import pytest

from mathrl.tools import BUILTIN_TOOLS, calculate
from mathrl.tools.calculator import MAX_DIGITS, calculator, format_value

OK = [
    # (expression, printed value, why)
    ("345678+987654", "1333332", "the addition a model checks its long arithmetic with"),
    ("345678*987654", "341410259412", "exact, no float rounding"),
    ("2**100", "1267650600228229401496703205376", "integers of any size stay exact"),
    ("99999999999999999999*99999999999999999999", "9999999999999999999800000000000000000001",
     "big-int product beyond float precision"),
    ("7/2", "3.5", "a fraction with a terminating decimal prints as that decimal, like print(7/2)"),
    ("1/3", "1/3 ≈ 0.333333333333", "a repeating decimal prints as the reduced fraction and its value"),
    ("2/6", "1/3 ≈ 0.333333333333", "fractions are reduced"),
    ("-1/3", "-1/3 ≈ -0.333333333333", "the sign goes on the fraction and the value"),
    ("1/3 + 1/6", "0.5", "exact fraction arithmetic: no 0.49999"),
    ("0.1 + 0.2", "0.3", "decimal literals are exact (a float would give 0.30000000000000004)"),
    ("6/3", "2", "a whole quotient prints as an integer"),
    ("1e3", "1000", "scientific notation is exact too"),
    ("1/2**70", "1/1180591620717411303424 ≈ 8.47032947254e-22",
     "a terminating decimal longer than 20 places prints as a fraction and its value"),
    ("2+3*4", "14", "precedence: * before +"),
    ("(2+3)*4", "20", "parentheses"),
    ("2**3**2", "512", "** is right-associative: 2**(3**2)"),
    ("-2**2", "-4", "unary minus binds looser than ** (Python: -(2**2))"),
    ("2**-1", "0.5", "a negative exponent in the exponent's unary position"),
    ("--3", "3", "repeated unary minus"),
    ("-7//2", "-4", "// floors, as in Python"),
    ("-7 % 3", "2", "% takes the sign of the divisor, as in Python"),
    ("7.5 // 2", "3", "floor division of an exact decimal"),
    ("8**(1/3)", "2", "an exact rational root stays exact"),
    ("sqrt(16/9)", "4/3 ≈ 1.33333333333", "sqrt of a rational square is exact"),
    ("sqrt(2)", "≈ 1.41421356237", "an irrational result is a float, marked ≈"),
    ("math.sqrt(49)", "7", "math.<function> is accepted for the allowed functions"),
    ("factorial(20)", "2432902008176640000", "factorial within its bound"),
    ("comb(50, 25)", "126410606437752", "binomial coefficients"),
    ("gcd(12, 18) + lcm(4, 6)", "18", "integer functions"),
    ("abs(-3) + max(1, 2, 3) - min(4, 5)", "2", "abs/min/max with any number of arguments"),
    ("round(7/3, 3)", "2.333", "round to places is exact"),
    ("round(2.5)", "2", "round() rounds half to even, as Python does"),
    ("2**33219", None, "2**33219 has exactly 10000 digits: the largest power of two allowed"),
    ("print(345678+987654)", "1333332", "a python-style print(...) wrapper"),
    ("import math\n# sum\nmath.factorial(5)", "120", "a short block: imports and comments are skipped, the last line is the expression"),
    ("```python\nprint(2**10)\n```", "1024", "a fenced code block"),
    ("print(1+1);", "2", "a trailing semicolon"),
]


@pytest.mark.parametrize("expression, expected, why", OK, ids=[c[0][:30] for c in OK])
def test_values(expression, expected, why):
    result = calculate(expression)
    assert result.status == "ok", (why, result.text)
    if expected is None:
        assert len(result.text) == MAX_DIGITS, why
    else:
        assert result.text == expected, why


ERRORS = [
    # (expression, start of the error text, why)
    ("1/0", "error: division by zero", "the classic"),
    ("5 % 0", "error: division by zero", "modulo by zero says the same"),
    ("0**-1", "error: division by zero", "zero to a negative power"),
    ("9**9**9", "error: result too large", "refused before computing: would not finish otherwise"),
    ("2**33220", "error: result too large", "one digit past the cap"),
    ("10**10000", "error: result too large", "10**10000 has 10001 digits"),
    ("factorial(5000)", "error: result too large", "factorial is capped by its result's size, checked before computing"),
    ("factorial(10**100)", "error: result too large", "a huge argument is refused at once"),
    ("comb(10**8, 5*10**7)", "error: result too large", "comb is capped the same way"),
    ("(2**30000)*(2**30000)", "error: result too large", "an intermediate over the cap is refused"),
    ("factorial(2.5)", "error: factorial takes integers", "integer-only functions say so"),
    ("sqrt(-1)", "error: sqrt of a negative number", "no complex results"),
    ("(-8)**(1/3)", "error: a negative number to a fractional power", "no complex results"),
    ("import os", "error: unsupported syntax 'import'", "statements are not expressions"),
    ("__import__('os')", "error: unsupported syntax: strings", "strings are refused before names"),
    ("__import__(1)", "error: unknown name '__import__'", "only the allowed functions can be called"),
    ("os.system(1)", "error: unknown name 'os.system'", "attributes other than math.<allowed> are refused"),
    ("math.pow(2, 3)", "error: unknown name 'math.pow'", "math.<name> only for the allowed functions"),
    ("().__class__", "error: unsupported syntax '.'", "attribute access on anything but math is refused"),
    ("[1, 2]", "error: unsupported syntax '['", "no lists"),
    ("lambda: 1", "error: unsupported syntax 'lambda'", "keywords are named"),
    ("x + 1", "error: unknown name 'x'", "no variables"),
    ("sqrt", "error: sqrt is a function", "a function without its call"),
    ("2^3", "error: unsupported syntax '^'", "^ is xor in Python and a power in LaTeX: refused, with a hint"),
    ("1 +", "error: unexpected end of expression", "incomplete"),
    ("(1 + 2", "error: expected ')'", "unbalanced parentheses"),
    ("1 2", "error: unexpected '2' after a complete expression", "two numbers"),
    ("max()", "error: unexpected ')'", "a call needs an argument"),
    ("abs(1, 2)", "error: abs takes 1 argument", "arity is checked"),
    ("", "error: empty expression", "nothing to evaluate"),
    ("x = 3\nprint(x)", "error: the calculator evaluates one expression; got 2 lines", "a program is for the python tool"),
    ("(" * 200 + "1" + ")" * 200, "error: expression nested more than", "nesting is bounded: no RecursionError"),
    ("1" * 5000, "error: number literal too long", "literals are bounded"),
    ("1_", "error: invalid number", "a malformed literal"),
]


@pytest.mark.parametrize("expression, error, why", ERRORS, ids=[c[0][:30] for c in ERRORS])
def test_errors(expression, error, why):
    result = calculate(expression)
    assert result.status == "error", why
    assert result.text.startswith(error), (why, result.text)
    assert "\n" not in result.text, "errors are one line"


ARGS = [
    # (args, kwargs, status, text, why)
    ({"expression": "6*7"}, {}, "ok", "42", "a JSON tool call's arguments"),
    ({"code": "6*7"}, {}, "error", "error: expected {\"expression\"", "the wrong key is named, not guessed"),
    (42, {}, "error", "error: expected an expression string, got int", "a non-string body"),
    ("1+1", {"digits": 3}, "error", "error: the calculator takes no options", "kwargs are not silently ignored"),
]


@pytest.mark.parametrize("args, kwargs, status, text, why", ARGS, ids=[str(c[0]) for c in ARGS])
def test_args(args, kwargs, status, text, why):
    result = calculate(args, **kwargs)
    assert result.status == status, why
    assert result.text.startswith(text), (why, result.text)


def test_contract_function_and_builtin_registry():
    # why: the registry entry is callable by the tool contract fn(args, **kwargs) -> str
    assert calculator("2**10") == "1024"
    assert BUILTIN_TOOLS["calculator"]("1/4") == "0.25"
    assert BUILTIN_TOOLS["calculator"].parameter == "expression"


def test_big_results_print_past_pythons_int_to_str_limit():
    # why: Python 3.11+ refuses str() of ints over 4300 digits; the calculator prints them by chunks
    # and leaves the process-wide limit alone
    import sys

    before = sys.get_int_max_str_digits() if hasattr(sys, "get_int_max_str_digits") else None
    text = calculate("10**9999").text
    assert text == "1" + "0" * 9999
    assert calculate("-(10**9999) - 1").text == "-1" + "0" * 9998 + "1"
    assert (sys.get_int_max_str_digits() if before is not None else None) == before


def test_format_value_rules():
    # why: the printing rule in one place, with its edge cases
    from fractions import Fraction

    assert format_value(Fraction(-7, 2)) == "-3.5"
    assert format_value(Fraction(1, 8)) == "0.125"
    assert format_value(Fraction(1, 10 ** 20)) == "0.00000000000000000001"  # 20 places: still exact
    assert format_value(Fraction(1, 7)) == "1/7 ≈ 0.142857142857"
    assert format_value(2.0) == "≈ 2"
