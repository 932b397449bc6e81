"""Splitting a rollout batch into mini-batches (one optimizer step each) and micro-batches (one
forward/backward each, sized by a token budget), trimming padding as it goes."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch


@dataclass
class TrainBatch:
    """Rows of a rollout batch with everything the loss needs. Shapes: [N, P] prompt, [N, T] response, [N] per row."""

    prompt_ids: torch.Tensor  # [N, P] left-padded
    prompt_mask: torch.Tensor  # [N, P]
    response_ids: torch.Tensor  # [N, T] right-padded
    response_mask: torch.Tensor  # [N, T] float: 1 on generated tokens (what the model attends to)
    loss_mask: torch.Tensor  # [N, T] float: 1 on tokens that count in the loss (filters may zero rows)
    old_logprobs: torch.Tensor  # [N, T] logprobs under the policy that sampled (recomputed by the trainer)
    advantages: torch.Tensor  # [N, T] per-token advantages

    def __len__(self) -> int:
        return self.response_ids.shape[0]

    def select(self, rows: torch.Tensor | list[int]) -> "TrainBatch":
        rows = torch.as_tensor(rows, dtype=torch.long)
        return TrainBatch(**{f.name: getattr(self, f.name)[rows] for f in fields(self)})

    def trimmed(self) -> "TrainBatch":
        """Drop prompt columns that are padding in every row (left) and response columns likewise (right)."""
        prompt_keep = int(self.prompt_mask.sum(-1).max().item())
        response_keep = max(1, int((self.response_mask.sum(0) > 0).nonzero().max().item()) + 1) if self.response_mask.any() else 1
        p = self.prompt_ids.shape[1]
        return TrainBatch(
            prompt_ids=self.prompt_ids[:, p - prompt_keep :],
            prompt_mask=self.prompt_mask[:, p - prompt_keep :],
            response_ids=self.response_ids[:, :response_keep],
            response_mask=self.response_mask[:, :response_keep],
            loss_mask=self.loss_mask[:, :response_keep],
            old_logprobs=self.old_logprobs[:, :response_keep],
            advantages=self.advantages[:, :response_keep],
        )


def micro_batch_slices(lengths: list[int], token_budget: int) -> list[list[int]]:
    """Group consecutive rows so that rows x longest row <= token_budget (at least one row per group)."""
    groups: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i, length in enumerate(lengths):
        if current and (len(current) + 1) * max(longest, length) > token_budget:
            groups.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, length)
    if current:
        groups.append(current)
    return groups


def micro_batches(batch: TrainBatch, token_budget: int) -> list[TrainBatch]:
    lengths = (batch.prompt_mask.sum(-1) + batch.response_mask.sum(-1)).long().tolist()
    return [batch.select(rows).trimmed() for rows in micro_batch_slices(lengths, token_budget)]
