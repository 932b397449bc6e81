"""Curriculum ordering: by a meta field (numbers and "Level N" strings, unknowns last, stable) and
by online pass-rate estimates with a Beta(1, 1) prior; checkpoint round trips.

Run: python -m pytest tests/tasks/test_curriculum.py -q
"""

import json

import pytest

from mathrl.tasks.base import Problem
from mathrl.tasks.curriculum import Curriculum, difficulty_value


def P(pid, **meta):
    return Problem(pid, "q", "1", meta)


@pytest.mark.parametrize(
    "value, expected",
    [
        (3, 3.0),  # MATH500 `level` is an int
        (4.0, 4.0),  # MATH train `difficulty` is a float
        ("Level 3", 3.0),  # the original MATH release spells levels as strings
        ("level 10", 10.0),  # more than one digit
        ("2.5", 2.5),  # a numeric string
        ("Level ?", None),  # MATH has a few of these: unknown
        ("hard", None),  # no number at all
        (None, None),  # missing / null
        (True, None),  # a bool is not a difficulty level
        (float("nan"), None),  # NaN would break the sort order
        ([1, 2], None),  # not a scalar
    ],
)
def test_difficulty_value(value, expected):
    assert difficulty_value(value) == expected


# ---------------------------------------------------------------------------------- field mode


def test_field_mode_sorts_ascending_unknown_last_stable():
    problems = [
        P("a", level="Level 3"),  # 3
        P("b", level=1),  # 1
        P("c", level="Level ?"),  # unknown
        P("d", level=3.0),  # 3, ties with a: keeps input order (a before d)
        P("e"),  # field missing: unknown, after c (input order)
        P("f", level=0),  # 0 is a real level, not "unknown" (no falsy-value bug)
    ]
    cur = Curriculum(problems, mode="field", field="level")
    assert [problems[i].id for i in cur.order()] == ["f", "b", "a", "d", "c", "e"]


def test_field_mode_ignores_online_counts():
    # update() keeps counts in field mode (for logging) but the order is still by the field.
    problems = [P("a", level=2), P("b", level=1)]
    cur = Curriculum(problems, mode="field", field="level")
    cur.update(["a", "a", "b"], [1.0, 1.0, 0.0])
    assert cur.order() == [1, 0]
    assert cur.pass_rates() == [pytest.approx(3 / 4), pytest.approx(1 / 3)]


# ---------------------------------------------------------------------------------- online mode


def test_online_beta_prior_and_reordering():
    problems = [P("x"), P("y"), P("z")]
    cur = Curriculum(problems, mode="online")
    # Nothing seen: every estimate is the prior mean 1/2, ties keep input order.
    assert cur.pass_rates() == [0.5, 0.5, 0.5]
    assert cur.order() == [0, 1, 2]
    # x: 0 of 2 -> (1+0)/(2+2) = 0.25; z: 2 of 2 -> (1+2)/(2+2) = 0.75; y unseen stays 0.5.
    cur.update(["x", "x", "z", "z"], [0.0, 0.0, 1.0, 1.0])
    assert cur.pass_rates() == [0.25, 0.5, 0.75]
    assert cur.order() == [2, 1, 0]
    # Training proceeds: x is now solved 4 times -> (1+4)/(2+6) = 0.625, above unseen y, below z.
    cur.update(["x"] * 4, [1.0] * 4)
    assert cur.pass_rates()[0] == 0.625
    assert cur.order() == [2, 0, 1]


def test_online_custom_prior_and_fractional_outcomes():
    # Beta(2, 2), one outcome of 0.5: (2 + 0.5) / (4 + 1) = 0.5; unseen -> 2/4 = 0.5.
    cur = Curriculum([P("a"), P("b")], mode="online", prior=(2.0, 2.0))
    cur.update(["a"], [0.5])
    assert cur.pass_rates() == [0.5, 0.5]


# ---------------------------------------------------------------------------------- checkpoints


def test_state_dict_round_trip_through_json():
    problems = [P("x"), P("y"), P("z")]
    cur = Curriculum(problems, mode="online")
    cur.update(["x", "y", "y"], [1.0, 0.0, 1.0])
    state = json.loads(json.dumps(cur.state_dict()))  # must survive JSON
    assert state["counts"] == {"x": [1.0, 1], "y": [1.0, 2]}  # unseen z is left out
    fresh = Curriculum(problems, mode="online")
    assert fresh.load_state_dict(state) == 0
    assert fresh.pass_rates() == cur.pass_rates() and fresh.order() == cur.order()


def test_load_ignores_unknown_ids_and_replaces_counts():
    cur = Curriculum([P("x")], mode="online")
    cur.update(["x"], [1.0])
    state = {"mode": "online", "counts": {"x": [0.0, 3], "gone": [1.0, 1]}}
    assert cur.load_state_dict(state) == 1  # "gone" is not a problem here
    assert cur.attempts == [3] and cur.successes == [0.0]  # replaced, not added


def test_load_with_other_mode_raises():
    cur = Curriculum([P("x", level=1)], mode="field", field="level")
    with pytest.raises(ValueError, match="mode='online'"):
        cur.load_state_dict({"mode": "online", "counts": {}})


# ---------------------------------------------------------------------------------- validation


def test_update_validates_before_changing_counts():
    cur = Curriculum([P("x"), P("y")], mode="online")
    with pytest.raises(ValueError, match="unknown problem id 'eval:1'"):
        cur.update(["x", "eval:1"], [1.0, 1.0])
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        cur.update(["x", "y"], [1.0, 2.0])
    with pytest.raises(ValueError, match="2 problem ids but 1 outcomes"):
        cur.update(["x", "y"], [1.0])
    assert cur.attempts == [0, 0]  # the valid leading entries were not applied either


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"mode": "easy"}, "mode must be"),
        ({"mode": "field"}, "needs `field`"),
        ({"mode": "online", "prior": (0.0, 1.0)}, "prior"),
    ],
)
def test_constructor_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Curriculum([P("x")], **kwargs)


def test_duplicate_ids_raise():
    with pytest.raises(ValueError, match="unique"):
        Curriculum([P("x"), P("x")], mode="online")
