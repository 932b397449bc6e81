"""OpenRLHF's loss-aggregation cases, ported as an outside oracle for mathrl's `losses.aggregate` under data
parallelism and gradient accumulation, and for the policy-loss metrics. The inputs and the numbers are
OpenRLHF's; the code is written here.

Source (OpenRLHF/OpenRLHF @3c3be623): tests/test_loss_aggregation.py.

Mapping: OpenRLHF's aggregate_loss(token_level_loss=True) is mathrl's `token_mean`, token_level_loss=False
`seq_mean_token_mean`; its batch_num_tokens / global_batch_size are mathrl's global num_tokens / num_seqs
(`global_counts`); its dp_size factor is mathrl's `dp_scale()` (the world size), which turns DDP's average
of the ranks' gradients back into their sum. OpenRLHF folds the window's token count by the accumulation
steps and DeepSpeed divides each micro-batch loss by them again; mathrl divides each micro-batch by the
window's count and lets backward() add them up: the same sum.

Run: python -m pytest tests/algo/test_peer_cases_openrlhf.py -q
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from mathrl.algo.losses import aggregate, batch_counts, masked_mean
from mathrl.algo.policy_losses import ppo_clip
from mathrl.algo.rollout_correction import mismatch_kl

DP = 2.0  # dp_scale() on two ranks


def agg(loss, mask, mode, counts) -> torch.Tensor:
    return aggregate(loss, mask, mode=mode, num_tokens=counts[0], num_seqs=counts[1])


@pytest.mark.parametrize("mode, loss, mask, expected, why", [
    ("token_mean", [[1.0, 2.0, 0.0], [3.0, 4.0, 5.0], [7.0, 0.0, 0.0]], [[1, 1, 0], [1, 1, 1], [1, 0, 0]],
     22 / 6, "token_mean_aggregation_matches_verl_dp_average: 22 over 6 tokens"),
    ("seq_mean_token_mean", [[1.0, 3.0, 9.0], [2.0, 4.0, 0.0], [8.0, 0.0, 0.0]], [[1, 1, 0], [1, 1, 0], [1, 0, 0]],
     13 / 3, "seq_mean_token_mean_aggregation_matches_verl_dp_average: row means 2, 3, 8"),
])
def test_two_ranks_average_to_the_global_loss(mode, loss, mask, expected, why):
    # rank 0 holds rows 0-1, rank 1 row 2; each divides by the global counts and is scaled by dp_size; DDP's
    # average of the two is the full batch's loss.
    loss_t, mask_t = torch.tensor(loss), torch.tensor(mask, dtype=torch.float32)
    counts = batch_counts(mask_t)
    full = agg(loss_t, mask_t, mode, counts)
    rank0 = agg(loss_t[:2], mask_t[:2], mode, counts) * DP
    rank1 = agg(loss_t[2:], mask_t[2:], mode, counts) * DP
    assert full.item() == pytest.approx(expected), why
    assert ((rank0 + rank1) / 2).item() == pytest.approx(expected), why


def test_fully_masked_sequences_are_not_counted():
    # test_loss_batch_info_excludes_fully_masked_sequences: the all-masked row does not count in num_seqs:
    # one sequence, mean (1 + 3) / 2 = 2.
    loss, mask = torch.tensor([[1.0, 3.0], [5.0, 7.0]]), torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    counts = batch_counts(mask)
    assert counts[1] == 1.0
    assert agg(loss, mask, "seq_mean_token_mean", counts).item() == pytest.approx(2.0)


def test_policy_loss_token_mean_split_matches_the_full_batch():
    # test_policy_loss_token_mean_aggregation_matches_full_batch: PPO with eps 0.2 / 0.2, token_mean, rows
    # 0-1 on one rank and row 2 on the other. Every |log ratio| <= 0.05 is inside the clip range, so the
    # loss is -mean(A exp(logp - old)) over the 7 counted tokens, worked out with math below.
    lp = torch.tensor([[-0.20, -0.40, -0.10], [-0.70, -0.30, -0.20], [-0.60, -0.10, -0.50]], dtype=torch.float64)
    delta = torch.tensor([[0.03, -0.04, 0.01], [0.02, 0.05, -0.03], [0.04, 0.0, -0.02]], dtype=torch.float64)
    adv = torch.tensor([[1.0, -0.5, 0.0], [0.3, -1.2, 0.5], [1.5, 0.0, -0.7]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 1.0]], dtype=torch.float64)
    old = lp - delta
    counts = batch_counts(mask)
    expected = -sum(float(adv[i, j]) * math.exp(float(delta[i, j]))
                    for i in range(3) for j in range(3) if mask[i, j]) / 7
    full = agg(ppo_clip(lp, old, adv, mask, eps_low=0.2, eps_high=0.2)[0], mask, "token_mean", counts)
    parts = [agg(ppo_clip(lp[s], old[s], adv[s], mask[s], eps_low=0.2, eps_high=0.2)[0], mask[s], "token_mean",
                 counts) * DP for s in (slice(0, 2), slice(2, 3))]
    assert full.item() == pytest.approx(expected, rel=1e-12)
    assert ((parts[0] + parts[1]) / 2).item() == pytest.approx(expected, rel=1e-12)


def test_policy_kl_metric_and_the_rollout_kl():
    # test_policy_kl_metric_uses_policy_ratio_when_vllm_correction_is_enabled: the policy KL metric is
    # mean(old - logp) = mean(-0.1, 0.3) = 0.1 (mathrl's actor/ppo_kl), the engine KL mean(rollout - old) =
    # -1.0 (mathrl's rollout_corr/k1_kl), whatever the correction does to the loss.
    lp, old, rollout = torch.tensor([[-0.2, -0.4]]), torch.tensor([[-0.3, -0.1]]), torch.tensor([[-1.3, -1.1]])
    mask = torch.ones(1, 2)
    _, stats = ppo_clip(lp, old, torch.ones(1, 2), mask)
    assert masked_mean(stats["ppo_kl"], mask).item() == pytest.approx(0.1, abs=1e-6)
    k1, _ = mismatch_kl(old, rollout, mask)
    assert k1.item() == pytest.approx(-1.0, abs=1e-6)


MB0, M0 = torch.tensor([[1.0, 2.0, 0.0]]), torch.tensor([[1.0, 1.0, 0.0]])
MB1, M1 = torch.tensor([[3.0, 4.0, 5.0], [6.0, 7.0, 0.0]]), torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def test_gradient_accumulation_divides_by_the_windows_token_count():
    # test_grad_accum_global_norm_matches_global_token_mean_over_window: two micro-batches of 2 and 5 tokens;
    # each divided by the window's 7 tokens, their sum is the window's token mean 28 / 7 = 4.
    window = (float(M0.sum() + M1.sum()), 3.0)
    total = agg(MB0, M0, "token_mean", window) + agg(MB1, M1, "token_mean", window)
    assert total.item() == pytest.approx(4.0)


def test_per_micro_batch_normalisation_is_not_the_window_mean():
    # test_grad_accum_global_norm_differs_from_per_microbatch_when_uneven: the mean of per-micro-batch token
    # means, (1.5 + 5) / 2 = 3.25, is not 4 when the micro-batches hold different token counts.
    per_mb = (agg(MB0, M0, "token_mean", batch_counts(M0)) + agg(MB1, M1, "token_mean", batch_counts(M1))) / 2
    assert per_mb.item() == pytest.approx(3.25)
    assert per_mb.item() != pytest.approx(4.0)


def test_policy_kl_metric_is_not_clamped():
    # test_policy_kl_metric_is_not_clamped: logp 100 against old 0: the metric is -100, not the log-ratio clamp.
    _, stats = ppo_clip(torch.tensor([[100.0]]), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1))
    assert_close(stats["ppo_kl"], torch.tensor([[-100.0]]))
