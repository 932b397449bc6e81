"""Fuzz tests for mathrl.reward: the verifier takes model output, and model output is untrusted input.

A policy under RL will find every way to make the reward function hang, crash or say "correct" by
accident, so we throw hostile completions at one persistent `Verifier(num_workers=1, timeout_s=1.0)`,
the way a trainer uses it. Hypothesis builds batches from these generators:

* exponent towers (`\\boxed{9^{9^{9^{9}}}}`, random depth and bases): SymPy tries to evaluate them;
* 100,000-digit numbers (a few fixed ones, so they are not regenerated every example);
* deeply nested braces (`\\boxed{{{{...`), balanced or not;
* one fixed 1 MB response;
* invalid UTF-8 decoded with `surrogateescape` or `replace`, and lone surrogates such as '\\udc80';
* LaTeX that makes parsers recurse (`\\frac{\\frac{...}{2}}{2}`, `\\sqrt{\\sqrt{...}}`, up to depth 500);
* random text mixed with `\\boxed{` fragments, and random unicode text.

Properties, for every batch: `score` returns (does not raise) one `RewardResult` per input, the score
is 0.0 or 1.0 and is 1.0 exactly when the reason is "correct", the reason is one of the five allowed,
the extracted answer is valid UTF-8; a generated answer that cannot equal its reference is never
"correct"; the batch returns within a bound computed from its size (see `time_bound`); and the next
call still works (`\\boxed{2}` vs `2` is correct), which shows that a worker killed for hanging was
replaced. A last test checks that mathrl.reward's own code calls no `eval`/`exec`.

Run: python -m pytest tests/reward/test_reward_fuzz.py -q    (about 30-45 s on 2 busy cores)
     add --hypothesis-show-statistics to see how many items timed out, were wrong, etc.

Time budget: each item that hangs costs its 1 s timeout plus about 1 s for the replacement worker to
import SymPy and math-verify, and roughly a third of generated items hang (deep towers and nestings).
With 15 random batches of at most 3 items, plus the explicit example batch, that is about 30 s.
"""

from __future__ import annotations

import importlib
import io
import pkgutil
import re
import threading
import time
import tokenize
from pathlib import Path
from typing import NamedTuple

import pytest
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

import mathrl.reward
from mathrl.reward import RewardResult, Verifier

REASONS = {"correct", "wrong", "no_answer", "timeout", "error"}

TIMEOUT_S = 1.0
"""Per-item timeout of the Verifier under test: short, so that hanging items are cheap."""

WORKER_RESTART_S = 5.0
"""Allowance per item for replacing a killed worker (spawn + import SymPy/math-verify: about 1 s on an
idle machine; five times that leaves room for a loaded one)."""

MARGIN_S = 20.0
"""Fixed slack per call: pipe transfer of a megabyte, scheduling on shared CPUs."""


def time_bound(n_items: int) -> float:
    """Seconds a `score` call on `n_items` may take. Items run one after another on one worker, and
    each can at worst run to its timeout and then wait for a fresh worker. Generous on purpose: this
    catches a parent that blocks forever (a wedged pipe, a lost deadline), not a slow machine."""
    return n_items * (TIMEOUT_S + WORKER_RESTART_S) + MARGIN_S


class Item(NamedTuple):
    completion: str
    reference: str
    may_be_correct: bool
    """False when the boxed answer provably differs from the reference (then "correct" is a bug)."""


def boxed(answer: str) -> str:
    return "\\boxed{" + answer + "}"


# ---------------------------------------------------------------------------------------------------
# Hostile completions
# ---------------------------------------------------------------------------------------------------

REFERENCES = ("1", "2", "42", r"\frac{1}{2}", r"\sqrt{2}", r"[0, 1)", r"\text{Monday}", "x^2+1")
"""Realistic references (integers take the exact path, the rest go to math-verify)."""
references = st.sampled_from(REFERENCES)

# Fixed, so that each example does not pay to generate (and Hypothesis to shrink) 100 kB strings.
HUGE_NUMBERS = (
    "9" * 100_000,
    "1" + "0" * 99_999,
    "-" + "3" * 100_000 + ".25",
    ",".join(["123"] * 25_000),  # 100k characters with comma thousands separators
)
ONE_MEGABYTE = ("Let me think step by step. " * 40_000)[: 1_000_000 - len(boxed("2"))] + boxed("2")


@st.composite
def exponent_towers(draw) -> Item:
    """`b1^{b2^{...}}`: SymPy evaluates integer powers eagerly, so depth 3 with base 9 never ends."""
    bases = draw(st.lists(st.integers(2, 99), min_size=1, max_size=6))
    braced = draw(st.booleans())  # `9^9^9` (a LaTeX "double superscript") must not crash either
    tower = str(bases[-1])
    for base in reversed(bases[:-1]):
        tower = f"{base}^{{{tower}}}" if braced else f"{base}^{tower}"
    # Products and powers of integers >= 2 are >= 2, however the parser groups them: never 1.
    return Item(boxed(tower), "1", may_be_correct=False)


@st.composite
def huge_numbers(draw) -> Item:
    number = draw(st.sampled_from(HUGE_NUMBERS))
    prose = draw(st.sampled_from(["", "The answer is ", "so x = "]))
    # Every reference in the pool is small (or not a number): a 100k-digit answer never equals it.
    return Item(prose + boxed(number), draw(references), may_be_correct=False)


@st.composite
def deep_braces(draw) -> Item:
    """`\\boxed{{{{...x...}}}`: balanced (the answer is brace soup) or not (no answer)."""
    opened = draw(st.integers(0, 20_000))
    closed = draw(st.one_of(st.just(opened), st.integers(0, 20_000)))
    inner = draw(st.sampled_from(["", "2", "x", r"\frac{1}{2}"]))
    return Item("\\boxed{" + "{" * opened + inner + "}" * closed + "}", draw(references), True)


@st.composite
def broken_utf8(draw) -> Item:
    """Bytes that are not UTF-8, decoded the two ways a pipeline might, plus raw lone surrogates."""
    errors = draw(st.sampled_from(["surrogateescape", "replace"]))
    before, inside = (draw(st.binary(max_size=200)).decode("utf-8", errors=errors) for _ in range(2))
    surrogates = draw(st.text(alphabet=st.characters(categories=["Cs"]), min_size=1, max_size=5))
    answer = draw(st.sampled_from(["2", inside, inside + surrogates + "2", surrogates]))
    return Item(before + surrogates + boxed(answer) + surrogates, draw(references), True)


NESTERS = (r"\frac{X}{2}", r"\sqrt{X}", r"\sqrt[3]{X}", r"\left(X\right)", r"{X}^{2}")
"""Each maps a positive value to a positive value, so a nesting of them around 2 is never 0."""


@st.composite
def recursive_latex(draw) -> Item:
    """`\\frac{\\frac{\\frac{...}}}`-style nesting: recursive-descent parsers and SymPy's tree walks
    recurse once per level."""
    depth = draw(st.integers(1, 500))
    cycle = draw(st.lists(st.sampled_from(NESTERS), min_size=1, max_size=3))
    expr = "2"
    for level in range(depth):
        expr = cycle[level % len(cycle)].replace("X", expr)
    return Item(boxed(expr), "0", may_be_correct=False)


BOX_FRAGMENTS = ("\\boxed{", "\\fbox{", "\\boxed", "{", "}", "\\", "\\{", "\\}", "\\\\", "$",
                 "\\frac{", "\\boxed{2}", "\\boxed{}", "\\boxed{\\frac{1}{2}}", "^{", "\\left(")


@st.composite
def text_with_box_fragments(draw) -> Item:
    parts = draw(st.lists(st.one_of(st.text(max_size=20), st.sampled_from(BOX_FRAGMENTS)), max_size=40))
    return Item("".join(parts), draw(references), True)


@st.composite
def unicode_text(draw) -> Item:
    return Item(draw(st.text(max_size=1000)), draw(references), True)


hostile_items = st.one_of(
    exponent_towers(),
    huge_numbers(),
    deep_braces(),
    st.builds(Item, st.just(ONE_MEGABYTE), references, st.just(True)),
    broken_utf8(),
    recursive_latex(),
    text_with_box_fragments(),
    unicode_text(),
)

# One of each headline case, always run (Hypothesis runs explicit examples before random ones).
HEADLINE_BATCH = [
    Item(boxed("9^{9^{9^{9}}}"), "1", False),
    Item(boxed(HUGE_NUMBERS[0]), "2", False),
    Item(boxed("{" * 20_000 + "2" + "}" * 20_000), "2", True),
    Item(ONE_MEGABYTE, "2", True),
    Item(b"\xff\xfe \\boxed{4\xc3 2}".decode("utf-8", errors="surrogateescape") + "\udc80", "42", True),
    Item(boxed("\\frac{" * 500 + "1" + "}{2}" * 500), "0", False),
    Item(boxed("\\sqrt{" * 500 + "2" + "}" * 500), "0", False),
]


# ---------------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def verifier():
    # One persistent Verifier for the whole module, as in training: a hostile batch must not leave it
    # broken for the next one.
    with Verifier(num_workers=1, timeout_s=TIMEOUT_S) as verifier:
        yield verifier


def score_within_bound(verifier: Verifier, completions: list[str], references: list[str]) -> list[RewardResult]:
    """`verifier.score(...)` in a daemon thread, failing the test (instead of hanging the suite) if it
    does not return within `time_bound`. Exceptions from `score` are re-raised here."""
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["results"] = verifier.score(completions, references)
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            outcome["error"] = e

    bound = time_bound(len(completions))
    started = time.monotonic()
    thread = threading.Thread(target=run, name="verifier-score-under-test", daemon=True)
    thread.start()
    thread.join(bound)
    elapsed = time.monotonic() - started
    assert not thread.is_alive(), f"score() on {len(completions)} items still running after {bound:.0f} s"
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    assert elapsed < bound  # (join returned in time; kept explicit for the failure message)
    return outcome["results"]  # type: ignore[return-value]


# 15 random batches of 1-3 items + 1 explicit one; about 30 s in all (see the module docstring).
@pytest.mark.slow
@settings(max_examples=15, deadline=None)
@given(batch=st.lists(hostile_items, min_size=1, max_size=3))
@example(batch=HEADLINE_BATCH)
def test_verifier_survives_hostile_batches(verifier: Verifier, batch: list[Item]) -> None:
    completions = [item.completion for item in batch]
    references = [item.reference for item in batch]

    results = score_within_bound(verifier, completions, references)

    assert len(results) == len(batch)
    for item, result in zip(batch, results):
        what = (item.completion[:80], item.reference, result)
        assert isinstance(result, RewardResult), what
        assert result.reason in REASONS, what
        assert result.score in (0.0, 1.0), what
        assert (result.score == 1.0) == (result.reason == "correct"), what
        if not item.may_be_correct:
            assert result.reason != "correct", what
        event(f"reason: {result.reason}")  # shown by pytest --hypothesis-show-statistics
        # Surrogates must be gone by the time results reach logs and JSON writers.
        for text in (result.extracted, result.detail):
            if text is not None:
                text.encode("utf-8")

    # A worker killed for hanging was replaced: the same Verifier still scores a plain item.
    sanity = score_within_bound(verifier, [boxed("2")], ["2"])
    assert sanity[0].reason == "correct", sanity


# ---------------------------------------------------------------------------------------------------
# No eval/exec in our reward code
# ---------------------------------------------------------------------------------------------------

_EVAL_CALL = re.compile(r"(?<![\w.])(?:eval|exec)\s*\(")


def eval_exec_calls(source: str) -> list[str]:
    """Lines of `source` that call `eval(` or `exec(`, comments excluded (method calls such as
    `model.eval()` do not count). String literals are kept: a docstring saying `eval(` is a cheap
    false alarm to reword, while a string handed to something that runs it is not."""
    comments = {(tok.start[0], tok.start[1]) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
                if tok.type == tokenize.COMMENT}
    hits = []
    for lineno, line in enumerate(source.splitlines(), start=1):
        cut = min((col for (row, col) in comments if row == lineno), default=len(line))
        if _EVAL_CALL.search(line[:cut]):
            hits.append(f"{lineno}: {line.strip()}")
    return hits


def test_eval_exec_detector_is_not_vacuous() -> None:
    assert eval_exec_calls("x = eval(text)\ny = 1  # eval(z) in a comment\nmodel.eval()\n") == [
        "1: x = eval(text)"
    ]
    assert eval_exec_calls("exec (code)\n") == ["1: exec (code)"]


def test_reward_modules_call_no_eval_or_exec() -> None:
    # Model text reaches these modules; nothing in them may turn text into code. (math-verify, which
    # they call, is a dependency and out of this test's reach.)
    names = [info.name for info in pkgutil.walk_packages(mathrl.reward.__path__, "mathrl.reward.")]
    assert {"mathrl.reward.extract", "mathrl.reward.verify"} <= set(names), names
    for name in ["mathrl.reward", *names]:
        path = Path(importlib.import_module(name).__file__)
        hits = eval_exec_calls(path.read_text(encoding="utf-8"))
        assert not hits, f"{path}: {hits}"
