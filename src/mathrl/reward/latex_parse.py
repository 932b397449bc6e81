"""Two-stage parsing for math-verify's LaTeX parser (latex2sympy2): SLL prediction first, full LL only
when SLL reports an error. The same trees, several times faster.

ANTLR guarantees that an SLL parse that succeeds is the tree LL would build, so the first stage parses
with SLL and bails out at the first error; the second parses again from scratch exactly as latex2sympy2
does (LL, its error listener), so every result and every error is LL's. Why, the guarantee's source and
the times: docs/evaluation.md, "What counts as equal (the answer checker)".

    >>> install_two_stage_parsing()   # idempotent; `equivalence` calls it before its first parse
    True

The patch replaces latex2sympy2's private ``_Latex2Sympy.create_parser`` and sets the ANTLR parser's private
``_interp.predictionMode`` and ``_errHandler`` (pyproject.toml pins the versions it is tested with). A probe
parse checks it before it is installed; where the private API differs, latex2sympy2 keeps its own LL parsing
(slower, same verdicts) and one RuntimeWarning per process says so. `fast_parse_active()` says which way.
"""

from __future__ import annotations

import warnings

__all__ = ["fast_parse_active", "install_two_stage_parsing", "two_stage_installed", "uninstall_two_stage_parsing"]

PROBE = "(15,-29)"
"""Parsed both ways before the patch goes in: a tuple, the ambiguity that SLL prediction speeds up."""

_fallback: str | None = None
"""Why this process parses with latex2sympy2's own LL parsing (the probe failed); None: it did not."""


def two_stage_installed() -> bool:
    """Whether latex2sympy2 in this process parses SLL-first."""
    from latex2sympy2_extended import latex2sympy2

    return getattr(latex2sympy2._Latex2Sympy.create_parser, "two_stage", False)


def fast_parse_active() -> bool:
    """Whether LaTeX parses in this process go SLL-first: False before `install_two_stage_parsing` (the
    first check that reaches math-verify calls it) and after a fallback to latex2sympy2's own parsing."""
    try:
        return _fallback is None and two_stage_installed()
    except Exception:  # latex2sympy2 itself does not import: nothing parses SLL-first
        return False


def install_two_stage_parsing() -> bool:
    """Make latex2sympy2 (and so math-verify) parse SLL-first in this process; returns whether it does.
    Idempotent. Where latex2sympy2's or ANTLR's private API is not the tested one, latex2sympy2 keeps
    its own parsing, with one RuntimeWarning; later calls then return False at once."""
    global _fallback
    if _fallback is not None:
        return False
    try:
        if not two_stage_installed():
            _install()
    except Exception as e:  # noqa: BLE001 - any change of the private API: the checks go on, unpatched
        _fallback = f"{type(e).__name__}: {e}"[:300]
        warnings.warn(f"math-verify's LaTeX parser stays on latex2sympy2's own (slower) parsing: the two-stage "
                      f"patch does not fit the installed latex2sympy2_extended / antlr4-python3-runtime "
                      f"({_fallback}); answers are checked the same way", RuntimeWarning, stacklevel=2)
        return False
    return True


def uninstall_two_stage_parsing() -> None:
    """Back to latex2sympy2's own LL parsing, and a fallback forgotten (for the tests that compare both)."""
    global _fallback
    from latex2sympy2_extended import latex2sympy2

    _fallback = None
    if two_stage_installed():
        latex2sympy2._Latex2Sympy.create_parser = latex2sympy2._Latex2Sympy.create_parser.ll


def _install() -> None:
    """Probe the private API, then wrap `create_parser` (raises, changing nothing, if the probe fails)."""
    from antlr4.atn.PredictionMode import PredictionMode
    from antlr4.error.ErrorStrategy import BailErrorStrategy
    from latex2sympy2_extended import latex2sympy2

    converter = latex2sympy2._Latex2Sympy
    create_ll_parser = converter.create_parser
    _probe(converter, create_ll_parser, PredictionMode.SLL, BailErrorStrategy)

    def create_parser(self, latex_str: str):
        parser = create_ll_parser(self, latex_str)
        parser.math = lambda: _math_two_stage(parser, lambda: create_ll_parser(self, latex_str),
                                              sll=PredictionMode.SLL, bail=BailErrorStrategy)
        return parser

    create_parser.two_stage = True
    create_parser.ll = create_ll_parser
    converter.create_parser = create_parser


def _probe(converter, create_ll_parser, sll, bail) -> None:
    """PROBE parsed by the first stage alone (SLL, bail-out) must succeed and give the tree LL gives."""
    ll_parser = create_ll_parser(converter(), PROBE)
    expected = ll_parser.math().toStringTree(recog=ll_parser)
    parser = create_ll_parser(converter(), PROBE)
    for name in ("_interp", "_errHandler"):
        if not hasattr(parser, name):
            raise AttributeError(f"{type(parser).__name__} has no {name}")
    got = _sll_parse(parser, sll=sll, bail=bail).toStringTree(recog=parser)
    if got != expected:
        raise RuntimeError(f"the SLL parse of {PROBE!r} differs from LL's")


def _sll_parse(parser, *, sll, bail):
    """The grammar's start rule ``math`` with SLL prediction and bail-out at the first error."""
    parser._interp.predictionMode = sll
    parser._errHandler = bail()
    return type(parser).math(parser)


def _math_two_stage(parser, create_ll_parser, *, sll, bail):
    """The start rule: SLL with bail-out on a fresh parser, else LL on another."""
    try:
        return _sll_parse(parser, sll=sll, bail=bail)
    except Exception:  # a syntax error, or SLL not strong enough: LL decides, errors included
        return type(parser).math(create_ll_parser())
