"""Tests for the torch engine's sampler: `inverse_cdf` and `sample_top_p` (mathrl.rollout.sampling).

Hand-computed cases for the binary search, and seeded draws against known distributions; each
stochastic test states its false-failure odds (the generators are seeded, so the outcome is fixed).

Run: python -m pytest tests/rollout/test_sampling.py -q
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from mathrl.rollout.sampling import inverse_cdf, sample_top_p

INF = float("inf")


def draw(probs: list[float], n: int, *, top_p: float = 1.0, seed: int = 0) -> torch.Tensor:
    """n tokens sampled from one distribution given as probabilities (0 -> a -inf logit)."""
    logits = torch.tensor(probs, dtype=torch.float32).log().repeat(n, 1)  # [n, V]
    tokens, _ = sample_top_p(logits, top_p, torch.Generator().manual_seed(seed))
    return tokens


def chi_square(tokens: torch.Tensor, probs: list[float]) -> float:
    """Pearson's statistic of the token counts against the expected n * p (over tokens with p > 0)."""
    counts = torch.bincount(tokens, minlength=len(probs)).double()
    expected = torch.tensor(probs, dtype=torch.float64) * len(tokens)
    positive = expected > 0
    return float(((counts[positive] - expected[positive]) ** 2 / expected[positive]).sum())


# --------------------------------------------------------------------------------------------------
# inverse_cdf: hand-computed
# --------------------------------------------------------------------------------------------------
# probabilities [0.2, 0, 0.5, 0.3, 0] -> cdf [0.2, 0.2, 0.7, 1.0, 1.0]: tokens 1 and 4 have zero mass
CDF = torch.tensor([[0.2, 0.2, 0.7, 1.0, 1.0]], dtype=torch.float64)


@pytest.mark.parametrize("u, mass, token", [
    (0.0, 1.0, 0),    # the bottom of token 0's interval [0, 0.2)
    (0.1999, 1.0, 0),
    (0.2, 1.0, 2),    # cdf[1] = 0.2 is not > 0.2: the zero-mass token 1 is skipped
    (0.6999, 1.0, 2),
    (0.7, 1.0, 3),
    (0.9999, 1.0, 3),
    (1.0, 1.0, 3),    # past the end (what a rounded-up u * mass looks like): clamped to the last nonzero token, not 4 or 5
    (0.5, 0.7, 2),    # sampling within the prefix of mass 0.7 (a nucleus {0, 1, 2}): 0.35 falls in [0.2, 0.7)
    (1.0, 0.7, 2),    # past the prefix's end: clamped to its last token, never to token 3 outside it
])
def test_inverse_cdf_hand_computed(u, mass, token):
    out = inverse_cdf(CDF, torch.tensor([[mass]], dtype=torch.float64), torch.tensor([[u]], dtype=torch.float64))
    assert out.tolist() == [token]


def test_inverse_cdf_per_row():
    # two rows with their own cdf, mass and u: [0.5, 1.0] with u 0.6 -> 1; [0.1, 0.1, 0.4] with u 0.2 -> 2
    cdf = torch.tensor([[0.5, 1.0, 1.0], [0.1, 0.1, 0.4]], dtype=torch.float64)
    mass = torch.tensor([[1.0], [0.4]], dtype=torch.float64)
    u = torch.tensor([[0.6], [0.5]], dtype=torch.float64)
    assert inverse_cdf(cdf, mass, u).tolist() == [1, 2]


# --------------------------------------------------------------------------------------------------
# sample_top_p: distributions
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("logits", [
    [-INF, -INF, 0.0, -INF],  # one token with mass 1
    [-1e9, -1e9, 0.0, -1e9],  # the same through a huge gap: exp(-1e9) is exactly 0 in float32
])
@pytest.mark.parametrize("top_p", [1.0, 0.5])
def test_one_hot_always_picks_its_token(logits, top_p):
    tokens, logprobs = sample_top_p(torch.tensor(logits).repeat(1000, 1), top_p, torch.Generator().manual_seed(0))
    assert (tokens == 2).all()
    assert (logprobs == 0).all()  # log 1


@pytest.mark.parametrize("top_p", [1.0, 0.99])
def test_zero_probability_tokens_are_never_picked(top_p):
    # Zero mass at the start, between and after the others (the trailing ones are where a draw that
    # runs past the end would land), from a -inf logit or from exp underflowing (e^-200 = 0 in float32).
    logits = torch.tensor([-INF, 0.0, -200.0, 1.0, -INF, 0.5, -200.0, -INF]).repeat(20_000, 1)
    tokens, _ = sample_top_p(logits, top_p, torch.Generator().manual_seed(1))
    assert set(tokens.tolist()) == {1, 3, 5}  # all three positive-mass tokens appear in 20k draws


def test_three_token_frequencies_pass_a_chi_square_test_a_wrong_sampler_fails():
    # 20k draws from [0.2, 0.5, 0.3]. Pearson's statistic has 2 degrees of freedom, whose survival
    # function is exp(-x / 2): the bound 27.6 has false-failure odds 1e-6. A sampler that is off by
    # 0.02 on two tokens ([0.22, 0.48, 0.3]) has an expected statistic of about
    # 20000 * (0.02^2 / 0.22 + 0.02^2 / 0.48) + 2 = 55: the same draws, scored against that wrong
    # distribution, must fail the bound (that is what makes the test able to catch a wrong sampler).
    probs = [0.2, 0.5, 0.3]
    tokens = draw(probs, 20_000, seed=2)
    assert chi_square(tokens, probs) < 27.6
    assert chi_square(tokens, [0.22, 0.48, 0.3]) > 27.6


def test_frequencies_on_a_large_vocabulary():
    # 32k tokens, a few with most of the mass and a long tail of tiny ones (as a language model's
    # distribution): token 0 has 0.5, token 1 0.3, the 31,998 others share 0.2 (6.25e-6 each).
    # 10k draws in 20 calls of 500 rows; the tail's share 0.2 has std 0.004, the bound 0.02 is 5 std
    # (odds ~6e-7).
    vocab = 32_000
    probs = torch.full((vocab,), 0.2 / (vocab - 2), dtype=torch.float64)
    probs[0], probs[1] = 0.5, 0.3
    logits = probs.log().float().repeat(500, 1)  # [500, V]
    gen = torch.Generator().manual_seed(3)
    tokens = torch.cat([sample_top_p(logits, 1.0, gen)[0] for _ in range(20)])
    shares = [(tokens == 0).double().mean().item(), (tokens == 1).double().mean().item(), (tokens >= 2).double().mean().item()]
    for share, p in zip(shares, [0.5, 0.3, 0.2]):
        assert abs(share - p) < 0.02
    # ~2000 tail draws over 31,998 tokens hit ~1940 distinct ones: spread over the tail, not stuck on a few
    assert len(set(tokens[tokens >= 2].tolist())) > 1500


def test_top_p_respects_the_nucleus():
    # probs [0.5, 0.3, 0.15, 0.05], top_p=0.7: the mass before tokens 0,1,2,3 is 0, 0.5, 0.8, 0.95,
    # so only {0, 1} are kept, renormalised to 0.625 / 0.375. Chi-square over 20k draws with 1 degree
    # of freedom: P(X > 24) ~ 1e-6.
    tokens = draw([0.5, 0.3, 0.15, 0.05], 20_000, top_p=0.7)
    assert set(tokens.tolist()) == {0, 1}
    assert chi_square(tokens, [0.625, 0.375, 0.0, 0.0]) < 24.0


def test_top_p_nucleus_in_vocabulary_order_other_than_sorted():
    # The nucleus is found in sorted order but reported in vocabulary ids: probs [0.05, 0.15, 0.3,
    # 0.5] with top_p=0.7 keeps ids {3, 2}.
    tokens = draw([0.05, 0.15, 0.3, 0.5], 5_000, top_p=0.7)
    assert set(tokens.tolist()) == {2, 3}


def test_tiny_top_p_is_argmax_per_row():
    # A tiny nucleus holds only the top token of each row, whatever its rank in the vocabulary.
    logits = torch.tensor([[0.1, 2.0, 0.3], [5.0, 4.9, -1.0], [0.0, 0.0, 0.5]])
    tokens, _ = sample_top_p(logits, 1e-9, torch.Generator().manual_seed(0))
    assert tokens.tolist() == [1, 0, 2]


# --------------------------------------------------------------------------------------------------
# sample_top_p: logprobs, the random stream, determinism
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_logprob_is_log_softmax_of_the_token(top_p):
    # The logprob reuses the sampler's exp(logits - max); it must equal log_softmax over the whole
    # vocabulary (before the nucleus cut), computed here in float64.
    logits = torch.randn(64, 50, generator=torch.Generator().manual_seed(4)) * 3
    logits[:, 7] = -INF
    tokens, logprobs = sample_top_p(logits, top_p, torch.Generator().manual_seed(5))
    expected = torch.log_softmax(logits.double(), dim=-1).gather(-1, tokens[:, None]).squeeze(-1).float()
    assert logprobs.dtype == torch.float32
    assert_close(logprobs, expected, rtol=0, atol=1e-6)


def test_hand_computed_logprob():
    # logits [0, ln 3]: probabilities 1/4 and 3/4
    tokens, logprobs = sample_top_p(torch.tensor([[0.0, math.log(3.0)]]).repeat(200, 1), 1.0,
                                    torch.Generator().manual_seed(0))
    expected = torch.where(tokens == 0, torch.tensor(math.log(0.25)), torch.tensor(math.log(0.75)))
    assert_close(logprobs, expected)


def test_one_uniform_per_row_from_the_generator():
    # The sampler is inverse-CDF on the generator's float64 uniforms, one per row: replaying them
    # through exp(logits - max) -> float64 cumsum -> inverse_cdf gives the same tokens, and the
    # generator then sits where B float64 draws leave it.
    logits = torch.randn(32, 20, generator=torch.Generator().manual_seed(6))
    gen = torch.Generator().manual_seed(7)
    tokens, _ = sample_top_p(logits, 1.0, gen)
    replay = torch.Generator().manual_seed(7)
    u = torch.rand((32, 1), generator=replay, dtype=torch.float64)
    cdf = (logits - logits.amax(-1, keepdim=True)).exp().double().cumsum(-1)
    assert torch.equal(tokens, inverse_cdf(cdf, cdf[:, -1:], u))
    assert torch.equal(gen.get_state(), replay.get_state())


def test_reproducible_from_the_generator():
    logits = torch.randn(64, 10, generator=torch.Generator().manual_seed(1))
    for top_p in (1.0, 0.9):
        a = sample_top_p(logits, top_p, torch.Generator().manual_seed(3))
        b = sample_top_p(logits, top_p, torch.Generator().manual_seed(3))
        c = sample_top_p(logits, top_p, torch.Generator().manual_seed(4))
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        assert not torch.equal(a[0], c[0])  # 64 rows of 10 tokens: two seeds agreeing on all is negligible


# --------------------------------------------------------------------------------------------------
# the two-level search of large vocabularies (over BLOCKED_ABOVE tokens, top_p 1)
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("vocab, top_p, blocked", [
    (32_000, 1.0, True),    # a real vocabulary: two levels
    (4_097, 1.0, True),     # just over the threshold
    (4_096, 1.0, False),    # at the threshold and below: one float64 cumulative sum (the tiny model's path)
    (99, 1.0, False),
    (32_000, 0.9, False),   # top-p < 1 sorts and searches the sorted cumulative sum
])
def test_which_vocabularies_take_the_two_level_search(monkeypatch, vocab, top_p, blocked):
    from mathrl.rollout import sampling

    calls = []
    real = sampling._inverse_cdf_blocked
    monkeypatch.setattr(sampling, "_inverse_cdf_blocked", lambda w, u: calls.append(w.shape) or real(w, u))
    assert sampling.BLOCKED_ABOVE == 4_096
    sample_top_p(torch.randn(3, vocab), top_p, torch.Generator().manual_seed(0))
    assert calls == ([(3, vocab)] if blocked else [])


@pytest.mark.parametrize("vocab", [40_000, 32_000])  # with and without a shorter last block (40000 = 156 * 256 + 64)
def test_two_level_search_draws_what_the_full_cumulative_sum_draws(vocab):
    # The same uniforms through the float64 cumulative sum of all V probabilities and through the blocks
    # pick the same token: the two differ only by float64 rounding of the interval ends (~1e-16 each),
    # so a disagreement in 512 rows has odds of about 512 * V * 1e-16.
    logits = torch.randn(512, vocab, generator=torch.Generator().manual_seed(8)) * 4
    logits[:, -70:] += 6.0  # mass in the last block too
    tokens, logprobs = sample_top_p(logits, 1.0, torch.Generator().manual_seed(9))
    u = torch.rand((512, 1), generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    cdf = torch.softmax(logits, dim=-1).double().cumsum(-1)
    assert torch.equal(tokens, inverse_cdf(cdf, cdf[:, -1:], u))
    assert (tokens >= vocab - 70).any()
    expected = torch.log_softmax(logits.double(), dim=-1).gather(-1, tokens[:, None]).squeeze(-1).float()
    assert_close(logprobs, expected, rtol=0, atol=1e-6)


def test_two_level_search_never_draws_zero_probability_tokens_or_blocks():
    # 5000 tokens (19 full blocks and one of 136), mass on 5 tokens: the first, one inside a block, the
    # last token of a block, the first of the next, and the very last token; every other token and all
    # other blocks have zero mass (-inf, or e^-200 which is 0 in float32). Chi-square, 4 degrees of
    # freedom: P(X > 33) ~ 1e-6.
    vocab = 5000
    probs = [0.0] * vocab
    for token, p in {0: 0.1, 1000: 0.2, 2047: 0.3, 2048: 0.15, vocab - 1: 0.25}.items():
        probs[token] = p
    logits = torch.tensor(probs).log()
    logits[3000] = -200.0
    tokens, _ = sample_top_p(logits.repeat(20_000, 1), 1.0, torch.Generator().manual_seed(10))
    assert set(tokens.tolist()) == {0, 1000, 2047, 2048, vocab - 1}
    assert chi_square(tokens, probs) < 33.0
    assert chi_square(tokens, [p + (0.02 if i == 1000 else -0.02 if i == 2047 else 0.0) for i, p in enumerate(probs)]) > 33.0
