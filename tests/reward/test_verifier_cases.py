"""The answer checker against a labelled set, and table tests of each normalisation rule and box policy.

`tests/data/verifier_cases.jsonl` holds 500 hand-labelled (response, gold, expected) pairs built from
public test suites and benchmark answers (sources and licences in `tests/data/README.md`).

Run: python -m pytest tests/reward/test_verifier_cases.py -q    (about 15-30 s: the set runs in-process, and
one exponent tower waits out math-verify's own 5 s alarm)
"""

from __future__ import annotations

import json
import logging
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mathrl.reward import verify_one
from mathrl.reward.extract import extract_boxes, final_answers
from mathrl.reward.normalize import (
    choice_letter,
    expand_plus_minus,
    inequality_to_interval,
    split_top_level,
    strip_answer_prose,
    strip_delimiters,
    strip_units,
    strip_variable,
    text_answer,
)
from mathrl.reward.numeric import mixed_number, plain_number, scientific_number, simple_fraction

CASES_FILE = Path(__file__).parents[1] / "data" / "verifier_cases.jsonl"

MIN_AGREEMENT = 0.97
"""Measured: 500/500 (1.000) with the default box policy (the held-out batches scored 69/70 and 49/50
when first run; see tests/data/README.md). The floor leaves room for a changed math-verify/SymPy
version to move a few pairs (15 of 500), not for a new class of mistakes; false positives are not
allowed at all."""


def load_cases() -> list[dict]:
    return [json.loads(line) for line in CASES_FILE.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="module")
def scored() -> list[tuple[dict, object]]:
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # timeouts log the whole input
    return [(case, verify_one(case["response"], case["gold"])) for case in load_cases()]


def test_the_labelled_set_is_well_formed() -> None:
    cases = load_cases()
    assert len(cases) >= 300
    assert len({c["id"] for c in cases}) == len(cases), "ids are unique"
    for case in cases:
        assert {"id", "source", "category", "response", "gold", "expected", "must_reject", "why", "batch"} <= set(case)
        assert isinstance(case["expected"], bool) and case["why"].strip(), case["id"]
        assert not (case["must_reject"] and case["expected"]), f"{case['id']}: a must-reject pair is labelled correct"
    assert sum(c["must_reject"] for c in cases) >= 40
    assert 0.3 < sum(c["expected"] for c in cases) / len(cases) < 0.8, "both labels well represented"


@pytest.mark.slow
def test_agreement_with_the_labels(scored) -> None:
    misses = [(c["id"], c["gold"], r.extracted, r.reason, r.detail) for c, r in scored
              if (r.score == 1.0) != c["expected"]]
    agreement = 1 - len(misses) / len(scored)
    assert agreement >= MIN_AGREEMENT, f"agreement {agreement:.3f} < {MIN_AGREEMENT}; misses: {misses}"


@pytest.mark.slow
def test_no_false_positive_on_must_reject_pairs(scored) -> None:
    # A "correct" here pays a hedge or garbage: every such verdict is a reward hack.
    hacks = [(c["id"], c["gold"], r.extracted, r.detail) for c, r in scored if c["must_reject"] and r.score == 1.0]
    assert hacks == []


@pytest.mark.slow
def test_no_false_positive_anywhere(scored) -> None:
    false_positives = [(c["id"], c["gold"], r.extracted, r.detail) for c, r in scored
                       if r.score == 1.0 and not c["expected"]]
    assert false_positives == []


# ---------------------------------------------------------------------------------------------------
# Box policies
# ---------------------------------------------------------------------------------------------------

POLICY_CASES = [
    # (completion, {policy: answers}, why)
    (r"The solutions are $\boxed{1}$, $\boxed{2}$, and $\boxed{3}$.",
     {"last": ["3"], "all": ["1, 2 and 3"], "any": ["1", "2", "3"]}, "one answer split over boxes; 'and' kept: a set"),
    (r"$x = \boxed{2}$ and $y = \boxed{3}$",
     {"last": ["3"], "all": ["2 and 3"], "any": ["2", "3"]}, "labels between boxes are connectors"),
    (r"First $\boxed{5}$. Wait, that is wrong; the answer is $\boxed{3}$.",
     {"last": ["3"], "all": ["3"], "any": ["5", "3"]}, "a sentence between boxes: only the final box is the answer"),
    (r"$\boxed{7}$, $\boxed{7}$", {"last": ["7"], "all": ["7"], "any": ["7", "7"]}, "a repeated box counts once"),
    (r"$\boxed{6}$ then $\boxed{6", {"last": None, "all": None, "any": None}, "final box cut off: no answer in any policy"),
    ("no box", {"last": None, "all": None, "any": None}, "no box"),
]


@pytest.mark.parametrize(("text", "expected", "why"), POLICY_CASES, ids=[c[2][:40] for c in POLICY_CASES])
def test_final_answers(text: str, expected: dict, why: str) -> None:
    for policy, answers in expected.items():
        assert final_answers(text, policy) == answers, (policy, why)


def test_any_policy_is_lenient_and_all_is_not() -> None:
    # Boxing every candidate: "any" pays it (hence never the default), "all" and "last" do not.
    hedge = r"$\boxed{1}$ $\boxed{2}$ $\boxed{3}$"
    assert verify_one(hedge, "2", boxed="any").reason == "correct"
    assert verify_one(hedge, "2", boxed="all").reason == "wrong"
    assert verify_one(hedge, "2", boxed="last").reason == "wrong"
    assert verify_one(hedge, "1, 2, 3", boxed="all").reason == "correct"


def test_extract_boxes_positions() -> None:
    text = r"a \boxed{1} b \boxed{\frac{1}{2}} c"
    assert [content for _, _, content in extract_boxes(text)] == ["1", r"\frac{1}{2}"]
    start, end, _ = extract_boxes(text)[1]
    assert text[start:end] == r"\boxed{\frac{1}{2}}"


# ---------------------------------------------------------------------------------------------------
# Normalisation rules, one table each
# ---------------------------------------------------------------------------------------------------

PLAIN_NUMBER_CASES = [
    ("27", Decimal("27"), "integer"),
    ("27.0", Decimal("27.0"), "trailing zero"),
    (".5", Decimal("0.5"), "no leading zero"),
    ("1,000", Decimal("1000"), "comma thousands"),
    ("11,\\!111", Decimal("11111"), "MATH's ,\\! thousands"),
    ("14{,}916", Decimal("14916"), "LaTeX {,} thousands"),
    ("3{,}14", Decimal("3.14"), "LaTeX {,} before a non-thousands group is a decimal comma"),
    ("0,111", None, "a leading 0 group is not thousands (decimal_comma_number reads it as 0.111)"),
    ("1,22", None, "not groups of three: not a plain number (decimal_comma_number reads it)"),
    ("1 000", Decimal("1000"), "thousands separated by a space"),
    ("1,000,00", None, "malformed groups"),
    ("1.234.567", None, "dots are decimal points only"),
    ("", None, "empty"),
    ("9" * 20_000, None, "over the length cap"),
]


@pytest.mark.parametrize(("text", "expected", "why"), PLAIN_NUMBER_CASES, ids=[c[2][:40] for c in PLAIN_NUMBER_CASES])
def test_plain_number(text: str, expected: Decimal | None, why: str) -> None:
    assert plain_number(text) == expected, why


RULE_CASES = [
    # (function, input, expected, why)
    (strip_delimiters, r"$\frac{1}{2}$.", r"\frac{1}{2}", "dollar delimiters and a full stop"),
    (strip_delimiters, r"{{2}}", "2", "redundant braces"),
    (strip_delimiters, r"32,\! 349", "32,349", "spaced thousands separator joined"),
    (strip_delimiters, r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}", r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}",
     "a matrix row break is not a spacing command"),
    (strip_delimiters, r"\$5", r"\$5", "an escaped dollar is currency, not a delimiter"),
    (strip_answer_prose, r"\text{The answer is } 42", "42", "leading prose"),
    (strip_answer_prose, r"42 \text{ (after simplifying)}", "42", "trailing remark"),
    (strip_answer_prose, r"\frac{\sqrt{3}}{3} \approx 0.577", r"\frac{\sqrt{3}}{3}", "approximation after the value"),
    (strip_answer_prose, r"\text{(C)}", r"\text{(C)}", "a parenthesised choice alone is the answer, not a remark"),
    (strip_units, r"15\mbox{ cm}^2", "15", "\\mbox unit, squared"),
    (strip_units, r"90^\circ", "90", "degree sign"),
    (strip_units, "76°", "76", "unicode degree sign"),
    (strip_units, r"10\%", "10", "percent"),
    (strip_units, r"\$1,000.99", "1,000.99", "currency"),
    (strip_units, "160 minutes", "160", "bare unit word after a number"),
    (strip_units, r"\text{Evelyn}", r"\text{Evelyn}", "a word alone is not a unit"),
    (strip_units, "5x", "5x", "a variable is not a unit"),
    (strip_variable, "x = 3", ("x", "3"), "variable name"),
    (strip_variable, "f(2) = 5", ("f(2)", "5"), "function value"),
    (strip_variable, "a_{10} = 5", ("a_{10}", "5"), "subscripted name"),
    (strip_variable, "x^2 = 9", (None, "x^2 = 9"), "an equation is not an assignment"),
    (strip_variable, r"x \in [0, 1]", ("x", "[0, 1]"), "membership"),
    (split_top_level, r"1, (2, 3), \{4, 5\}", ["1", "(2, 3)", r"\{4, 5\}"], "nested brackets stay whole"),
    (split_top_level, r"19, 46, \text{ and } 82", ["19", "46", "82"], "\\text{and} separates"),
    (split_top_level, "1,000, 2", ["1,000", "2"], "a thousands comma does not separate"),
    (split_top_level, "0,111", ["0", "111"], "a leading-zero group is not thousands"),
    (split_top_level, "32, 349", ["32", "349"], "a space after the comma makes a list"),
    (expand_plus_minus, r"1 \pm \sqrt{19}", [r"1 + (\sqrt{19})", r"1 - (\sqrt{19})"], "two roots"),
    (expand_plus_minus, r"\pm 3", ["3", "-(3)"], "leading plus-minus"),
    (expand_plus_minus, "3", ["3"], "nothing to expand"),
    (inequality_to_interval, r"-2 \le x \le 7", "[-2, 7]", "closed"),
    (inequality_to_interval, "x > 2", r"(2, \infty)", "ray"),
    (inequality_to_interval, r"x \leq 0", r"(-\infty, 0]", "closed ray"),
    (inequality_to_interval, "2 < x", r"(2, \infty)", "bound on the left"),
    (inequality_to_interval, r"3 < x \le 4", "(3, 4]", "half-open"),
    (inequality_to_interval, "1 < x > 3", None, "a chain that changes direction"),
    (inequality_to_interval, "-x > -1", None, "not one variable alone"),
    (text_answer, r"\text{an ellipse}", "ellipse", "article dropped"),
    (text_answer, r"\text{East}", "east", "case"),
    (text_answer, "42", None, "a number is not a word"),
    (choice_letter, r"\text{(C)}", "C", "choice in text"),
    (choice_letter, "(B)", "B", "choice in math"),
    (choice_letter, "x", None, "lower case is a variable"),
    (mixed_number, r"2\frac{1}{2}", Fraction(5, 2), "mixed number is a sum"),
    (mixed_number, r"-2\frac{1}{2}", Fraction(-5, 2), "the sign applies to the whole"),
    (mixed_number, r"2\frac{3}{2}", None, "an improper part is a product, not a mixed number"),
    (scientific_number, r"6.72 \times 10^{-5}", Decimal("0.0000672"), "scientific notation"),
    (scientific_number, "6.72", None, "no power of ten"),
    (simple_fraction, r"-\dfrac{35}{9}", Fraction(-35, 9), "signed \\dfrac"),
    (simple_fraction, r"\frac34", Fraction(3, 4), "brace-less shorthand"),
    (simple_fraction, "10/9", Fraction(10, 9), "slash"),
    (simple_fraction, r"\frac{1}{0}", None, "zero denominator"),
    (simple_fraction, r"\frac{x}{2}", None, "not numbers"),
]


@pytest.mark.parametrize(("function", "text", "expected", "why"), RULE_CASES,
                         ids=[f"{c[0].__name__}:{c[3][:30]}" for c in RULE_CASES])
def test_normalisation_rule(function, text: str, expected, why: str) -> None:
    assert function(text) == expected, why


# ---------------------------------------------------------------------------------------------------
# Verdicts that training depends on (a why per case)
# ---------------------------------------------------------------------------------------------------

VERDICT_CASES = [
    # (answer in the box, reference, reason, why)
    ("0,111", "111", "wrong", "regression: the fast path read 0,111 as 111"),
    ("1,22", "1.22", "correct", "a decimal comma, as math-verify reads it (the gold is one number)"),
    ("1.22", "1, 22", "wrong", "the gold is a list of two numbers, not 1.22"),
    ("3{,}14", "3.14", "correct", "LaTeX decimal comma"),
    ("4, 10, -2", "10, 4, -2", "wrong", "a bare list keeps its order: a set reading pays wrong ordered answers"),
    ("10, 4, -2", "10, 4, -2", "correct", "a bare list in its order"),
    ("3, 3, 5, 7", "3, 5, 7", "wrong", "a repeated item (math-verify reads both as sets and pays it)"),
    (r"\{-2, 1\}", r"\{1, -2\}", "correct", "a set in braces: any order"),
    ("-10, -8, 4", r"a = 4, -8, -10", "correct", "the values of one named variable are a set"),
    (r"(x, y) = (5, 8) \text{ and } (8, 5)", "(8, 5), (5, 8)", "correct", "a list of tuples is a set of solutions"),
    ("(3, 2)", "(p, q) = (3, 2)", "correct", "a named tuple (math-verify on the whole answer)"),
    ("(0, 1)", "0 < f(x) < 1", "correct", "a range written as an inequality (math-verify on the whole answer)"),
    (r"-2 \le x \le 7", r"x \in [-2, 7]", "correct", "an inequality for a membership"),
    ("1 000", "1000", "correct", "thousands separated by a space"),
    ("1000,99", "1000.99", "correct", "a decimal comma that cannot be a thousands separator"),
    ("0.0833333333333333", r"\frac{1}{12}", "correct", "equal to math-verify's 6 decimal places"),
    ("4.123105625617661", r"\sqrt{17}", "correct", "a decimal approximation of an irrational, as math-verify"),
    (r"Answer \( 9 \)", "9", "correct", "math delimiters and a word inside the box"),
    ("the largest $n$ is 34", "34", "correct", "prose inside the box: the number after the last formula"),
    ("the number is not 10 which is 1,000.99", "1000.99", "correct", "prose without delimiters: its last number"),
    (r"\frac{1}{2} \text{ meters}", "0.5", "correct", "a unit word is not prose: the value stays"),
    ("x = 5+5+1 = 11", "x = 11", "correct", "a relation chain keeps its last value"),
    ("[10, 10]", "10", "wrong", "a degenerate interval for a number (math-verify pays it)"),
    (r"F_n = \sum_{k=0}^{n-2} F_k", r"F_n = \sum_{k=0}^{n-1} F_k", "wrong", "regression: `\\sum_{k=` was read as a name"),
    (r"1 + \frac{1}{e}", r"1 - \frac{1}{e}", "wrong", "a sign flip (math-verify's tests label this pair equal)"),
    ("(4, 10, -2)", "(10, 4, -2)", "wrong", "tuples: in order"),
    ("2, 3", "(2, 3)", "correct", "a tuple's parentheses may be dropped"),
    ("0, 1", "[0, 1]", "wrong", "an interval's brackets may not"),
    ("x^2 = 9", "9", "wrong", "an equation whose right side is the reference"),
    ("x = 9", "9", "correct", "a variable name before the value"),
    ("y = 9", "x = 9", "wrong", "a different variable"),
    ("3r^2", "3R^2", "wrong", "variables are case-sensitive (math-verify is not)"),
    ("0.333", r"\frac{1}{3}", "wrong", "a rounded decimal is not the exact value"),
    ("0.5", r"\frac{1}{2}", "correct", "an exact decimal"),
    (r"2\frac{1}{2}", "2.5", "correct", "mixed number"),
    (r"-2 \le x \le 7", "[-2, 7]", "correct", "interval written as an inequality"),
    (r"\pm 3", "3", "wrong", "a hedge over two values"),
    ("3, 5", "3, 5, 7", "wrong", "a missing solution"),
    (r"\text{The answer is } 42", "42", "correct", "prose inside the box"),
    ("50", r"50\%", "correct", "percent sign dropped"),
    ("0.5", r"50\%", "correct", "percent as a fraction of one"),
    (r"12.5\%", r"\frac{1}{8}", "correct", "a percent answer for a fraction gold"),
    (r"90^\circ", "90", "correct", "degree sign"),
    (r"\infty", r"\infty", "correct", "infinity"),
    (r"\infty", "5", "wrong", "infinity is not a number"),
]


@pytest.mark.parametrize(("answer", "reference", "reason", "why"), VERDICT_CASES, ids=[c[3][:40] for c in VERDICT_CASES])
def test_verdict(answer: str, reference: str, reason: str, why: str) -> None:
    result = verify_one("so the answer is $\\boxed{" + answer + "}$.", reference)
    assert result.reason == reason, (why, result)


def test_reward_boxed_config_field() -> None:
    # The switch is a checked config field; a typo names the field and the choices.
    from mathrl.config import ConfigError, load_config

    assert load_config().reward.boxed == "all"
    assert load_config(overrides=["reward.boxed=last"]).reward.boxed == "last"
    with pytest.raises(ConfigError, match="reward.boxed"):
        load_config(overrides=["reward.boxed=first"])


def test_verifier_rejects_an_unknown_box_policy() -> None:
    from mathrl.reward import Verifier

    with pytest.raises(ValueError, match="boxed must be one of all, last, any"):
        Verifier(num_workers=0, boxed="first")
    with Verifier(num_workers=0, boxed="last") as verifier:
        assert verifier.score([r"$\boxed{1}$, $\boxed{2}$"], ["1, 2"])[0].reason == "wrong"


RULES = (strip_delimiters, strip_answer_prose, strip_units, strip_variable, split_top_level, expand_plus_minus,
         inequality_to_interval, text_answer, choice_letter, plain_number, scientific_number, simple_fraction,
         mixed_number)
LATEXISH = st.lists(st.sampled_from(list("0123456789,.{}()[]\\$%^_=<>-+ xyzabc") + [
    r"\frac", r"\text{", r"\left(", r"\right)", r"\pm", r"\le", r"\circ", r"\{", r"\}", r",\!", "{,}", "and", "or",
]), max_size=60).map("".join)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=200), LATEXISH))
def test_rules_never_raise(text: str) -> None:
    # Model text reaches every rule; none may raise (the verifier would turn it into an "error").
    for rule in RULES:
        rule(text)


# ---------------------------------------------------------------------------------------------------
# The held-out set and reward.checker=math-verify
# ---------------------------------------------------------------------------------------------------

HELDOUT_FILE = Path(__file__).parents[1] / "data" / "verifier_heldout.jsonl"

MIN_HELDOUT_AGREEMENT = 0.97
"""Measured: 513/517 (0.992) when these rules were first scored on it (docs/evaluation.md)."""


def load_heldout() -> list[dict]:
    return [json.loads(line) for line in HELDOUT_FILE.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.mark.slow
def test_heldout_agreement_and_no_false_positive() -> None:
    # Pairs from other projects' checker tests and dataset formats; a false positive is a paid wrong answer.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    cases = load_heldout()
    assert len(cases) >= 400
    verdicts = [(c, verify_one(c["response"], c["gold"]).score == 1.0) for c in cases]
    false_positives = [c["id"] for c, correct in verdicts if correct and not c["expected"]]
    agreement = sum(correct == c["expected"] for c, correct in verdicts) / len(cases)
    assert false_positives == []
    assert agreement >= MIN_HELDOUT_AGREEMENT, agreement


@pytest.mark.slow
def test_math_verify_checker_is_plain_math_verify() -> None:
    # reward.checker=math-verify must score exactly as math-verify called as its README shows, on
    # every labelled pair of both sets (disagreements with the labels included).
    import math_verify

    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    mismatches = []
    for case in load_cases() + load_heldout():
        expected = bool(math_verify.verify(math_verify.parse("$" + case["gold"] + "$"), math_verify.parse(case["response"])))
        if (verify_one(case["response"], case["gold"], checker="math-verify").score == 1.0) != expected:
            mismatches.append(case["id"])
    assert mismatches == []


def test_reward_checker_config_field() -> None:
    # The switch is a checked config field; a typo names the field and the choices.
    from mathrl.config import ConfigError, load_config
    from mathrl.reward import Verifier

    assert load_config().reward.checker == "mathrl"
    assert load_config(overrides=["reward.checker=math-verify"]).reward.checker == "math-verify"
    with pytest.raises(ConfigError, match="reward.checker"):
        load_config(overrides=["reward.checker=sympy"])
    with pytest.raises(ValueError, match="checker must be one of mathrl, math-verify"):
        Verifier(num_workers=0, checker="sympy")
