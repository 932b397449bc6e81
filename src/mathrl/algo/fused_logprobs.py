"""log pi(target) and entropy over the whole vocabulary, chunk by chunk, with a hand-written backward.

`algo.entropy.logprobs_and_entropy` calls this: the hot spot of every scoring pass and update. The
backward recomputes one chunk's logits and writes their gradient in closed form, in place; the forward
keeps nothing of size V, only each position's logsumexp and entropy. With z = logits / temperature,
p = softmax(z) and H = -sum p log p, for upstream gradients a (logprob) and b (entropy) per position:

    dL/dz = a * onehot(target) - p * (a + b * (log p + H))

Derivation, and what it saves against a checkpointed chunk function: docs/performance.md,
"Kept: logprobs and entropy with a closed-form backward".

    python -m pytest tests/algo/test_entropy_kl.py -q     # values and gradients against autograd (float64)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["fused_logprobs_entropy"]


def _tempered_logits(hidden: Tensor, weight: Tensor, bias: Tensor | None, temperature: float, dtype: torch.dtype) -> Tensor:
    """[C, V] logits / temperature in `dtype` (at least float32: the softmax sums ~1e5 terms). A fresh tensor."""
    logits = F.linear(hidden, weight, bias)
    logits = logits.to(dtype) if logits.dtype != dtype else logits
    if temperature != 1.0:
        logits = logits.div_(temperature)
    return logits


class _LogprobsEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, chunk_size, with_entropy):
        out_dtype = torch.promote_types(torch.promote_types(hidden.dtype, weight.dtype), torch.float32)
        n = hidden.shape[0]
        logprobs = torch.empty(n, dtype=out_dtype, device=hidden.device)
        lse_all = torch.empty(n, dtype=out_dtype, device=hidden.device)  # logsumexp(z) per position
        entropy = torch.zeros(n if with_entropy else 0, dtype=out_dtype, device=hidden.device)
        for s in range(0, n, chunk_size):
            e = min(s + chunk_size, n)
            z = _tempered_logits(hidden[s:e], weight, bias, temperature, out_dtype)  # [C, V]
            top = z.amax(dim=-1, keepdim=True)  # [C, 1]
            z.sub_(top)  # max entry 0: exp cannot overflow, and H's two terms stay small
            p = torch.exp(z)  # [C, V], unnormalised
            total = p.sum(dim=-1, keepdim=True)  # [C, 1]
            lse = total.log()  # [C, 1] logsumexp of the shifted logits, in [0, log V]
            logprobs[s:e] = z.gather(-1, targets[s:e, None]).squeeze(-1) - lse.squeeze(-1)
            lse_all[s:e] = (lse + top).squeeze(-1)
            if with_entropy:
                p.div_(total)  # softmax
                # H = lse - sum_v p_v z_v: a row-wise dot product, no [C, V] temporary
                entropy[s:e] = lse.squeeze(-1) - torch.bmm(p.unsqueeze(1), z.unsqueeze(2)).reshape(-1)
        ctx.save_for_backward(hidden, weight, bias, targets, lse_all, entropy)
        ctx.temperature, ctx.chunk_size, ctx.with_entropy = temperature, chunk_size, with_entropy
        ctx.out_dtype = out_dtype
        if not with_entropy:
            ctx.mark_non_differentiable(entropy)
        return logprobs, entropy

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropy):
        hidden, weight, bias, targets, lse_all, entropy = ctx.saved_tensors
        temperature, chunk_size, dtype = ctx.temperature, ctx.chunk_size, ctx.out_dtype
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        n = hidden.shape[0]
        if grad_logprobs is None:
            grad_logprobs = torch.zeros(n, dtype=dtype, device=hidden.device)
        use_entropy = ctx.with_entropy and grad_entropy is not None
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros_like(weight) if need_w else None
        grad_b = torch.zeros(weight.shape[0], dtype=dtype, device=weight.device) if need_b else None
        for s in range(0, n, chunk_size):
            e = min(s + chunk_size, n)
            a = grad_logprobs[s:e, None].to(dtype)  # [C, 1]
            g = _tempered_logits(hidden[s:e], weight, bias, temperature, dtype)  # [C, V] z
            g.sub_(lse_all[s:e, None])  # log p
            p = torch.exp(g)  # [C, V]
            if use_entropy:
                b = grad_entropy[s:e, None].to(dtype)  # [C, 1]
                g.add_(entropy[s:e, None]).mul_(b).add_(a).mul_(p).neg_()  # -p * (a + b * (log p + H))
            else:
                g = p.mul_(-a)  # -p * a
            g.scatter_add_(-1, targets[s:e, None], a)  # + a * onehot(target)
            if temperature != 1.0:
                g.div_(temperature)  # dz/dlogits = 1 / temperature
            g_in = g.to(weight.dtype)
            if need_h:
                grad_h[s:e] = (g_in @ weight).to(hidden.dtype)
            if need_w:
                grad_w.addmm_(g_in.t(), hidden[s:e].to(weight.dtype))
            if need_b:
                grad_b += g.sum(0)
        if grad_b is not None:
            grad_b = grad_b.to(bias.dtype)
        return grad_h, grad_w, grad_b, None, None, None, None


def fused_logprobs_entropy(
    hidden: Tensor,  # [N, H]
    weight: Tensor,  # [V, H]
    bias: Tensor | None,  # [V] or None
    targets: Tensor,  # [N] long
    *,
    temperature: float,
    chunk_size: int,
    with_entropy: bool,
) -> tuple[Tensor, Tensor | None]:
    """(logprobs [N], entropy [N] or None) of softmax((hidden @ weight.T + bias) / temperature) at
    `targets`, chunk_size positions at a time; differentiable in hidden, weight and bias (first order).

    Output dtype: float32, or float64 for float64 inputs. Peak extra memory: two [chunk_size, V]
    buffers. The logits must be finite (an output projection's are).
    """
    logprobs, entropy = _LogprobsEntropy.apply(hidden, weight, bias, targets, temperature, chunk_size, with_entropy)
    return logprobs, (entropy if with_entropy else None)
