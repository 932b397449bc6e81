"""Tests for mathrl.evaluation.metrics against brute-force references and hand-computed cases.

Run: python -m pytest tests/evaluation/test_eval_metrics.py -q
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest

from mathrl.evaluation.metrics import (
    avg_at_n,
    bootstrap_ci95,
    default_ks,
    maj_at_k,
    mean_std_ci95,
    pass_at_k,
    pass_at_k_table,
    problem_scores,
    t_quantile_975,
)

# ----------------------------------------------------------------------------- pass@k


def _pass_at_k_brute_force(n: int, c: int, k: int) -> Fraction:
    """Exact fraction of the k-subsets of n samples (c correct) holding a correct sample."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(samples, k))
    return Fraction(sum(any(s) for s in subsets), len(subsets))


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_matches_enumeration_of_all_k_subsets(n: int) -> None:
    for c in range(n + 1):
        for k in range(1, n + 1):
            expected = _pass_at_k_brute_force(n, c, k)
            assert pass_at_k(n, c, k) == pytest.approx(float(expected), abs=1e-12), (n, c, k)


def test_pass_at_k_matches_binomial_formula_for_large_n() -> None:
    # The product form exists because C(n, k) overflows floats; check it against exact integers.
    n, c, k = 1000, 7, 64
    expected = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(float(expected), rel=1e-12)


def test_pass_at_1_is_fraction_correct() -> None:
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)


@pytest.mark.parametrize(
    ("n", "c", "k", "match"),
    [
        (4, 1, 5, "k <= n"),  # more draws than samples
        (4, 1, 0, "k >= 1"),  # pass@0 is meaningless
        (4, 5, 1, r"c=5"),  # more correct than samples
        (4, -1, 1, r"c=-1"),
    ],
)
def test_pass_at_k_rejects_bad_arguments(n: int, c: int, k: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        pass_at_k(n, c, k)


def test_pass_at_k_table_averages_over_problems() -> None:
    correct = [[True, False, False, True], [False, False, False, False]]
    table = pass_at_k_table(correct, [1, 2, 4])
    # Problem 0: pass@1 = 2/4, pass@2 = 1 - C(2,2)/C(4,2) = 5/6, pass@4 = 1; problem 1: all 0.
    assert table == pytest.approx({1: 0.25, 2: 5 / 12, 4: 0.5})


def test_pass_at_k_table_names_the_short_problem() -> None:
    with pytest.raises(ValueError, match="problem 1 has 2 samples"):
        pass_at_k_table([[True] * 4, [True, False]], [4])


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        (1, [1]),
        (4, [1, 2, 4]),
        (5, [1, 2, 4, 5]),  # n itself is appended: pass@n is the coverage ceiling
        (16, [1, 2, 4, 8, 16]),
    ],
)
def test_default_ks(n: int, expected: list[int]) -> None:
    assert default_ks(n) == expected


# ----------------------------------------------------------------------------- avg@n, maj@k


def test_avg_at_n_weighs_problems_equally() -> None:
    # 1/2 and 1/4 correct: mean 3/8, not the pooled 2/6.
    assert avg_at_n([[True, False], [True, False, False, False]]) == pytest.approx(3 / 8)


@pytest.mark.parametrize(
    ("answers", "correct", "k", "expected"),
    [
        # Clear majority "2" (wrong) beats a single correct "3".
        ([["2", "2", "3"]], [[False, False, True]], 3, 0.0),
        # Only the first k samples vote: with k=1 the correct "3" stands alone.
        ([["3", "2", "2"]], [[True, False, False]], 1, 1.0),
        # Tie 1-1: the earlier answer ("5", sample 0) wins.
        ([["5", "7"]], [[True, False]], 2, 1.0),
        ([["7", "5"]], [[False, True]], 2, 0.0),
        # None never votes: one "4" beats two missing extractions.
        ([[None, "4", None]], [[False, True, False]], 3, 1.0),
        # No extracted answer at all counts as wrong.
        ([[None, None]], [[False, False]], 2, 0.0),
        # Mean over problems: right, wrong.
        ([["1", "1"], ["x", "y"]], [[True, True], [False, True]], 2, 0.5),
        # Tie broken by first occurrence, not by the later sample in the group: "a" at 0 and 3,
        # "b" at 1 and 2 -> "a" wins, scored by sample 0.
        ([["a", "b", "b", "a"]], [[True, False, False, True]], 4, 1.0),
    ],
)
def test_maj_at_k_hand_computed(
    answers: list[list[str | None]], correct: list[list[bool]], k: int, expected: float
) -> None:
    assert maj_at_k(answers, correct, k) == pytest.approx(expected)


def test_maj_at_k_rejects_mismatched_rows() -> None:
    with pytest.raises(ValueError, match="problem 0: 2 answers but 3"):
        maj_at_k([["1", "2"]], [[True, True, False]], 1)
    with pytest.raises(ValueError, match="too few for maj@3"):
        maj_at_k([["1", "2"]], [[True, True]], 3)


# ----------------------------------------------------------------------------- seeds CI


def test_mean_std_ci95_hand_computed() -> None:
    # [1, 2, 3]: mean 2, sample std 1, half-width t_{0.975,2} / sqrt(3) = 4.3026527 / 1.7320508.
    mean, std, half = mean_std_ci95([1.0, 2.0, 3.0])
    assert (mean, std) == pytest.approx((2.0, 1.0))
    assert half == pytest.approx(2.4841377, abs=1e-6)
    # [0.5, 0.7]: std = sqrt(0.02) and half-width = 12.7062047 * sqrt(0.02) / sqrt(2) = 1.27062047.
    mean, std, half = mean_std_ci95([0.5, 0.7])
    assert (mean, std, half) == pytest.approx((0.6, math.sqrt(0.02), 1.27062047))


def test_mean_std_ci95_single_value_has_unknown_half_width() -> None:
    mean, std, half = mean_std_ci95([0.42])
    assert (mean, std) == (0.42, 0.0)
    assert math.isnan(half)


def test_mean_std_ci95_rejects_empty() -> None:
    with pytest.raises(ValueError, match="at least one value"):
        mean_std_ci95([])


def test_t_quantile_is_continuous_past_the_table_and_tends_to_z() -> None:
    # The expansion takes over at df=31; values from R qt(0.975, df).
    assert t_quantile_975(30) == pytest.approx(2.0422725, abs=1e-7)
    assert t_quantile_975(31) == pytest.approx(2.0395134, abs=1e-5)
    assert t_quantile_975(120) == pytest.approx(1.9799304, abs=1e-5)
    assert t_quantile_975(10**9) == pytest.approx(1.959964, abs=1e-6)
    values = [t_quantile_975(df) for df in range(1, 200)]
    assert all(a > b for a, b in itertools.pairwise(values))


# ----------------------------------------------------------------------------- bootstrap CI over problems


def test_problem_scores_average_each_problem_over_seeds() -> None:
    assert problem_scores([[0.5, 1.0, 0.0]]) == [0.5, 1.0, 0.0]  # one seed: its own avg@n
    assert problem_scores([[0.5, 1.0, 0.0], [0.0, 1.0, 0.25]]) == [0.25, 1.0, 0.125]
    with pytest.raises(ValueError, match="same problems"):
        problem_scores([[0.5, 1.0], [0.5]])
    with pytest.raises(ValueError, match="at least one seed"):
        problem_scores([])


def test_bootstrap_ci95_hand_computed() -> None:
    # [0, 1]: a resampled mean is 0, 0.5 or 1 with probabilities 1/4, 1/2, 1/4; the 2.5% and 97.5%
    # quantiles fall inside the masses at 0 and at 1.
    assert bootstrap_ci95([0.0, 1.0]) == (0.5, 0.0, 1.0)
    # [0, 0, 0, 1]: the mean of 4 draws is K/4 with K ~ Binomial(4, 1/4): P(K = 0) = 81/256 > 2.5%, so
    # low = 0; P(K = 4) = 1/256 < 2.5% <= P(K >= 3) = 13/256, so high = 3/4.
    assert bootstrap_ci95([0.0, 0.0, 0.0, 1.0]) == (0.25, 0.0, 0.75)
    # one problem: every resample is that problem
    assert bootstrap_ci95([0.375]) == (0.375, 0.375, 0.375)


def test_bootstrap_ci95_all_correct_and_all_wrong_stay_at_the_bounds() -> None:
    assert bootstrap_ci95([1.0] * 8) == (1.0, 1.0, 1.0)
    assert bootstrap_ci95([0.0] * 8) == (0.0, 0.0, 0.0)


def test_bootstrap_ci95_one_and_two_seeds() -> None:
    # one seed: the problems' avg@n are resampled as they are
    assert bootstrap_ci95(problem_scores([[0.0, 0.0, 0.0, 1.0]])) == (0.25, 0.0, 0.75)
    # two seeds with pass@1 0.125 and 0.25: the Student-t interval over them leaves [0, 1] (12.7 * sd / sqrt 2)
    per_seed = [[0.0, 0.0, 0.0, 0.5], [0.0, 0.0, 0.0, 1.0]]
    mean, _, half = mean_std_ci95([sum(s) / 4 for s in per_seed])
    assert mean - half < 0.0
    # problem scores [0, 0, 0, 0.75]: the resampled mean is 0.75 K / 4, K ~ Binomial(4, 1/4) as above
    assert bootstrap_ci95(problem_scores(per_seed)) == (0.1875, 0.0, 0.5625)


def test_bootstrap_ci95_never_leaves_the_unit_interval_and_is_seeded() -> None:
    import random

    rng = random.Random(0)
    for _ in range(100):
        scores = [rng.choice([0.0, 1.0, rng.randint(0, 8) / 8]) for _ in range(rng.randint(1, 40))]
        mean, low, high = bootstrap_ci95(scores, resamples=500)
        assert 0.0 <= low <= mean <= high <= 1.0, scores
    scores = [rng.random() for _ in range(30)]
    assert bootstrap_ci95(scores) == bootstrap_ci95(scores)  # the same scores, the same interval
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        bootstrap_ci95([0.5, 1.5])
    with pytest.raises(ValueError, match="at least one problem"):
        bootstrap_ci95([])
