"""slime's CISPO cases, ported as an outside oracle for mathrl's `cispo` (mathrl/algo/policy_losses.py). The
inputs and the numbers are slime's; the code is written here.

Source (THUDM/slime @624b824a): tests/test_cispo_loss.py.

slime's compute_cispo_loss takes ppo_kl = -log ratio beside the logprobs; mathrl's cispo takes the old
logprobs, so each case sets old_logprobs = logprobs - log(ratio). slime's eps_clip / eps_clip_high are
mathrl's eps_low / eps_high (algo.clip.eps_low / eps_high).

Run: python -m pytest tests/algo/test_peer_cases_slime.py -q
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from mathrl.algo.policy_losses import cispo

ADV = torch.tensor([[1.0, -0.5, 2.0, -1.0]], dtype=torch.float64)
LP = torch.tensor([[-0.7, -1.2, -0.4, -2.1]], dtype=torch.float64)
MASK = torch.ones(1, 4, dtype=torch.float64)

CASES = [  # (eps_low, eps_high, raw ratios, ratios clamped to [1 - eps_low, 1 + eps_high])
    pytest.param(0.2, 0.28, [1.0, 1.14, 1.56, 0.4], [1.0, 1.14, 1.28, 0.8], id="ppo_band"),
    pytest.param(1.0, 4.0, [1.0, 3.0, 9.0, 0.4], [1.0, 3.0, 5.0, 0.4], id="wide_minimax_band"),
]


def _old(ratios) -> torch.Tensor:
    return LP - torch.tensor([[math.log(r) for r in ratios]], dtype=torch.float64)


@pytest.mark.parametrize("eps_low, eps_high, ratios, clamped", CASES)
def test_cispo_matches_the_closed_form_surrogate(eps_low, eps_high, ratios, clamped):
    # test_compute_cispo_loss_matches_closed_form_surrogate: -clamp(r) A logp per token, and the clip
    # share 1 where the clamp changed the ratio.
    loss, stats = cispo(LP, _old(ratios), ADV, MASK, eps_low=eps_low, eps_high=eps_high)
    c = torch.tensor([clamped], dtype=torch.float64)
    assert_close(loss, -c * ADV * LP, rtol=1e-6, atol=1e-6)
    assert stats["pg_clipfrac"].tolist() == [[float(a != b) for a, b in zip(clamped, ratios)]]


@pytest.mark.parametrize("eps_low, eps_high, ratios, clamped", CASES)
def test_cispo_gradient_flows_only_through_the_logprobs(eps_low, eps_high, ratios, clamped):
    # test_compute_cispo_loss_gradient_flows_only_through_log_probs: d loss / d logp = -clamp(r) A, and the
    # clipped weight is stopped. slime checks the log ratio's gradient; here the old logprobs carry it.
    lp = LP.clone().requires_grad_(True)
    old = _old(ratios).requires_grad_(True)
    loss, _ = cispo(lp, old, ADV, MASK, eps_low=eps_low, eps_high=eps_high)
    loss.sum().backward()
    assert_close(lp.grad, -torch.tensor([clamped], dtype=torch.float64) * ADV, rtol=1e-6, atol=1e-6)
    assert old.grad is None or bool((old.grad == 0).all()), old.grad
