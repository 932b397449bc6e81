"""prime-rl's MaxRL case, ported as an outside oracle for mathrl's `maxrl_advantages`
(mathrl/algo/advantages.py). The rewards and the advantages are prime-rl's; the code is written here.

Source (PrimeIntellect-ai/prime-rl @559b4477): tests/unit/orchestrator/test_advantage.py,
test_max_rl_mean_normalized.

Run: python -m pytest tests/algo/test_peer_cases_prime_rl.py -q
"""

from __future__ import annotations

import pytest
import torch

from mathrl.algo.advantages import maxrl_advantages


@pytest.mark.parametrize("rewards, expected, why", [
    ([1.0, 0.0, 0.0, 0.0], [3.0, -1.0, -1.0, -1.0], "mean 0.25: the success (1 - 0.25) / 0.25 = 3, failures -1"),
    ([0.0, 0.0], [0.0, 0.0], "no success carries no signal (the paper's K = 0 convention)"),
    ([1.0, 1.0], [0.0, 0.0], "all successes centre to zero, as GRPO"),
])
def test_maxrl_mean_normalised(rewards, expected, why):
    # prime-rl divides by the bare group mean: mathrl's eps = 0 gives its numbers exactly. mathrl's default
    # eps = 1e-6 (SkyRL's) divides by 0.250001 instead: 2.999988 and -0.999996, within 4e-6 of prime-rl's
    # (pytest.approx's default 1e-6 would not hold there, so that tolerance is stated).
    r, g = torch.tensor(rewards, dtype=torch.float64), torch.zeros(len(rewards), dtype=torch.long)
    assert maxrl_advantages(r, g, eps=0.0).tolist() == pytest.approx(expected, rel=1e-12, abs=1e-12), why
    assert maxrl_advantages(r, g).tolist() == pytest.approx(expected, rel=4e-6, abs=1e-12), why
