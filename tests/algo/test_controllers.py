"""Coefficient controllers: hand-computed update sequences, bounds, and checkpoint round trips.

Run: python -m pytest tests/algo/test_controllers.py -q
"""

import pytest
import torch

from mathrl.algo.controllers import (
    AdaptiveEntropyController,
    AdaptiveKLController,
    FixedCoef,
    SkyworkEntropyController,
)


def test_fixed_coef_ignores_measurements():
    ctl = FixedCoef(0.01)
    assert ctl.update(5.0) == ctl.update(n_steps=7) == ctl.coef == 0.01


def test_adaptive_kl_hand_values():
    # Ziegler et al.: error clipped to +-0.2, coef *= 1 + error * n_steps / horizon.
    ctl = AdaptiveKLController(0.1, target_kl=6.0, horizon=10_000)
    # KL 9 -> raw error 0.5, clipped to 0.2: 0.1 * (1 + 0.2 * 256 / 10000) = 0.100512.
    assert ctl.update(9.0, n_steps=256) == pytest.approx(0.100512)
    # KL on target -> no change.
    assert ctl.update(6.0, n_steps=256) == pytest.approx(0.100512)
    # KL 5.4 -> error -0.1 inside the clip: 0.100512 * (1 - 0.1 * 1000 / 10000) = 0.100512 * 0.99.
    assert ctl.update(torch.tensor(5.4), n_steps=1000) == pytest.approx(0.100512 * 0.99)


def test_adaptive_entropy_hand_values_and_bounds():
    # coef = clamp(coef + kp * (target - entropy), min, max) with kp 0.1, target 0.5, bounds [0, 0.05].
    ctl = AdaptiveEntropyController(0.01, 0.5, kp=0.1, min_coef=0.0, max_coef=0.05)
    assert ctl.update(0.3) == pytest.approx(0.03)  # entropy low: bonus up by 0.1 * 0.2
    assert ctl.update(0.1) == pytest.approx(0.05)  # 0.03 + 0.04 = 0.07, capped at max
    assert ctl.update(1.5) == pytest.approx(0.0)  # 0.05 - 0.1 floored at min
    assert ctl.coef == pytest.approx(0.0)


def test_skywork_hand_sequence():
    # Step 0.0005, bounds [0, 0.001], c_0 = 0 as in Skywork-OR1; target entropy 0.2.
    ctl = SkyworkEntropyController(0.0, 0.2, step=0.0005, min_coef=0.0, max_coef=0.001)
    assert ctl.active and ctl.coef == 0.0  # before any update
    assert ctl.update(0.1) == pytest.approx(0.0005) and ctl.active  # below target: c up, loss on
    assert ctl.update(0.1) == pytest.approx(0.001)  # up again
    assert ctl.update(0.1) == pytest.approx(0.001)  # capped at max_coef
    # Above target: c decreases but the loss is switched off, so the coefficient to use is 0.
    assert ctl.update(0.3) == 0.0 and not ctl.active
    assert ctl.raw_coef == pytest.approx(0.0005)
    # Exactly on target: c unchanged, loss on (entropy <= target).
    assert ctl.update(0.2) == pytest.approx(0.0005) and ctl.active
    assert ctl.update(0.9) == 0.0 and ctl.update(0.9) == 0.0
    assert ctl.raw_coef == 0.0  # floored at min_coef


@pytest.mark.parametrize(
    "make,measurements",
    [
        (lambda: FixedCoef(0.3), [1.0]),
        (lambda: AdaptiveKLController(0.05, 0.1, 100.0), [0.3, 0.01, 0.12]),
        (lambda: AdaptiveEntropyController(0.0, 0.4, kp=0.05, min_coef=0.0, max_coef=1.0), [0.1, 0.2]),
        (lambda: SkyworkEntropyController(0.0, 0.4, step=0.01, min_coef=0.0, max_coef=1.0), [0.1, 0.9]),
    ],
)
def test_state_dict_round_trip_resumes_exactly(make, measurements):
    # A controller restored from a checkpoint continues exactly like the original would.
    original = make()
    for m in measurements:
        original.update(m, n_steps=8)
    restored = make()
    restored.load_state_dict(original.state_dict())
    assert restored.coef == original.coef
    for m in (0.05, 0.5, 0.3):
        assert restored.update(m, n_steps=8) == original.update(m, n_steps=8)
        assert restored.state_dict() == original.state_dict()


def test_validation_errors():
    with pytest.raises(KeyError, match="missing keys"):
        ctl = SkyworkEntropyController(0.0, 0.2, step=0.1, min_coef=0.0, max_coef=1.0)
        ctl.load_state_dict({"coef": 0.1})
    with pytest.raises(ValueError, match="min_coef"):
        AdaptiveEntropyController(0.1, 0.2, kp=0.1, min_coef=1.0, max_coef=0.0)
    with pytest.raises(ValueError, match="init_coef"):
        SkyworkEntropyController(2.0, 0.2, step=0.1, min_coef=0.0, max_coef=1.0)
    with pytest.raises(ValueError, match="horizon"):
        AdaptiveKLController(0.1, 0.1, 0.0)
    with pytest.raises(ValueError, match="measured"):
        AdaptiveKLController(0.1, 0.1, 10.0).update()
