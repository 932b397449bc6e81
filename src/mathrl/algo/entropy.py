"""Token entropy and memory-bounded log-probabilities.

* ``entropy_from_logits``: exact entropy of softmax(logits) over the vocabulary.
* ``logprobs_and_entropy``: log pi(target) and entropy from the last hidden states, computed chunk
  by chunk so peak memory is O(chunk_size * V) instead of O(B * T * V) (a 7B model's vocabulary is
  ~150k: the full float32 logits of 16 x 8k tokens would need ~80 GB).
* ``entropy_bonus_mask``: which tokens receive the entropy bonus under the ``ref_gain_clip`` guard.

Note on naming (STYLE.md rule 11): the entropy here is the exact entropy of the full next-token
distribution, sum_v -p_v log p_v, not the mean negative log-prob of the sampled tokens.

Run the tests with ``python -m pytest tests/algo/test_entropy_kl.py -q``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mathrl.algo.fused_logprobs import fused_logprobs_entropy

__all__ = ["entropy_from_logits", "logprobs_and_entropy", "entropy_bonus_mask"]


def _upcast(x: Tensor) -> Tensor:
    """bf16/fp16 logits become float32 (softmax sums over ~1e5 terms); float64 stays float64."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _shifted_log_softmax_parts(logits: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Returns (z, lse_z, p): logits shifted by their max, logsumexp(z) [..., 1], softmax [..., V].

    Shifting by the (detached) max does not change softmax or entropy, and keeps the terms of
    H = logsumexp(z) - sum p z small (logsumexp(z) lies in [0, log V]), so no large cancellation.
    """
    x = _upcast(logits)
    z = x - x.amax(dim=-1, keepdim=True).detach()  # [..., V], max entry 0
    lse = torch.logsumexp(z, dim=-1, keepdim=True)  # [..., 1]
    p = torch.exp(z - lse)  # [..., V]
    return z, lse, p


def _entropy_from_parts(z: Tensor, lse: Tensor, p: Tensor) -> Tensor:
    # -inf logits (vocabulary masking) have p = 0: define p * z = 0 there instead of 0 * -inf = NaN.
    # Selecting z (not the product) keeps the backward NaN-free as well.
    z_safe = torch.where(p > 0, z, torch.zeros_like(z))
    return lse.squeeze(-1) - (p * z_safe).sum(-1)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Exact entropy of softmax(logits): H = logsumexp(x) - sum_v softmax(x)_v x_v.

    Numerically stable (max-shifted, computed in at least float32) and differentiable; logits of
    -inf (masked vocabulary entries) contribute 0.

    logits: [..., V] unnormalised scores -> [...] the entropy in nats, float32 (float64 for float64 input).
    """
    return _entropy_from_parts(*_shifted_log_softmax_parts(logits))


def logprobs_and_entropy(
    hidden: Tensor,
    lm_head_weight: Tensor,
    targets: Tensor,
    *,
    chunk_size: int = 1024,
    temperature: float = 1.0,
    with_entropy: bool = True,
    lm_head_bias: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """log pi(target) and the entropy of pi at every position, without materialising [B, T, V].

    The B*T positions are flattened and processed ``chunk_size`` at a time: logits = hidden @ W^T
    (+ b), divided by ``temperature`` (``algo.fused_logprobs``). The forward keeps only each
    position's logsumexp and entropy; the backward recomputes one chunk's logits at a time and writes
    their gradient in closed form, so neither pass ever holds more than one chunk of [chunk_size, V]
    logits. Cost: the lm-head matmul runs twice (forward, and once more in the backward).

    ``temperature`` must equal the sampling temperature of the rollout engine, otherwise these
    logprobs and the engine's old logprobs describe different distributions.

    hidden: [B, T, H] final hidden states at the positions that predict ``targets``; lm_head_weight: [V, H] the
    output embedding; targets: [B, T] token ids in [0, V) (padding positions must still hold a valid id, e.g.
    the pad id, not -100; mask their outputs afterwards); chunk_size: positions per chunk, peak logits memory
    chunk_size * V * 4 bytes; temperature: > 0, the logits are divided by it; with_entropy: also return the
    entropy (skip it to save work); lm_head_bias: [V] an optional output bias. -> (logprobs [B, T] float32
    (float64 for float64 inputs), entropy [B, T]: the exact entropy of the tempered distribution, or None if not
    requested).
    """
    if hidden.dim() != 3:
        raise ValueError(f"hidden must be [B, T, H], got {tuple(hidden.shape)}")
    batch, length, width = hidden.shape
    if targets.shape != (batch, length):
        raise ValueError(f"targets must be [B, T] = {(batch, length)}, got {tuple(targets.shape)}")
    if lm_head_weight.dim() != 2 or lm_head_weight.shape[1] != width:
        raise ValueError(f"lm_head_weight must be [V, {width}], got {tuple(lm_head_weight.shape)}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")

    flat_hidden = hidden.reshape(batch * length, width)  # [N, H]
    flat_targets = targets.reshape(batch * length)  # [N]
    if batch * length == 0:
        out_dtype = torch.promote_types(torch.promote_types(hidden.dtype, lm_head_weight.dtype), torch.float32)
        empty = hidden.new_zeros((batch, length), dtype=out_dtype)
        return empty, (empty.clone() if with_entropy else None)
    logprobs, entropy = fused_logprobs_entropy(
        flat_hidden, lm_head_weight, lm_head_bias, flat_targets,
        temperature=temperature, chunk_size=chunk_size, with_entropy=with_entropy,
    )
    return logprobs.reshape(batch, length), (entropy.reshape(batch, length) if with_entropy else None)


def entropy_bonus_mask(
    entropy: Tensor,
    ref_entropy: Tensor,
    mask: Tensor,
    *,
    max_gain: float | None,
    max_ratio: float | None,
) -> Tensor:
    """Tokens that receive the entropy bonus under the ``ref_gain_clip`` guard.

    An entropy bonus rewards raising entropy everywhere, and can blow it up on tokens where the
    model is already far more uncertain than it was before RL (the "entropy explosion" that makes
    a fixed bonus coefficient fragile; Skywork-OR1, He et al. 2025, "Adaptive Entropy Control").
    This guard drops the bonus on exactly those tokens, using the reference (initial) model's
    entropy at the same position as the yardstick. It is a mathrl safeguard, not a published
    method, and only changes which tokens the bonus touches, never the policy loss.

    A token is excluded (0) when either enabled threshold is exceeded:
        entropy - ref_entropy > max_gain        (absolute gain, in nats)
        entropy > max_ratio * ref_entropy       (relative gain)
    Config ``algo.entropy.ref_gain_clip.max_gain`` / ``algo.entropy.ref_gain_clip.max_ratio``;
    None disables a threshold (both None: the result equals the mask).

    entropy: [B, T] policy entropy per token; ref_entropy: [B, T] the reference model's entropy at the same
    positions; mask: [B, T] nonzero on counted tokens. -> [B, T] float mask (dtype of ``entropy``): 1 where the
    bonus applies, else 0; use it as the mask when aggregating the entropy term. Not differentiable (it is a
    selection).
    """
    if not (entropy.shape == ref_entropy.shape == mask.shape):
        raise ValueError(
            f"entropy, ref_entropy and mask must have the same shape, got {tuple(entropy.shape)}, "
            f"{tuple(ref_entropy.shape)}, {tuple(mask.shape)}"
        )
    h, h_ref = entropy.detach(), ref_entropy.detach()
    keep = mask.bool()
    if max_gain is not None:
        keep = keep & ~(h - h_ref > max_gain)
    if max_ratio is not None:
        keep = keep & ~(h > max_ratio * h_ref)
    return keep.to(entropy.dtype if entropy.is_floating_point() else torch.get_default_dtype())
