"""TRL's hand-computed GRPOTrainer mask cases, ported as an outside oracle for mathrl's 80/20 entropy mask
(`policy_losses.top_entropy_mask`) and off-policy sequence masking (`rollout_correction.opsm_keep`). The
inputs and the expected masks are TRL's; the code is written here.

Source (huggingface/trl @f2cd5771): tests/test_grpo_trainer.py, classes TestGetHighEntropyMask and the
test_get_off_policy_mask* cases.

Run: python -m pytest tests/algo/test_peer_cases_trl.py -q
"""

from __future__ import annotations

import pytest
import torch

from mathrl.algo.policy_losses import top_entropy_mask
from mathrl.algo.rollout_correction import opsm_keep

ENT = torch.tensor([[0.1, 0.2, 0.3, 0.4, 0.5, 0.6], [0.7, 0.8, 0.9, 1.0, 1.1, 1.2]])
MASK = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])


@pytest.mark.parametrize("entropies, mask, threshold, expected, why", [
    (ENT, MASK, 0.8, [[0, 0, 0, 0, 0, 0], [0, 0, 1, 1, 0, 0]],
     "mask_0: the top 20% of the 10 counted tokens are 0.9 and 1.0; the padded 1.1 and 1.2 never count"),
    (torch.tensor([[0.1, 0.2, 0.3, 1.4, 0.5, 0.14], [0.5, 0.6, 0.7, 0.8, 0.9, 1.0]]),
     torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 0, 0]]), 0.8, [[0, 0, 0, 1, 0, 0], [0, 0, 0, 1, 0, 0]],
     "mask_1: of the 8 counted tokens 1.4 and 0.8 are the top 20%"),
    (ENT, MASK, 0.5, [[0, 0, 0, 0, 0, 1], [1, 1, 1, 1, 0, 0]], "lower_threshold: the top half, 0.6 to 1.0"),
    (ENT, MASK, 0.0, [[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], "threshold_0: every counted token"),
    (ENT, MASK, 1.0, [[0, 0, 0, 0, 0, 0], [0, 0, 0, 1, 0, 0]], "threshold_1: only the highest counted entropy"),
    (ENT, torch.zeros(2, 6, dtype=torch.long), 0.5, [[0] * 6, [0] * 6], "all_masked: nothing to keep"),
])
def test_high_entropy_mask(entropies, mask, threshold, expected, why):
    # TRL's get_high_entropy_mask(threshold) keeps the counted tokens at or above the `threshold` quantile of
    # the counted entropies; GRPOConfig passes threshold = 1 - top_entropy_quantile. mathrl's `quantile` is
    # top_entropy_quantile itself (the share kept), so TRL's threshold t is mathrl's quantile 1 - t
    # (threshold 1.0 = quantile 0: the highest-entropy token alone).
    got = top_entropy_mask(entropies, mask, quantile=1.0 - threshold)
    assert got.int().tolist() == expected, why


def _rows(keep: torch.Tensor, mask: torch.Tensor) -> list[float]:
    """mathrl's [B, T] keep mask as TRL's one verdict per row ([B, 1]): the verdict of the row's counted tokens."""
    return [float(keep[i][mask[i].bool()].all()) for i in range(keep.shape[0])]


def test_off_policy_mask():
    # test_get_off_policy_mask: sampling logprobs 0, current logprobs -2 / -0.5 / -2, so the mean KL
    # estimate (sampling - current) is 2 / 0.5 / 2 against threshold 1 with advantages +1 / -1 / -1: kept
    # (positive), kept (under the threshold), dropped. TRL's per_token_logps is mathrl's old_logprobs (the
    # policy being trained) and sampling_per_token_logps its rollout_logprobs; off_policy_mask_threshold is
    # opsm's delta.
    mask = torch.ones(3, 4)
    current = torch.tensor([[-2.0] * 4, [-0.5] * 4, [-2.0] * 4])
    keep = opsm_keep(current, torch.zeros(3, 4), torch.tensor([1.0, -1.0, -1.0]), mask, delta=1.0)
    assert _rows(keep, mask) == [1.0, 1.0, 0.0]


@pytest.mark.parametrize("valid_logp, expected, why", [
    (-2.0, 0.0, "mean KL over the 2 valid tokens (2 + 2) / 2 = 2 > 1 with A < 0: dropped"),
    (-0.5, 1.0, "mean KL 0.5 <= 1: kept"),
])
def test_off_policy_mask_ignores_padding(valid_logp, expected, why):
    # test_get_off_policy_mask_padding: the padded positions hold -10000 and +10000 and must not enter the mean.
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0]])
    current = torch.tensor([[valid_logp, valid_logp, -10_000.0, 10_000.0]])
    keep = opsm_keep(current, torch.zeros(1, 4), torch.tensor([[-1.0]]), mask, delta=1.0)
    assert _rows(keep, mask) == [expected], why
