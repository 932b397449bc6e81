"""Table-driven tests of the collapse detectors in mathrl.reward.collapse.

Each case says why it is what it is. Run: python -m pytest tests/reward/test_collapse.py -q
"""

from __future__ import annotations

import math
import random
import time

import pytest

from mathrl.reward.collapse import is_garbled, is_repetitive

HEALTHY = "7+9+0=16,4+8+1=13,3+5+1=09,\\boxed{936}"

# ----------------------------------------------------------------------------- is_repetitive

REPETITIVE_CASES = [
    # (text, expected, why)
    ("", False, "empty response: nothing to loop"),
    (HEALTHY, False, "a healthy worked solution ends in its boxed answer"),
    ("7+9+0=16," + "4+8+1=13," * 10, True, "one column repeated until the length limit"),
    ("0" * 40, True, "period 1: a single character forever"),
    ("The answer is " + "the answer is " * 8, True, "a phrase loop (period 14)"),
    ("abab", False, "two units only: min_repeats=3 needs three"),
    ("ababab", True, "three whole units of period 2 cover the whole text"),
    ("x" * 60 + "ab" * 10, False, "the 2-periodic tail is 20 of 80 characters, under coverage 0.5"),
    ("Let us think. " + "".join(chr(97 + i % 26) for i in range(100)) + "q" * 10, False,
     "the q-loop covers 10 of 124 chars; the alphabet cycle before it is not at the tail"),
    ("".join(chr(33 + (i * 7) % 90) for i in range(60)) * 2, False,
     "a 60-char unit repeated: longer than max_period=50"),
    ("So " + "1234567890" * 5 + " and so \\boxed{5}", False, "the loop ended and the model answered"),
]


@pytest.mark.parametrize(("text", "expected", "why"), REPETITIVE_CASES)
def test_is_repetitive(text: str, expected: bool, why: str) -> None:
    assert is_repetitive(text) is expected, why


def test_is_repetitive_coverage_boundary() -> None:
    # 10 loop characters: 50% of a 20-char text (exactly the default coverage) counts, of 21 does not.
    unique = "".join(chr(65 + i) for i in range(10))  # no repeats inside
    assert is_repetitive(unique + "xy" * 5)  # L = ceil(0.5 * 20) = 10, the loop is 10 chars
    assert not is_repetitive("!" + unique + "xy" * 5)  # L = ceil(10.5) = 11 > the 10-char loop


def test_is_repetitive_matches_plain_loop_definition() -> None:
    """The slice comparison against a character-by-character reading of the documented rule."""

    def reference(text: str, max_period=50, coverage=0.5, min_repeats=3) -> bool:
        n = len(text)
        for p in range(1, max_period + 1):
            length = max(math.ceil(coverage * n), min_repeats * p)
            if 0 < length <= n and all(text[i] == text[i + p] for i in range(n - length, n - p)):
                return True
        return False

    rng = random.Random(0)
    for _ in range(300):
        # a random prefix and a random unit repeated a random number of times: both outcomes occur
        prefix = "".join(rng.choice("ab01") for _ in range(rng.randint(0, 30)))
        unit = "".join(rng.choice("ab01") for _ in range(rng.randint(1, 6)))
        text = prefix + unit * rng.randint(0, 12)
        assert is_repetitive(text) == reference(text), text


def test_is_repetitive_is_fast_on_long_text() -> None:
    # A 200k-character non-repetitive response must not take quadratic time.
    rng = random.Random(1)
    text = "".join(rng.choice("abcdefghij0123456789+=,") for _ in range(200_000))
    t0 = time.perf_counter()
    assert not is_repetitive(text)
    assert time.perf_counter() - t0 < 10.0  # linear: milliseconds; quadratic: minutes


@pytest.mark.parametrize("kwargs", [{"coverage": 0.0}, {"coverage": 1.5}, {"max_period": 0}, {"min_repeats": 1}])
def test_is_repetitive_rejects_bad_settings(kwargs) -> None:
    with pytest.raises(ValueError):
        is_repetitive("abc", **kwargs)


# ----------------------------------------------------------------------------- is_garbled

GARBLED_CASES = [
    # (text, token_logprobs, expected, why)
    ("", None, False, "empty: a no-answer case, not garbage"),
    (HEALTHY, None, False, "healthy text, no logprobs"),
    ("line one\nline two\ttabbed\r\n", None, False, "newline, tab and CR are ordinary whitespace"),
    ("caf\ufffd latte", None, True, "a replacement character in the middle: invalid UTF-8 was sampled"),
    ("the sum is 4\ufffd", None, False, "one trailing U+FFFD: a multi-byte char cut by the length limit"),
    ("the sum is 4\ufffd\ufffd", None, True, "two trailing: the one before the last was not a cut"),
    ("ab\x00\x01\x02\x03cd", None, True, "4 control characters in 8 (50%) > 10%"),
    ("a" * 19 + "\x07", None, False, "1 control char in 20 (5%) <= 10%"),
    ("\ue000\ue001\ue002 xyz", None, True, "private-use code points are not printable"),
    (HEALTHY, [-0.1, -0.3, -0.2], False, "confident tokens: mean logprob -0.2"),
    (HEALTHY, [-4.0, -5.0, -4.5], True, "near-uniform sampling: mean -4.5 < -3"),
    (HEALTHY, [], False, "no logprobs to average: only the text rules apply"),
    (HEALTHY, [-3.0, -3.0], False, "exactly at the threshold is not below it"),
]


@pytest.mark.parametrize(("text", "logprobs", "expected", "why"), GARBLED_CASES)
def test_is_garbled(text: str, logprobs, expected: bool, why: str) -> None:
    assert is_garbled(text, logprobs) is expected, why


def test_is_garbled_accepts_a_tensor_of_logprobs() -> None:
    torch = pytest.importorskip("torch")
    assert is_garbled("abc", torch.tensor([-6.0, -7.0]))
    assert not is_garbled("abc", torch.tensor([-0.5, -0.5]))


def test_is_garbled_thresholds_are_keyword_settings() -> None:
    assert is_garbled("ab\x00cdefghi", max_nonprintable=0.05)  # 1 in 10 > 5%
    assert not is_garbled("abc", [-4.0], min_mean_logprob=-5.0)
