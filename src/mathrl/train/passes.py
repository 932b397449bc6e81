"""The no-grad per-token passes over a batch's rows: the old policy's logprobs and entropy, the
reference's, the teacher's, sum_v pi_v^2 for the optimal token baseline, the critic's values; each in
token-budget micro-batches, in the policy's autocast, on the rows this rank holds.
"""

from __future__ import annotations

import torch

import mathrl.train.dist as tdist
from mathrl.config import Config
from mathrl.model.dtypes import autocast
from mathrl.model.scoring import input_device, response_logprobs, response_sum_pi_squared
from mathrl.train.batching import Rows, micro_batch_slices, row_lengths


@torch.no_grad()
def per_token_pass(model, batch: Rows, cfg: Config, forward, *, rows: list[int] | None = None) -> list[torch.Tensor]:
    """Run `forward(model, micro_batch) -> [n, t] (or [n, t, k]) tensors` over no-grad micro-batches of `batch`,
    the model in eval mode; returns each output as [N, T] (or [N, T, K]) on CPU, float32 unless it is an integer
    tensor, 0 at masked positions.

    With several ranks each computes only its `rows` (global row indices) and the outputs are summed
    over ranks (disjoint rows, zeros elsewhere: exact). A rank with fewer micro-batches than another
    runs throw-away forwards so that every rank makes the same sharded-model calls.
    """
    was_training = model.training
    model.eval()
    own = list(range(len(batch))) if rows is None else list(rows)
    slices = [[own[i] for i in s] for s in micro_batch_slices(row_lengths(batch.select(own)), cfg.train.micro_batch_tokens * 4)] if own else []
    calls = tdist.all_reduce_max(len(slices))  # no activations kept: a 4x larger budget
    outputs: list[torch.Tensor] = []
    for k in range(calls):
        real = k < len(slices)
        with autocast(cfg.model.dtype, input_device(model)):
            parts = forward(model, batch.select(slices[k] if real else [0]).trimmed())
        if not outputs:
            outputs = [batch.response_mask.new_zeros((*batch.response_mask.shape, *part.shape[2:]),
                                                     dtype=part.dtype if not part.is_floating_point() else None)
                       for part in parts]
        if real:
            idx = (torch.as_tensor(slices[k])[:, None], torch.arange(parts[0].shape[1])[None, :])
            for out, part in zip(outputs, parts):
                out[idx] = part.to(out.dtype).cpu()
    model.train(was_training)
    outputs = [tdist.all_reduce_sum_tensor(out) for out in outputs]
    masks = [batch.response_mask.view(*batch.response_mask.shape, *[1] * (out.dim() - 2)) for out in outputs]
    return [out * (mask if out.is_floating_point() else mask.to(out.dtype)) for out, mask in zip(outputs, masks)]


def engine_logprobs_are_old(cfg: Config, model) -> bool:
    """train.old_logprobs: whether the rollout engine's sampling logprobs stand in for the old-policy
    logprobs (no scoring pass). `auto` says yes only where they are the trainer's own to float
    rounding (`Config.engine_logprobs_not_old`: e.g. the torch engine samples from these very float32
    weights, tests/train/test_old_logprobs.py measures the gap, ~1e-6) and no FSDP-sharded model is involved."""
    from torch.distributed.fsdp import FSDPModule

    mode = cfg.train.old_logprobs
    if mode != "auto":
        return mode == "reuse_engine"
    return cfg.engine_logprobs_not_old() is None and not isinstance(model, FSDPModule)


def scoring_pass(model, batch: Rows, cfg: Config, *, with_entropy: bool,
                 rows: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, T] logprobs (and entropy, zeros if not asked) of the sampled tokens under `model`, no grad
    (each rank scores its `rows`, see `per_token_pass`)."""

    def forward(model, mb: Rows) -> list[torch.Tensor]:
        lp, ent = response_logprobs(
            model, mb.prompt_ids, mb.prompt_mask, mb.response_ids, mb.context_mask,
            temperature=cfg.rollout.temperature, chunk_size=cfg.model.logprob_chunk_size, with_entropy=with_entropy,
        )
        return [lp, ent if ent is not None else torch.zeros_like(lp)]

    logprobs, entropy = per_token_pass(model, batch, cfg, forward, rows=rows)
    return logprobs, entropy


def sum_pi_squared_pass(model, batch: Rows, cfg: Config, *, rows: list[int] | None = None) -> torch.Tensor:
    """[N, T] sum_v pi_v^2 of each response position's next-token distribution under `model`, no grad
    (the estimators with needs_policy_stats: the optimal token baseline)."""

    def forward(model, mb: Rows) -> list[torch.Tensor]:
        return [response_sum_pi_squared(model, mb.prompt_ids, mb.prompt_mask, mb.response_ids, mb.context_mask,
                                        temperature=cfg.rollout.temperature, chunk_size=cfg.model.logprob_chunk_size)]

    return per_token_pass(model, batch, cfg, forward, rows=rows)[0]
