"""Rollout/trainer mismatch correction (algo.rollout_correction) against hand-computed values."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

from mathrl.algo.losses import aggregate, policy_loss
from mathrl.algo.rollout_correction import correction_weights, log_ratio

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
    glossary = (Path(__file__).resolve().parents[1] / "docs" / "metrics.md").read_text()
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
    metrics: dict = {}
    batch.is_weights, batch.loss_mask = importance_weights(cfg, batch.old_logprobs, batch.rollout_logprobs,
                                                           batch.response_mask, batch.loss_mask, metrics)
    logprobs = (old + 0.1).clone().requires_grad_(True)  # pi_theta moved a little away from the proximal policy
    x = TermInputs(cfg, batch, logprobs, torch.zeros(n, t), batch.loss_mask, float(batch.loss_mask.sum()),
                   float(n), 0.0, 0.0, {"entropy": 0.0, "kl": 0.0}, {})
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
