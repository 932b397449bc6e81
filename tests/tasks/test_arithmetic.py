"""Tests for mathrl.tasks.arithmetic: the train/held-out split and the worked solutions.

Run: python -m pytest tests/tasks/test_arithmetic.py -q
"""

from __future__ import annotations

import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mathrl.tasks.arithmetic import ArithmeticTask

BOXED = re.compile(r"\\boxed\{(\d+)\}$")
COLUMN = re.compile(r"(\d)\+(\d)\+(\d)=(\d\d)")


def boxed(solution: str) -> str:
    m = BOXED.search(solution)
    assert m, f"no trailing \\boxed{{digits}} in {solution!r}"
    return m.group(1)


def columns(solution: str) -> list[tuple[int, int, int, int]]:
    """(x, y, carry_in, written_total) per column, rightmost column first."""
    body = solution.rsplit(",\\boxed{", 1)[0]
    parts = body.split(",")
    out = []
    for part in parts:
        m = COLUMN.fullmatch(part)
        assert m, f"malformed column {part!r} in {solution!r}"
        out.append(tuple(int(g) for g in m.groups()))
    return out


# --------------------------------------------------------------------------------------------------
# the split
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("digits", [(1, 3), (2, 4), (1, 6)])
@pytest.mark.parametrize("seed", [0, 1, 2, 17])
def test_training_problems_are_never_held_out(digits, seed):
    # The whole point of the split: RL training (and the base model's pretraining, which draws from
    # train_problems too) must never see an evaluation problem, for every seed, not just seed 0.
    task = ArithmeticTask(min_digits=digits[0], max_digits=digits[1])
    for p in task.train_problems(300, seed=seed):
        a, b = task.operands(p)
        assert not task.is_heldout(a, b), p


@pytest.mark.parametrize("permille", [1, 50, 500])
def test_heldout_problems_are_held_out_distinct_and_reproducible(permille):
    # The eval set must be held out, without duplicates (a duplicate would double-weight a problem
    # in pass@1), and identical across runs so checkpoints are compared on the same problems.
    task = ArithmeticTask(min_digits=1, max_digits=3, heldout_permille=permille)
    problems = task.heldout_problems(40)
    assert len(problems) == 40
    assert len({p.id for p in problems}) == 40
    for p in problems:
        assert task.is_heldout(*task.operands(p))
    assert task.heldout_problems(40) == problems
    assert task.heldout_problems(40, seed=0) == problems  # the default seed is 0
    assert ArithmeticTask(min_digits=1, max_digits=3, heldout_permille=permille).heldout_problems(40) == problems
    assert task.heldout_problems(40, seed=1) != problems  # the seed does pick another set


def test_asking_for_more_heldout_problems_than_exist_is_an_error(monkeypatch):
    # Bug story: with max_digits=1 only 5 of the 100 problems are held out, and the default
    # data.eval_size is 200, so `mathrl train data.arith.max_digits=1` hung forever while building its
    # eval set. Now the search is bounded and raises ValueError; the bounded _draw below keeps this
    # test from hanging should the bug come back.
    real_draw = ArithmeticTask._draw
    calls = 0

    def bounded_draw(self, rng, *, heldout):
        nonlocal calls
        calls += 1
        if calls > 20_000:  # 20,000 draws from a space of 5 problems: the loop cannot be making progress
            raise RuntimeError("heldout_problems did not stop")
        return real_draw(self, rng, heldout=heldout)

    monkeypatch.setattr(ArithmeticTask, "_draw", bounded_draw)
    task = ArithmeticTask(min_digits=1, max_digits=1)
    with pytest.raises(ValueError, match="held"):
        task.heldout_problems(6)


def test_is_heldout_is_deterministic_and_pinned():
    # The split is a keyed blake2b hash, not Python's salted hash(): it must be the same in every
    # process. Pinned values guard against an accidental change of the split, which would silently
    # leak evaluation problems into a cached base model's pretraining data.
    task = ArithmeticTask()
    pairs = [(a, b) for a in range(30) for b in range(30) if task.is_heldout(a, b)][:6]
    assert pairs == [(0, 4), (0, 9), (1, 3), (1, 10), (2, 25), (3, 14)]
    assert all(ArithmeticTask().is_heldout(a, b) == task.is_heldout(a, b) for a in range(50) for b in range(50))


def test_heldout_share_matches_permille_and_split_key_reshuffles():
    # heldout_permille=50 reserves ~5% of the problem space; over all 10,000 pairs below 100 the share
    # is a deterministic number (495), within 1 percentage point of 5%.
    task = ArithmeticTask()
    space = [(a, b) for a in range(100) for b in range(100)]
    held = {ab for ab in space if task.is_heldout(*ab)}
    assert abs(len(held) / len(space) - 0.05) < 0.01
    # a different split_key is documented to reshuffle which problems are held out
    other = {ab for ab in space if ArithmeticTask(split_key="another-key").is_heldout(*ab)}
    assert other != held


def test_train_problems_are_reproducible_and_seeded():
    # Training problems are drawn from seed alone, so a run is reproducible; different seeds differ.
    task = ArithmeticTask(min_digits=1, max_digits=3)
    assert task.train_problems(20, seed=3) == task.train_problems(20, seed=3)
    assert task.train_problems(20, seed=3) != task.train_problems(20, seed=4)


def test_operand_sizes_stay_in_range():
    # Operands have min_digits..max_digits digits (a 1-digit operand may be 0).
    task = ArithmeticTask(min_digits=2, max_digits=4)
    sizes = set()
    for p in task.train_problems(400, seed=0):
        for x in task.operands(p):
            sizes.add(len(str(x)))
            assert 10 <= x <= 9999
        assert p.answer == str(sum(task.operands(p)))
    assert sizes == {2, 3, 4}


# --------------------------------------------------------------------------------------------------
# worked solutions
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "a, b",
    [
        (0, 0),  # a single column "0+0+0=00" and answer 0
        (5, 5),  # one carry creates a new leading digit
        (999, 1),  # a carry ripples through every column of the longer operand
        (1, 999),  # ... with the short operand first
        (99999, 99999),  # carries in every column and a final carry
        (123456, 9),  # very different operand sizes
        (100, 0),  # zeros inside and at the end
    ],
)
def test_worked_solution_without_slips_is_correct(a, b):
    # slip_prob=0 must give the true sum: this is the text the base model learns to add from.
    solution = ArithmeticTask(max_digits=18).worked_solution(a, b)
    assert int(boxed(solution)) == a + b
    assert boxed(solution) == str(a + b)  # unpadded operands: no leading zeros in the answer
    assert len(columns(solution)) == max(len(str(a)), len(str(b)))


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10**9), st.integers(0, 10**9))
def test_worked_solution_is_correct_for_random_pairs(a, b):
    # Random operands of any sizes: every column is x+y+carry with its true total, the carry passed
    # on is the previous total // 10, and the boxed answer is the sum.
    solution = ArithmeticTask(max_digits=18).worked_solution(a, b, rng=random.Random(0), slip_prob=0.0)
    assert int(boxed(solution)) == a + b
    carry = 0
    for x, y, c, total in columns(solution):
        assert c == carry
        assert total == x + y + c
        carry = total // 10


@pytest.mark.parametrize("seed", range(20))
def test_slips_propagate_to_the_final_answer(seed):
    # slip_prob=1: every written column sum is wrong, and later carries and the boxed answer follow
    # the WRITTEN sums (a slip propagates the way a person's would), so a model pretrained on this
    # text answers consistently with its own working.
    rng = random.Random(seed)
    a, b = rng.randrange(10**6), rng.randrange(10**6)
    solution = ArithmeticTask(max_digits=18).worked_solution(a, b, rng=rng, slip_prob=1.0)
    cols = columns(solution)
    carry = 0
    digits = []
    for x, y, c, total in cols:
        assert c == carry  # the carry written in is the one the previous written sum implies
        assert total != x + y + c  # the sum is a slip
        assert 0 <= total <= 19
        digits.append(str(total % 10))
        carry = total // 10
    expected = (str(carry) if carry else "") + "".join(reversed(digits))
    assert boxed(solution) == expected


def test_slip_rate_matches_slip_prob():
    # The base model should slip at about slip_prob per column. 4000 columns at p=0.3: std 0.0072, so
    # a 0.05 tolerance is ~7 standard deviations (false-failure odds < 1e-11; the rng is seeded anyway).
    rng = random.Random(0)
    task = ArithmeticTask(max_digits=18)
    slipped = total_cols = 0
    while total_cols < 4000:
        a, b = rng.randrange(10**6), rng.randrange(10**6)
        for x, y, c, total in columns(task.worked_solution(a, b, rng=rng, slip_prob=0.3)):
            slipped += total != x + y + c
            total_cols += 1
    assert abs(slipped / total_cols - 0.3) < 0.05


def test_worked_solution_without_rng_ignores_slip_prob():
    # Slips need an rng; without one the solution is always correct (documented by the signature).
    assert boxed(ArithmeticTask().worked_solution(47, 85, slip_prob=1.0)) == "132"


@pytest.mark.parametrize("a, b", [(5, 3), (5, 123), (999, 999), (0, 0), (120, 7)])
def test_padded_operands(a, b):
    # pad_operands=True writes both operands zero-padded to max_digits, so there are exactly
    # max_digits columns, and the boxed answer keeps the padding (the verifier compares numbers).
    task = ArithmeticTask(min_digits=1, max_digits=3, pad_operands=True)
    assert task.question(a, b) == f"{a:03d}+{b:03d}"
    solution = task.worked_solution(a, b)
    assert len(columns(solution)) == 3
    answer = boxed(solution)
    assert int(answer) == a + b
    assert len(answer) == (4 if a + b >= 1000 else 3)
    # operands() must read padded questions back (int("005") == 5)
    problem = task._problem(a, b)
    assert task.operands(problem) == (a, b)
    assert problem.answer == str(a + b)


def test_padding_does_not_change_the_split():
    # The split hashes the numbers, not the text, so padding cannot move a problem across it.
    plain = ArithmeticTask(max_digits=3)
    padded = ArithmeticTask(max_digits=3, pad_operands=True)
    assert all(plain.is_heldout(a, b) == padded.is_heldout(a, b) for a in range(0, 1000, 37) for b in range(0, 1000, 41))


# --------------------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"min_digits": 0}, "min_digits"),  # a 0-digit operand does not exist
        ({"min_digits": 4, "max_digits": 3}, "min_digits"),  # empty range
        ({"max_digits": 19}, "18"),  # the documented operand range is 1..18 digits
        ({"heldout_permille": 0}, "heldout_permille"),  # no eval set at all
        ({"heldout_permille": 1000}, "heldout_permille"),  # no training problems: _draw would loop forever
    ],
)
def test_invalid_task_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ArithmeticTask(**kwargs)
