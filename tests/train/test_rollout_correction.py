"""Rollout/trainer mismatch correction (algo.rollout_correction) against hand-computed values."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

LN2, LN3 = math.log(2.0), math.log(3.0)

# Two rows of three tokens; row 0 has all three sampled, row 1 only the first two (third is padding).
# old - rollout per token: row 0 = [ln 2, 0, -ln 2] (ratios 2, 1, 1/2), row 1 = [ln 3, ln 3, <pad>].
OLD = torch.tensor([[LN2, 0.0, -LN2], [LN3, LN3, 99.0]])
ROLLOUT = torch.zeros(2, 3)
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
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


def _update_once(overrides, old, rollout_lp, mask, adv):
    """The aggregated policy-gradient term of one micro-batch holding the whole batch, built as
    train/step.py and train/update.py build it; returns the loss, its gradient with respect to the
    logprobs, the step metrics and the batch."""
    from mathrl.config import load_config
    from mathrl.train.batching import TrainBatch
    from mathrl.train.step import correction
    from mathrl.train.update import TermInputs, pg_term

    cfg = load_config(None, overrides)
    n, t = old.shape
    batch = TrainBatch(prompt_ids=torch.zeros(n, 1, dtype=torch.long), prompt_mask=torch.ones(n, 1),
                       response_ids=torch.zeros(n, t, dtype=torch.long), response_mask=mask.clone(),
                       loss_mask=mask.clone(), old_logprobs=old, advantages=adv, ref_logprobs=torch.zeros(n, t),
                       ref_entropy=torch.zeros(n, t), correct=torch.zeros(n), rollout_logprobs=rollout_lp)
    corrected = correction(cfg, batch.old_logprobs, batch.rollout_logprobs, batch.response_mask, batch.loss_mask)
    batch.is_weights, batch.loss_mask, metrics = corrected.weights, corrected.loss_mask, corrected.metrics
    logprobs = (old + 0.1).clone().requires_grad_(True)  # pi_theta moved a little away from the proximal policy
    x = TermInputs(algo=cfg.algo, max_len=cfg.rollout.max_new_tokens, seed=0, micro=batch, logprobs=logprobs,
                   entropy=torch.zeros(n, t), mask=batch.loss_mask, num_tokens=float(batch.loss_mask.sum()),
                   num_seqs=float(n), pos_tokens=0.0, pos_seqs=0.0, coefs={"entropy": 0.0, "kl": 0.0})
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
    from mathrl.train.step import Scored, advantage_masks, correction

    old = torch.tensor([[-LN2, 0.0, LN2], [-LN3, -LN3, -99.0]])  # row 1: mean log(pi_rollout / pi_old) = ln3 > 0.5
    cfg = load_config(None, ["algo.rollout_correction.masks=[opsm]", "algo.rollout_correction.rejected=drop"])
    # opsm is not applied with the rules that need no advantages (there are none yet) ...
    before = correction(cfg, old, ROLLOUT, MASK, MASK.clone())
    assert before.weights is None and torch.equal(before.loss_mask, MASK)
    assert "rollout_corr/k1_kl" in before.metrics and "rollout_corr/opsm_rejected" not in before.metrics
    # ... but once they are: row 1 (negative) goes, and with drop leaves the mask
    scored = Scored(old_logprobs=old, entropy=None, ref_logprobs=None, ref_entropy=None, ref_kl=None,
                    is_weights=before.weights, loss_mask=before.loss_mask, mean_entropy=None, metrics=before.metrics)
    prep = SimpleNamespace(batch=SimpleNamespace(response_mask=MASK, rollout_logprobs=ROLLOUT),
                           checks=SimpleNamespace(loss_mask=MASK))
    out = advantage_masks(cfg, scored, Advantages(-torch.ones(2, 3) * MASK), prep)
    assert_close(out.weights * MASK, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))  # padding: never in the loss
    assert_close(out.loss_mask, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))
    assert out.metrics["rollout_corr/opsm_rejected"] == pytest.approx(2 / 5)


def test_a_default_run_has_no_correction_and_no_new_metric():
    from mathrl.config import load_config
    from mathrl.train.step import correction

    out = correction(load_config(None, []), OLD, ROLLOUT, MASK, MASK)
    assert out.weights is None and out.loss_mask is MASK and out.metrics == {}


@pytest.mark.parametrize("overrides, settings, why", [
    (["algo.off_policy=decoupled", "algo.rollout_correction.cap=3"],
     {"mode": "mis", "level": "token", "cap": 3.0, "lower": None, "rules": [], "drop": False},
     "decoupled PPO is token MIS at the shared cap"),
    (["algo.rollout_correction.mode=tis", "algo.rollout_correction.level=sequence", "algo.rollout_correction.lower=0.5",
      "algo.rollout_correction.masks=[icepop]", "algo.rollout_correction.rejected=drop"],
     {"mode": "tis", "level": "sequence", "cap": 2.0, "lower": 0.5, "rules": ["icepop"], "drop": True,
      "icepop_bounds": [0.5, 2.0]},
     "rollout_correction's own weight, its rule with its bounds (no other rule's), and rejected=drop"),
    (["algo.rollout_correction.masks=[k2_max_rs]"], {"rules": ["k2_max_rs"], "drop": False, "k2_rs_threshold": 0.01},
     "a rule alone: its threshold and `rejected`, no weight"),
    ([], {"rules": []}, "nothing on: no weight, no rule, and no rule's setting read (config/reads.py)"),
])
def test_correction_settings_read_the_config(overrides, settings, why):
    from mathrl.config import load_config
    from mathrl.train.step import correction_settings

    assert correction_settings(load_config(None, overrides)) == settings, why


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
    got = SimpleNamespace()  # the step reads the prepared rows, not the engine's record
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
