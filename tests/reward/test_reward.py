"""Tests for mathrl.reward: extraction, equivalence, hostile text, worker timeouts and crashes.

Run: python -m pytest tests/reward/test_reward.py -q    (about 15-30 s; most of it is starting worker processes)
"""

from __future__ import annotations

import os
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mathrl.reward import RewardResult, Verifier, extract_boxed, verify_one

REASONS = {"correct", "wrong", "no_answer", "timeout", "error"}

# ---------------------------------------------------------------------------------------------------
# extract_boxed
# ---------------------------------------------------------------------------------------------------

EXTRACT_CASES = [
    # (text, expected, why)
    (r"The answer is \boxed{42}.", "42", "the plain case"),
    (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}", "nested braces must be balanced, not cut at the first }"),
    (r"\boxed{1} no wait \boxed{2}", "2", "the model's final answer is the last box"),
    (r"\boxed{1} then \boxed{2", None, "last box unterminated (ran out of tokens): no answer, not box 1"),
    ("no box here, the answer is 42", None, "no box means no answer; we do not guess from prose"),
    (r"\fbox{7}", "7", r"\fbox is an accepted spelling"),
    (r"\boxed {7}", "7", "LaTeX allows spaces between the command and its argument"),
    (r"\fboxsep=3pt \boxed{8}", "8", r"\fboxsep is another command, not \fbox"),
    (r"\boxed{\{1,2\}}", r"\{1,2\}", r"escaped braces \{ \} are literal and do not count"),
    (r"\boxed{ 5 }", "5", "outer whitespace is not part of the answer"),
    (r"\boxed{}", "", "an empty box is a box: empty string, not None"),
    (r"\boxed{\boxed{3}}", "3", "a box inside a box: the inner one starts last"),
    ("\\boxed{" + "{" * 10_000 + "x" + "}" * 10_000 + "}", "{" * 10_000 + "x" + "}" * 10_000,
     "10k-deep nesting: no recursion, so no RecursionError"),
    ("x" * 3_000_000 + r"\boxed{9}", "9", "huge text: only the tail is scanned, the answer is there"),
]


@pytest.mark.parametrize(("text", "expected", "why"), EXTRACT_CASES, ids=[c[2][:40] for c in EXTRACT_CASES])
def test_extract_boxed(text: str, expected: str | None, why: str) -> None:
    assert extract_boxed(text) == expected, why


def test_extract_boxed_cuts_to_the_tail() -> None:
    # The box lies entirely before the last max_chars characters, so it is not seen.
    assert extract_boxed(r"\boxed{1}" + "x" * 100, max_chars=100) is None
    assert extract_boxed(r"\boxed{1}" + "x" * 100, max_chars=200) == "1"


def test_extract_boxed_is_linear_on_hostile_input() -> None:
    # A megabyte of unclosed braces or of `\boxed` without a brace would be quadratic with a naive
    # "try every start" scan. Generous bound: these take milliseconds.
    started = time.monotonic()
    assert extract_boxed(r"\boxed{" + "{" * 999_000) is None
    assert extract_boxed((r"\boxed" + " " * 1000 + "x") * 1000) is None
    assert time.monotonic() - started < 30.0  # a quadratic scan would take hours, not seconds


@settings(max_examples=100, deadline=None)
@given(st.text())
def test_extract_boxed_never_raises(text: str) -> None:
    result = extract_boxed(text)
    assert result is None or isinstance(result, str)


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_characters="{}\\", blacklist_categories=("Cs",))))
def test_extract_boxed_round_trips_brace_free_content(content: str) -> None:
    assert extract_boxed("reasoning... \\boxed{" + content + "}") == content.strip()


# ---------------------------------------------------------------------------------------------------
# verify_one: equivalence
# ---------------------------------------------------------------------------------------------------

EQUIV_CASES = [
    # (completion, reference, reason, why)
    (r"\boxed{936}", "936", "correct", "integers, exact fast path"),
    (r"\boxed{27}", "27.0", "correct", "a trailing .0 in the reference does not change the number"),
    (r"\boxed{27.0}", "27", "correct", "nor in the answer"),
    (r"\boxed{1,000}", "1000", "correct", "comma thousands separators"),
    (r"\boxed{\$1{,}000}", "1000", "correct", r"dollar sign and LaTeX {,} separator"),
    (r"\boxed{0.1}", "0.10000000000000001", "correct", "equal to 6 decimal places, as math-verify rounds"),
    (r"\boxed{0.1}", "0.100001", "wrong", "decimals that differ in the first 6 places: final, math-verify is not asked"),
    (r"\boxed{\frac{1}{2}}", "0.5", "correct", "math-verify: a fraction equals its decimal"),
    (r"\boxed{\frac12}", r"\frac{1}{2}", "correct", r"brace-less \frac12 shorthand parses"),
    (r"\boxed{x^2+1}", "1+x^2", "correct", "math-verify: symbolic equality, not string equality"),
    (r"\boxed{935}", "936", "wrong", "a wrong number"),
    (r"\boxed{\frac{1}{3}}", "0.5", "wrong", "a wrong fraction through math-verify"),
    (r"\boxed{3} no, \boxed{2}", "3", "wrong", "a right earlier box does not rescue a wrong final one"),
    (r"$\boxed{1}$, $\boxed{2}$ and $\boxed{3}$", "1, 2, 3", "correct", "an answer split over boxes is one answer"),
    (r"\boxed{0,111}", "111", "wrong", "regression: a leading-zero group is not a thousands group"),
    (r"\boxed{}", "936", "no_answer", "an empty box carries no answer"),
    ("936", "936", "no_answer", "no box: the format is part of the task"),
    (r"\boxed{936", "936", "no_answer", "unterminated box"),
]


@pytest.mark.parametrize(
    ("completion", "reference", "reason", "why"), EQUIV_CASES, ids=[c[3][:40] for c in EQUIV_CASES]
)
def test_verify_one(completion: str, reference: str, reason: str, why: str) -> None:
    result = verify_one(completion, reference)
    assert result.reason == reason, (why, result)
    assert result.score == (1.0 if reason == "correct" else 0.0)


def test_verify_one_off_the_main_thread() -> None:
    # math-verify's SIGALRM timeouts raise ValueError off the main thread unless disabled; trainers
    # call rewards from threads (e.g. async rollout), so verify_one must detect this and pass None.
    results: list[RewardResult] = []
    thread = threading.Thread(target=lambda: results.append(verify_one(r"\boxed{\frac{2}{4}}", "0.5")))
    thread.start()
    thread.join()
    assert results[0].reason == "correct", results[0]


# ---------------------------------------------------------------------------------------------------
# verify_one: hostile text never raises and finishes in bounded time
# ---------------------------------------------------------------------------------------------------

MALFORMED_CASES = [
    # (completion, reference, why)
    ("\udcff\udcfe junk \\boxed{4\ud800 2}", "42", "lone surrogates (text decoded with surrogateescape)"),
    ("\\boxed{" + "{" * 10_000 + "1" + "}" * 10_000 + "}", "1", "10k-deep braces: no recursion, no SymPy"),
    ("\\boxed{" + "9" * 100_000 + "}", "9" * 100_000, "100k-digit number: skips Decimal and SymPy"),
    ("word " * 200_000 + "\\boxed{5}", "5", "a megabyte of text before the answer"),
    ("\\boxed{" + "x+" * 500_000 + "}", "5", "a megabyte inside the box"),
    ("\\boxed{5}", "", "an empty reference (bad data) is an error, not a crash"),
    (None, "5", "not a string at all (a broken pipeline)"),
]


@pytest.mark.parametrize(
    ("completion", "reference", "why"), MALFORMED_CASES, ids=[c[2][:40] for c in MALFORMED_CASES]
)
def test_verify_one_survives_hostile_text(completion: str, reference: str, why: str) -> None:
    started = time.monotonic()
    result = verify_one(completion, reference)
    assert result.reason in REASONS, why
    assert result.score == 0.0 or result.reason == "correct"
    assert time.monotonic() - started < 30.0, why  # each takes well under a second; loose for busy machines


def test_surrogates_are_replaced_not_propagated() -> None:
    # The extracted answer must be valid UTF-8 so that logging and JSON writers cannot choke on it.
    # (str.encode's errors="replace" substitutes "?", unlike decode's U+FFFD.)
    result = verify_one("\\boxed{4\udcff2}", "42")
    assert result.extracted == "4?2"
    result.extracted.encode("utf-8")


# ---------------------------------------------------------------------------------------------------
# Verifier: worker processes, timeouts, crashes
# ---------------------------------------------------------------------------------------------------

HANG = r"__test_hang__ \boxed{13}"
CRASH = "__test_crash__"


def hanging_or_crashing_item_fn(completion: str, reference: str) -> RewardResult:
    """Testing hook for Verifier(_item_fn=...): hangs or kills its process on marked inputs.

    Module level so that spawned workers can unpickle it by name."""
    if completion == HANG:
        time.sleep(600)
    if completion == CRASH:
        os._exit(3)
    return verify_one(completion, reference)


@pytest.fixture(scope="module")
def hooked_verifier():
    # Two workers so that a hanging item and normal items are in flight together. Normal items in
    # these tests take the exact-number path (microseconds), so a 0.5 s timeout cannot be flaky.
    with Verifier(num_workers=2, timeout_s=0.5, _item_fn=hanging_or_crashing_item_fn) as verifier:
        yield verifier


def test_verifier_times_out_a_hanging_item_and_recovers(hooked_verifier: Verifier) -> None:
    started = time.monotonic()
    results = hooked_verifier.score([r"\boxed{1}", HANG, r"\boxed{2}"], ["1", "1", "2"])
    # The hanging item never returns on its own, so finishing at all proves the timeout fired; the
    # bound only guards against the pool waiting far beyond it (loose, for a busy 2-core machine).
    assert time.monotonic() - started < 60.0
    assert [r.reason for r in results] == ["correct", "timeout", "correct"]
    assert results[1].score == 0.0
    assert results[1].extracted == "13"  # the parent still reports what the model answered

    # The hung worker was killed and replaced: the same Verifier keeps working.
    again = hooked_verifier.score([r"\boxed{3}", r"\boxed{4}", r"\boxed{5}"], ["3", "0", "5"])
    assert [r.reason for r in again] == ["correct", "wrong", "correct"]


def test_verifier_reports_a_crashed_worker_as_error_and_recovers(hooked_verifier: Verifier) -> None:
    results = hooked_verifier.score([CRASH, r"\boxed{7}"], ["1", "7"])
    assert [r.reason for r in results] == ["error", "correct"]
    assert "3" in results[0].detail  # the exit code, for whoever reads the logs

    again = hooked_verifier.score([r"\boxed{8}"], ["8"])
    assert again[0].reason == "correct"


def test_verifier_keeps_input_order(hooked_verifier: Verifier) -> None:
    # Many items over two workers finish out of order; results must still line up with inputs.
    n = 40
    completions = [f"\\boxed{{{i}}}" for i in range(n)]
    references = [str(i if i % 3 else i + 1) for i in range(n)]  # every third one is wrong
    results = hooked_verifier.score(completions, references)
    assert [r.extracted for r in results] == [str(i) for i in range(n)]
    assert [r.reason for r in results] == ["wrong" if i % 3 == 0 else "correct" for i in range(n)]


def test_verifier_survives_hostile_text(hooked_verifier: Verifier) -> None:
    # Same hostile inputs as for verify_one, now through pipes (surrogates, megabytes, None).
    completions = [case[0] for case in MALFORMED_CASES]
    references = [case[1] for case in MALFORMED_CASES]
    started = time.monotonic()
    results = hooked_verifier.score(completions, references)
    assert len(results) == len(MALFORMED_CASES)
    assert all(r.reason in REASONS for r in results)
    assert time.monotonic() - started < 60.0  # per-item timeouts; loose for a busy machine


def test_verifier_matches_verify_one() -> None:
    # The real pipeline (no hook, default timeout) agrees with the in-process check, including the
    # math-verify cases; and num_workers=0 (debugging mode) is the in-process check.
    completions = [case[0] for case in EQUIV_CASES]
    references = [case[1] for case in EQUIV_CASES]
    expected = [case[2] for case in EQUIV_CASES]
    with Verifier(num_workers=1) as verifier:
        assert [r.reason for r in verifier.score(completions, references)] == expected
    with Verifier(num_workers=0) as verifier:
        assert [r.reason for r in verifier.score(completions, references)] == expected


def test_verifier_workers_use_the_box_policy() -> None:
    # The policy travels to spawned workers (a pickled partial of verify_one): an answer split over
    # boxes is one answer under the default "all", only its last box under "last".
    split = [r"The roots are $\boxed{1}$ and $\boxed{2}$."]
    with Verifier(num_workers=1) as verifier:
        assert verifier.score(split, ["1, 2"])[0].reason == "correct"
    with Verifier(num_workers=1, boxed="last") as verifier:
        result = verifier.score(split, ["1, 2"])[0]
        assert (result.reason, result.extracted) == ("wrong", "2")


def test_verifier_argument_errors() -> None:
    # Programming errors (not model text) raise, with a message that says what to do.
    with pytest.raises(ValueError, match="one reference per completion"):
        Verifier(num_workers=0).score(["a", "b"], ["a"])
    with pytest.raises(ValueError, match="num_workers"):
        Verifier(num_workers=-1)
    with pytest.raises(ValueError, match="timeout_s"):
        Verifier(timeout_s=0)
    verifier = Verifier(num_workers=0)
    verifier.close()
    verifier.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        verifier.score([], [])


def test_model_answers_never_reach_sympy_parse_expr(monkeypatch) -> None:
    # sympy's parse_expr evaluates Python code; math-verify's plain-expression extractor uses it. Model
    # text must only go through the LaTeX parser, whatever it contains.
    import math_verify.parser

    calls: list[str] = []
    monkeypatch.setattr(math_verify.parser, "parse_expr_cached", lambda expr: calls.append(expr))
    cases = [
        (r"\boxed{\frac{3}{4}}", "3/4", "correct"),
        (r"\boxed{3/4}", "\\frac{3}{4}", "correct"),
        (r"\boxed{x**2 + 1}", "x^2+1", None),  # Python syntax: whatever it scores, no parse_expr
        (r"\boxed{__import__('os').system('true')}", "0", "wrong"),
        (r"\boxed{(lambda: 1)()}", "1", None),
    ]
    for completion, reference, expected in cases:
        result = verify_one(completion, reference)
        if expected is not None:
            assert result.reason == expected, completion
    assert calls == []
