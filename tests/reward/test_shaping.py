"""Length-dependent reward terms against hand-computed values and a plain loop.

Run: python -m pytest tests/reward/test_shaping.py -q
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from mathrl.reward.shaping import (
    kimi_length_penalty,
    length_bonus,
    length_schedule_reward,
    scheduled_target,
    soft_overlong_punishment,
)

# ---------------------------------------------------------------------------------- DAPO eq. 13


def test_soft_overlong_hand_values():
    # L = 10, C = 4, so the ramp starts at L - C = 6:
    # len 0, 6 -> 0 (inside the budget, 6 is the edge); 7 -> (6-7)/4 = -0.25; 8 -> -0.5;
    # 10 -> (6-10)/4 = -1 (the limit itself); 12 -> beyond L -> -1.
    out = soft_overlong_punishment(torch.tensor([0, 6, 7, 8, 10, 12]), max_len=10, cache_len=4)
    assert_close(out, torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0, -1.0]))


def test_soft_overlong_cache_equals_max_len():
    # C = L = 4: the ramp covers the whole range, -len/4.
    out = soft_overlong_punishment(torch.tensor([0, 1, 4]), max_len=4, cache_len=4)
    assert_close(out, torch.tensor([0.0, -0.25, -1.0]))


@pytest.mark.parametrize("max_len, cache_len", [(10, 0), (10, 11), (10, -1)])
def test_soft_overlong_invalid(max_len, cache_len):
    with pytest.raises(ValueError, match="0 < cache_len <= max_len"):
        soft_overlong_punishment(torch.tensor([1]), max_len=max_len, cache_len=cache_len)


# ---------------------------------------------------------------------------------- Kimi k1.5


def test_kimi_hand_values():
    # Group 0: lengths 10, 20, 30 -> lambda 0.5, 0, -0.5; correct, correct, wrong -> 0.5, 0, -0.5.
    # Group 1: lengths 10, 30 -> lambda 0.5, -0.5; the short one is wrong -> min(0, 0.5) = 0;
    #          the long one is correct -> -0.5 (correct but longest in its group).
    # Group 2: a single sample -> 0. Group 3: equal lengths -> 0 (no division by zero).
    lengths = torch.tensor([10, 20, 30, 10, 30, 5, 7, 7])
    correct = torch.tensor([1, 1, 0, 0, 1, 1, 1, 0])
    ids = torch.tensor([0, 0, 0, 1, 1, 2, 3, 3])
    out = kimi_length_penalty(lengths, correct, ids)
    assert_close(out, torch.tensor([0.5, 0.0, -0.5, 0.0, -0.5, 0.0, 0.0, 0.0]))
    # coef scales everything.
    assert_close(kimi_length_penalty(lengths, correct, ids, coef=2.0), 2 * out)


def test_kimi_groups_need_not_be_contiguous():
    # Same group 4 split by group 9: lengths 0 and 40 in group 4 -> +0.5 (correct) / -0.5 (wrong).
    out = kimi_length_penalty(torch.tensor([0.0, 3.0, 40.0]), torch.tensor([True, True, False]),
                              torch.tensor([4, 9, 4]))
    assert_close(out, torch.tensor([0.5, 0.0, -0.5]))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 50), st.booleans()), min_size=1, max_size=20))
def test_kimi_matches_plain_loop(rows):
    ids = torch.tensor([g for g, _, _ in rows])
    lengths = torch.tensor([n for _, n, _ in rows])
    correct = torch.tensor([c for _, _, c in rows])
    expected = []
    for g, n, c in rows:
        lens = [m for gg, m, _ in rows if gg == g]
        lo, hi = min(lens), max(lens)
        if hi == lo:
            expected.append(0.0)
            continue
        lam = 0.5 - (n - lo) / (hi - lo)
        expected.append(lam if c else min(0.0, lam))
    assert_close(kimi_length_penalty(lengths, correct, ids), torch.tensor(expected))


def test_kimi_empty_and_shape_checks():
    assert kimi_length_penalty(torch.zeros(0), torch.zeros(0), torch.zeros(0, dtype=torch.long)).numel() == 0
    with pytest.raises(ValueError, match="same shape"):
        kimi_length_penalty(torch.ones(2), torch.ones(3), torch.zeros(2, dtype=torch.long))


# ---------------------------------------------------------------------------------- ablation terms


def test_length_bonus_hand_values():
    # 0.5 * len / 10.
    assert_close(length_bonus(torch.tensor([0, 5, 10]), coef=0.5, max_len=10), torch.tensor([0.0, 0.25, 0.5]))
    with pytest.raises(ValueError, match="max_len"):
        length_bonus(torch.tensor([1]), coef=1.0, max_len=0)


def test_scheduled_target_is_piecewise_constant():
    sched = [(0, 100), (10, 200), (20, 50)]
    # step 9 is still in the first piece; 10 starts the second; past the last entry it stays.
    assert [scheduled_target(sched, s) for s in (0, 9, 10, 19, 20, 1000)] == [100, 100, 200, 200, 50, 50]
    # A step before the first entry uses the first target.
    assert scheduled_target([(5, 100)], 0) == 100


@pytest.mark.parametrize(
    "sched, match",
    [([], "empty"), ([(0, 100), (0, 200)], "strictly increasing"), ([(0, 0)], "targets must be > 0")],
)
def test_scheduled_target_invalid(sched, match):
    with pytest.raises(ValueError, match=match):
        scheduled_target(sched, 0)


def test_length_schedule_reward_hand_values():
    # Target at step 12 is 200. Correct responses: len 200 -> 0; 300 -> -|100|/200 = -0.5;
    # 100 -> -0.5. The wrong response (len 600) gets 0 whatever its length. coef 2 doubles.
    lengths = torch.tensor([200, 300, 100, 600])
    correct = torch.tensor([1.0, 1.0, 1.0, 0.0])
    out = length_schedule_reward(lengths, correct, step=12, schedule=[(0, 100), (10, 200)], coef=2.0)
    assert_close(out, torch.tensor([0.0, -1.0, -1.0, 0.0]))


# ---------------------------------------------------------------------------------- the terms by name
def _config(*overrides: str):
    from mathrl.config import load_config

    return load_config(None, ["rollout.max_new_tokens=10", *overrides])


LENGTHS = torch.tensor([2, 8, 10, 4])
CORRECT = torch.tensor([1.0, 0.0, 1.0, 1.0])
GROUPS = torch.tensor([0, 0, 1, 1])


@pytest.mark.parametrize("overrides, terms", [
    # nothing on: the reward is the correctness itself, no term logged
    ((), {}),
    # each switch adds its own pure function's values, logged under its name
    (("reward.overlong.soft_punishment=true", "reward.overlong.cache_len=4"),
     {"overlong_penalty": soft_overlong_punishment(LENGTHS, max_len=10, cache_len=4)}),
    (("reward.kimi_length_coef=0.5",), {"length_penalty": kimi_length_penalty(LENGTHS, CORRECT, GROUPS, coef=0.5)}),
    (("reward.length_bonus_coef=0.1",), {"length_bonus": length_bonus(LENGTHS, coef=0.1, max_len=10)}),
    (("reward.length_schedule=[[0, 6]]", "reward.length_schedule_coef=0.5"),
     {"length_schedule": length_schedule_reward(LENGTHS, CORRECT, step=3, schedule=[(0, 6)], coef=0.5)}),
    # all four: added in SHAPING_TERMS' order, each logged
    (("reward.overlong.soft_punishment=true", "reward.overlong.cache_len=4", "reward.kimi_length_coef=0.5",
      "reward.length_bonus_coef=0.1", "reward.length_schedule=[[0, 6]]", "reward.length_schedule_coef=0.5"),
     {"overlong_penalty": soft_overlong_punishment(LENGTHS, max_len=10, cache_len=4),
      "length_penalty": kimi_length_penalty(LENGTHS, CORRECT, GROUPS, coef=0.5),
      "length_bonus": length_bonus(LENGTHS, coef=0.1, max_len=10),
      "length_schedule": length_schedule_reward(LENGTHS, CORRECT, step=3, schedule=[(0, 6)], coef=0.5)}),
])
def test_shape_rewards_adds_the_enabled_terms_in_order(overrides, terms):
    from mathrl.reward.shaping import shape_rewards

    rewards, means = shape_rewards(_config(*overrides), 3, LENGTHS, CORRECT, GROUPS)
    expected = CORRECT.clone()
    for term in terms.values():
        expected = expected + term
    assert_close(rewards, expected, rtol=0, atol=0)  # the same additions in the same order: bit for bit
    assert list(means) == list(terms) and means == {k: float(v.mean()) for k, v in terms.items()}


def test_shape_rewards_starts_from_the_total_and_reward_incorrect():
    # total: the components' weighted sum; incorrect=-1 adds -1 where the math checker said wrong (DAPO's +-1)
    from mathrl.reward.shaping import shape_rewards

    total = torch.tensor([1.5, 0.25, 1.0, 0.5])
    rewards, means = shape_rewards(_config("reward.incorrect=-1"), 3, LENGTHS, CORRECT, GROUPS, total=total)
    assert_close(rewards, torch.tensor([1.5, -0.75, 1.0, 0.5])) and means == {}


def test_a_new_shaping_term_is_one_registration():
    # the extension point: one registered ShapingTerm is summed and logged, nothing else to touch or patch
    from mathrl.registry import SHAPING_TERMS
    from mathrl.reward import shaping

    SHAPING_TERMS.register("short_bonus", shaping.ShapingTerm(lambda cfg: True, lambda x: (x.lengths < 5).float() * 0.1))
    try:
        rewards, means = shaping.shape_rewards(_config(), 3, LENGTHS, CORRECT, GROUPS)
    finally:
        SHAPING_TERMS.remove("short_bonus")
    assert_close(rewards, CORRECT + torch.tensor([0.1, 0.0, 0.0, 0.1]))
    assert means == {"short_bonus": pytest.approx(0.05)}
