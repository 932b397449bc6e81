"""Evaluation metrics over sampled completions: pass@k, avg@n, maj@k and confidence intervals.

Every function takes plain Python sequences (one row per problem, one entry per sample) so it can be
fed from any rollout format and tested without tensors:

    >>> from mathrl.evaluation.metrics import pass_at_k_table, default_ks
    >>> correct = [[True, False, False, True], [False, False, False, False]]
    >>> pass_at_k_table(correct, default_ks(4))
    {1: 0.25, 2: 0.41666666666666663, 4: 0.5}

pass@k uses the unbiased estimator of Chen et al. (2021), never "any of the first k samples", which
has higher variance and depends on sample order (STYLE.md rule 12).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = [
    "pass_at_k",
    "pass_at_k_table",
    "default_ks",
    "avg_at_n",
    "maj_at_k",
    "mean_std_ci95",
    "t_quantile_975",
    "problem_scores",
    "bootstrap_ci95",
    "answer_forms",
]


# ----------------------------------------------------------------------------- pass@k


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from `n` samples of which `c` are correct.

    Chen et al. 2021, "Evaluating Large Language Models Trained on Code", eq. 1:
    pass@k = 1 - C(n-c, k) / C(n, k), the probability that a random k-subset of the n samples
    contains at least one correct one. The binomials overflow floats for large n, so we use the
    product form from the paper's Figure 3: C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k/i).
    When fewer than k samples are wrong (n - c < k) every k-subset holds a correct one: 1.0.
    """
    if k < 1:
        raise ValueError(f"pass@k needs k >= 1, got k={k}")
    if k > n:
        raise ValueError(f"pass@k needs k <= n (k={k}, n={n}); draw at least k samples per problem")
    if not 0 <= c <= n:
        raise ValueError(f"number correct c={c} must lie in [0, n={n}]")
    if n - c < k:
        return 1.0
    prob_all_wrong = 1.0
    for i in range(n - c + 1, n + 1):
        prob_all_wrong *= 1.0 - k / i
    return 1.0 - prob_all_wrong


def default_ks(n: int) -> list[int]:
    """The k values to report for n samples per problem: powers of two up to n, plus n itself.

    n is appended when it is not a power of two (n=5 -> [1, 2, 4, 5]) because pass@n, "solved by any
    sample", is the coverage ceiling that RL-vs-base comparisons report; the powers of two keep
    columns aligned between runs that drew different n.
    """
    if n < 1:
        raise ValueError(f"need at least one sample per problem, got n={n}")
    ks = []
    k = 1
    while k <= n:
        ks.append(k)
        k *= 2
    if ks[-1] != n:
        ks.append(n)
    return ks


def pass_at_k_table(correct: Sequence[Sequence[bool]], ks: Sequence[int]) -> dict[int, float]:
    """Mean unbiased pass@k over problems, for each k in `ks`.

    correct: one row per problem, one bool per sample; rows may differ in length, but every row
    needs at least max(ks) samples.
    """
    _check_nonempty(correct)
    table: dict[int, float] = {}
    for k in ks:
        total = 0.0
        for i, row in enumerate(correct):
            n = len(row)
            if k > n:
                raise ValueError(f"problem {i} has {n} samples, too few for pass@{k}")
            total += pass_at_k(n, sum(bool(x) for x in row), k)
        table[k] = total / len(correct)
    return table


# ----------------------------------------------------------------------------- avg@n and maj@k


def avg_at_n(correct: Sequence[Sequence[bool]]) -> float:
    """Mean over problems of the fraction of correct samples (pass@1 averaged over all n samples).

    Each problem weighs the same whatever its number of samples.
    """
    _check_nonempty(correct)
    total = 0.0
    for i, row in enumerate(correct):
        if len(row) == 0:
            raise ValueError(f"problem {i} has no samples")
        total += sum(bool(x) for x in row) / len(row)
    return total / len(correct)


def maj_at_k(
    answers: Sequence[Sequence[str | None]],
    correct: Sequence[Sequence[bool]],
    k: int,
) -> float:
    """Fraction of problems whose majority-vote answer over the FIRST k samples is correct.

    answers[i][j] is the extracted, already normalised final answer of sample j of problem i (None
    when nothing could be extracted); correct[i][j] is the verifier's verdict for that sample.
    Votes group answers by exact string equality, so normalise them first (e.g. to the verifier's
    canonical form) or "1/2" and "\\frac{1}{2}" split the vote. None never votes; a problem with no
    extracted answer among its first k samples counts as wrong.

    Ties between equally frequent answers go to the answer that appeared first, which keeps the
    metric deterministic and independent of dict ordering. The voted answer is scored by the verdict
    of its first sample (equal strings get equal verdicts from a deterministic verifier).

    Unlike pass@k this uses the first k samples rather than an unbiased average over k-subsets;
    with k = n (the usual report) the two coincide.
    """
    _check_nonempty(answers)
    if len(answers) != len(correct):
        raise ValueError(f"answers has {len(answers)} problems but correct has {len(correct)}")
    if k < 1:
        raise ValueError(f"maj@k needs k >= 1, got k={k}")
    n_right = 0
    for i, (ans_row, ok_row) in enumerate(zip(answers, correct)):
        if len(ans_row) != len(ok_row):
            raise ValueError(
                f"problem {i}: {len(ans_row)} answers but {len(ok_row)} correctness flags"
            )
        if k > len(ans_row):
            raise ValueError(f"problem {i} has {len(ans_row)} samples, too few for maj@{k}")
        counts: dict[str, int] = {}
        first_index: dict[str, int] = {}
        for j in range(k):
            a = ans_row[j]
            if a is None:
                continue
            counts[a] = counts.get(a, 0) + 1
            first_index.setdefault(a, j)
        if not counts:
            continue
        # Highest count wins; among equals the smallest first index (earliest sample) wins.
        voted = min(counts, key=lambda a: (-counts[a], first_index[a]))
        n_right += bool(ok_row[first_index[voted]])
    return n_right / len(answers)


# ----------------------------------------------------------------------------- across seeds

# Two-sided 95% Student t quantiles t_{0.975, df} for df = 1..30 (standard tables, e.g. the
# NIST/SEMATECH e-Handbook of Statistical Methods, 1.3.6.7.2), hard-coded so mathrl needs no scipy.
_T_975 = (
    12.7062047, 4.3026527, 3.1824463, 2.7764451, 2.5705818,
    2.4469119, 2.3646243, 2.3060041, 2.2621572, 2.2281389,
    2.2009852, 2.1788128, 2.1603687, 2.1447867, 2.1314495,
    2.1199053, 2.1098155, 2.1009220, 2.0930241, 2.0859634,
    2.0796138, 2.0738731, 2.0686576, 2.0638986, 2.0595386,
    2.0555294, 2.0518305, 2.0484071, 2.0452296, 2.0422725,
)  # fmt: skip
_Z_975 = 1.959963984540054


def t_quantile_975(df: int) -> float:
    """The 0.975 quantile of Student's t with `df` degrees of freedom.

    Exact table for df <= 30. Beyond it we use the Cornish-Fisher expansion of t in powers of 1/df
    (Abramowitz & Stegun 26.7.5, first three terms), within 2e-6 of the exact value there; plain
    1.96 would make the interval about 3% too narrow at df = 31.
    """
    if df < 1:
        raise ValueError(f"t distribution needs df >= 1, got {df}")
    if df <= len(_T_975):
        return _T_975[df - 1]
    z = _Z_975
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    return z + g1 / df + g2 / df**2 + g3 / df**3


def mean_std_ci95(values: Sequence[float]) -> tuple[float, float, float]:
    """Mean, sample standard deviation (ddof=1) and 95% CI half-width of a metric across seeds.

    The half-width is t_{0.975, n-1} * std / sqrt(n), the Student t interval for the mean, because
    seed counts are small (3-5) and 1.96 would badly understate the uncertainty.
    A single value returns std 0.0 and half-width nan: the spread is unknown, not zero, and nan
    prints as such in a table instead of suggesting a certain result.
    """
    n = len(values)
    if n == 0:
        raise ValueError("mean_std_ci95 needs at least one value")
    mean = math.fsum(values) / n
    if n == 1:
        return mean, 0.0, float("nan")
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, std, t_quantile_975(n - 1) * std / math.sqrt(n)


# ----------------------------------------------------------------------------- over problems


def problem_scores(per_seed: Sequence[Sequence[float]]) -> list[float]:
    """Each problem's score over every seed: the mean of its per-seed fractions correct.

    per_seed[s][i] is problem i's avg@n under seed s (every seed scores the same problems, in the
    same order). With the same n per seed this is the problem's fraction correct among all its
    seeds x n samples; the mean of the result is the mean over seeds of avg@n.
    """
    if len(per_seed) == 0:
        raise ValueError("problem_scores needs at least one seed")
    sizes = {len(row) for row in per_seed}
    if len(sizes) != 1:
        raise ValueError(f"every seed must score the same problems; got {sorted(sizes)} problems")
    _check_nonempty(per_seed[0])
    return [math.fsum(column) / len(per_seed) for column in zip(*per_seed)]


def bootstrap_ci95(scores: Sequence[float], *, resamples: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """Mean of `scores` (one per problem, each in [0, 1]) and the percentile-bootstrap 95% interval
    of that mean over problems: (mean, low, high).

    Each of `resamples` draws takes len(scores) problems with replacement and averages their
    scores; low and high are the 2.5% and 97.5% quantiles (linear interpolation) of those means.
    Resampling problems is how the data were drawn (a benchmark is a sample of problems, each
    sampled many times), so the interval covers both the choice of problems and the sampling noise
    in each problem's score, and it does not shrink with more samples of the same problems. Every
    resampled mean is an average of values in [0, 1], so the interval always lies inside [0, 1]
    (all scores 1: [1, 1]; all 0: [0, 0]). The generator is seeded: the same scores give the same
    interval.
    """
    import numpy as np

    if resamples < 1:
        raise ValueError(f"bootstrap needs resamples >= 1, got {resamples}")
    _check_nonempty(scores)
    values = np.asarray(scores, dtype=np.float64)
    if not ((values >= 0) & (values <= 1)).all():
        raise ValueError("bootstrap_ci95 takes scores in [0, 1] (one fraction correct per problem)")
    rng = np.random.default_rng(seed)
    p = len(values)
    chunk = max(1, 4_000_000 // p)  # resamples per block: at most ~4M indices in memory at once
    means = np.concatenate([values[rng.integers(0, p, size=(min(chunk, resamples - start), p))].mean(axis=1)
                            for start in range(0, resamples, chunk)])
    low, high = np.quantile(means, [0.025, 0.975])
    mean = math.fsum(scores) / p
    return mean, min(max(float(low), 0.0), 1.0), min(max(float(high), 0.0), 1.0)


def _check_nonempty(rows: Sequence[Sequence[object]]) -> None:
    if len(rows) == 0:
        raise ValueError("need at least one problem")


# ----------------------------------------------------------------------------- how answers are written


def answer_forms(completions: Sequence[str]) -> dict[str, float]:
    """Share of the completions whose final boxed answer is written as an integer, a decimal, a
    fraction or otherwise (`reward.numeric.answer_form`), and the share with no boxed answer.

    The integer-answer transform's hack (training on integer answers only teaches the model to answer
    integers where the working gives a decimal) shows as `integer` rising on problems whose gold
    answers are decimals. Returns {"integer", "decimal", "fraction", "other", "none"}, summing to 1
    (all 0 for no completions)."""
    from mathrl.reward.extract import final_answers
    from mathrl.reward.numeric import answer_form

    counts = dict.fromkeys(("integer", "decimal", "fraction", "other", "none"), 0)
    for text in completions:
        answers = final_answers(text, "last")
        counts[answer_form(answers[-1]) if answers else "none"] += 1
    return {k: v / len(completions) if completions else 0.0 for k, v in counts.items()}
