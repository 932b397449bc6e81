"""Policy losses and loss aggregation, two independent switches (STYLE.md rule 4):

* ``policy_loss`` returns the *per-token* PPO clipped surrogate (clip-higher, optional dual clip).
* ``aggregate`` turns any per-token loss into a scalar (``algo.loss_agg``: the normalisation), dividing by counts over the
  WHOLE mini-batch (all micro-batches, all data-parallel ranks): summed micro-batch losses are exactly the full-batch loss.

    num_tokens, num_seqs = global_counts(minibatch_mask)        # once per mini-batch
    for micro in micro_batches:
        per_token, stats = policy_loss(lp, micro.old_lp, micro.adv, micro.mask)
        loss = aggregate(per_token, micro.mask, mode=cfg.algo.loss_agg, num_tokens=num_tokens,
                         num_seqs=num_seqs, max_len=cfg.rollout.max_new_tokens)
        (loss * dp_scale()).backward()                           # DDP/FSDP average the grads

Masks are [B, T] float or bool; any nonzero entry counts as one token (masks are not weights). Tests:
``python -m pytest tests/algo/test_losses.py tests/algo/test_aggregation_invariance.py -q``.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = [
    "AggMode",
    "AGG_MODES",
    "masked_sum",
    "masked_mean",
    "policy_loss",
    "aggregate",
    "batch_counts",
    "global_counts",
    "dp_scale",
    "sft_loss",
    "positive_example_lm_loss",
]

AggMode = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"]
AGG_MODES: tuple[str, ...] = (
    "token_mean",
    "seq_mean_token_mean",
    "seq_mean_token_sum",
    "seq_mean_token_sum_norm",
)

# Bound on |logprobs - old_logprobs| before exp(): exp(20) ~ 4.9e8 is finite in float32 and bf16,
# so a wildly off-policy token cannot produce inf/NaN (verl clamps the log-ratio the same way).
_LOG_RATIO_CLAMP = 20.0


def _check_same_shape(**tensors: Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) != 1:
        raise ValueError(f"tensors must have the same shape, got {shapes}")


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of ``x`` over entries where ``mask`` is nonzero.

    Masked entries are selected away (``torch.where``), not multiplied by 0, so inf/NaN at padding
    positions (e.g. logprobs of pad tokens) cannot leak into the sum or its gradient.

    x: [...] values; mask: the same shape as ``x``, nonzero where counted; dim: the dimension to reduce, None
    reduces everything. -> [] if ``dim`` is None, else ``x`` with ``dim`` removed.
    """
    _check_same_shape(x=x, mask=mask)
    selected = torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device))
    return selected.sum() if dim is None else selected.sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None, *, eps: float = 1e-8) -> Tensor:
    """Mean of ``x`` over entries where ``mask`` is nonzero; 0 where nothing is counted.

    x: [...] values; mask: the same shape as ``x``; dim: the dimension to reduce, None reduces everything; eps:
    a lower bound of the count, so an all-masked slice gives 0 instead of NaN. -> [] if ``dim`` is None, else
    ``x`` with ``dim`` removed.
    """
    count = mask.bool().sum() if dim is None else mask.bool().sum(dim)
    return masked_sum(x, mask, dim) / count.to(x.dtype).clamp_min(eps)


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    dual_clip_c: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token PPO clipped surrogate loss with decoupled clip range and optional dual clip.

    ratio  = exp(clamp(logprobs - old_logprobs, -20, 20))
    loss   = -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A)
        PPO (Schulman et al. 2017, eq. 7) with clip-higher: a larger upper bound eps_high lets
        low-probability tokens with A > 0 grow, which delays entropy collapse (DAPO, Yu et al.
        2025, §3.1 "Clip-Higher"). eps_low = eps_high = 0.2 is plain PPO/GRPO.
    dual clip (Ye et al. 2020, "Mastering Complex Control in MOBA Games with Deep RL", dual-clip PPO):
        for A < 0 the objective is max(min(ratio*A, clip(ratio)*A), c*A), i.e. the loss becomes
        min(loss, -c * A) = min(loss, c * |A|). It caps the loss of a token whose ratio exploded
        (ratio > c) while its advantage is negative; that token then has zero gradient.

    The log-ratio clamp to [-20, 20] only keeps exp() finite; inside it the math is exact.

    logprobs: [B, T] log pi_theta of the sampled tokens (differentiable); old_logprobs: [B, T] log pi_old of the
    same tokens (behaviour policy, no grad); advantages: [B, T] per-token advantages (see
    ``advantages.expand_to_tokens``); mask: [B, T] nonzero on tokens that count; eps_low: the lower clip,
    ratio >= 1 - eps_low; eps_high: the upper clip, ratio <= 1 + eps_high (clip-higher when > eps_low);
    dual_clip_c: the dual-clip constant c > 1 (3.0 in Ye et al. 2020), or None to disable.

    -> (loss, stats): loss is the [B, T] per-token loss, NOT aggregated (use ``aggregate``), 0 at masked tokens;
    stats holds per-token float tensors [B, T] for metrics (average them with ``masked_mean``), detached and 0
    at masked tokens: ``clipped``, the eps clip is active, so the token's gradient is zero because of it: (A > 0
    and ratio > 1 + eps_high) or (A < 0 and ratio < 1 - eps_low); ``dual_clipped``, A < 0 and the dual-clip
    bound -c*A is the active branch; ``ppo_kl``, old_logprobs - logprobs (the k1 estimate of
    KL(pi_old || pi_theta)); ``ratio``, the importance ratio.
    """
    _check_same_shape(logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages, mask=mask)
    if eps_low < 0 or eps_high < 0:
        raise ValueError(f"eps_low and eps_high must be >= 0, got {eps_low} and {eps_high}")
    if dual_clip_c is not None and dual_clip_c <= 1.0:
        raise ValueError(
            f"dual_clip_c must be > 1 (Ye et al. 2020), got {dual_clip_c}; use None to disable"
        )
    m = mask.bool()
    zeros = torch.zeros_like(logprobs)

    log_ratio = (logprobs - old_logprobs).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)  # [B, T]
    ratio = torch.exp(log_ratio)  # [B, T]
    lower, upper = 1.0 - eps_low, 1.0 + eps_high
    loss_unclipped = -advantages * ratio  # [B, T]
    loss_clipped = -advantages * ratio.clamp(lower, upper)  # [B, T]
    # -min(a, b) == max(-a, -b): the pessimistic (larger) loss wins.
    loss = torch.maximum(loss_unclipped, loss_clipped)  # [B, T]
    clipped = ((advantages > 0) & (ratio > upper)) | ((advantages < 0) & (ratio < lower))

    if dual_clip_c is not None:
        dual_bound = -dual_clip_c * advantages  # [B, T], positive where A < 0
        dual_clipped = (advantages < 0) & (loss > dual_bound)
        loss = torch.where(dual_clipped, dual_bound, loss)
    else:
        dual_clipped = torch.zeros_like(m)

    loss = torch.where(m, loss, zeros)
    with torch.no_grad():
        stats = {
            "clipped": (clipped & m).to(logprobs.dtype),
            "dual_clipped": (dual_clipped & m).to(logprobs.dtype),
            "ppo_kl": torch.where(m, old_logprobs - logprobs, zeros),
            "ratio": torch.where(m, ratio, zeros),
        }
    return loss, stats


def aggregate(
    loss: Tensor,
    mask: Tensor,
    *,
    mode: AggMode,
    num_tokens: float,
    num_seqs: float,
    max_len: int | None = None,
) -> Tensor:
    """Reduce a per-token loss to a scalar with GLOBAL normalisers (config ``algo.loss_agg``).

    With len_i the number of counted tokens of sequence i, and num_tokens / num_seqs counted over
    the whole mini-batch on all ranks (``global_counts``):

    ``token_mean``               sum_{i,t} l_it / num_tokens
        DAPO token-level policy gradient loss (Yu et al. 2025, §3.3); every token weighs the same.
    ``seq_mean_token_mean``      sum_i (sum_t l_it / max(len_i, 1)) / num_seqs
        Original GRPO (Shao et al. 2024, eq. 3): mean over tokens, then over sequences.
    ``seq_mean_token_sum``       sum_{i,t} l_it / num_seqs
        Sum over tokens, mean over sequences (no length normalisation at all).
    ``seq_mean_token_sum_norm``  sum_{i,t} l_it / (max_len * num_seqs)
        Dr. GRPO (Liu et al. 2025, §3.1): a constant per-sequence normaliser removes the length
        bias. ``max_len`` must be a constant (the generation budget, e.g. max response length),
        never the padded width of a micro-batch, or the split would change the gradient.

    Because every normaliser is global and every term is per sequence, the sum of ``aggregate``
    over micro-batches equals ``aggregate`` of the full mini-batch (micro-batches hold whole
    sequences, i.e. they split rows, never a row's tokens). Under data parallelism with
    gradient averaging (DDP/FSDP default) the loop multiplies the loss by ``dp_scale()`` so that
    the average of the ranks' gradients is the gradient of the global loss.

    A sequence with no counted token contributes 0 and is not counted in num_seqs (see
    ``batch_counts``). If num_tokens or num_seqs is 0 nothing is counted and the result is 0.

    loss: [B, T] per-token loss; mask: [B, T] nonzero on counted tokens; mode: one of ``AGG_MODES``; num_tokens:
    counted tokens in the whole mini-batch (all micro-batches, all ranks); num_seqs: sequences with >= 1 counted
    token in the whole mini-batch; max_len: the constant normaliser, required by ``seq_mean_token_sum_norm``.
    -> [] the scalar loss.
    """
    _check_same_shape(loss=loss, mask=mask)
    if loss.dim() != 2:
        raise ValueError(f"loss must be [B, T], got {tuple(loss.shape)}")
    if num_tokens < 0 or num_seqs < 0:
        raise ValueError(f"num_tokens and num_seqs must be >= 0, got {num_tokens}, {num_seqs}")
    # max(., 1): when a count is 0 every masked sum is 0 too, and 0/1 = 0 is the right answer.
    if mode == "token_mean":
        return masked_sum(loss, mask) / max(float(num_tokens), 1.0)
    if mode == "seq_mean_token_mean":
        seq_len = mask.bool().sum(-1).to(loss.dtype).clamp_min(1)  # [B]
        per_seq = masked_sum(loss, mask, -1) / seq_len  # [B]
        return per_seq.sum() / max(float(num_seqs), 1.0)
    if mode == "seq_mean_token_sum":
        return masked_sum(loss, mask) / max(float(num_seqs), 1.0)
    if mode == "seq_mean_token_sum_norm":
        if max_len is None or max_len <= 0:
            raise ValueError(
                "mode 'seq_mean_token_sum_norm' (Dr. GRPO) needs max_len > 0: pass the generation "
                f"budget (max response length), got {max_len}"
            )
        return masked_sum(loss, mask) / (float(max_len) * max(float(num_seqs), 1.0))
    raise ValueError(f"unknown loss aggregation mode {mode!r}; choose one of {AGG_MODES}")


def batch_counts(mask: Tensor) -> tuple[float, float]:
    """Normalisers of ``aggregate`` for one tensor.

    mask: [B, T] nonzero on counted tokens -> (num_tokens, num_seqs): the counted tokens, and the sequences with
    at least one counted token. A fully masked sequence (e.g. filtered out, or truncated with its loss masked)
    has no tokens to learn from, so it does not dilute the others by counting in num_seqs.
    """
    if mask.dim() != 2:
        raise ValueError(f"mask must be [B, T], got {tuple(mask.shape)}")
    m = mask.bool()
    return float(m.sum().item()), float(m.any(-1).sum().item())


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def global_counts(mask: Tensor, *, group: dist.ProcessGroup | None = None) -> tuple[float, float]:
    """``batch_counts`` summed over all ranks of ``group`` when torch.distributed is initialised.

    Call it once per mini-batch with the mask of this rank's whole mini-batch (all its
    micro-batches), then pass the result to every ``aggregate`` call of that mini-batch.

    mask: [B, T] this rank's mini-batch mask; group: the process group to reduce over, None for the default
    (world) group. -> (num_tokens, num_seqs) over the whole mini-batch of all ranks; the local counts when
    torch.distributed is not initialised.
    """
    num_tokens, num_seqs = batch_counts(mask)
    if not _distributed():
        return num_tokens, num_seqs
    device = mask.device
    if dist.get_backend(group) == "nccl" and device.type != "cuda":
        # NCCL only reduces CUDA tensors; the counts are tiny, so where they live does not matter.
        device = torch.device("cuda", torch.cuda.current_device())
    counts = torch.tensor([num_tokens, num_seqs], dtype=torch.float64, device=device)
    dist.all_reduce(counts, op=dist.ReduceOp.SUM, group=group)
    return float(counts[0].item()), float(counts[1].item())


def dp_scale(*, group: dist.ProcessGroup | None = None) -> float:
    """Factor the loop multiplies each rank's loss by before ``backward``.

    DDP and FSDP *average* gradients over ranks. ``aggregate`` already divides by global counts, so
    each rank's loss is its share of the global loss and the right gradient is the *sum* over
    ranks; multiplying by the world size turns the average back into that sum.

    -> the torch.distributed world size of ``group`` when initialised, else 1.0.
    """
    return float(dist.get_world_size(group)) if _distributed() else 1.0


def sft_loss(logprobs: Tensor, mask: Tensor) -> Tensor:
    """Per-token negative log-likelihood, 0 at masked tokens (for the pretraining/PTX term and
    ``positive_example_lm_loss``); aggregate it with ``aggregate``.

    logprobs: [B, T] log-probabilities of the target tokens; mask: [B, T] nonzero on counted tokens.
    -> [B, T] -logprobs where counted, else 0.
    """
    _check_same_shape(logprobs=logprobs, mask=mask)
    return torch.where(mask.bool(), -logprobs, torch.zeros_like(logprobs))


def positive_example_lm_loss(
    logprobs: Tensor,
    mask: Tensor,
    rewards_or_correct: Tensor,
    *,
    threshold: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """VAPO positive-example LM loss (Yue et al. 2025, "VAPO", §3.3 "Positive Example LM Loss"):
    NLL on the tokens of correct responses, normalised by the number of tokens of correct responses
    and added to the PPO loss with weight mu (0.1 in the paper).

    The caller aggregates with ``mode="token_mean"`` and the (global) token count of the returned
    mask, e.g. ``aggregate(loss, correct_mask, mode="token_mean", num_tokens=n_correct_tokens, ...)``
    where ``n_correct_tokens = global_counts(correct_mask_of_minibatch)[0]``.

    logprobs: [B, T] log pi_theta of the sampled tokens; mask: [B, T] nonzero on counted tokens;
    rewards_or_correct: [B] bool correctness, or float rewards where reward > ``threshold`` means correct (pass
    the verifier's bool when reward shaping could push a correct answer's reward to or below the threshold);
    threshold: the reward above which a float reward counts as correct. -> (loss [B, T]: the per-token NLL, 0
    outside correct responses' counted tokens; correct_mask [B, T] float: 1 on counted tokens of correct
    responses).
    """
    _check_same_shape(logprobs=logprobs, mask=mask)
    if rewards_or_correct.shape != logprobs.shape[:1]:
        raise ValueError(
            f"rewards_or_correct must be [B] = {tuple(logprobs.shape[:1])}, "
            f"got {tuple(rewards_or_correct.shape)}"
        )
    if rewards_or_correct.dtype == torch.bool:
        correct = rewards_or_correct
    else:
        correct = rewards_or_correct > threshold  # [B]
    correct_mask = mask.bool() & correct.unsqueeze(-1)  # [B, T]
    return sft_loss(logprobs, correct_mask), correct_mask.to(logprobs.dtype)
