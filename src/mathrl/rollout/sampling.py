"""The sampler of the torch engine: top-p sampling by inverse CDF over the sorted probabilities (a
two-level search for large vocabularies), each row's uniforms from one generator per chunk of rows or
from the row's own stream (`row_uniforms`), and greedy decoding at temperature 0.
"""

from __future__ import annotations

import torch

from mathrl.rollout.base import row_seed

__all__ = ["inverse_cdf", "next_token", "row_uniforms", "sample_top_p"]


BLOCK = 256  # tokens per block of the two-level search
BLOCKED_ABOVE = 16 * BLOCK  # vocabularies larger than this sample through blocks; smaller ones in one pass


def inverse_cdf(cdf: torch.Tensor, mass: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The token whose cumulative-mass interval holds u * mass: inverse-CDF sampling of one token per row.

    cdf:  [B, V] cumulative (unnormalised) probabilities, non-decreasing along V
    mass: [B, 1] the mass sampled from: cdf[:, -1:] for the whole distribution, the mass of a prefix
          (a top-p nucleus in sorted order) to sample within that prefix only
    u:    [B, 1] uniform fractions in [0, 1)
    -> [B] long: the first index i with cdf[i] > u * mass, i.e. cdf[i-1] <= u * mass < cdf[i]

    A token of zero probability has cdf[i] == cdf[i-1] (adding 0 is exact), so no u selects it.
    u * mass can round up to mass itself (and u = 1 would reach it), where the search would run past the
    end; such a draw is clamped to the first index whose cdf reaches `mass`: the last token of nonzero
    probability inside the sampled prefix.
    """
    index = torch.searchsorted(cdf, u * mass, right=True)  # [B, 1]
    last = torch.searchsorted(cdf, mass.contiguous(), right=False)  # [B, 1]
    return torch.minimum(index, last).squeeze(-1)


def sample_top_p(logits: torch.Tensor, top_p: float, generator: torch.Generator | None = None, *,
                 u: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row from softmax(logits) restricted to the top-p nucleus, with its logprob.

    logits: [B, V] float -> (token [B] long, logprob [B] float32). The logprob is log_softmax(logits) of
    the token, the distribution before the nucleus cut (what the trainer's scoring pass computes).
    The row's uniform is drawn from `generator` ([B, 1] at once), or given as `u` ([B, 1] float64 in
    [0, 1): `row_uniforms`, one stream per row).

    Inverse-CDF sampling: one uniform per row (from `generator`) and a binary search in the cumulative
    probabilities, instead of `torch.multinomial`, whose one-sample path draws an exponential variate
    per vocabulary entry (37% of generation time at a 32k vocabulary; docs/performance.md). The same
    exp(logits - max) serves the sample and the logprob, log p = logits - max - log(sum exp(logits - max)),
    the formula of log_softmax. The cumulative sum is float64: in float32 its rounding (~3e-8 near a
    cumulative mass of 1) would add or remove up to that much probability to each of the many near-zero
    tokens of a large vocabulary (up to 1e-3 in all at 32k tokens). Vocabularies over BLOCKED_ABOVE
    tokens (at top_p 1) take the probabilities from one fused softmax and search them in two levels
    (`_inverse_cdf_blocked`); their logprob is log p of the token minus the log of the summed p.
    """
    if u is None:
        u = torch.rand((logits.shape[0], 1), generator=generator, dtype=torch.float64, device=logits.device)  # [B, 1]
    if top_p >= 1.0 and logits.shape[-1] > BLOCKED_ABOVE:
        probs = torch.softmax(logits, dim=-1)  # [B, V]; one vectorised pass, 2x faster than max, subtract, exp
        token, total = _inverse_cdf_blocked(probs, u)  # [B], [B, 1] (total = 1 up to float32 rounding)
        logprob = (probs.gather(-1, token[:, None]).double().log() - total.log()).squeeze(-1).float()  # [B]
        return token, logprob
    top = logits.amax(dim=-1, keepdim=True)  # [B, 1]
    weights = (logits - top).exp_()  # [B, V], unnormalised probabilities, the top token's is 1
    if top_p < 1.0:
        weights, order = weights.sort(dim=-1, descending=True)  # [B, V] each
        cdf = weights.double().cumsum(-1)  # [B, V]
        total = cdf[:, -1:]  # [B, 1]
        # keep a token if the mass before it is < top_p (so the most likely token is always kept);
        # sorted descending, the kept tokens are a prefix, and the nucleus mass is the cdf at its end
        kept = ((cdf - weights) < top_p * total).sum(-1, keepdim=True)  # [B, 1], >= 1
        token = order.gather(-1, inverse_cdf(cdf, cdf.gather(-1, kept - 1), u)[:, None]).squeeze(-1)  # [B]
    else:
        cdf = weights.double().cumsum(-1)  # [B, V]; cumsum(dtype=float64) measured 8x slower on CPU
        total = cdf[:, -1:]  # [B, 1]
        token = inverse_cdf(cdf, total, u)  # [B]
    picked = logits.gather(-1, token[:, None]).double() - top.double()  # [B, 1]
    logprob = (picked - total.log()).squeeze(-1).float()  # [B]
    return token, logprob


def _inverse_cdf_blocked(weights: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse-CDF sampling in two levels: a block of BLOCK tokens, then a token inside it.

    weights: [B, V] float32 unnormalised probabilities; u: [B, 1] float64 uniforms in [0, 1)
    -> (token [B] long, total [B, 1] float64: the summed weights)

    The same draw as `inverse_cdf` over the float64 cumulative sum of all V weights, at a fraction of
    its cost: that needs a float64 copy and a cumulative sum of the whole [B, V] (most of the sampler's
    time at a 32k vocabulary), this one sums each block in float32 (relative error ~1e-7 of a block's
    mass, so every token keeps its probability to that relative precision; the tiny tail tokens are not
    shifted by an absolute rounding as in a float32 cumulative sum), finds the block in the float64
    cumulative sum of the V / BLOCK block sums, and the token in the float64 cumulative sum of that
    block's BLOCK weights at the position of u inside the block's interval. A zero-weight token or
    block has an empty interval and is never drawn.
    """
    rows, vocab = weights.shape
    full = vocab // BLOCK * BLOCK
    sums = weights[:, :full].reshape(rows, -1, BLOCK).sum(-1)  # [B, V // BLOCK]
    if full < vocab:  # the last, shorter block
        sums = torch.cat([sums, weights[:, full:].sum(-1, keepdim=True)], dim=-1)  # [B, NB]
    cdf = sums.double().cumsum(-1)  # [B, NB]
    total = cdf[:, -1:]  # [B, 1]
    block = inverse_cdf(cdf, total, u)[:, None]  # [B, 1]
    end = cdf.gather(-1, block)  # [B, 1]: the cumulative mass at the end of the chosen block
    start = torch.where(block > 0, cdf.gather(-1, (block - 1).clamp(min=0)), torch.zeros_like(end))  # [B, 1]
    inside = ((u * total - start) / (end - start)).clamp(0.0, 1.0)  # [B, 1]: where u falls in the block's interval
    index = block * BLOCK + torch.arange(BLOCK, device=weights.device)  # [B, BLOCK]
    in_vocab = index < vocab
    block_weights = weights.gather(-1, index.clamp(max=vocab - 1)) * in_vocab  # [B, BLOCK], 0 past the vocabulary
    block_cdf = block_weights.double().cumsum(-1)  # [B, BLOCK]
    token = block.squeeze(-1) * BLOCK + inverse_cdf(block_cdf, block_cdf[:, -1:], inside)  # [B]
    return token, total


def row_uniforms(seed: int, first_row: int, rows: int, columns: int, device) -> torch.Tensor:
    """The uniforms of rollout.draws=row: [rows, columns] float64 in [0, 1), row r's the first `columns`
    draws of a generator seeded with row_seed(seed, first_row + r), so that the draw of a row's token at
    response column c depends on (seed, row, c) alone: not on the other rows, the batch size or the
    chunk, nor on `columns` (a longer stream has the shorter one as its prefix)."""
    out = torch.empty((rows, columns), dtype=torch.float64)
    generator = torch.Generator()
    for r in range(rows):
        generator.manual_seed(row_seed(seed, first_row + r))
        torch.rand(columns, generator=generator, dtype=torch.float64, out=out[r])
    return out.to(device)


def next_token(logits: torch.Tensor, temperature: float, top_p: float,
                generator: torch.Generator | None, u: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row from [A, V] `logits` at `temperature` within the top-p nucleus, with its logprob
    ([A] long, [A] float32), drawn from `generator` or with the given uniforms `u` ([A, 1]).
    temperature=0 is greedy: the most likely token, and the logprob of the untempered model."""
    if temperature == 0:
        scaled = logits.float()  # [A, V]
        token = scaled.argmax(-1)  # [A]
        return token, torch.log_softmax(scaled, dim=-1).gather(-1, token[:, None]).squeeze(-1)
    scaled = logits.float() if temperature == 1.0 else logits.float() / temperature  # [A, V]
    if u is not None:
        return sample_top_p(scaled, top_p, u=u)
    return sample_top_p(scaled, top_p, generator)
