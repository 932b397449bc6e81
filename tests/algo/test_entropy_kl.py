"""Entropy, chunked logprobs, the ref_gain_clip mask and the KL estimators against hand values and
naive references.

Run: python -m pytest tests/algo/test_entropy_kl.py -q
"""

import math

import pytest
import torch
from torch.testing import assert_close

from mathrl.algo.entropy import entropy_bonus_mask, entropy_from_logits, logprobs_and_entropy
from mathrl.algo.kl import KL_ESTIMATORS, apply_kl_reward_penalty, kl_penalty

LN2 = math.log(2.0)


# ---------------------------------------------------------------- entropy_from_logits


def test_entropy_hand_values():
    # Uniform over 4 -> ln 4. p = (1/2, 1/4, 1/4) -> 1/2 ln 2 + 2 * 1/4 ln 4 = 1.5 ln 2.
    logits = torch.tensor(
        [[0.0, 0.0, 0.0, 0.0], [math.log(0.5), math.log(0.25), math.log(0.25), -math.inf]]
    )
    assert_close(entropy_from_logits(logits), torch.tensor([math.log(4.0), 1.5 * LN2]))


def test_entropy_matches_categorical_and_is_shift_invariant():
    # Reference: torch.distributions; adding 1e4 to every logit must not change the result
    # (the max-shift prevents catastrophic cancellation in logsumexp - sum p x).
    logits = torch.randn(3, 5, 7, generator=torch.Generator().manual_seed(0))
    expected = torch.distributions.Categorical(logits=logits).entropy()
    assert_close(entropy_from_logits(logits), expected)
    assert_close(entropy_from_logits(logits + 1e4), expected, atol=1e-4, rtol=1e-4)


def test_entropy_with_masked_vocab_has_finite_gradient():
    # One finite logit, the rest -inf (vocabulary masking): a point mass, entropy 0, and the
    # backward must not produce 0 * inf = NaN.
    logits = torch.tensor([[2.0, -math.inf, -math.inf]], requires_grad=True)
    h = entropy_from_logits(logits)
    h.sum().backward()
    assert_close(h, torch.tensor([0.0]))
    assert torch.isfinite(logits.grad).all()


def test_entropy_upcasts_half_precision():
    # bf16 logits are computed in float32 (softmax over a large vocabulary needs it).
    out = entropy_from_logits(torch.zeros(2, 8, dtype=torch.bfloat16))
    assert out.dtype == torch.float32
    assert_close(out, torch.full((2,), math.log(8.0)))


# ---------------------------------------------------------------- logprobs_and_entropy (chunked)


def _naive(hidden, weight, bias, targets, temperature):
    logits = (hidden @ weight.T + (0 if bias is None else bias)) / temperature  # [B, T, V]
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1), entropy_from_logits(logits)


@pytest.mark.parametrize("chunk_size", [1, 4, 6, 1000])
@pytest.mark.parametrize("use_bias", [False, True])
def test_chunked_matches_naive_values_and_gradients(chunk_size, use_bias):
    # B*T = 6 positions: chunk 4 leaves a ragged last chunk, 1000 is a single chunk. Gradients of a
    # loss using both outputs must match for hidden, weight and bias.
    gen = torch.Generator().manual_seed(0)
    batch, length, width, vocab, temperature = 2, 3, 4, 5, 0.7
    hidden = torch.randn(batch, length, width, generator=gen, dtype=torch.float64)
    weight = torch.randn(vocab, width, generator=gen, dtype=torch.float64)
    bias = torch.randn(vocab, generator=gen, dtype=torch.float64) if use_bias else None
    targets = torch.randint(0, vocab, (batch, length), generator=gen)
    coeffs = torch.randn(2, batch, length, generator=gen, dtype=torch.float64)

    results = []
    for fn in ("naive", "chunked"):
        inputs = (hidden, weight) + ((bias,) if use_bias else ())
        leaves = [t.clone().requires_grad_(True) for t in inputs]
        h, w, b = leaves[0], leaves[1], (leaves[2] if use_bias else None)
        if fn == "naive":
            lp, ent = _naive(h, w, b, targets, temperature)
        else:
            lp, ent = logprobs_and_entropy(
                h, w, targets, chunk_size=chunk_size, temperature=temperature, lm_head_bias=b
            )
        ((coeffs[0] * lp).sum() + (coeffs[1] * ent).sum()).backward()
        results.append((lp.detach(), ent.detach(), [t.grad for t in leaves]))
    (lp0, ent0, g0), (lp1, ent1, g1) = results
    assert_close(lp1, lp0)
    assert_close(ent1, ent0)
    for a, b in zip(g1, g0):
        assert_close(a, b)


def test_chunked_keeps_no_logits_for_backward():
    # The point of chunking + checkpoint: no [chunk, V] logits tensor is saved for backward, only
    # each chunk's inputs (hidden chunk, weight, targets). The naive version saves [B*T, V].
    batch, length, width, vocab = 2, 8, 3, 50
    hidden = torch.randn(batch, length, width, requires_grad=True)
    weight = torch.randn(vocab, width, requires_grad=True)
    targets = torch.randint(0, vocab, (batch, length))
    saved = []

    def pack(t):
        saved.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logprobs_and_entropy(hidden, weight, targets, chunk_size=2)
    assert saved and all(shape == (vocab, width) or vocab not in shape for shape in saved), saved


def test_chunked_options_and_no_grad():
    # with_entropy=False returns None; under no_grad no checkpoint is used and results still match.
    hidden, weight = torch.randn(1, 3, 2), torch.randn(4, 2)
    targets = torch.tensor([[0, 3, 1]])
    lp, ent = logprobs_and_entropy(hidden, weight, targets, with_entropy=False)
    assert ent is None
    with torch.no_grad():
        lp2, ent2 = logprobs_and_entropy(hidden, weight, targets, chunk_size=2)
    ref_lp, ref_ent = _naive(hidden, weight, None, targets, 1.0)
    assert_close(lp, ref_lp)
    assert_close(lp2, ref_lp)
    assert_close(ent2, ref_ent)
    no_targets = torch.zeros(0, 3, dtype=torch.long)
    empty_lp, empty_ent = logprobs_and_entropy(torch.zeros(0, 3, 2), weight, no_targets)
    assert empty_lp.shape == empty_ent.shape == (0, 3)
    with pytest.raises(ValueError, match="temperature"):
        logprobs_and_entropy(hidden, weight, targets, temperature=0.0)
    with pytest.raises(ValueError, match="targets"):
        logprobs_and_entropy(hidden, weight, targets[:, :2])


# ---------------------------------------------------------------- entropy_bonus_mask (ref_gain_clip)


ENT = torch.tensor([[1.0, 2.0, 3.0, 0.5]])
REF = torch.tensor([[1.0, 1.0, 1.0, 1.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0]])


@pytest.mark.parametrize(
    "max_gain,max_ratio,expected,why",
    [
        (None, None, [1, 1, 1, 0], "both disabled: the mask itself"),
        (1.5, None, [1, 1, 0, 0], "gain 2 > 1.5 drops token 2; gain 1 is allowed"),
        (0.5, None, [1, 0, 0, 0], "gains 1 and 2 exceed 0.5; gain 0 stays"),
        (None, 2.5, [1, 1, 0, 0], "3 > 2.5 * 1 drops token 2; 2 <= 2.5 stays"),
        (1.5, 1.5, [1, 0, 0, 0], "either threshold excludes: 2 > 1.5 * 1 drops token 1"),
    ],
)
def test_entropy_bonus_mask(max_gain, max_ratio, expected, why):
    got = entropy_bonus_mask(ENT, REF, MASK, max_gain=max_gain, max_ratio=max_ratio)
    assert_close(got, torch.tensor([expected], dtype=torch.float32), msg=why)


# ---------------------------------------------------------------- kl_penalty


def test_kl_estimators_hand_values():
    # p(token) = 1/2, q(token) = 1/4: log p - log q = ln 2.
    # k1 = ln 2; k2 = (ln 2)^2 / 2; k3 = q/p - ln(q/p) - 1 = 1/2 + ln 2 - 1.
    lp, ref = torch.tensor([[math.log(0.5)]]), torch.tensor([[math.log(0.25)]])
    assert_close(kl_penalty(lp, ref, estimator="k1"), torch.tensor([[LN2]]))
    assert_close(kl_penalty(lp, ref, estimator="k2"), torch.tensor([[0.5 * LN2**2]]))
    assert_close(kl_penalty(lp, ref, estimator="k3"), torch.tensor([[0.5 + LN2 - 1.0]]))


@pytest.mark.parametrize("estimator, value, why", [
    ("k1+", LN2, "the value of k1 = log p - log q"),
    ("k3+", 0.5 + LN2 - 1.0, "the value of k3 = q/p - ln(q/p) - 1"),
])
def test_plus_estimators_take_the_value_of_one_and_the_gradient_of_k2(estimator, value, why):
    # p = 1/2, q = 1/4 as above: d k2 / d log p = log p - log q = ln 2 (k1's gradient would be 1,
    # k3's 1 - q/p = 1/2): verl's kl_penalty("k1+" / "k3+") straight-through.
    lp = torch.tensor([[math.log(0.5)]], requires_grad=True)
    ref = torch.tensor([[math.log(0.25)]])
    out = kl_penalty(lp, ref, estimator=estimator)
    out.sum().backward()
    assert_close(out.detach(), torch.tensor([[value]]), msg=why)
    assert_close(lp.grad, torch.tensor([[LN2]]), msg="the gradient of k2")


def test_k1_and_k3_are_unbiased_k2_is_not():
    # Exact expectation over the vocabulary under p (no sampling noise): E_p[k1] = E_p[k3] = KL(p||q).
    gen = torch.Generator().manual_seed(0)
    logp = torch.log_softmax(torch.randn(6, generator=gen, dtype=torch.float64), -1)
    logq = torch.log_softmax(torch.randn(6, generator=gen, dtype=torch.float64), -1)
    p = logp.exp()
    true_kl = (p * (logp - logq)).sum()
    expect = {
        e: (p * kl_penalty(logp[None], logq[None], estimator=e, clamp=None)[0]).sum()
        for e in KL_ESTIMATORS
    }
    assert_close(expect["k1"], true_kl)
    assert_close(expect["k3"], true_kl)
    assert not torch.allclose(expect["k2"], true_kl)


def test_k3_clamp_and_finite_gradient():
    # log p - log q = -30: the log-ratio is clamped to 20 before exp, k3 = e^20 - 21, then capped at
    # clamp = 10. The gradient is finite (0 here, the value is clamped). k1/k2 are never clamped.
    lp = torch.tensor([[-30.0]], requires_grad=True)
    ref = torch.zeros(1, 1)
    k3 = kl_penalty(lp, ref, estimator="k3")
    k3.sum().backward()
    assert_close(k3, torch.tensor([[10.0]]))
    assert torch.isfinite(lp.grad).all()
    unclamped = kl_penalty(lp.detach(), ref, estimator="k3", clamp=None)
    assert_close(unclamped, torch.tensor([[math.exp(20.0) - 21.0]]))
    assert_close(kl_penalty(lp.detach(), ref, estimator="k1"), torch.tensor([[-30.0]]))
    with pytest.raises(ValueError, match="unknown KL estimator"):
        kl_penalty(lp, ref, estimator="k4")


def test_apply_kl_reward_penalty():
    # r - coef * kl on counted tokens; the masked position keeps its reward; kl carries no gradient.
    rewards = torch.tensor([[0.0, 0.0, 1.0, 5.0]])
    kl = torch.tensor([[0.5, -0.5, 1.0, 9.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 0]])
    out = apply_kl_reward_penalty(rewards, kl, mask, coef=0.1)
    assert_close(out, torch.tensor([[-0.05, 0.05, 0.9, 5.0]]))
    assert not out.requires_grad
