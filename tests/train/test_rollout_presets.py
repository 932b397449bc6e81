"""Each of verl's rollout-correction presets (`RolloutCorrectionConfig`'s factory methods, verl
verl/trainer/config/algorithm.py) as the mathrl settings of docs/tricks.md's table, checked on hand-derived
numbers: the policy-gradient term of one micro-batch holding the batch, built as train/step.py and
train/update.py build it, against the loss and gradient written from the presets' formulas.

Run with ``python -m pytest tests/train/test_rollout_presets.py -q``.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

LN2, LN3, E = math.log(2.0), math.log(3.0), math.exp(0.1)
# log rho = log pi_trainer - log pi_rollout per token (rho = pi_trainer / pi_rollout):
#   row A: [ln3, -ln3, 0]  token ratios [3, 1/3, 1], sequence ratio 1, geometric mean 1, mean k3 = 4/9
#   row B: [0.1, -0.1, 0]  token ratios [e^.1, e^-.1, 1], sequence ratio 1, geometric mean 1, mean k3 = 0.00334
#   row C: [ln2, ln2, pad] token ratios [2, 2], sequence ratio 4, geometric mean 2, mean k3 = 1 - ln2 = 0.307
DELTA = torch.tensor([[LN3, -LN3, 0.0], [0.1, -0.1, 0.0], [LN2, LN2, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
ROLLOUT = torch.full((3, 3), -2.0) * MASK
TRAINER = (ROLLOUT + DELTA) * MASK  # pi_old in decoupled mode, pi_theta in bypass mode
ADV = torch.tensor([[1.0], [-0.5], [2.0]]).expand(3, 3) * MASK  # A, B, C: no two kept rows cancel

RC = "algo.rollout_correction."
GEO = f"{RC}geo_rs_bounds=[0.999000999000999, 1.001001001001001]"  # verl's "0.999_1.001" bounds 1/rho
# The table of docs/tricks.md, "verl's rollout-correction presets": preset -> mathrl overrides.
PRESETS = {
    "decoupled_token_is": [f"{RC}mode=tis", f"{RC}level=token", f"{RC}cap=2"],
    "decoupled_seq_is": [f"{RC}mode=tis", f"{RC}level=sequence", f"{RC}cap=2"],
    "decoupled_token_icepop": [f"{RC}mode=mis", f"{RC}level=token", f"{RC}cap=5", f"{RC}lower=0.5"],
    "decoupled_seq_is_rs": [f"{RC}mode=mis", f"{RC}level=sequence", f"{RC}cap=2", f"{RC}lower=0.5", f"{RC}rejected=drop"],
    "decoupled_geo_rs": [f"{RC}masks=[geo_rs]", GEO, f"{RC}rejected=drop"],
    "bypass_ppo_clip": [f"{RC}bypass=true"],
    "bypass_ppo_clip_geo_rs": [f"{RC}bypass=true", f"{RC}masks=[geo_rs]", GEO],
    "bypass_ppo_clip_k3_rs": [f"{RC}bypass=true", f"{RC}masks=[k3_rs]", f"{RC}k3_rs_threshold=0.01"],
    "bypass_pg_is": [f"{RC}bypass=true", "algo.policy_loss=gpg", f"{RC}mode=tis", f"{RC}level=sequence", f"{RC}cap=2"],
    "bypass_pg_token_icepop": [f"{RC}bypass=true", "algo.policy_loss=gpg", f"{RC}mode=mis", f"{RC}level=token",
                               f"{RC}cap=5", f"{RC}lower=0.5"],
    "bypass_pg_geo_rs": [f"{RC}bypass=true", "algo.policy_loss=gpg", f"{RC}masks=[geo_rs]", GEO],
    "decoupled_geo_rs_seq_tis": [f"{RC}mode=tis", f"{RC}level=sequence", f"{RC}cap=2", f"{RC}masks=[geo_rs]", GEO,
                                 f"{RC}rejected=drop"],
    "decoupled_geo_rs_token_tis": [f"{RC}mode=tis", f"{RC}level=token", f"{RC}cap=2", f"{RC}masks=[geo_rs]", GEO,
                                   f"{RC}rejected=drop"],
    "bypass_pg_geo_rs_seq_tis": [f"{RC}bypass=true", "algo.policy_loss=gpg", f"{RC}mode=tis", f"{RC}level=sequence",
                                 f"{RC}cap=2", f"{RC}masks=[geo_rs]", GEO],
    "bypass_pg_geo_rs_token_tis": [f"{RC}bypass=true", "algo.policy_loss=gpg", f"{RC}mode=tis", f"{RC}level=token",
                                   f"{RC}cap=2", f"{RC}masks=[geo_rs]", GEO],
    "decoupled_k3_rs": [f"{RC}masks=[k3_rs]", f"{RC}k3_rs_threshold=0.01", f"{RC}rejected=drop"],
    "decoupled_k3_rs_seq_tis": [f"{RC}mode=tis", f"{RC}level=sequence", f"{RC}cap=2", f"{RC}masks=[k3_rs]",
                                f"{RC}k3_rs_threshold=0.01", f"{RC}rejected=drop"],
    "decoupled_k3_rs_token_tis": [f"{RC}mode=tis", f"{RC}level=token", f"{RC}cap=2", f"{RC}masks=[k3_rs]",
                                  f"{RC}k3_rs_threshold=0.01", f"{RC}rejected=drop"],
    "disabled": [],
}

ONE, NONE_ = [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]
TOKEN_TIS = [[2.0, 1 / 3, 1.0], [E, 1 / E, 1.0], [2.0, 2.0, 0.0]]  # min(rho_t, 2)
SEQ_TIS = [ONE, ONE, [2.0, 2.0, 0.0]]  # min(rho_seq, 2): C's 4 capped
ICEPOP = [[3.0, 0.0, 1.0], [E, 1 / E, 1.0], [2.0, 2.0, 0.0]]  # rho_t 1[0.5 <= rho_t <= 5]: A's 1/3 zeroed
# (weights W where the token stays in the loss, normaliser rows: which rows stay in the loss mask, why)
EXPECTED = {
    "decoupled_token_is": (TOKEN_TIS, [1, 1, 1], "A's ratio 3 capped to 2 and kept; nothing leaves the normaliser"),
    "decoupled_seq_is": (SEQ_TIS, [1, 1, 1], "one weight per row: C's 4 capped to 2"),
    "decoupled_token_icepop": (ICEPOP, [1, 1, 1], "IcePop zeroes A's 1/3 and keeps it in the normaliser (verl keeps response_mask)"),
    "decoupled_seq_is_rs": ([ONE, ONE, NONE_], [1, 1, 0], "seq_sum_k1 [0.5, 2] rejects C (ratio 4): out of the normaliser"),
    "decoupled_geo_rs": ([ONE, ONE, NONE_], [1, 1, 0], "C's geometric mean 2 is outside [1/1.001, 1/0.999]"),
    "bypass_ppo_clip": ([ONE, ONE, [1.0, 1.0, 0.0]], [1, 1, 1], "no weight: the PPO ratio is pi_theta / pi_rollout"),
    "bypass_ppo_clip_geo_rs": ([ONE, ONE, NONE_], [1, 1, 1], "C rejected in the loss: a zero term, 8 in the normaliser"),
    "bypass_ppo_clip_k3_rs": ([NONE_, ONE, NONE_], [1, 1, 1], "only B's mean k3 0.0033 is under 0.01"),
    "bypass_pg_is": (SEQ_TIS, [1, 1, 1], "REINFORCE with the sequence weight"),
    "bypass_pg_token_icepop": (ICEPOP, [1, 1, 1], "REINFORCE with IcePop's zeroed token"),
    "bypass_pg_geo_rs": ([ONE, ONE, NONE_], [1, 1, 1], "REINFORCE, C rejected as a zero term"),
    "decoupled_geo_rs_seq_tis": ([ONE, ONE, NONE_], [1, 1, 0], "A and B have sequence ratio 1; C rejected and dropped"),
    "decoupled_geo_rs_token_tis": ([TOKEN_TIS[0], TOKEN_TIS[1], NONE_], [1, 1, 0],
                                   "the capped token (A's 3 -> 2) stays in the loss and the normaliser; only C leaves"),
    "bypass_pg_geo_rs_seq_tis": ([ONE, ONE, NONE_], [1, 1, 1], "A, B weight 1; C a zero term"),
    "bypass_pg_geo_rs_token_tis": ([TOKEN_TIS[0], TOKEN_TIS[1], NONE_], [1, 1, 1], "token TIS on A, B; C a zero term"),
    "decoupled_k3_rs": ([NONE_, ONE, NONE_], [0, 1, 0], "k3 means 4/9 and 0.307 > 0.01: A and C leave"),
    "decoupled_k3_rs_seq_tis": ([NONE_, ONE, NONE_], [0, 1, 0], "B's sequence ratio is 1"),
    "decoupled_k3_rs_token_tis": ([NONE_, [E, 1 / E, 1.0], NONE_], [0, 1, 0], "B's token ratios are under the cap"),
    "disabled": ([ONE, ONE, [1.0, 1.0, 0.0]], [1, 1, 1], "no correction"),
}


def _term(cfg_overrides):
    """(loss, d loss / d logprobs, the loss mask in force) of the policy-gradient term on the batch above."""
    from mathrl.config import load_config
    from mathrl.train.batching import TrainBatch
    from mathrl.train.step import correction
    from mathrl.train.update import TermInputs, pg_term

    cfg = load_config(None, cfg_overrides)
    bypass = cfg.algo.rollout_correction.bypass
    old = ROLLOUT.clone() if bypass else TRAINER.clone()  # bypass: old logprobs := the engine's
    batch = TrainBatch(prompt_ids=torch.zeros(3, 1, dtype=torch.long), prompt_mask=torch.ones(3, 1),
                       response_ids=torch.zeros(3, 3, dtype=torch.long), response_mask=MASK.clone(),
                       loss_mask=MASK.clone(), old_logprobs=old, advantages=ADV.clone(), ref_logprobs=torch.zeros(3, 3),
                       ref_entropy=torch.zeros(3, 3), correct=torch.zeros(3), rollout_logprobs=ROLLOUT.clone())
    corrected = correction(cfg, old, ROLLOUT, MASK, MASK.clone())
    batch.is_weights, batch.loss_mask = corrected.weights, corrected.loss_mask
    # decoupled: pi_theta = pi_old + 0.1 (ratio e^0.1, inside the clip); bypass: pi_theta = the trainer's logprobs
    logprobs = (TRAINER if bypass else TRAINER + 0.1).clone().requires_grad_(True)
    x = TermInputs(algo=cfg.algo, max_len=cfg.rollout.max_new_tokens, seed=0, micro=batch, logprobs=logprobs,
                   entropy=torch.zeros(3, 3), mask=batch.loss_mask, num_tokens=float(batch.loss_mask.sum()),
                   num_seqs=3.0, pos_tokens=0.0, pos_seqs=0.0, coefs={"entropy": 0.0, "kl": 0.0})
    loss, _ = pg_term(x)
    loss.backward()
    return float(loss.detach()), logprobs.grad, batch.loss_mask


def _expected(name, weights, rows):
    """The loss and gradient from the preset's formulas: token-mean over the loss mask in force of
    w_t * l_t, with l_t verl's per-token loss: PPO-clip -min(r A, clip(r, 0.8, 1.28) A), r = pi_theta / pi_old
    (decoupled: e^0.1; bypass_ppo_clip: rho_t), or REINFORCE -A log pi_theta (bypass_pg)."""
    w = torch.tensor(weights, dtype=torch.float64)
    m = MASK.double() * torch.tensor(rows, dtype=torch.float64)[:, None]
    adv, n = ADV.double(), float(m.sum())
    if name.startswith("bypass_pg"):
        lp = TRAINER.double()
        loss, grad = -adv * lp, -adv
    else:
        r = DELTA.double().exp() if name.startswith("bypass") else torch.full((3, 3), E, dtype=torch.float64)
        clipped = r.clamp(0.8, 1.28)
        loss = -torch.minimum(r * adv, clipped * adv)
        grad = torch.where(r * adv <= clipped * adv, -adv * r, torch.zeros_like(r))  # d/d log pi of -r A where unclipped
    return float((loss * w * m).sum() / n), (grad * w * m / n).float()


def test_every_verl_preset_has_a_row_and_a_test():
    # verl @1dda039 RolloutCorrectionConfig's factory methods: 18 presets and `disabled`
    assert len(PRESETS) == 19 and set(PRESETS) == set(EXPECTED)


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_matches_its_formula_by_hand(name):
    weights, rows, why = EXPECTED[name]
    loss, grad, loss_mask = _term(PRESETS[name])
    want_loss, want_grad = _expected(name, weights, rows)
    assert_close(loss_mask, MASK * torch.tensor(rows, dtype=torch.float32)[:, None]), why
    assert loss == pytest.approx(want_loss, rel=1e-6, abs=1e-7), why
    assert_close(grad, want_grad, rtol=1e-5, atol=1e-7), why


def test_tis_with_a_rejection_mask_keeps_the_capped_tokens():
    # the regression: with rejected=drop, token TIS used to take A's capped token out of the loss mask too
    _, _, loss_mask = _term(PRESETS["decoupled_geo_rs_token_tis"])
    assert loss_mask[0].tolist() == [1.0, 1.0, 1.0] and loss_mask.sum() == 6


def test_the_docs_table_lists_the_same_overrides():
    text = (Path(__file__).resolve().parents[2] / "docs" / "tricks.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \| ([^|]*) \|", text, flags=re.M))
    for name, overrides in PRESETS.items():
        assert name in rows, f"docs/tricks.md has no row for verl's preset {name}"
        listed = re.findall(r"`([^`]+)`", rows[name])
        assert listed == overrides, name
