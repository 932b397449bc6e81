"""The DAPO integer-answer transform: table of answers with the integer each must become, and why.

Run: python -m pytest tests/tasks/test_transforms.py -q
"""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mathrl.tasks.base import Problem
from mathrl.tasks.transforms import (
    FRACTION_SUFFIX,
    NEGATIVE,
    NOT_SUPPORTED,
    SQRT_SUFFIX,
    ZERO_DENOMINATOR,
    integer_answer_transform,
    parse_integer_answer,
)

CASES = [
    # (answer, kind, new answer, suffix or drop reason)  -- why
    ("12", "integer", "12", ""),  # already an integer
    ("-7", "integer", "-7", ""),  # negative integers are integers
    ("12.0", "integer", "12", ""),  # amc-style float text: strip .0
    ("+3", "integer", "3", ""),  # canonical text has no plus sign
    ("$42$", "integer", "42", ""),  # surrounding math delimiters removed
    ("1,000", "integer", "1000", ""),  # thousands separator, as the verifier reads it
    ("1{,}000", "integer", "1000", ""),  # LaTeX spelling of the same
    ("\\frac{3}{4}", "converted", "7", FRACTION_SUFFIX),  # m + n = 3 + 4
    ("\\dfrac{6}{8}", "converted", "7", FRACTION_SUFFIX),  # reduced to 3/4 first (gcd(m, n) = 1)
    ("\\tfrac{1}{12}", "converted", "13", FRACTION_SUFFIX),  # \tfrac is \frac
    ("\\frac12", "converted", "3", FRACTION_SUFFIX),  # shorthand: two bare digits
    ("\\frac 92", "converted", "11", FRACTION_SUFFIX),  # shorthand with a space
    ("\\frac{29}4", "converted", "33", FRACTION_SUFFIX),  # braced numerator, bare denominator
    ("\\frac1{512}", "converted", "513", FRACTION_SUFFIX),  # bare numerator, braced denominator
    ("5/12", "converted", "17", FRACTION_SUFFIX),  # plain slash fraction
    ("\\frac{4}{2}", "converted", "2", ""),  # equals an integer: answer replaced, nothing to ask
    ("\\frac{0}{5}", "converted", "0", ""),  # zero numerator is the integer 0
    ("2\\sqrt{3}", "converted", "5", SQRT_SUFFIX),  # k + m = 2 + 3
    ("4 \\sqrt{2}", "converted", "6", SQRT_SUFFIX),  # space between k and \sqrt
    ("3\\cdot\\sqrt{5}", "converted", "8", SQRT_SUFFIX),  # explicit \cdot
    ("\\sqrt{5}", "converted", "6", SQRT_SUFFIX),  # k = 1 implied
    ("\\sqrt2", "converted", "3", SQRT_SUFFIX),  # shorthand radicand
    ("\\!\\sqrt{21}", "converted", "22", SQRT_SUFFIX),  # spacing command removed (MATH has this)
    ("2\\sqrt{8}", "converted", "6", SQRT_SUFFIX),  # 2 sqrt(8) = 4 sqrt(2): m must be square-free
    ("\\sqrt{72}", "converted", "8", SQRT_SUFFIX),  # sqrt(72) = 6 sqrt(2)
    ("3\\sqrt{9}", "converted", "9", ""),  # 3 sqrt(9) = 9, an integer
    ("-\\frac{1}{2}", None, None, NEGATIVE),  # m + n ambiguous: -1 + 2 or 1 + (-2)
    ("\\frac{-33}{2}", None, None, NOT_SUPPORTED),  # sign inside the braces: not a recognised form
    ("-\\sqrt{2}", None, None, NEGATIVE),  # same ambiguity for k
    ("\\frac{1}{0}", None, None, ZERO_DENOMINATOR),  # not a number
    ("4.5", None, None, NOT_SUPPORTED),  # decimals are not converted
    ("\\frac{\\sqrt{3}}{2}", None, None, NOT_SUPPORTED),  # radical inside a fraction
    ("1 + \\sqrt{3}", None, None, NOT_SUPPORTED),  # sums are not recognised
    ("60^\\circ", None, None, NOT_SUPPORTED),  # units are not stripped
    ("\\frac{\\pi}{4}", None, None, NOT_SUPPORTED),  # symbols
    ("(1, 2)", None, None, NOT_SUPPORTED),  # tuples
    ("10\\frac{1}{12}", None, None, NOT_SUPPORTED),  # mixed numbers
    ("1" * 60, None, None, NOT_SUPPORTED),  # absurdly long integer: bounded parser refuses it
    ("", None, None, NOT_SUPPORTED),  # empty (never produced by the loader, still safe)
]


@pytest.mark.parametrize("answer, kind, new, note", CASES, ids=[c[0] or "empty" for c in CASES])
def test_parse_integer_answer_table(answer, kind, new, note):
    assert parse_integer_answer(answer) == (kind, new, note)


def test_transform_report_counts_and_problems():
    problems = [
        Problem("a:1", "What is x?", "\\frac{3}{4}", {"level": 2}),
        Problem("a:2", "What is y?", "12.0"),
        Problem("a:3", "What is z?", "60^\\circ"),
        Problem("a:4", "What is w?", "17"),
        Problem("a:5", "What is v?  ", "2\\sqrt{8}"),
    ]
    report = integer_answer_transform(problems)
    # 2 converted (fraction, radical), 2 unchanged integers, 1 dropped (degrees).
    assert (report.converted, report.unchanged, report.dropped) == (2, 2, 1)
    assert report.dropped_reasons == {NOT_SUPPORTED: 1}
    assert [p.id for p in report.problems] == ["a:1", "a:2", "a:4", "a:5"]  # input order
    frac, twelve, seventeen, root = report.problems
    assert frac.question == "What is x?\n\n" + FRACTION_SUFFIX and frac.answer == "7"
    assert frac.meta == {"level": 2, "original_answer": "\\frac{3}{4}", "transform": "integer_answer"}
    assert root.question == "What is v?\n\n" + SQRT_SUFFIX and root.answer == "6"  # trailing space gone
    assert twelve.answer == "12" and twelve.question == "What is y?"  # canonicalised, not rewritten
    assert seventeen is problems[3]  # an untouched integer problem is passed through as is
    assert problems[0].answer == "\\frac{3}{4}" and problems[0].meta == {"level": 2}  # inputs unchanged
    kinds = [(e.id, e.new_answer) for e in report.examples]
    assert kinds == [("a:1", "7"), ("a:3", None), ("a:5", "6")]


def test_examples_are_capped():
    # 4 converted and 4 dropped with max_examples=2: two of each are kept.
    problems = [Problem(f"p{i}", "q", "\\frac{1}{3}" if i % 2 else "x") for i in range(8)]
    report = integer_answer_transform(problems, max_examples=2)
    assert sum(e.new_answer is None for e in report.examples) == 2
    assert sum(e.new_answer is not None for e in report.examples) == 2


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("0123456789-+./{}$ \\fracdtsqrtcdot,!")), max_size=30))
def test_never_raises_and_outputs_integers(text):
    # Any string: either dropped with a reason, or an integer answer (what the transform promises).
    kind, new, note = parse_integer_answer(text)
    if kind is None:
        assert new is None and note in (NOT_SUPPORTED, NEGATIVE, ZERO_DENOMINATOR)
    else:
        assert re.fullmatch(r"-?\d+", new)


def test_math_train_file(shared_math):
    # The real MATH train split: every kept answer is an integer, and the counts add up.
    path = shared_math / "math_train.jsonl"
    if not path.exists():
        pytest.skip(f"{path} not found (shared data folder absent)")
    from mathrl.tasks.loading import load_problems

    problems = load_problems(path, on_error="skip").problems
    report = integer_answer_transform(problems)
    assert report.converted + report.unchanged + report.dropped == len(problems)
    assert all(re.fullmatch(r"-?\d+", p.answer) for p in report.problems)
    assert report.converted > 500  # MATH has ~900 plain fractions and ~100 k\sqrt{m} answers
