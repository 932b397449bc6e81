"""SkyRL's hand-computed loss and off-policy-correction cases, ported as an outside oracle for
mathrl's policy losses (mathrl/algo/policy_losses.py) and rollout correction
(mathrl/algo/rollout_correction.py). The inputs and the numbers are SkyRL's; the code is written here.

Sources (NovaSky-AI/SkyRL @a9564572):
  L = tests/train/algorithms/test_losses.py
  C = tests/train/algorithms/test_off_policy_correction.py

SkyRL's loss tests reduce with a plain sum over tokens; for one row that is mathrl's
`seq_mean_token_sum` with one sequence, the aggregation used below. Where the peer's convention differs
the case says how it maps.

Run: python -m pytest tests/algo/test_peer_cases_skyrl.py -q
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from mathrl.algo.losses import aggregate, batch_counts
from mathrl.algo.policy_losses import cispo, clip_cov, dppo_kl, dppo_tv, gspo_token, kl_cov, ppo_clip, sapo
from mathrl.algo.rollout_correction import (
    chain,
    correction_weights,
    geo_rs_keep,
    icepop_keep,
    kl_rs_keep,
    rule_keeps,
)


def t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def summed(loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """SkyRL's sum reduction: seq_mean_token_sum over one sequence."""
    return aggregate(loss, mask, mode="seq_mean_token_sum", num_tokens=float(mask.sum()), num_seqs=1.0)


# ----------------------------------------------------------------------------- L: dual clip, CISPO
# Ratios ~ [0.5, 1, 10] (log(0.5) - 1, log(1) - 1, log(10) - 3) with advantages [1, -1, -4].
DC_ADV = t([[1.0, -1.0, -4.0]])
DC_OLD = t([[-1.0, -1.0, -3.0]])
DC_LP = t([[-1.69315, -1.0, -0.69741]])
ONE_ROW = torch.ones(1, 3, dtype=torch.float64)


def test_dual_clip_hand_value():
    # L test_policy_loss_dual_clip: eps 0.2 / 0.2, c = 3. PPO gives [-0.5, 1, 40]; for A < 0 the dual clip
    # caps the loss at -c A = [_, 3, 12]: [-0.5, 1, 12], sum 12.5 (SkyRL asserts abs 1e-4).
    loss, stats = ppo_clip(DC_LP, DC_OLD, DC_ADV, ONE_ROW, eps_low=0.2, eps_high=0.2, dual_clip_c=3.0)
    assert_close(loss, t([[-0.5, 1.0, 12.0]]), atol=1e-4, rtol=0)
    assert summed(loss, ONE_ROW).item() == pytest.approx(12.5, abs=1e-4)
    # only the third token takes the dual-clip branch; no token's eps clip is the active one
    assert_close(stats["pg_clipfrac_lower"], torch.tensor([[0.0, 0.0, 1.0]]), check_dtype=False)
    assert_close(stats["pg_clipfrac"], torch.zeros(1, 3), check_dtype=False)


def test_cispo_hand_value():
    # L test_policy_loss_cispo: the clipped weight [0.8, 1, 1.2] (eps 0.2 / 0.2) times -A logp:
    # 1.35452 - 1.0 - 3.347568 = -2.9930. SkyRL's cispo_eps_clip_low/high map to algo.clip.eps_low/high.
    lp = DC_LP.clone().requires_grad_(True)
    loss, stats = cispo(lp, DC_OLD, DC_ADV, ONE_ROW, eps_low=0.2, eps_high=0.2)
    total = summed(loss, ONE_ROW)
    assert total.item() == pytest.approx(-2.9930, abs=1e-4)
    total.backward()
    # the weight is stopped: the gradient is -clip(ratio) A = [-0.8, 1.0, 4.8]
    assert_close(lp.grad, t([[-0.8, 1.0, 4.8]]), atol=1e-4, rtol=0)
    assert_close(stats["pg_clipfrac"], torch.tensor([[1.0, 0.0, 1.0]]), check_dtype=False)


def test_cispo_anchored_on_the_rollout_logprobs():
    # L test_policy_loss_cispo_rollout_anchor: SkyRL's cispo_anchor="rollout" takes the IS ratio against the
    # rollout logprobs [-1.30685, -1.5, -1.0]; mathrl's bypass mode (old := the engine's logprobs) is that
    # anchor. Ratios exp([-0.3863, 0.5, 0.3094]) = [0.680, 1.649, 1.363] clip to [0.8, 1.2, 1.2]:
    # 1.35452 - 1.2 - 3.347568 = -3.193048, not the old-anchored -2.9930.
    rollout = t([[-1.30685, -1.5, -1.0]])
    loss, stats = cispo(DC_LP, rollout, DC_ADV, ONE_ROW, eps_low=0.2, eps_high=0.2)
    assert summed(loss, ONE_ROW).item() == pytest.approx(1.35452 - 1.2 - 3.347568, abs=1e-4)
    assert_close(stats["pg_clipfrac"], torch.ones(1, 3), check_dtype=False)
    old_anchored, _ = cispo(DC_LP, DC_OLD, DC_ADV, ONE_ROW, eps_low=0.2, eps_high=0.2)
    assert not torch.allclose(summed(loss, ONE_ROW), summed(old_anchored, ONE_ROW))


# ----------------------------------------------------------------------------- L: GSPO token vs sequence
GS_ADV = t([[1.5, 2.0, 1.0, 0.8, 0.5, 0.0, 0.0, 0.0],
            [3.0, 1.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
            [0.5, 0.8, 1.2, 2.5, 0.0, 0.0, 0.0, 0.0]])
GS_OLD = torch.full((3, 8), -1.0, dtype=torch.float64)
GS_LP = t([[0.2, -2.5, -0.3, 0.1, -1.8, -1.0, -1.0, -1.0],
           [0.8, -0.2, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0],
           [-0.5, 0.3, -1.7, 0.4, -1.0, -1.0, -1.0, -1.0]])
GS_MASK = t([[1, 1, 1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0, 0, 0]])


def _gspo_reference(eps: float) -> tuple[float, float, float, float]:
    """(token-level PPO sum, GSPO-token sum, token clip share, sequence clip share) with loops and math, as
    SkyRL derives them: s_i = exp(mean_t log ratio), each token's -min(s A, clip(s) A)."""
    ppo = seq = 0.0
    clipped_tok = clipped_seq = 0
    n = 0
    for i in range(3):
        idx = [j for j in range(8) if GS_MASK[i, j] > 0]
        lrs = [float(GS_LP[i, j] - GS_OLD[i, j]) for j in idx]
        s = math.exp(sum(lrs) / len(lrs))
        for j, lr in zip(idx, lrs):
            a, r = float(GS_ADV[i, j]), math.exp(lr)
            ppo += -min(r * a, min(max(r, 1 - eps), 1 + eps) * a)
            seq += -min(s * a, min(max(s, 1 - eps), 1 + eps) * a)
            clipped_tok += int(-min(max(r, 1 - eps), 1 + eps) * a > -r * a)
            clipped_seq += int(-min(max(s, 1 - eps), 1 + eps) * a > -s * a)
            n += 1
    return ppo, seq, clipped_tok / n, clipped_seq / n


def test_gspo_token_level_against_sequence_level():
    # L test_gspo_importance_sampling_levels: SkyRL's `gspo` is GSPO-token (the sequence ratio's value
    # with each token's own gradient, per-token advantages), mathrl's `gspo_token`; eps 0.2 / 0.2 (SkyRL's
    # eps_clip, not GSPO's published 3e-4 / 4e-4); SkyRL sums over all tokens, mathrl's seq_mean_token_sum
    # over the counted tokens of 3 rows times num_seqs = 3 gives that sum.
    ppo_ref, seq_ref, clip_tok_ref, clip_seq_ref = _gspo_reference(0.2)
    n_tok, n_seq = batch_counts(GS_MASK)
    tok_loss, tok_stats = ppo_clip(GS_LP, GS_OLD, GS_ADV, GS_MASK, eps_low=0.2, eps_high=0.2)
    seq_loss, seq_stats = gspo_token(GS_LP, GS_OLD, GS_ADV, GS_MASK, eps_low=0.2, eps_high=0.2)
    total_tok = aggregate(tok_loss, GS_MASK, mode="seq_mean_token_sum", num_tokens=n_tok, num_seqs=n_seq) * n_seq
    total_seq = aggregate(seq_loss, GS_MASK, mode="seq_mean_token_sum", num_tokens=n_tok, num_seqs=n_seq) * n_seq
    assert total_tok.item() == pytest.approx(ppo_ref, rel=1e-5)
    assert total_seq.item() == pytest.approx(seq_ref, rel=1e-5)
    clip_tok = float(tok_stats["pg_clipfrac"].sum()) / n_tok
    clip_seq = float(seq_stats["pg_clipfrac"].sum()) / n_tok
    assert clip_tok == pytest.approx(clip_tok_ref) and clip_seq == pytest.approx(clip_seq_ref)
    # SkyRL's claims: the two clip shares differ, and so do the losses
    assert clip_tok != pytest.approx(clip_seq, rel=1e-2)
    assert total_tok.item() != pytest.approx(total_seq.item(), rel=1e-3)


# ----------------------------------------------------------------------------- L: Clip-Cov, KL-Cov
CC_ADV = t([[2.0, -1.0, 1.5, 0.8], [1.0, 0.5, -2.0, 1.2]])
CC_OLD = torch.full((2, 4), -1.0, dtype=torch.float64)
CC_LP = t([[-0.5, -1.5, -0.8, -1.2], [-1.3, -0.7, -1.8, -0.9]])
CV_MASK = t([[1, 1, 1, 1], [1, 1, 1, 0]])


def test_clip_cov_cuts_the_gradient_of_picked_tokens_only():
    # L test_clip_cov_policy_loss: clip_ratio 0.5, cov bounds (-5, 5), eps 0.2 / 0.2; SkyRL checks that the
    # loss is finite, the clip share in [0, 1] and that it differs from PPO's. Here, by hand: the ratios
    # exp(logp + 1) are [1.65, 0.61, 1.22, 0.82 | 0.74, 1.35, 0.45]; PPO's clip is active on five of them
    # (A > 0 above 1.2, A < 0 below 0.8), leaving (0, 3) and (1, 0), both with |cov| < 5. int(0.5 x 7) = 3
    # picks exceed the 2 candidates: both are picked, their loss is 0, every other token's is PPO's.
    g = torch.Generator().manual_seed(42)
    loss, stats = clip_cov(CC_LP, CC_OLD, CC_ADV, CV_MASK, eps_low=0.2, eps_high=0.2, cov_ratio=0.5, cov_lb=-5.0,
                           cov_ub=5.0, generator=g)
    ppo, ppo_stats = ppo_clip(CC_LP, CC_OLD, CC_ADV, CV_MASK, eps_low=0.2, eps_high=0.2)
    picked = stats["cov_selected_frac"].bool()
    assert picked.tolist() == [[False, False, False, True], [True, False, False, False]]
    assert int(ppo_stats["pg_clipfrac"].sum()) == 5
    assert_close(loss, torch.where(picked, torch.zeros_like(ppo), ppo))
    assert torch.isfinite(loss).all() and 0.0 <= float(stats["pg_clipfrac"].sum()) / 7 <= 1.0
    assert summed(loss, CV_MASK).item() != pytest.approx(summed(ppo, CV_MASK).item(), rel=1e-3)


KC_ADV = t([[1.5, -0.5, 2.0, 0.8], [0.5, 1.0, -1.5, 1.2]])
KC_LP = t([[-0.8, -1.2, -0.6, -1.1], [-1.1, -0.9, -1.4, -0.7]])


def test_kl_cov_penalises_the_top_covariance_tokens_by_hand():
    # L test_kl_cov_policy_loss: kl_cov_frac 0.5, ppo_kl_coef 1 (mathrl's algo.cov.ratio, algo.cov.kl_coef).
    # SkyRL checks finiteness, clip_ratio 0 and a difference from PPO. By hand: over the 7 counted tokens
    # mean A = 3.8/7, mean logp = -7.1/7; (A - mean A)(logp - mean logp) is 0.2051, 0.1937, 0.6037, -0.0220,
    # 0.0037, 0.0522, 0.7880: the int(7 x 0.5) = 3 largest are (1,2), (0,2), (0,0). Loss: -A ratio, plus
    # |log ratio| on those three.
    loss, stats = kl_cov(KC_LP, CC_OLD, KC_ADV, CV_MASK, cov_ratio=0.5, kl_coef=1.0)
    picked = [[1, 0, 1, 0], [0, 0, 1, 0]]
    assert_close(stats["cov_selected_frac"], torch.tensor(picked), check_dtype=False)
    expected = [[-KC_ADV[i, j].item() * math.exp(KC_LP[i, j].item() + 1.0) + picked[i][j] * abs(KC_LP[i, j].item() + 1.0)
                 if CV_MASK[i, j] else 0.0 for j in range(4)] for i in range(2)]
    assert_close(loss, t(expected))
    assert float(stats["pg_clipfrac"].sum()) == 0.0
    ppo, _ = ppo_clip(KC_LP, CC_OLD, KC_ADV, CV_MASK, eps_low=0.2, eps_high=0.2)
    assert summed(loss, CV_MASK).item() != pytest.approx(summed(ppo, CV_MASK).item(), rel=1e-3)


# ----------------------------------------------------------------------------- L: SAPO
def test_sapo_hand_value():
    # L test_sapo_policy_loss_basic: tau_pos 1, tau_neg 2, ratios exp([-0.5, 0.2, -0.1]), A [1, -1, 0.5];
    # each token -sigmoid(tau (r - 1)) 4 / tau A, summed (SkyRL's reduction; mathrl's sapo is registered with
    # seq_mean_token_mean, which for one row is the same loss divided by its 3 tokens).
    adv, old, lp = t([[1.0, -1.0, 0.5]]), t([[-1.0, -1.0, -1.0]]), t([[-1.5, -0.8, -1.1]])
    loss, stats = sapo(lp, old, adv, ONE_ROW, tau_pos=1.0, tau_neg=2.0)

    def gate(r, tau):
        return 4.0 / tau / (1.0 + math.exp(-tau * (r - 1.0)))

    expected = [-gate(math.exp(-0.5), 1.0) * 1.0, -gate(math.exp(0.2), 2.0) * -1.0, -gate(math.exp(-0.1), 1.0) * 0.5]
    assert_close(loss, t([expected]), atol=1e-8, rtol=1e-5)
    assert summed(loss, ONE_ROW).item() == pytest.approx(sum(expected), rel=1e-5)
    assert float(stats["pg_clipfrac"].sum()) == 0.0


# ----------------------------------------------------------------------------- L: DPPO's masks
@pytest.mark.parametrize("fn, delta, old, new, adv, keep, why", [
    (dppo_tv, 0.2, [[-1.0] * 3], [[-0.3, -2.0, -0.9]], [[1.0, -1.0, 1.0]], [[0, 0, 1]],
     "tv_pos_adv_masked: p - p_old = 0.373 > 0.2 with A > 0, -0.233 < -0.2 with A < 0, 0.039 kept"),
    (dppo_tv, 0.2, [[-1.0] * 2], [[-2.0, -0.3]], [[1.0, -1.0]], [[1, 1]],
     "tv_wrong_direction_not_masked: the probability moved against the advantage, which is never masked"),
    (dppo_kl, 0.05, [[-1.0] * 2], [[-0.1, -0.95]], [[1.0, 1.0]], [[0, 1]],
     "kl_masked: binary KL 0.866 > 0.05 with p > p_old masked; 0.0007 kept (SkyRL asserts only clip > 0)"),
    (dppo_kl, 0.5, [[-1.0] * 2], [[-1.01, -0.99]], [[1.0, -1.0]], [[1, 1]],
     "kl_no_masking_within_delta: both binary KLs are far under 0.5"),
])
def test_dppo_masks(fn, delta, old, new, adv, keep, why):
    # L test_dppo_policy_loss. SkyRL's loss value is -(ratio A mask); mathrl's is -A sg[min(ratio, 20)] logp
    # mask (verl's): the values differ, the gradient (-A ratio mask per token) is the same, so the gradient
    # carries SkyRL's number here; the mask is mathrl's pg_clipfrac = 1 - valid.
    old_t, adv_t, m = t(old), t(adv), torch.ones(len(old[0]), dtype=torch.float64)[None]
    lp = t(new).requires_grad_(True)
    loss, stats = fn(lp, old_t, adv_t, m, delta_low=delta, delta_high=delta)
    summed(loss, m).backward()
    keep_t = t(keep)
    assert_close(lp.grad, -(torch.exp(t(new) - old_t) * adv_t * keep_t), msg=why)
    assert_close(stats["pg_clipfrac"], 1.0 - keep_t, check_dtype=False, msg=why)


def test_dppo_anchor_on_the_rollout_logprobs_changes_the_mask():
    # L test_dppo_policy_loss "tv_uses_rollout_logprobs": SkyRL anchors DPPO's trust region on the rollout
    # logprobs when given. mathrl's dppo anchors it on old_logprobs only; the same anchor is mathrl's bypass
    # mode (old := the engine's logprobs), so the two anchorings are old = [-1, -1] and old = [-0.35, -1.0].
    # Against -1 token 0 moved by p - p_old = 0.373 > 0.2 (masked); against -0.35 by 0.036 (kept).
    lp, adv, m = t([[-0.3, -0.95]]), t([[1.0, 1.0]]), torch.ones(1, 2, dtype=torch.float64)
    loss_old, s_old = dppo_tv(lp, t([[-1.0, -1.0]]), adv, m)
    loss_roll, s_roll = dppo_tv(lp, t([[-0.35, -1.0]]), adv, m)
    assert_close(s_old["pg_clipfrac"], torch.tensor([[1.0, 0.0]]), check_dtype=False)
    assert_close(s_roll["pg_clipfrac"], torch.tensor([[0.0, 0.0]]), check_dtype=False)
    assert not torch.allclose(summed(loss_old, m), summed(loss_roll, m))


# ----------------------------------------------------------------------------- C: TIS
def test_tis_only_leaves_ratios_under_the_cap():
    # C test_compute_off_policy_correction_tis_only: token ratios exp(0.5) = 1.6487 each, under the cap 2.
    w, over = correction_weights(t([[-1.0] * 3]), t([[-1.5] * 3]), ONE_ROW, mode="tis", level="token", cap=2.0)
    assert_close(w, torch.full((1, 3), math.exp(0.5), dtype=torch.float64))
    assert float(over.sum()) == 0.0


@pytest.mark.parametrize("call, match", [
    (lambda: correction_weights(ONE_ROW, ONE_ROW, ONE_ROW, mode="invalid", level="token", cap=2.0), "unknown mode"),
    (lambda: correction_weights(ONE_ROW, ONE_ROW, ONE_ROW, mode="tis", level="invalid", cap=2.0), "unknown level"),
    (lambda: rule_keeps(ONE_ROW, ONE_ROW, ONE_ROW, ["invalid"]), "rules must be distinct names"),
])
def test_an_unknown_correction_is_an_error(call, match):
    # C test_compute_tis_ratio_invalid_type / test_compute_sequence_mask_invalid_type: an unknown ratio type
    # (mathrl's mode or level) or mask metric (mathrl's rule name) is refused with its name.
    with pytest.raises(ValueError, match=match):
        call()


def test_tis_token_level_caps_at_two():
    # C test_compute_tis_ratio_token_level: ratios exp([0.5, -0.5, 1]) capped at 2: [1.6487, 0.6065, 2];
    # 1 token of 3 capped (mathrl's `rejected` flags it; with tis it keeps the weight C).
    w, over = correction_weights(t([[-1.0, -1.5, -0.5]]), t([[-1.5, -1.0, -1.5]]), ONE_ROW, mode="tis",
                                 level="token", cap=2.0)
    assert_close(w, t([[1.6487, 0.6065, 2.0]]), rtol=1e-3, atol=1e-4)
    assert float(over.mean()) == pytest.approx(1 / 3)


@pytest.mark.parametrize("old, rollout, mask, cap, weight, capped, why", [
    ([[-1.0, -1.5, -0.5]], [[-1.5, -1.0, -1.5]], [[1, 1, 1]], 5.0, math.exp(1.0), 0.0,
     "sequence_level: log ratios sum to 1: 2.7183 < 5, not capped"),
    ([[-1.0, -1.0, -1.0]], [[-2.0, -2.0, -2.0]], [[1, 1, 1]], 5.0, 5.0, 1.0,
     "sequence_level_with_cap: exp(3) = 20.09 capped at 5"),
    ([[-1.0, -1.5, -0.5]], [[-1.5, -1.0, -1.5]], [[1, 0, 1]], 10.0, math.exp(1.5), 0.0,
     "with_mask: the masked token leaves the sum, 0.5 + 1 = 1.5: 4.4817"),
])
def test_tis_sequence_level(old, rollout, mask, cap, weight, capped, why):
    # C test_compute_tis_ratio_sequence_level / _with_cap / _with_mask. SkyRL returns one weight per row
    # ([B, 1]); mathrl broadcasts it to the row's counted tokens (0 at masked ones).
    m = t(mask)
    w, over = correction_weights(t(old), t(rollout), m, mode="tis", level="sequence", cap=cap)
    assert_close(w, weight * m, rtol=1e-3, atol=1e-4, msg=why)
    assert float(over.max()) == capped


# ----------------------------------------------------------------------------- C: geometric and product masks
@pytest.mark.parametrize("old, rollout, lower, upper, keep, why", [
    ([[-1.0, -1.1, -1.0]], [[-1.1, -1.0, -1.0]], 0.9, 1.1, True, "geometric: log ratios [0.1, -0.1, 0]: mean 1.0"),
    ([[-1.0] * 3], [[-1.5] * 3], 0.9, 1.1, False, "geometric_rejects: exp(0.5) = 1.6487 over 1.1"),
    ([[-1.0] * 3], [[-1.0] * 3], 0.9, 1.1, True, "sequence_mask_only: on-policy, the loss mask is unchanged"),
    ([[-1.0] * 3], [[-2.0] * 3], 0.9, 1.1, False, "sequence_mask_zeros_loss: exp(1) = 2.718, the row leaves the loss"),
])
def test_geometric_sequence_mask(old, rollout, lower, upper, keep, why):
    # C test_compute_sequence_mask_geometric(_rejects), test_compute_off_policy_correction_sequence_mask_only
    # and _sequence_mask_zeros_loss: SkyRL's geo_mask_low/high are mathrl's geo_rs bounds (both on
    # pi_old / pi_rollout). A rejected row leaves the loss mask: mathrl's `rejected: drop`.
    got = geo_rs_keep(t(old), t(rollout), ONE_ROW, lower=lower, upper=upper)
    assert got.tolist() == [[keep] * 3], why
    assert_close(ONE_ROW * got, ONE_ROW * float(keep))


def test_tis_and_geometric_mask_together():
    # C test_compute_off_policy_correction_both_enabled: log ratios 0.1 each: TIS weight exp(0.1) (under the cap
    # 2), geometric mean exp(0.1) inside [0.8, 1.2]: kept, weight exp(0.1) on every token.
    old, rollout = t([[-1.0] * 3]), t([[-1.1] * 3])
    w, _ = correction_weights(old, rollout, ONE_ROW, mode="tis", level="token", cap=2.0)
    keep = geo_rs_keep(old, rollout, ONE_ROW, lower=0.8, upper=1.2)
    assert_close(w * keep, torch.full((1, 3), math.exp(0.1), dtype=torch.float64), rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("old, rollout, weight, rejected, why", [
    ([[-1.0, -1.1, -1.2]], [[-1.2, -1.2, -1.2]], math.exp(0.3), 0.0, "product: log ratios [0.2, 0.1, 0] sum 0.3: 1.35 in [0.5, 2]"),
    ([[-1.0] * 3], [[-2.0, -2.0, -2.0]], 0.0, 1.0, "product_rejects_by_seq_ratio: exp(3) = 20.09 over 2"),
])
def test_product_sequence_mask(old, rollout, weight, rejected, why):
    # C test_compute_sequence_mask_product(_rejects_by_seq_ratio): SkyRL's product mask keeps a row whose
    # sequence ratio prod_t rho_t is in [0.5, 2]. mathrl's sequence-level MIS with cap 2 and lower 0.5 rejects
    # the same rows; it also weighs a kept row by its ratio (SkyRL's mask alone gives it weight 1).
    w, rej = correction_weights(t(old), t(rollout), ONE_ROW, mode="mis", level="sequence", cap=2.0, lower=0.5)
    assert_close(rej, torch.full((1, 3), rejected, dtype=torch.float64), msg=why)
    assert_close(w, torch.full((1, 3), weight, dtype=torch.float64), rtol=1e-6, atol=1e-8, msg=why)


# ----------------------------------------------------------------------------- C: outlier token masks
HIGH, LOW = 100.0, 1e-4


@pytest.mark.parametrize("old, rollout, mask, lower, upper, row_kept, why", [
    ([[-1.0] * 3], [[-1.0, -1.0, -6.0]], [[1, 1, 1]], LOW, HIGH, False, "masks_by_token_bounds: ratio e^5 = 148 > 100"),
    ([[-1.0, -1.5, -1.0]], [[-1.5, -1.0, -1.0]], [[1, 1, 1]], LOW, HIGH, True, "accepts_in_bounds: [1.65, 0.61, 1]"),
    ([[-1.0] * 3], [[-1.0, -1.0, -6.0]], [[1, 1, 0]], LOW, HIGH, True, "respects_loss_mask: the outlier is padding"),
    ([[-1.0] * 3], [[-1.0, -1.0, -6.0]], [[1, 1, 1]], 1e-30, HIGH, False, "only_high_threshold (no low: 1e-30)"),
    ([[-1.0, -1.0, -11.0]], [[-1.0] * 3], [[1, 1, 1]], LOW, 1e30, False, "only_low_threshold: e^-10 = 4.5e-5 < 1e-4"),
])
def test_outlier_token_mask(old, rollout, mask, lower, upper, row_kept, why):
    # C test_compute_outlier_token_mask_*: SkyRL rejects a whole row when any counted token's ratio is outside
    # [low, high]. mathrl has no rule that rejects a row for one token's ratio window: its icepop rule
    # rejects that token alone. SkyRL's row verdict is the conjunction of icepop's over the row's counted
    # tokens, asserted here with icepop's own per-token verdict. (A missing bound is an extreme one: icepop
    # needs 0 < lower <= 1 <= upper < inf.)
    m = t(mask)
    keep = icepop_keep(t(old), t(rollout), m, lower=lower, upper=upper)
    assert bool((keep | ~m.bool()).all(-1)) == row_kept, why
    lr = (t(old) - t(rollout))[0]
    per_token = [bool(math.log(lower) <= float(x) <= math.log(upper)) or not mask[0][j] for j, x in enumerate(lr)]
    assert keep[0].tolist() == per_token, why


def test_outlier_token_mask_symmetric_window_as_k2_max_rs():
    # C test_compute_outlier_token_mask_masks_by_token_bounds / _accepts_in_bounds with a window symmetric in
    # log space, [1/100, 100]: a row with a token outside is one whose max_t 1/2 (log rho_t)^2 is over
    # 1/2 (ln 100)^2, mathrl's k2_max_rs, which rejects the whole row as SkyRL does.
    thr = 0.5 * math.log(100.0) ** 2
    out = kl_rs_keep(t([[-1.0] * 3]), t([[-1.0, -1.0, -6.0]]), ONE_ROW, estimator="k2", threshold=thr, reduce="max")
    inb = kl_rs_keep(t([[-1.0, -1.5, -1.0]]), t([[-1.5, -1.0, -1.0]]), ONE_ROW, estimator="k2", threshold=thr,
                     reduce="max")
    assert out.tolist() == [[False] * 3] and inb.tolist() == [[True] * 3]


def test_no_rule_keeps_everything():
    # C test_compute_outlier_token_mask_null_thresholds / test_compute_off_policy_correction_null_configs: with
    # no rule configured nothing is rejected: mathrl's chain of no keep mask is all True.
    assert chain([], like=ONE_ROW).all()


# ----------------------------------------------------------------------------- C: token mask (IcePop window)
@pytest.mark.parametrize("old, rollout, mask, keep, share, why", [
    ([[-1.0, -1.1, -1.0]], [[-1.1, -1.0, -1.0]], [[1, 1, 1]], [[1, 1, 1]], 0.0, "all_in_bounds: [1.105, 0.905, 1]"),
    ([[-1.0] * 3], [[-1.0, -1.0, -3.0]], [[1, 1, 1]], [[1, 1, 0]], 1 / 3, "masks_high_ratio_tokens: e^2 = 7.39 > 2"),
    ([[-1.0, -1.0, -3.0]], [[-1.0] * 3], [[1, 1, 1]], [[1, 1, 0]], 1 / 3, "masks_low_ratio_tokens: e^-2 = 0.135 < 0.5"),
    ([[-1.0] * 3], [[-1.0, -1.0, -6.0]], [[1, 1, 0]], [[1, 1, 1]], 0.0, "ignores_already_masked_tokens"),
    ([[-1.0, -1.0], [-3.0, -1.0]], [[-1.0, -3.0], [-1.0, -1.0]], [[1, 1], [1, 1]], [[1, 0], [0, 1]], 0.5,
     "multi_sequence_batch: one token of each row"),
    ([[0.0, 0.0]], [[-math.log(0.5), -math.log(2.0)]], [[1, 1]], [[1, 1]], 0.0,
     "boundary_values: ratios exactly 0.5 and 2 are kept (>= low, <= high)"),
])
def test_token_mask(old, rollout, mask, keep, share, why):
    # C test_compute_token_mask_*: SkyRL's token_mask_is_threshold_low/high [0.5, 2] is mathrl's icepop rule
    # with bounds [0.5, 2] (inclusive, on pi_old / pi_rollout; padding is kept, as SkyRL keeps it 1).
    m = torch.tensor(mask, dtype=torch.float32)
    got = icepop_keep(torch.tensor(old), torch.tensor(rollout), m, lower=0.5, upper=2.0)
    assert got.int().tolist() == keep, why
    assert float((~got & m.bool()).sum() / m.sum()) == pytest.approx(share), why


def test_token_mask_in_the_loss_mask():
    # C test_compute_off_policy_correction_with_token_mask: the rejected token leaves the loss mask
    # ([1, 1, 0]), mathrl's `rejected: drop`.
    keep = icepop_keep(t([[-1.0] * 3]), t([[-1.0, -1.0, -3.0]]), ONE_ROW, lower=0.5, upper=2.0)
    assert_close(ONE_ROW * keep, t([[1.0, 1.0, 0.0]]))


def test_token_tis_changes_the_ppo_loss_by_hand():
    # C test_ppo_policy_loss_with_off_policy_correction: token TIS cap 2 with token_mean; SkyRL asserts the
    # loss changes. By hand: ratios exp([-0.1, 0.1, 0]) with A [1, -1, 0.5] are inside [0.8, 1.2], so the loss
    # is mean(-0.90484, 1.10517, -0.5) = -0.099890; every TIS weight is exp(-1 + 1.05) = exp(0.05) (under the
    # cap): -0.099890 x 1.051271 = -0.105012.
    adv, old, lp = t([[1.0, -1.0, 0.5]]), t([[-1.0] * 3]), t([[-1.1, -0.9, -1.0]])
    w, _ = correction_weights(old, t([[-1.05] * 3]), ONE_ROW, mode="tis", level="token", cap=2.0)
    plain, _ = ppo_clip(lp, old, adv, ONE_ROW, eps_low=0.2, eps_high=0.2)
    weighted, _ = ppo_clip(lp, old, adv, ONE_ROW, eps_low=0.2, eps_high=0.2, weights=w)
    mean = dict(mode="token_mean", num_tokens=3.0, num_seqs=1.0)
    without = (-math.exp(-0.1) + math.exp(0.1) - 0.5) / 3
    assert aggregate(plain, ONE_ROW, **mean).item() == pytest.approx(without, rel=1e-9)
    assert aggregate(weighted, ONE_ROW, **mean).item() == pytest.approx(without * math.exp(0.05), rel=1e-9)
