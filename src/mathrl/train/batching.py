"""The step's record of its samples (`Rows`: the engine's `RolloutBatch` with the loss mask, extended by
`TrainBatch` and `ValueBatch`), and its split into micro-batches (one forward/backward each, sized by a
token budget), trimming padding as it goes."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mathrl.rollout.base import RolloutBatch


@dataclass(kw_only=True)
class Rows(RolloutBatch):
    """The engine's rows (`RolloutBatch`, every tensor under its name) with what the step adds before any
    pass: the loss mask and correctness (`train/collect.py:prepare`; SFT's examples too, with no sampling
    logprobs). The stages after it extend it: the scoring pass and the advantages make it a `TrainBatch`,
    critic pretraining's value targets a `ValueBatch`.

    Prompt-side tensors are [N, P] (left-padded); every other 2-D tensor is response-side [N, T]
    (right-padded), as are 3-D ones [N, T, K]; 1-D tensors are per row [N]. `select`, `to` and `trimmed` keep the
    record's type.
    """

    loss_mask: torch.Tensor  # [N, T] float: 1 on tokens that count in the loss (filters may zero rows)
    correct: torch.Tensor  # [N] float, 1 if the verifier accepted the answer

    def trimmed(self):
        """Drop prompt columns that are padding in every row (left) and response columns likewise (right)."""
        prompt_keep = max(1, int(self.prompt_mask.sum(-1).max().item()))
        used = (self.context_mask.sum(0) > 0).nonzero()
        response_keep = int(used.max().item()) + 1 if len(used) else 1
        p = self.prompt_ids.shape[1]
        out = {}
        for name, x in self.tensors().items():
            if x is None:
                out[name] = None
            elif name.startswith("prompt_"):
                out[name] = x[:, p - prompt_keep :]
            elif x.dim() >= 2:  # response-side [N, T] (and [N, T, K]: the teacher's top-k)
                out[name] = x[:, :response_keep]
            else:
                out[name] = x
        return type(self)(**out)


@dataclass(kw_only=True)
class TrainBatch(Rows):
    """The rows with everything the policy (and critic) update reads, set once by the step
    (`train/step.py:train_batch`) from the scoring pass and the advantages."""

    old_logprobs: torch.Tensor  # [N, T] logprobs under the policy that sampled (the trainer's, or the engine's standing in)
    advantages: torch.Tensor  # [N, T] per-token advantages
    ref_logprobs: torch.Tensor  # [N, T] reference-model logprobs (zeros when no term needs them)
    ref_entropy: torch.Tensor  # [N, T] reference-model entropy (zeros when no term needs it)
    is_weights: torch.Tensor | None = None  # [N, T] importance weights of the policy-gradient term (Config.correction), None = 1
    old_values: torch.Tensor | None = None  # [N, T] critic values at sampling time (PPO with a critic only)
    returns: torch.Tensor | None = None  # [N, T] value targets (PPO with a critic only)
    teacher_logprobs: torch.Tensor | None = None  # [N, T] the teacher's logprobs of the sampled tokens (algo.distill)
    teacher_topk_ids: torch.Tensor | None = None  # [N, T, K] long: the teacher's top-k token ids (forward_kl_topk, jsd)
    teacher_topk_logprobs: torch.Tensor | None = None  # [N, T, K] ... and its logprobs of them


@dataclass(kw_only=True)
class ValueBatch(Rows):
    """The rows with value targets only: critic pretraining (`train/critic.py:pretrain_critic`)."""

    old_values: torch.Tensor  # [N, T] the critic's values of the sampled responses
    returns: torch.Tensor  # [N, T] the value targets


def micro_batch_slices(lengths: list[tuple[int, int]], token_budget: int) -> list[list[int]]:
    """Group consecutive rows so that a trimmed micro-batch (rows x (longest prompt + longest response))
    holds at most token_budget tokens; a row over budget on its own still gets a group.

    lengths: (prompt length, response length) of each row.
    """
    groups: list[list[int]] = []
    current: list[int] = []
    longest_p = longest_r = 0
    for i, (p, r) in enumerate(lengths):
        width = max(longest_p, p) + max(longest_r, r)
        if current and (len(current) + 1) * width > token_budget:
            groups.append(current)
            current, longest_p, longest_r = [], 0, 0
        current.append(i)
        longest_p, longest_r = max(longest_p, p), max(longest_r, r)
    if current:
        groups.append(current)
    return groups


def row_lengths(batch: Rows) -> list[tuple[int, int]]:
    return list(zip(batch.prompt_mask.sum(-1).long().tolist(), batch.context_mask.sum(-1).long().tolist()))


def micro_batches(batch: Rows, token_budget: int) -> list[Rows]:
    """`batch` cut into micro-batches of consecutive rows (`micro_batch_slices`), each trimmed; each keeps `batch`'s type."""
    return [batch.select(rows).trimmed() for rows in micro_batch_slices(row_lengths(batch), token_budget)]
