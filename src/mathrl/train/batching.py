"""Splitting a rollout batch into mini-batches (one optimizer step each) and micro-batches (one
forward/backward each, sized by a token budget), trimming padding as it goes."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch


@dataclass
class TrainBatch:
    """Rows of a rollout batch with everything the losses need.

    Prompt-side tensors are [N, P] (left-padded); every other 2-D tensor is response-side [N, T]
    (right-padded); 1-D tensors are per row [N].
    """

    prompt_ids: torch.Tensor  # [N, P] left-padded
    prompt_mask: torch.Tensor  # [N, P]
    response_ids: torch.Tensor  # [N, T] right-padded
    response_mask: torch.Tensor  # [N, T] float: 1 on the model's generated tokens (with observation_mask: what it attends to)
    loss_mask: torch.Tensor  # [N, T] float: 1 on tokens that count in the loss (filters may zero rows)
    old_logprobs: torch.Tensor | None  # [N, T] logprobs under the policy that sampled (recomputed by the trainer; None until scored)
    advantages: torch.Tensor | None  # [N, T] per-token advantages (None until computed)
    ref_logprobs: torch.Tensor | None  # [N, T] reference-model logprobs (zeros when no term needs them; None until scored)
    ref_entropy: torch.Tensor | None  # [N, T] reference-model entropy (zeros when no term needs it; None until scored)
    correct: torch.Tensor  # [N] float, 1 if the verifier accepted the answer
    old_values: torch.Tensor | None = None  # [N, T] critic values at sampling time (PPO with a critic only)
    returns: torch.Tensor | None = None  # [N, T] value targets (PPO with a critic only)
    rollout_logprobs: torch.Tensor | None = None  # [N, T] the rollout engine's sampling logprobs (algo.rollout_correction)
    is_weights: torch.Tensor | None = None  # [N, T] importance weights of the policy-gradient term (Config.correction), None = 1
    observation_mask: torch.Tensor | None = None  # [N, T] 1 on tool-observation tokens: in the context, in no loss (None: single-turn)

    @property
    def context_mask(self) -> torch.Tensor:  # [N, T] what the model attends to: its own tokens and the observations
        return self.response_mask if self.observation_mask is None else self.response_mask + self.observation_mask

    def __len__(self) -> int:
        return self.response_ids.shape[0]

    def select(self, rows: torch.Tensor | list[int]) -> "TrainBatch":
        rows = torch.as_tensor(rows, dtype=torch.long)
        return TrainBatch(**{f.name: None if (x := getattr(self, f.name)) is None else x[rows] for f in fields(self)})

    def to(self, device: torch.device | str) -> "TrainBatch":
        """The same rows with every tensor on `device` (the tensors themselves when already there)."""
        return TrainBatch(**{f.name: None if (x := getattr(self, f.name)) is None else x.to(device) for f in fields(self)})

    def trimmed(self) -> "TrainBatch":
        """Drop prompt columns that are padding in every row (left) and response columns likewise (right)."""
        prompt_keep = max(1, int(self.prompt_mask.sum(-1).max().item()))
        used = (self.context_mask.sum(0) > 0).nonzero()
        response_keep = int(used.max().item()) + 1 if len(used) else 1
        p = self.prompt_ids.shape[1]
        out = {}
        for f in fields(self):
            x = getattr(self, f.name)
            if x is None:
                out[f.name] = None
            elif f.name.startswith("prompt_"):
                out[f.name] = x[:, p - prompt_keep :]
            elif x.dim() == 2:
                out[f.name] = x[:, :response_keep]
            else:
                out[f.name] = x
        return TrainBatch(**out)


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


def row_lengths(batch: TrainBatch) -> list[tuple[int, int]]:
    return list(zip(batch.prompt_mask.sum(-1).long().tolist(), batch.context_mask.sum(-1).long().tolist()))


def micro_batches(batch: TrainBatch, token_budget: int) -> list[TrainBatch]:
    return [batch.select(rows).trimmed() for rows in micro_batch_slices(row_lengths(batch), token_budget)]
