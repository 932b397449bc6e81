"""Two-stage parsing for math-verify's LaTeX parser (latex2sympy2): SLL prediction first, full LL only
when SLL reports an error. The same trees, several times faster.

latex2sympy2's ANTLR grammar is ambiguous at an opening bracket (a tuple, an interval, a bracketed
expression), so ANTLR's default prediction (LL) keeps falling back to full-context analysis there,
which its DFA cache does not keep: a parse of ``(15,-29)`` takes 30-90 ms on a slow core, every time,
against 1-6 ms with SLL prediction. ANTLR guarantees that an SLL parse that succeeds is the tree LL
would build (``PredictionMode.SLL``: "the parser will either return a correct parse tree (i.e. the
same parse tree that would be returned with the LL prediction mode), or it will report a syntax
error"). So the first stage parses with SLL and bails out at the first error; the second stage parses
again from scratch exactly as latex2sympy2 does (LL, its error listener), so that every result and
every error is LL's. This is the strategy of Parr, "The Definitive ANTLR 4 Reference", section 13.7.

    >>> install_two_stage_parsing()   # idempotent; `equivalence` calls it before its first parse

`tests/test_latex_parse.py` checks that both ways give the same expressions and the same errors.
"""

from __future__ import annotations

__all__ = ["install_two_stage_parsing", "two_stage_installed", "uninstall_two_stage_parsing"]


def two_stage_installed() -> bool:
    """Whether latex2sympy2 in this process parses SLL-first."""
    from latex2sympy2_extended import latex2sympy2

    return getattr(latex2sympy2._Latex2Sympy.create_parser, "two_stage", False)


def install_two_stage_parsing() -> None:
    """Make latex2sympy2 (and so math-verify) parse SLL-first in this process. Idempotent."""
    from latex2sympy2_extended import latex2sympy2

    converter = latex2sympy2._Latex2Sympy
    if two_stage_installed():
        return
    create_ll_parser = converter.create_parser

    def create_parser(self, latex_str: str):
        parser = create_ll_parser(self, latex_str)
        parser.math = lambda: _math_two_stage(parser, lambda: create_ll_parser(self, latex_str))
        return parser

    create_parser.two_stage = True
    create_parser.ll = create_ll_parser
    converter.create_parser = create_parser


def uninstall_two_stage_parsing() -> None:
    """Back to latex2sympy2's own LL parsing (for the tests that compare both)."""
    from latex2sympy2_extended import latex2sympy2

    if two_stage_installed():
        latex2sympy2._Latex2Sympy.create_parser = latex2sympy2._Latex2Sympy.create_parser.ll


def _math_two_stage(parser, create_ll_parser):
    """The grammar's start rule ``math``: SLL with bail-out on a fresh parser, else LL on another."""
    from antlr4.atn.PredictionMode import PredictionMode
    from antlr4.error.ErrorStrategy import BailErrorStrategy

    parser._interp.predictionMode = PredictionMode.SLL
    parser._errHandler = BailErrorStrategy()
    try:
        return type(parser).math(parser)
    except Exception:  # a syntax error, or SLL not strong enough: LL decides, errors included
        return type(parser).math(create_ll_parser())
