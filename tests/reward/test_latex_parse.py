"""Two-stage LaTeX parsing (mathrl.reward.latex_parse) builds the trees latex2sympy2's LL parsing builds.

Each string is parsed both ways in this process; the expressions must print the same under
``sympy.srepr`` (symbol assumptions and float precision included), and a string LL rejects must be
rejected with the same message. The fast way must really predict with SLL (a spy on ANTLR's
prediction), and a latex2sympy2 or ANTLR whose private API changed must leave the checks working.
"""

from __future__ import annotations

import warnings

import pytest

sympy = pytest.importorskip("sympy")
latex2sympy2 = pytest.importorskip("latex2sympy2_extended.latex2sympy2")

from mathrl.reward import latex_parse  # noqa: E402

CASES = [
    ("(15,-29)", "a tuple: the ambiguity at '(' that sends LL into full-context prediction"),
    ("\\left( 3, \\frac{\\pi}{3} \\right)", "a tuple with \\left( \\right)"),
    ("(3,\\infty)", "an open interval"),
    ("[1, 5)", "a half-open interval"),
    ("x \\in [-2,7]", "a set relation"),
    ("(0,9) \\cup (9,36)", "a union of intervals"),
    ("\\{1, 2, 3\\}", "a braced set"),
    ("1, 2, 3", "a bare list: set elements"),
    ("333,333", "a number with a thousands comma (latex2sympy2 reads it as a number)"),
    ("\\frac{14}{8}", "a fraction"),
    ("2\\sqrt{118}", "an implicit product"),
    ("\\frac{11+9a}{10}", "symbols"),
    ("6r^2-4r-24", "a polynomial"),
    ("-2 \\le x \\le 7", "a chain of relations"),
    ("y = 2x + 3", "an equation"),
    ("\\begin{pmatrix} -1/3 \\\\ 2/3 \\\\ 5/3 \\end{pmatrix}", "a matrix"),
    ("\\text{(C)}", "text"),
    ("0.0833333333333333", "a long decimal (float precision must match)"),
    ("3 \\pm 2\\sqrt{2}", "plus-minus"),
    ("\\sin^2 x + \\cos^2 x", "functions with powers"),
    ("f(x) = x^2", "a function assignment"),
    ("\\frac{1}{", "a syntax error: same error both ways"),
    ("(1,2", "an unclosed bracket: same error both ways"),
    ("x ++ ) (", "garbage: same error both ways"),
]


def _parse(latex: str) -> tuple[str, str]:
    try:
        return "ok", sympy.srepr(latex2sympy2.latex2sympy(latex))
    except Exception as e:  # the error itself is part of the result
        return "error", f"{type(e).__name__}: {e}"


@pytest.fixture
def restore_parsing():
    installed = latex_parse.two_stage_installed()
    yield
    if installed:
        latex_parse.install_two_stage_parsing()
    else:
        latex_parse.uninstall_two_stage_parsing()


@pytest.mark.parametrize("latex, why", CASES, ids=[why for _, why in CASES])
def test_two_stage_gives_the_ll_tree(latex: str, why: str, restore_parsing) -> None:
    latex_parse.uninstall_two_stage_parsing()
    assert not latex_parse.two_stage_installed()
    expected = _parse(latex)
    latex_parse.install_two_stage_parsing()
    assert latex_parse.two_stage_installed()
    assert _parse(latex) == expected, why


def test_install_is_idempotent_and_done_by_the_checker(restore_parsing) -> None:
    from mathrl.reward import verify_one

    latex_parse.uninstall_two_stage_parsing()
    assert verify_one("\\boxed{2\\sqrt{2}}", "\\sqrt{8}").score == 1.0  # a value for math-verify
    assert latex_parse.two_stage_installed()
    installed = latex2sympy2._Latex2Sympy.create_parser
    latex_parse.install_two_stage_parsing()
    assert latex2sympy2._Latex2Sympy.create_parser is installed  # not wrapped twice
    latex_parse.uninstall_two_stage_parsing()
    assert not latex_parse.two_stage_installed()


# ---- the fast path runs ---------------------------------------------------------------------------------
@pytest.fixture
def prediction_modes(monkeypatch):
    """The prediction mode of every ANTLR prediction made while the test runs (a spy on the simulator)."""
    from antlr4.atn.ParserATNSimulator import ParserATNSimulator

    modes = []
    predict = ParserATNSimulator.adaptivePredict

    def spy(self, *args, **kwargs):
        modes.append(self.predictionMode)
        return predict(self, *args, **kwargs)

    monkeypatch.setattr(ParserATNSimulator, "adaptivePredict", spy)
    return modes


def test_the_two_stage_parser_predicts_with_sll(restore_parsing, prediction_modes) -> None:
    from antlr4.atn.PredictionMode import PredictionMode

    latex_parse.uninstall_two_stage_parsing()
    latex2sympy2.latex2sympy("(15,-28)")
    assert prediction_modes and set(prediction_modes) == {PredictionMode.LL}  # latex2sympy2's own way
    assert latex_parse.install_two_stage_parsing() and latex_parse.fast_parse_active()  # its probe parses both ways
    prediction_modes.clear()
    latex2sympy2.latex2sympy("(15,-28)")
    # a parse that SLL can do is done by SLL alone: no LL prediction at all
    assert prediction_modes and set(prediction_modes) == {PredictionMode.SLL}


def test_the_checker_parses_with_sll(restore_parsing, prediction_modes) -> None:
    from antlr4.atn.PredictionMode import PredictionMode

    from mathrl.reward import verify_one

    latex_parse.uninstall_two_stage_parsing()
    assert verify_one("\\boxed{5\\sqrt{3}}", "\\sqrt{75}").detail == "math-verify"  # installs it first
    assert PredictionMode.SLL in prediction_modes


# ---- a changed private API falls back ----------------------------------------------------------------
class _ParserWithoutPrivateFields:
    """A parser as a latex2sympy2 whose parser object hides ANTLR's fields would return: the start rule only."""

    def __init__(self, parser):
        self._parser = parser

    def math(self):
        return self._parser.math()


def _bail_strategy_gone(monkeypatch) -> None:
    import antlr4.error.ErrorStrategy

    monkeypatch.delattr(antlr4.error.ErrorStrategy, "BailErrorStrategy")  # ANTLR moved or renamed it


def _parser_fields_gone(monkeypatch) -> None:
    create_parser = latex2sympy2._Latex2Sympy.create_parser
    monkeypatch.setattr(latex2sympy2._Latex2Sympy, "create_parser",
                        lambda self, latex: _ParserWithoutPrivateFields(create_parser(self, latex)))


@pytest.mark.parametrize("break_api", [_bail_strategy_gone, _parser_fields_gone], ids=["antlr", "latex2sympy2"])
def test_a_changed_private_api_falls_back_with_one_warning_and_still_scores(break_api, restore_parsing,
                                                                            monkeypatch) -> None:
    from mathrl.reward import verify_one

    latex_parse.uninstall_two_stage_parsing()
    break_api(monkeypatch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # answers only math-verify decides (the detail says so), each parsed for the first time here
        right = [verify_one("\\boxed{4\\sqrt{7}}", "\\sqrt{112}"), verify_one("\\boxed{x^2+4x+4}", "(x+2)^2"),
                 verify_one("\\boxed{(6,-29)}", "(6,-29)")]
        wrong = verify_one("\\boxed{4\\sqrt{5}}", "\\sqrt{112}")
    assert [r.score for r in right] == [1.0, 1.0, 1.0], right
    assert (wrong.score, wrong.reason) == (0.0, "wrong")
    assert right[0].detail == "math-verify"
    fallbacks = [w for w in caught if issubclass(w.category, RuntimeWarning) and "two-stage" in str(w.message)]
    assert len(fallbacks) == 1, [str(w.message) for w in caught]
    assert not latex_parse.two_stage_installed() and not latex_parse.fast_parse_active()
    assert latex_parse.install_two_stage_parsing() is False  # at once, and silent


def test_the_verifier_reports_whether_its_workers_parse_fast() -> None:
    from mathrl.reward import Verifier

    with Verifier(num_workers=1, timeout_s=30.0) as verifier:
        assert verifier.latex_fast_parse is None  # no worker has started yet
        assert verifier.score(["\\boxed{2\\sqrt{6}}"], ["\\sqrt{24}"])[0].score == 1.0
        assert verifier.latex_fast_parse is True
    assert Verifier(num_workers=0).latex_fast_parse is True
    assert Verifier(num_workers=0, checker="math-verify").latex_fast_parse is None  # parses as math-verify does
