"""Rollout/trainer mismatch correction (algo.rollout_correction) against hand-computed values."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

from mathrl.algo.losses import aggregate, policy_loss
from mathrl.algo.rollout_correction import (
    chain,
    correction_weights,
    geo_rs_keep,
    icepop_keep,
    kl_rs_keep,
    log_ratio,
    mismatch_kl,
    opsm_keep,
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
# end to end: the switch in a 2-step training run of a tiny model
# --------------------------------------------------------------------------------------------------
TINY_RUN = [
    "base.steps=20", "base.hidden_size=32", "base.intermediate_size=64", "base.num_layers=2", "base.num_heads=2",
    "base.num_kv_heads=1", "train.steps=2", "rollout.prompts_per_step=4", "rollout.n=4", "train.mini_batch_size=8",
    "data.eval_size=4", "eval.n=1", "eval.every=2", "rollout.max_new_tokens=16", "train.save_every=0",
    "reward.num_workers=0", "log.rollouts_per_step=0",
    # every group trains: a 20-step base model is never right, so dynamic sampling would drop every step
    "data.dynamic_sampling.mode=none",
]


@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides, expect_mismatch",
    [
        # float32: the torch engine samples with the trainer's own weights, so every weight is 1 up to rounding
        (["algo.rollout_correction.mode=tis", "algo.rollout_correction.level=token"], False),
        # bfloat16: the engine's cached decoding and the trainer's full forward round differently (mean
        # |dlogp| ~5e-5 here); with a cap of 1.0001 (1e-4 nats) about a third of the responses' ratios are
        # over it (measured 0.34 and 0.33 at steps 1 and 2; the run is seeded) and MIS drops them
        (["algo.rollout_correction.mode=mis", "algo.rollout_correction.level=sequence",
          "algo.rollout_correction.cap=1.0001", "model.dtype=bfloat16"], True),
    ],
    ids=["tis-token-float32", "mis-sequence-bfloat16"],
)
def test_training_with_the_correction_logs_finite_metrics(tmp_path, monkeypatch, overrides, expect_mismatch):
    import io

    from rich.console import Console

    from mathrl.config import load_config
    from mathrl.track.sinks import read_metrics
    from mathrl.train.loop import train

    monkeypatch.setenv("MATHRL_CACHE", str(tmp_path / "cache"))
    cfg = load_config(None, [*TINY_RUN, *overrides, f"run_dir={tmp_path / 'run'}"])
    train(cfg, console=Console(file=io.StringIO(), width=120))
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "actor/pg_loss" in r]
    glossary = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    assert "`actor/rollout_is_weight`" in glossary and "`actor/rollout_is_over_cap`" in glossary
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        for key in ("actor/rollout_is_weight", "actor/rollout_is_over_cap", "rollout/logprob_mismatch", "actor/pg_loss"):
            assert isinstance(row[key], float) and math.isfinite(row[key]), (key, row[key])
        if expect_mismatch:
            assert row["rollout/logprob_mismatch"] > 0
            assert 0 < row["actor/rollout_is_over_cap"] <= 1
            assert row["actor/rollout_is_weight"] < 1  # dropped responses weigh 0
        else:
            assert row["rollout/logprob_mismatch"] < 1e-4
            assert row["actor/rollout_is_weight"] == pytest.approx(1.0, abs=1e-4)
            assert row["actor/rollout_is_over_cap"] == 0


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


def _update_once(overrides, old, rollout_lp, mask, adv):
    """The aggregated policy-gradient term of one micro-batch holding the whole batch, built as
    train/step.py and train/update.py build it; returns the loss, its gradient with respect to the
    logprobs, the step metrics and the batch."""
    from mathrl.config import load_config
    from mathrl.train.batching import TrainBatch
    from mathrl.train.step import importance_weights
    from mathrl.train.update import TermInputs, pg_term

    cfg = load_config(None, overrides)
    n, t = old.shape
    batch = TrainBatch(prompt_ids=torch.zeros(n, 1, dtype=torch.long), prompt_mask=torch.ones(n, 1),
                       response_ids=torch.zeros(n, t, dtype=torch.long), response_mask=mask.clone(),
                       loss_mask=mask.clone(), old_logprobs=old, advantages=adv, ref_logprobs=torch.zeros(n, t),
                       ref_entropy=torch.zeros(n, t), correct=torch.zeros(n), rollout_logprobs=rollout_lp)
    batch.is_weights, batch.loss_mask, metrics = importance_weights(cfg, batch.old_logprobs, batch.rollout_logprobs,
                                                                    batch.response_mask, batch.loss_mask)
    logprobs = (old + 0.1).clone().requires_grad_(True)  # pi_theta moved a little away from the proximal policy
    x = TermInputs(cfg.algo, cfg.rollout.max_new_tokens, 0, batch, logprobs, torch.zeros(n, t), batch.loss_mask,
                   float(batch.loss_mask.sum()), float(n), 0.0, 0.0, {"entropy": 0.0, "kl": 0.0}, {})
    loss, _ = pg_term(x)
    loss.backward()
    return float(loss.detach()), logprobs.grad, metrics, batch


def test_decoupled_ppo_matches_the_areal_objective_by_hand():
    # AReaL's decoupled PPO: per token -min(r A, clip(r) A) * w, r = pi_theta / pi_prox, w = pi_prox / pi_behav
    # zeroed where w > cap, summed over the loss mask and divided by its count (rejected tokens stay in it).
    adv = torch.tensor([[1.0, -1.0, 2.0], [0.5, 0.5, 0.0]])
    loss, grad, metrics, _ = _update_once(["algo.off_policy=decoupled", "algo.rollout_correction.cap=2.5"],
                                          OLD, ROLLOUT, MASK, adv)
    r = math.exp(0.1)  # every token: logprobs = prox + 0.1; clip(r) = min(r, 1.28) = r (r = 1.105)
    w = [[2.0, 1.0, 0.5], [0.0, 0.0]]  # ratio-3 tokens rejected
    terms = [-r * a * wt for a, wt in zip([1.0, -1.0, 2.0, 0.5, 0.5], w[0] + w[1])]
    assert loss == pytest.approx(sum(terms) / 5, rel=1e-6)
    assert metrics["actor/rollout_is_over_cap"] == pytest.approx(2 / 5)
    assert metrics["actor/rollout_is_weight"] == pytest.approx((2 + 1 + 0.5) / 5)
    assert grad[1, :2].abs().sum() == 0  # the rejected tokens teach nothing


def test_rejected_drop_takes_tokens_out_of_the_normaliser_and_zero_keeps_them():
    adv = torch.ones(2, 3)
    base = ["algo.off_policy=decoupled", "algo.rollout_correction.cap=2.5"]
    zero, _, _, kept = _update_once(base, OLD, ROLLOUT, MASK, adv)
    drop, _, _, dropped = _update_once([*base, "algo.rollout_correction.rejected=drop"], OLD, ROLLOUT, MASK, adv)
    assert kept.loss_mask.sum() == 5 and dropped.loss_mask.sum() == 3  # the two ratio-3 tokens left the mask
    assert drop == pytest.approx(zero * 5 / 3, rel=1e-6)  # the same terms over 3 tokens instead of 5


def test_off_policy_tis_is_token_tis_and_cannot_be_combined_with_rollout_correction():
    from mathrl.config import ConfigError, load_config

    c = load_config(None, ["algo.off_policy=tis", "algo.rollout_correction.cap=3", "algo.rollout_correction.lower=0.25"]).correction()
    assert (c.mode, c.level, c.cap, c.lower, c.rejected) == ("tis", "token", 3.0, 0.25, "zero")
    assert load_config(None, []).correction() is None
    with pytest.raises(ConfigError, match="takes one importance weight"):
        load_config(None, ["algo.off_policy=decoupled", "algo.rollout_correction.mode=tis"])


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


def test_masks_in_the_step_by_hand():
    # masks=[icepop] at [0.6, 4], no importance weight: the weights are the keep mask, row 0's third token 0.
    adv = torch.ones(2, 3)
    loss, grad, metrics, batch = _update_once(["algo.rollout_correction.masks=[icepop]",
                                               "algo.rollout_correction.icepop_bounds=[0.6, 4]"], OLD, ROLLOUT, MASK, adv)
    assert_close(batch.is_weights * MASK, torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]]))
    assert batch.loss_mask.sum() == 5  # rejected=zero: the rejected token stays in the normaliser
    assert metrics["rollout_corr/icepop_rejected"] == pytest.approx(1 / 5)
    assert metrics["rollout_corr/k1_kl"] == pytest.approx(-2 * LN3 / 5, rel=1e-6)
    assert metrics["rollout_corr/k3_kl"] == pytest.approx((4.5 - 2 * LN3) / 5, rel=1e-6)
    assert "actor/rollout_is_weight" not in metrics  # no importance weight is on
    r = math.exp(0.1)  # pi_theta = old + 0.1 on every token, under the clip 1.28: -r A per kept token, over 5
    assert loss == pytest.approx(-r * 4 / 5, rel=1e-6)
    assert grad[0, 2] == 0


def test_chained_masks_with_tis_and_drop_by_hand():
    # tis (cap 2.5) weights [[2, 1, 1/2], [2.5, 2.5]]; icepop [0.6, 4] rejects (0, 2), geo_rs [0.5, 2] rejects row 1:
    # only (0, 0) and (0, 1) remain, and with drop they alone are the normaliser.
    overrides = ["algo.rollout_correction.mode=tis", "algo.rollout_correction.cap=2.5", "algo.rollout_correction.rejected=drop",
                 "algo.rollout_correction.masks=[icepop, geo_rs]", "algo.rollout_correction.icepop_bounds=[0.6, 4]",
                 "algo.rollout_correction.geo_rs_bounds=[0.5, 2]"]
    loss, _, metrics, batch = _update_once(overrides, OLD, ROLLOUT, MASK, torch.ones(2, 3))
    assert_close(batch.is_weights, torch.tensor([[2.0, 1.0, 0.0], [0.0, 0.0, 0.0]]))
    assert_close(batch.loss_mask, torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]))
    # each rule's share is its own, of the sample filters' 5 tokens (not of what the other rules left)
    assert metrics["rollout_corr/icepop_rejected"] == pytest.approx(1 / 5)
    assert metrics["rollout_corr/geo_rs_rejected"] == pytest.approx(2 / 5)
    assert metrics["actor/rollout_is_over_cap"] == pytest.approx(2 / 5)  # tis caps the two ratio-3 tokens
    r = math.exp(0.1)
    assert loss == pytest.approx(-r * (2.0 + 1.0) / 2, rel=1e-6)


def test_opsm_is_applied_after_the_advantages():
    from types import SimpleNamespace

    from mathrl.algo.estimators import Advantages
    from mathrl.config import load_config
    from mathrl.train.step import Scored, advantage_masks, importance_weights

    cfg = load_config(None, ["algo.rollout_correction.masks=[opsm]", "algo.rollout_correction.rejected=drop"])
    # opsm is not applied with the rules that need no advantages (there are none yet) ...
    is_weights, loss_mask, metrics = importance_weights(cfg, OPSM_OLD, ROLLOUT, MASK, MASK.clone())
    assert is_weights is None and torch.equal(loss_mask, MASK)
    assert "rollout_corr/k1_kl" in metrics and "rollout_corr/opsm_rejected" not in metrics
    # ... but once they are: row 1 (negative, mean log(pi_rollout / pi_old) = ln3 > 0.5) goes, and with drop leaves the mask
    scored = Scored(old_logprobs=OPSM_OLD, entropy=None, ref_logprobs=None, ref_entropy=None, ref_kl=None,
                    is_weights=is_weights, loss_mask=loss_mask, metrics=metrics)
    got = SimpleNamespace(rollout=SimpleNamespace(logprobs=ROLLOUT))
    prep = SimpleNamespace(batch=SimpleNamespace(response_mask=MASK), checks=SimpleNamespace(loss_mask=MASK))
    out, metrics = advantage_masks(cfg, scored, Advantages(-torch.ones(2, 3) * MASK), got, prep)
    assert_close(out.is_weights * MASK, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))  # padding: never in the loss
    assert_close(out.loss_mask, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))
    assert metrics["rollout_corr/opsm_rejected"] == pytest.approx(2 / 5)


def test_a_default_run_has_no_correction_and_no_new_metric():
    from mathrl.config import load_config
    from mathrl.train.step import importance_weights

    is_weights, loss_mask, metrics = importance_weights(load_config(None, []), OLD, ROLLOUT, MASK, MASK)
    assert is_weights is None and loss_mask is MASK and metrics == {}


def test_bypass_takes_the_rollout_logprobs_as_old_without_a_scoring_pass(monkeypatch):
    from types import SimpleNamespace

    from mathrl.config import load_config
    from mathrl.train import step
    from mathrl.train.batching import Rows

    def no_pass(*args, **kwargs):
        raise AssertionError("bypass must not run the old-logprob scoring pass")

    monkeypatch.setattr(step, "scoring_pass", no_pass)
    # bfloat16: without bypass, auto would recompute (the engine's logprobs are not the trainer's here)
    cfg = load_config(None, ["algo.rollout_correction.bypass=true", "model.dtype=bfloat16"])
    rollout_lp = torch.tensor([[-0.5, -1.0, -2.0], [-0.25, -3.0, -7.0]])
    batch = Rows(prompt_ids=torch.zeros(2, 1, dtype=torch.long), prompt_mask=torch.ones(2, 1),
                 response_ids=torch.zeros(2, 3, dtype=torch.long), response_mask=MASK.clone(), loss_mask=MASK.clone(),
                 correct=torch.zeros(2), rollout_logprobs=rollout_lp)
    trainer = SimpleNamespace(cfg=cfg, model=None)
    got = SimpleNamespace(rollout=SimpleNamespace(logprobs=rollout_lp))
    prep = SimpleNamespace(batch=batch, checks=SimpleNamespace(loss_mask=MASK.clone()), rows=None)
    scored = step.score(trainer, got, prep)
    assert torch.equal(scored.old_logprobs, rollout_lp * MASK)  # old == rollout on every sampled token
    assert scored.entropy is None and scored.is_weights is None and scored.metrics == {}


@pytest.mark.parametrize("overrides, fragment", [
    (["algo.rollout_correction.mode=tis"], "algo.rollout_correction.mode=tis with algo.policy_loss=ppo_clip"),
    (["algo.rollout_correction.masks=[k3_rs, opsm]"], "algo.rollout_correction.masks with opsm"),
    (["algo.rollout_correction.masks=[k3_rs]", "algo.rollout_correction.rejected=drop"],
     "algo.rollout_correction.rejected=drop"),
    (["algo.off_policy=decoupled"], "algo.off_policy=decoupled"),
    (["train.old_logprobs=recompute"], "leave train.old_logprobs=auto"),
    (["algo.entropy.mode=adaptive"], "algo.entropy.mode=adaptive"),
])
def test_bypass_refuses_what_needs_the_trainers_old_logprobs(overrides, fragment):
    from mathrl.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"algo\.rollout_correction\.bypass=true .*" + re.escape(fragment)):
        load_config(None, ["algo.rollout_correction.bypass=true", *overrides])


def test_mask_settings_are_checked_before_anything_loads():
    from mathrl.config import ConfigError, load_config

    for override, message in [("masks=[geo_rs, geo_rs]", "without repeats"), ("icepop_bounds=[1.5, 2]", "0 < lower <= 1 <= upper"),
                              ("geo_rs_bounds=[0.999]", "0 < lower <= 1 <= upper"), ("k3_rs_threshold=0", "must be > 0"),
                              ("opsm_delta=-1", "must be > 0"), ("masks=[tis]", "is not one of")]:
        with pytest.raises(ConfigError, match=re.escape(message)):
            load_config(None, [f"algo.rollout_correction.{override}"])


# --------------------------------------------------------------------------------------------------
# end to end: 2 steps of the tiny model with each rule (the base model built once for all of them)
# --------------------------------------------------------------------------------------------------
TINY = [
    "base.steps=200", "base.max_digits=1", "data.arith.max_digits=1", "base.hidden_size=32",
    "base.intermediate_size=64", "base.num_layers=2", "base.num_heads=2", "base.num_kv_heads=1",
    "train.steps=2", "rollout.prompts_per_step=4", "rollout.n=4", "train.mini_batch_size=8", "data.eval_size=4",
    "eval.n=2", "eval.every=2", "reward.num_workers=0", "data.dynamic_sampling.mode=none", "train.save_every=0",
]
ALL_RULES = "[geo_rs, icepop, k3_rs, k2_mean_rs, k2_max_rs, opsm]"


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.mark.slow
@pytest.mark.parametrize("overrides, rules", [
    (["algo.rollout_correction.masks=[geo_rs]"], ["geo_rs"]),
    (["algo.rollout_correction.masks=[icepop]", "algo.rollout_correction.mode=tis"], ["icepop"]),
    (["algo.rollout_correction.masks=[k3_rs]"], ["k3_rs"]),
    (["algo.rollout_correction.masks=[k2_mean_rs]", "algo.rollout_correction.rejected=drop"], ["k2_mean_rs"]),
    (["algo.rollout_correction.masks=[opsm]"], ["opsm"]),
    ([f"algo.rollout_correction.masks={ALL_RULES}"], ["geo_rs", "icepop", "k3_rs", "k2_mean_rs", "k2_max_rs", "opsm"]),
    (["algo.rollout_correction.bypass=true"], []),
    (["algo.rollout_correction.bypass=true", "algo.policy_loss=gpg", "algo.rollout_correction.mode=tis",
      "algo.rollout_correction.masks=[geo_rs]"], []),
], ids=["geo_rs", "icepop+tis", "k3_rs", "k2_mean_rs-drop", "opsm", "chained", "bypass", "bypass+tis+geo_rs"])
def test_training_with_each_mask(overrides, rules, shared_cache, tmp_path, monkeypatch):
    import io

    from rich.console import Console

    from mathrl.config import load_config
    from mathrl.track.sinks import read_metrics
    from mathrl.train.loop import train

    monkeypatch.setenv("MATHRL_CACHE", str(shared_cache))
    # bfloat16: the engine's cached decoding and the trainer's forward round differently, so the rules
    # compare two different logprobs (they must run either way)
    cfg = load_config(None, [*TINY, "model.dtype=bfloat16", *overrides, f"run_dir={tmp_path / 'run'}"])
    result = train(cfg, console=Console(file=io.StringIO()))
    rows = [r for r in read_metrics(result.run_dir / "metrics.jsonl") if "actor/pg_loss" in r]
    assert [r["step"] for r in rows] == [1, 2]
    glossary = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    for row in rows:
        for key, value in row.items():
            assert isinstance(value, (int, float)) and math.isfinite(value), (key, value)
        corr = sorted(k for k in row if k.startswith("rollout_corr/"))
        if not rules:  # bypass: old == rollout, no scoring pass (so no rollout entropy), nothing to compare
            assert corr == [] and row["rollout/logprob_mismatch"] == 0 and "actor/rollout_entropy" not in row
            continue
        assert corr == sorted(["rollout_corr/k1_kl", "rollout_corr/k3_kl", *(f"rollout_corr/{r}_rejected" for r in rules)])
        assert row["rollout_corr/k3_kl"] > 0  # bf16 sampling: the two logprobs differ
        assert all(0 <= row[f"rollout_corr/{r}_rejected"] <= 1 for r in rules)
        assert [k for k in corr if f"`{k}`" not in glossary] == []  # docs/metrics.md defines every key
