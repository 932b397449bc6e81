"""Reward functions of the reward tests (tests/reward/test_reward_functions.py), loaded by file path in the
verifier's worker processes the way a user's module is. Each one misbehaves on a marked response."""

from __future__ import annotations

import time


def length(prompts, responses, fields, tokens, *, per=10.0):
    """len(response) / per: a value that differs per sample, so mixed-up rows would show."""
    return [len(r) / per for r in responses]


def raises_on_boom(prompts, responses, fields, tokens):
    if any("boom" in r for r in responses):
        raise RuntimeError("boom in the response")
    return [1.0 for _ in responses]


def hangs_on_hang(prompts, responses, fields, tokens):
    if any("hang" in r for r in responses):
        time.sleep(3600)
    return [1.0 for _ in responses]


def named(prompts, responses, fields, tokens):
    """A dict per sample: the score and a logged value (the number of prompt characters)."""
    return [{"score": 1.0 if f["answer"] in r else 0.0, "prompt_chars": float(len(p))}
            for p, r, f in zip(prompts, responses, fields)]


def token_count(prompts, responses, fields, tokens):
    return [float(len(t)) for t in tokens]


def bad_values(prompts, responses, fields, tokens):
    """NaN for a response with "nan", a string for one with "str": neither is a reward."""
    return [float("nan") if "nan" in r else "x" if "str" in r else 0.5 for r in responses]


def too_few(prompts, responses, fields, tokens):
    return [1.0]


def no_kwargs(prompts, responses):  # the wrong signature: no fields, no tokens
    return [0.0 for _ in responses]
