"""The `calculator` tool: exact arithmetic on one expression written by the model.

    calculator("345678*987654")          -> "341410259412"
    calculator("7/2")                    -> "3.5"
    calculator("1/3")                    -> "1/3 ≈ 0.333333333333"
    calculator({"expression": "2**-2"})  -> "0.25"
    calculator("print(2**10)")           -> "1024"   (the python-style block a model often writes)

A recursive-descent parser, not `ast` + `eval`: the input is hostile, and the grammar is a dozen rules
(written in `_Parser`'s docstring). It never runs `eval`, `exec` or `compile`, and reports the first thing
it does not accept by name (``error: unsupported syntax 'import'``); why not Python's AST: docs/tools.md,
"calculator". The input is at most `MAX_INPUT_CHARS` characters and `MAX_DEPTH` nested parentheses or
calls deep. Values, their bounds and how they are printed: tools/exact.py.

Never raises: every failure is a one-line ``error: ...`` (`calculate` returns a `ToolResult`).
"""

from __future__ import annotations

import re
import time
from typing import Callable

from mathrl.tools.base import ToolResult
from mathrl.tools.exact import FUNCTIONS, MAX_DIGITS, CalcError, Value, binary, checked, format_value, number, power

__all__ = ["FUNCTIONS", "MAX_DIGITS", "CalcError", "calculate", "calculator", "evaluate", "format_value",
           "strip_code_block"]

MAX_INPUT_CHARS = 20_000
"""Longest input accepted (a code block with comments included)."""
MAX_DEPTH = 100
"""Deepest nesting of parentheses and calls: the parser recurses once per level."""


# ---------------------------------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------------------------------


def calculator(args: str | dict, **kwargs) -> str:
    """The tool function (contract ``fn(args, **kwargs) -> str``): the printed value, or ``error: ...``.

    `args` is the expression (or a short python-style block, see `strip_code_block`) or
    ``{"expression": str}``. The calculator takes no kwargs; any given are an error.
    """
    return calculate(args, **kwargs).text


def calculate(args: str | dict, *, timeout_s: float | None = None, stop: object = None, **kwargs) -> ToolResult:
    """`calculator` with its status: ``ok`` or ``error``. `timeout_s` and `stop` are accepted for the
    pool's uniform call and unused: every step is bounded by `MAX_DIGITS`, so there is no timeout."""
    start = time.perf_counter()
    try:
        if kwargs:
            raise CalcError(f"the calculator takes no options; got {', '.join(sorted(kwargs))}")
        text, status = format_value(evaluate(strip_code_block(_expression_of(args)))), "ok"
    except CalcError as e:
        text, status = f"error: {e}", "error"
    except Exception as e:  # a case the rules above missed: still one line, never raised
        text, status = f"error: {type(e).__name__}: {_one_line(str(e))}", "error"
    return ToolResult(text=text, status=status, seconds=time.perf_counter() - start)


def _expression_of(args: str | dict) -> str:
    if isinstance(args, dict):
        if set(args) != {"expression"} or not isinstance(args["expression"], str):
            raise CalcError('expected {"expression": "<arithmetic>"}, got keys ' + ", ".join(map(repr, args)))
        return args["expression"]
    if not isinstance(args, str):
        raise CalcError(f"expected an expression string, got {type(args).__name__}")
    return args


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---------------------------------------------------------------------------------------------------
# Python-style blocks
# ---------------------------------------------------------------------------------------------------

_IGNORED_LINE = re.compile(r"\s*(#.*)?$|\s*(import\s+math|from\s+math\s+import\s+[\w\s,*]+)\s*(#.*)?$")
_PRINT_CALL = re.compile(r"\s*print\s*\((?P<inner>.*)\)\s*;?\s*(#.*)?$", re.S)


def strip_code_block(text: str) -> str:
    """The expression in `text`: a bare expression, or a short python-style block of which it is the
    one line left after blank lines, ``# comments`` and ``import math`` / ``from math import ...``
    lines, optionally wrapped in one ``print(...)``, optionally inside a ```python fence.

    Why: models trained on tool-integrated reasoning write ``print(345678+987654)`` or a block ending
    in the expression; the calculator answers those too, and refuses a block that really is a
    program (assignments, loops: ``error: the calculator evaluates one expression ...``).
    """
    if len(text) > MAX_INPUT_CHARS:
        raise CalcError(f"input too long ({len(text)} characters; at most {MAX_INPUT_CHARS})")
    lines = text.strip().splitlines()
    if lines and lines[0].strip().startswith("```"):
        lines = lines[1:-1] if len(lines) > 1 and lines[-1].strip() == "```" else lines[1:]
    kept = [line for line in lines if not _IGNORED_LINE.match(line)]
    if not kept:
        raise CalcError("empty expression")
    if len(kept) > 1:
        raise CalcError(f"the calculator evaluates one expression; got {len(kept)} lines (use the python tool "
                        "for programs)")
    line = kept[0].strip().removesuffix(";").strip()
    match = _PRINT_CALL.match(line)
    return match.group("inner") if match else line


# ---------------------------------------------------------------------------------------------------
# Tokens and grammar
# ---------------------------------------------------------------------------------------------------

_TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<number>(?:\d[\d_]*(?:\.[\d_]*)?|\.\d[\d_]*)(?:[eE][+-]?\d+)?)
  | (?P<name>[A-Za-z_][A-Za-z_0-9]*(?:\s*\.\s*[A-Za-z_][A-Za-z_0-9]*)*)
  | (?P<op>\*\*|//|[-+*/%(),])
  | (?P<other>.)
""", re.X | re.S)

_KEYWORDS = frozenset("""False None True and as assert async await break class continue def del elif else except
finally for from global if import in is lambda nonlocal not or pass raise return try while with yield""".split())


def _tokens(text: str) -> list[tuple[str, str]]:
    """(kind, text) pairs, kind in number|name|op; anything else is an error naming it."""
    out = []
    for m in _TOKEN.finditer(text):
        kind, value = m.lastgroup, m.group()
        if kind == "space":
            continue
        if kind == "other":
            if value in "\"'":
                raise CalcError("unsupported syntax: strings")
            if value == "^":
                raise CalcError("unsupported syntax '^' (use ** for powers)")
            raise CalcError(f"unsupported syntax {value!r}")
        if kind == "name":
            value = re.sub(r"\s+", "", value)
            if value.split(".")[0] in _KEYWORDS:
                raise CalcError(f"unsupported syntax {value.split('.')[0]!r}")
        out.append((kind, value))
    return out


class _Parser:
    """Recursive descent over Python's precedence for this grammar:

        expr  := term (("+" | "-") term)*
        term  := unary (("*" | "/" | "//" | "%") unary)*
        unary := ("+" | "-") unary | power
        power := atom ["**" unary]          # right-associative; -2**2 == -4, 2**-1 == 1/2
        atom  := NUMBER | "(" expr ")" | FUNCTION "(" expr ("," expr)* ")"

    FUNCTION is a name of `FUNCTIONS`, bare or as ``math.<name>``. Each rule computes its value as it
    parses (no tree is kept), checking sizes after every operation (`checked`).
    """

    def __init__(self, tokens: list[tuple[str, str]]):
        self.tokens = tokens
        self.pos = 0
        self.depth = 0

    def parse(self) -> Value:
        if not self.tokens:
            raise CalcError("empty expression")
        value = self.expr()
        if self.pos < len(self.tokens):
            raise CalcError(f"unexpected {self.tokens[self.pos][1]!r} after a complete expression")
        return value

    def peek(self) -> str | None:
        return self.tokens[self.pos][1] if self.pos < len(self.tokens) else None

    def take(self) -> tuple[str, str]:
        if self.pos >= len(self.tokens):
            raise CalcError("unexpected end of expression")
        self.pos += 1
        return self.tokens[self.pos - 1]

    def expect(self, op: str) -> None:
        got = self.peek()
        if got != op:
            raise CalcError(f"expected {op!r}, got {'end of expression' if got is None else repr(got)}")
        self.pos += 1

    def expr(self) -> Value:
        value = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()[1]
            right = self.term()
            value = checked(value + right if op == "+" else value - right)
        return value

    def term(self) -> Value:
        value = self.unary()
        while self.peek() in ("*", "/", "//", "%"):
            op = self.take()[1]
            value = binary(op, value, self.unary())
        return value

    def unary(self) -> Value:
        if self.peek() in ("+", "-"):
            op = self.take()[1]
            value = self.nested(self.unary)
            return -value if op == "-" else value
        return self.power()

    def power(self) -> Value:
        base = self.atom()
        if self.peek() == "**":
            self.take()
            return power(base, self.nested(self.unary))
        return base

    def atom(self) -> Value:
        kind, value = self.take()
        if kind == "number":
            return number(value)
        if value == "(":
            inner = self.nested(self.expr)
            self.expect(")")
            return inner
        if kind == "name":
            return self.call(value)
        raise CalcError(f"unexpected {value!r}")

    def call(self, name: str) -> Value:
        fn = FUNCTIONS.get(name.removeprefix("math.") if name.startswith("math.") else name)
        if fn is None or name.count(".") > (1 if name.startswith("math.") else 0):
            raise CalcError(f"unknown name {name!r}; allowed functions: {', '.join(FUNCTIONS)}")
        if self.peek() != "(":
            raise CalcError(f"{name} is a function; call it as {name}(...)")
        self.take()
        args = [self.nested(self.expr)]
        while self.peek() == ",":
            self.take()
            args.append(self.nested(self.expr))
        self.expect(")")
        return checked(fn(*args))

    def nested(self, rule: Callable[[], Value]) -> Value:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise CalcError(f"expression nested more than {MAX_DEPTH} levels deep")
        try:
            return rule()
        finally:
            self.depth -= 1


def evaluate(expression: str) -> Value:
    """The exact value of `expression` (grammar: `_Parser`); raises `CalcError` with a one-line reason."""
    return _Parser(_tokens(expression)).parse()
