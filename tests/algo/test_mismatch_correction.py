"""Rollout/trainer mismatch correction (algo/rollout_correction.py) against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from mathrl.algo.losses import aggregate, policy_loss
from mathrl.algo.rollout_correction import (
    advantage_rejection,
    chain,
    correction_weights,
    geo_rs_keep,
    icepop_keep,
    kl_rs_keep,
    log_ratio,
    mismatch_kl,
    opsm_keep,
    rollout_correction,
    rule_keeps,
)

LN2, LN3 = math.log(2.0), math.log(3.0)

# Two rows of three tokens; row 0 has all three sampled, row 1 only the first two (third is padding).
# old - rollout per token: row 0 = [ln 2, 0, -ln 2] (ratios 2, 1, 1/2), row 1 = [ln 3, ln 3, <pad>].
OLD = torch.tensor([[LN2, 0.0, -LN2], [LN3, LN3, 99.0]])
ROLLOUT = torch.zeros(2, 3)
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])

CASES = [
    # (mode, level, cap, expected weights, expected over_cap, why)
    ("tis", "token", 2.5, [[2.0, 1.0, 0.5], [2.5, 2.5, 0.0]], [[0, 0, 0], [1, 1, 0]],
     "token TIS caps ratio 3 at C=2.5 and keeps ratios under the cap as they are (0.5 stays 0.5: no lower cap)"),
    ("mis", "token", 2.5, [[2.0, 1.0, 0.5], [0.0, 0.0, 0.0]], [[0, 0, 0], [1, 1, 0]],
     "token MIS drops the two ratio-3 tokens instead of capping them; kept tokens keep their ratio"),
    ("tis", "sequence", 2.5, [[1.0, 1.0, 1.0], [2.5, 2.5, 0.0]], [[0, 0, 0], [1, 1, 0]],
     "row 0's sequence ratio is 2 * 1 * 1/2 = 1; row 1's is 3 * 3 = 9, capped at 2.5 on every token"),
    ("mis", "sequence", 2.5, [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]], [[0, 0, 0], [1, 1, 0]],
     "sequence MIS drops all of row 1 (ratio 9 > 2.5) and keeps row 0 whole although one token has ratio 2"),
    ("tis", "token", 10.0, [[2.0, 1.0, 0.5], [3.0, 3.0, 0.0]], [[0] * 3, [0] * 3],
     "with a cap above every ratio TIS is plain importance sampling"),
    ("mis", "sequence", 10.0, [[1.0, 1.0, 1.0], [9.0, 9.0, 0.0]], [[0] * 3, [0] * 3],
     "sequence ratio 9 is under C=10 and kept with its full weight"),
]


@pytest.mark.parametrize("mode, level, cap, weights, over, why", CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in CASES])
def test_weights_match_hand_computed_values(mode, level, cap, weights, over, why):
    w, o = correction_weights(OLD, ROLLOUT, MASK, mode=mode, level=level, cap=cap)
    assert_close(w, torch.tensor(weights), msg=why)
    assert_close(o, torch.tensor(over, dtype=torch.float32), msg=why)


def test_identical_logprobs_give_weight_one_everywhere():
    # The torch engine samples from the trainer's own float32 weights: no correction must change nothing.
    lp = torch.randn(3, 5)
    for mode in ("tis", "mis"):
        for level in ("token", "sequence"):
            w, o = correction_weights(lp, lp.clone(), torch.ones(3, 5), mode=mode, level=level, cap=2.0)
            assert_close(w, torch.ones(3, 5))
            assert o.sum() == 0


def test_sequence_ratio_far_over_the_cap_does_not_overflow():
    # 100 tokens each 1 nat apart: the sequence ratio is e^100 (inf in float32 after exp without the clamp).
    old, rollout, mask = torch.ones(1, 100), torch.zeros(1, 100), torch.ones(1, 100)
    w, _ = correction_weights(old, rollout, mask, mode="tis", level="sequence", cap=2.0)
    assert_close(w, torch.full((1, 100), 2.0))
    w, _ = correction_weights(old, rollout, mask, mode="mis", level="sequence", cap=2.0)
    assert torch.isfinite(w).all() and w.sum() == 0


def test_padding_never_enters_the_sequence_ratio():
    # Row 1's padded third token has old - rollout = 99; counting it would make the ratio e^101.
    lr = log_ratio(OLD, ROLLOUT, MASK, level="sequence")
    assert_close(lr, torch.tensor([[0.0, 0.0, 0.0], [2 * LN3, 2 * LN3, 0.0]]))


def test_weights_carry_no_gradient():
    old = OLD.clone().requires_grad_(True)
    w, _ = correction_weights(old, ROLLOUT, MASK, mode="tis", level="token", cap=2.5)
    assert not w.requires_grad


def test_weighted_policy_loss_scales_each_tokens_gradient_by_its_weight():
    # At ratio 1 (new == old) the per-token loss is -A * ratio, so d loss / d logprob_t = -A_t * w_t / N.
    logprobs = OLD.clone().requires_grad_(True)
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    w, _ = correction_weights(OLD, ROLLOUT, MASK, mode="tis", level="token", cap=2.5)
    per_token, _ = policy_loss(logprobs, OLD, adv, MASK)
    loss = aggregate(per_token * w, MASK, mode="token_mean", num_tokens=5, num_seqs=2)
    loss.backward()
    expected = -adv * torch.tensor([[2.0, 1.0, 0.5], [2.5, 2.5, 0.0]]) / 5
    assert_close(logprobs.grad, expected)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(mode="tis", level="token", cap=1.0), "cap must be"),  # ratio 1 is on-policy: a cap of 1 drops everything
        (dict(mode="tis", level="token", cap=float("inf")), "cap must be"),
        (dict(mode="clip", level="token", cap=2.0), "unknown mode"),
        (dict(mode="tis", level="row", cap=2.0), "unknown level"),
    ],
)
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        correction_weights(OLD, ROLLOUT, MASK, **kwargs)


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="same shape"):
        correction_weights(OLD, ROLLOUT[:, :2], MASK, mode="tis", level="token", cap=2.0)


# --------------------------------------------------------------------------------------------------
# the lower bound (a two-sided rejection window) and what a rejected token does to the loss
# --------------------------------------------------------------------------------------------------
LOWER_CASES = [
    # ratios: row 0 = [2, 1, 1/2], row 1 = [3, 3, pad]
    ("mis", 2.5, 0.6, [[2.0, 1.0, 0.0], [0.0, 0.0, 0.0]], [[0, 0, 1], [1, 1, 0]],
     "MIS with [0.6, 2.5]: ratio 1/2 is under the lower bound and rejected like the ratio-3 tokens"),
    ("tis", 2.5, 0.6, [[2.0, 1.0, 0.0], [2.5, 2.5, 0.0]], [[0, 0, 1], [1, 1, 0]],
     "TIS caps ratio 3 at 2.5 and rejects ratio 1/2 (under 0.6)"),
    ("mis", 2.5, 0.5, [[2.0, 1.0, 0.5], [0.0, 0.0, 0.0]], [[0, 0, 0], [1, 1, 0]],
     "ratio exactly 1/2 is on the lower bound, so kept (verl and IcePop keep [L, C] inclusive)"),
    ("mis", 2.0, 0.5, [[2.0, 1.0, 0.5], [0.0, 0.0, 0.0]], [[0, 0, 0], [1, 1, 0]],
     "IcePop's window [0.5, 2]: both ends kept, ratio 3 rejected"),
]


@pytest.mark.parametrize("mode, cap, lower, weights, rejected, why", LOWER_CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in LOWER_CASES])
def test_lower_bound_rejects_small_ratios(mode, cap, lower, weights, rejected, why):
    w, r = correction_weights(OLD, ROLLOUT, MASK, mode=mode, level="token", cap=cap, lower=lower)
    assert_close(w, torch.tensor(weights), msg=why)
    assert_close(r, torch.tensor(rejected, dtype=torch.float32), msg=why)


def test_lower_bound_outside_the_unit_interval_is_refused():
    for lower in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match="lower must be in"):
            correction_weights(OLD, ROLLOUT, MASK, mode="mis", level="token", cap=2.0, lower=lower)


# --------------------------------------------------------------------------------------------------
# rejection rules (algo.rollout_correction.masks): each by hand on OLD / ROLLOUT / MASK
#   log ratio (old - rollout): row 0 = [ln 2, 0, -ln 2] (ratios 2, 1, 1/2), row 1 = [ln 3, ln 3, <pad>]
#   True = kept; padding counts as kept (the loss mask takes it out)
# --------------------------------------------------------------------------------------------------
T_, F_ = True, False
ROW0_KEPT_ROW1_REJECTED = [[T_, T_, T_], [F_, F_, T_]]

GEO_CASES = [
    # (lower, upper, keep, why)
    (0.5, 2.0, ROW0_KEPT_ROW1_REJECTED,
     "row 0: mean log ratio (ln2 + 0 - ln2) / 3 = 0, geometric mean 1, kept; row 1: (ln3 + ln3) / 2 = ln3, 3 > 2"),
    (0.999, 1.001, ROW0_KEPT_ROW1_REJECTED,
     "verl's preset window: row 0 is kept whole although two of its tokens have ratios 2 and 1/2 (they cancel)"),
    (0.5, 3.0, [[T_] * 3, [T_] * 3], "row 1's geometric mean 3 is on the upper bound: kept (inclusive, as verl)"),
    (0.5, 2.9, ROW0_KEPT_ROW1_REJECTED, "just under 3 rejects row 1; the sequence ratio 3 * 3 = 9 plays no part"),
]


@pytest.mark.parametrize("lower, upper, keep, why", GEO_CASES, ids=[f"{c[0]}-{c[1]}" for c in GEO_CASES])
def test_geo_rs_keeps_responses_by_the_geometric_mean_of_their_ratios(lower, upper, keep, why):
    assert geo_rs_keep(OLD, ROLLOUT, MASK, lower=lower, upper=upper).tolist() == keep, why


def test_geo_rs_bounds_the_reciprocal_of_verls_k1_ratio():
    # Row 2's ratios are all 1/2 (geometric mean 1/2). The window [0.6, 2] is on pi_old / pi_rollout:
    # 1/2 < 0.6 rejects it. verl's seq_mean_k1 would read "0.6_2" as bounds on pi_rollout / pi_old = 2,
    # inside [0.6, 2], and keep it: the same window here is [1/2, 1/0.6] (docs/tricks.md).
    old = torch.tensor([[-LN2, -LN2, -LN2]])
    assert geo_rs_keep(old, torch.zeros(1, 3), torch.ones(1, 3), lower=0.6, upper=2.0).tolist() == [[F_, F_, F_]]
    assert geo_rs_keep(old, torch.zeros(1, 3), torch.ones(1, 3), lower=0.5, upper=1 / 0.6).tolist() == [[T_, T_, T_]]


ICEPOP_CASES = [
    (0.5, 2.0, ROW0_KEPT_ROW1_REJECTED, "IcePop's [0.5, 2]: ratios 2, 1, 1/2 are inside (bounds inclusive), 3 is not"),
    (0.6, 2.5, [[T_, T_, F_], [F_, F_, T_]], "ratio 1/2 is under 0.6 and 3 over 2.5: each token on its own"),
    (0.4, 4.0, [[T_] * 3, [T_] * 3], "every ratio is inside [0.4, 4]"),
]


@pytest.mark.parametrize("lower, upper, keep, why", ICEPOP_CASES, ids=[f"{c[0]}-{c[1]}" for c in ICEPOP_CASES])
def test_icepop_rejects_each_token_whose_ratio_is_outside_the_window(lower, upper, keep, why):
    assert icepop_keep(OLD, ROLLOUT, MASK, lower=lower, upper=upper).tolist() == keep, why


def test_icepop_with_tis_is_the_icepop_objective():
    # IcePop weighs a token by M(rho) = rho * 1[0.5 <= rho <= 2]: tis (cap 2) times the mask.
    w, _ = correction_weights(OLD, ROLLOUT, MASK, mode="tis", level="token", cap=2.0)
    keep = icepop_keep(OLD, ROLLOUT, MASK, lower=0.5, upper=2.0)
    assert_close(w * keep, torch.tensor([[2.0, 1.0, 0.5], [0.0, 0.0, 0.0]]))


# Per-token estimates of KL(pi_rollout || pi_old) at rho = 2, 1, 1/2 and 3:
#   k3 = rho - 1 - ln rho:  2 - 1 - ln2 = 0.3069, 0, 1/2 - 1 + ln2 = 0.1931, 3 - 1 - ln3 = 0.9014
#   k2 = (ln rho)^2 / 2:    0.2402, 0, 0.2402, 0.6035
#   row means: k3 row 0 = (1 - ln2 + 0 - 1/2 + ln2) / 3 = 1/6 = 0.1667, row 1 = 2 - ln3 = 0.9014
#              k2 row 0 = ln2^2 / 3 = 0.1602,                          row 1 = ln3^2 / 2 = 0.6035
KL_RS_CASES = [
    ("k3", 0.2, ROW0_KEPT_ROW1_REJECTED, "k3 means 0.1667 <= 0.2 < 0.9014"),
    ("k3", 0.165, [[F_] * 3, [F_, F_, T_]], "row 0's k3 mean 1/6 = 0.1667 is just over 0.165"),
    ("k2", 0.165, ROW0_KEPT_ROW1_REJECTED, "row 0's k2 mean 0.1602 is under 0.165: k2 and k3 differ away from ratio 1"),
    ("k2", 0.16, [[F_] * 3, [F_, F_, T_]], "0.1602 > 0.16"),
    ("k3", 1.0, [[T_] * 3, [T_] * 3], "both means are under 1"),
]
# the max over a row's tokens (verl seq_max_k2): row 0's k2 = [ln2^2/2, 0, ln2^2/2] = 0.2402 at most, row 1's 0.6035
KL_MAX_CASES = [
    (0.2, [[F_] * 3, [F_, F_, T_]], "row 0's max 0.2402 > 0.2 although its mean 0.1602 is under"),
    (0.25, ROW0_KEPT_ROW1_REJECTED, "0.2402 <= 0.25 < 0.6035"),
    (0.61, [[T_] * 3, [T_] * 3], "both maxima under 0.61"),
]


@pytest.mark.parametrize("estimator, threshold, keep, why", KL_RS_CASES, ids=[f"{c[0]}-{c[1]}" for c in KL_RS_CASES])
def test_kl_rs_rejects_responses_whose_mean_kl_estimate_is_over_the_threshold(estimator, threshold, keep, why):
    assert kl_rs_keep(OLD, ROLLOUT, MASK, estimator=estimator, threshold=threshold).tolist() == keep, why


@pytest.mark.parametrize("threshold, keep, why", KL_MAX_CASES, ids=[str(c[0]) for c in KL_MAX_CASES])
def test_k2_max_rs_rejects_a_response_by_its_largest_token(threshold, keep, why):
    assert kl_rs_keep(OLD, ROLLOUT, MASK, estimator="k2", threshold=threshold, reduce="max").tolist() == keep, why
    by_name = rule_keeps(OLD, ROLLOUT, MASK, ["k2_max_rs"], k2_rs_threshold=threshold)["k2_max_rs"]
    assert by_name.tolist() == keep, why


# OPSM on the mirrored batch: old = -OLD, so log pi_rollout - log pi_old is row 0 = [ln2, 0, -ln2]
# (mean 0) and row 1 = [ln3, ln3] (mean ln3 = 1.0986): the trainer finds row 1 far less likely than the engine did.
OPSM_OLD = torch.tensor([[-LN2, 0.0, LN2], [-LN3, -LN3, -99.0]])
OPSM_CASES = [
    # (advantages, delta, keep, why)
    ([[-1.0] * 3, [-1.0] * 3], 0.5, ROW0_KEPT_ROW1_REJECTED, "both negative; row 1's mean 1.0986 > 0.5, row 0's 0 is not"),
    ([[-1.0] * 3, [1.0] * 3], 0.5, [[T_] * 3, [T_] * 3], "row 1 is as far off-policy but its advantage is positive: kept"),
    ([[-1.0] * 3, [0.0] * 3], 0.5, [[T_] * 3, [T_] * 3], "advantage 0 is not negative (TRL keeps A >= 0)"),
    ([[-1.0] * 3, [-1.0] * 3], 1.1, [[T_] * 3, [T_] * 3], "delta 1.1 is over ln3 = 1.0986"),
    ([[-1.0] * 3, [1.0, -1.0, -1.0]], 0.5, [[T_] * 3, [T_, F_, T_]],
     "per-token advantages (DeepSeek-V3.2's M_{i,t}): only row 1's negative token goes (the third is padding)"),
]


@pytest.mark.parametrize("adv, delta, keep, why", OPSM_CASES, ids=[str(i) for i in range(len(OPSM_CASES))])
def test_opsm_rejects_negative_responses_the_trainer_drifted_from(adv, delta, keep, why):
    assert opsm_keep(OPSM_OLD, ROLLOUT, torch.tensor(adv), MASK, delta=delta).tolist() == keep, why


def test_opsm_takes_one_advantage_per_response_too():
    assert opsm_keep(OPSM_OLD, ROLLOUT, torch.tensor([-1.0, -1.0]), MASK, delta=0.5).tolist() == ROW0_KEPT_ROW1_REJECTED


def test_chained_rules_keep_the_intersection():
    # icepop [0.6, 4] rejects row 0's ratio-1/2 token; geo_rs [0.5, 2] rejects row 1 (geometric mean 3).
    keeps = rule_keeps(OLD, ROLLOUT, MASK, ["icepop", "geo_rs"], icepop_bounds=(0.6, 4.0), geo_rs_bounds=(0.5, 2.0))
    assert keeps["icepop"].tolist() == [[T_, T_, F_], [T_, T_, T_]]
    assert keeps["geo_rs"].tolist() == ROW0_KEPT_ROW1_REJECTED
    both = [[T_, T_, F_], [F_, F_, T_]]
    assert chain(keeps.values(), like=MASK).tolist() == both
    assert chain(reversed(list(keeps.values())), like=MASK).tolist() == both  # the order of the rules is irrelevant
    assert chain([], like=MASK).all()  # no rule keeps everything


def test_rule_list_is_checked():
    with pytest.raises(ValueError, match="distinct"):
        rule_keeps(OLD, ROLLOUT, MASK, ["icepop", "icepop"])
    with pytest.raises(ValueError, match="distinct"):
        rule_keeps(OLD, ROLLOUT, MASK, ["clip"])
    with pytest.raises(ValueError, match="needs the advantages"):
        rule_keeps(OLD, ROLLOUT, MASK, ["opsm"])
    with pytest.raises(ValueError, match="0 < lower <= 1 <= upper"):
        icepop_keep(OLD, ROLLOUT, MASK, lower=1.2, upper=2.0)  # a window without ratio 1 rejects on-policy tokens


def test_mismatch_kl_by_hand():
    # over the 5 sampled tokens: k1 = mean(rollout - old) = -(ln2 + 0 - ln2 + 2 ln3) / 5 = -0.4394
    # k3 = (k3 sum of row 0 = 1/2) + 2 (2 - ln3) over 5 = (4.5 - 2 ln3) / 5 = 0.4606; padding (99 apart) never enters
    k1, k3 = mismatch_kl(OLD, ROLLOUT, MASK)
    assert float(k1) == pytest.approx(-2 * LN3 / 5, rel=1e-6)
    assert float(k3) == pytest.approx((4.5 - 2 * LN3) / 5, rel=1e-6)
    k1, k3 = mismatch_kl(OLD, OLD.clone(), MASK)
    assert float(k1) == 0 and float(k3) == 0


# --------------------------------------------------------------------------------------------------
# the step's correction: weights, rules, drop and metrics at once (rollout_correction, advantage_rejection)
# --------------------------------------------------------------------------------------------------
K1, K3 = -2 * LN3 / 5, (4.5 - 2 * LN3) / 5  # mismatch_kl over the 5 sampled tokens (test_mismatch_kl_by_hand)
ICEPOP, GEO = {"icepop_bounds": (0.6, 4.0)}, {"geo_rs_bounds": (0.5, 2.0)}
CORRECTION_CASES = [
    # (settings, weights (None: no weight), loss mask, metrics, why)
    ({}, None, MASK.tolist(), {}, "nothing on: no weight, the mask as given, no metric"),
    ({"mode": "mis", "cap": 2.5}, [[2.0, 1.0, 0.5], [0.0, 0.0, 0.0]], MASK.tolist(),
     {"actor/rollout_is_weight": 3.5 / 5, "actor/rollout_is_over_cap": 2 / 5},
     "mis zeroes the two ratio-3 tokens; rejected=zero keeps them in the normaliser"),
    ({"mode": "mis", "cap": 2.5, "drop": True}, [[2.0, 1.0, 0.5], [0.0, 0.0, 0.0]], [[1, 1, 1], [0, 0, 0]],
     {"actor/rollout_is_weight": 3.5 / 5, "actor/rollout_is_over_cap": 2 / 5}, "drop takes the zeroed tokens out of the mask"),
    ({"mode": "tis", "cap": 2.5, "drop": True}, [[2.0, 1.0, 0.5], [2.5, 2.5, 0.0]], MASK.tolist(),
     {"actor/rollout_is_weight": 8.5 / 5, "actor/rollout_is_over_cap": 2 / 5},
     "tis caps the ratio-3 tokens at 2.5: capped, not zeroed, so they stay even with drop"),
    ({"rules": ["icepop"], **ICEPOP}, [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]], MASK.tolist(),
     {"rollout_corr/icepop_rejected": 1 / 5}, "a rule alone: the weights are its keep mask (padding kept, never in the loss)"),
    ({"mode": "tis", "cap": 2.5, "rules": ["icepop", "geo_rs"], "drop": True, **ICEPOP, **GEO},
     [[2.0, 1.0, 0.0], [0.0, 0.0, 0.0]], [[1, 1, 0], [0, 0, 0]],
     {"actor/rollout_is_weight": 8.5 / 5, "actor/rollout_is_over_cap": 2 / 5, "rollout_corr/icepop_rejected": 1 / 5,
      "rollout_corr/geo_rs_rejected": 2 / 5},
     "chained: icepop rejects (0, 2), geo_rs row 1; each share is of the 5 filtered tokens, on its own"),
    ({"rules": ["opsm"]}, None, MASK.tolist(), {}, "opsm waits for the advantages: only the gap is measured"),
]


@pytest.mark.parametrize("settings, weights, loss_mask, metrics, why", CORRECTION_CASES,
                         ids=[str(i) for i in range(len(CORRECTION_CASES))])
def test_rollout_correction_by_hand(settings, weights, loss_mask, metrics, why):
    out = rollout_correction(OLD, ROLLOUT, MASK, MASK, **settings)
    if weights is None:
        assert out.weights is None, why
    else:
        assert_close(out.weights, torch.tensor(weights), msg=why)
    assert_close(out.loss_mask, torch.tensor(loss_mask, dtype=torch.float32), msg=why)
    expected = {} if not settings else {"rollout_corr/k1_kl": K1, "rollout_corr/k3_kl": K3, **metrics}
    assert out.metrics == pytest.approx(expected, rel=1e-6), why


def test_rollout_correction_measures_over_the_sample_filters_mask():
    # the sample filters dropped row 1: the gap and the weights' means are of row 0's 3 tokens only, and
    # the returned mask never brings row 1 back although the response mask has it
    filtered = MASK * torch.tensor([[1.0], [0.0]])
    out = rollout_correction(OLD, ROLLOUT, MASK, filtered, mode="tis", cap=2.5, drop=True)
    assert out.metrics["rollout_corr/k1_kl"] == pytest.approx(0.0, abs=1e-7)  # ln2 + 0 - ln2
    assert out.metrics["actor/rollout_is_weight"] == pytest.approx(3.5 / 3)
    assert out.metrics["actor/rollout_is_over_cap"] == 0.0
    assert_close(out.loss_mask, filtered)


def test_advantage_rejection_applies_opsm_alone_once_the_advantages_are_known():
    # OPSM_OLD: row 1 is ln3 per token further from the trainer than the sampler; both rows negative
    adv = -torch.ones(2, 3) * MASK
    weights = torch.tensor([[2.0, 1.0, 0.5], [1.0, 1.0, 0.0]])
    out = advantage_rejection(OPSM_OLD, ROLLOUT, MASK, adv, weights=weights, loss_mask=MASK, filtered=MASK,
                              rules=["icepop", "opsm"], drop=True, icepop_bounds=(0.99, 1.01))
    assert_close(out.weights, torch.tensor([[2.0, 1.0, 0.5], [0.0, 0.0, 0.0]]))  # icepop is not applied here
    assert_close(out.loss_mask, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))
    assert out.metrics == pytest.approx({"rollout_corr/opsm_rejected": 2 / 5})
    same = advantage_rejection(OPSM_OLD, ROLLOUT, MASK, adv, weights=None, loss_mask=MASK, filtered=MASK, rules=["icepop"])
    assert same.weights is None and same.loss_mask is MASK and same.metrics == {}
