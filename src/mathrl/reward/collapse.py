"""Collapse detectors: is a sampled response stuck in a loop, or garbage?

Two small pure functions over one decoded response, shared by `mathrl eval` (collapse rates per
checkpoint) and the training-time sample filter, so both count the same thing:

    >>> from mathrl.reward.collapse import is_repetitive, is_garbled
    >>> is_repetitive("7+9+0=16," + "4+8+1=13," * 10)
    True
    >>> is_repetitive("7+9+0=16,4+8+1=13,3+5+1=09,\\\\boxed{936}")
    False
    >>> is_garbled("\\ufffd\\ufffd the answer")
    True

Neither ever raises on model text (any `str`, empty included). The third collapse signal, "no
answer", is the verifier's `no_answer` verdict (`RewardResult.reason`), not a detector here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

__all__ = ["is_repetitive", "is_garbled"]

_REPLACEMENT_CHAR = "\ufffd"
_ALLOWED_CONTROL = frozenset("\n\r\t")


def is_repetitive(text: str, *, max_period: int = 50, coverage: float = 0.5, min_repeats: int = 3) -> bool:
    """True if the response ends in a loop: a unit of at most `max_period` characters repeated
    until the end, the loop covering at least `coverage` of the response's characters.

    The exact rule, for a text of N characters: repetitive iff for some period p in
    1..max_period, the last L = max(ceil(coverage * N), min_repeats * p) characters are p-periodic,
    i.e. text[i] == text[i + p] for every i in [N - L, N - p). `min_repeats` (whole units the loop
    must span) keeps short texts from counting: "abab" is not a loop at the default 3.

    Only the tail is checked because degenerate decoding loops run until the length limit; a loop
    that the model leaves on its own to finish the answer is not collapse. Characters, not tokens,
    so the rule does not depend on the tokenizer; a repeated n-gram of tokens is a repeated string.
    A periodic tail with period p is also periodic with period 2p, 3p, ..., so a "minimum n-gram
    length" would exclude nothing; `min_repeats` is the knob that matters for short units.

    Cost: one slice comparison per p (runs in C), O(max_period * N) character comparisons; about
    a millisecond for a 20k-character response at the default max_period=50.
    """
    if not 0 < coverage <= 1:
        raise ValueError(f"coverage must be in (0, 1], got {coverage}")
    if max_period < 1 or min_repeats < 2:
        raise ValueError(f"need max_period >= 1 and min_repeats >= 2, got {max_period}, {min_repeats}")
    n = len(text)
    if n == 0:
        return False
    needed = math.ceil(coverage * n)
    for p in range(1, min(max_period, n) + 1):
        length = max(needed, min_repeats * p)
        if length > n:
            break  # min_repeats * p only grows with p
        start = n - length
        # text[start:n-p] == text[start+p:n]  <=>  text[i] == text[i+p] for i in [start, n-p)
        if text[start : n - p] == text[start + p : n]:
            return True
    return False


def is_garbled(
    text: str,
    token_logprobs: Iterable[float] | None = None,
    *,
    max_nonprintable: float = 0.1,
    min_mean_logprob: float = -3.0,
) -> bool:
    """True if the response looks like garbage rather than language.

    Any one of three signals:
    1. a U+FFFD replacement character (invalid UTF-8 from byte-level tokens, which a healthy model
       never emits). A single one at the very end is ignored: it is what a length limit cutting a
       multi-byte character in half decodes to.
    2. more than `max_nonprintable` of the characters are non-printable (`str.isprintable()` is
       False, newline, carriage return and tab excepted): control characters, unassigned or
       private-use code points, format characters.
    3. when `token_logprobs` (the sampled tokens' logprobs, e.g. `RolloutBatch.rollout_logprobs` over the
       response mask) are given: their mean is below `min_mean_logprob` nats. At temperature 1
       this mean estimates minus the policy's entropy where it sampled; a healthy reasoning model
       sits around -0.2 to -1, a policy that has fallen apart near -log(vocabulary size). The
       logprobs are those of the *sampling* distribution, so at temperatures above 1 they are
       lower for every response: raise the threshold's magnitude there or pass None.
    An empty text is not garbled (an empty answer is a no-answer case, counted by the verifier).
    """
    if text:
        body = text[:-1] if text.endswith(_REPLACEMENT_CHAR) else text
        if _REPLACEMENT_CHAR in body:
            return True
        nonprintable = sum(1 for ch in text if not ch.isprintable() and ch not in _ALLOWED_CONTROL)
        if nonprintable > max_nonprintable * len(text):
            return True
    if token_logprobs is not None:
        values = [float(x) for x in token_logprobs]
        if values and math.fsum(values) / len(values) < min_mean_logprob:
            return True
    return False
