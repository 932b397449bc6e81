"""Two-stage LaTeX parsing (mathrl.reward.latex_parse) builds the trees latex2sympy2's LL parsing builds.

Each string is parsed both ways in this process; the expressions must print the same under
``sympy.srepr`` (symbol assumptions and float precision included), and a string LL rejects must be
rejected with the same message.
"""

from __future__ import annotations

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
