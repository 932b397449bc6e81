"""NeMo-RL's hand-computed loss and advantage cases, ported as an outside oracle for mathrl's policy losses,
KL penalty, rollout correction and GDPO estimator. The inputs and the numbers are NeMo-RL's; the code is
written here.

Sources (NVIDIA-NeMo/RL @7ea279ab):
  F = tests/unit/algorithms/test_loss_functions.py
  G = tests/unit/algorithms/test_grpo.py

NeMo-RL's ClippedPGLossFn defaults: ratio_clip_min = ratio_clip_max = 0.2 (mathrl's algo.clip.eps_low /
eps_high set to 0.2), token-level loss = mathrl's `token_mean`, `token_level_loss=False` =
`seq_mean_token_mean`. Its IS correction weight exp(prev - generation) is mathrl's rollout-correction weight
exp(old - rollout). NeMo's cases put three counted tokens after a masked first one; the masked column is
dropped here (a masked token adds nothing to either side).

Run: python -m pytest tests/algo/test_peer_cases_nemo_rl.py -q
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from mathrl.algo.estimators import ADVANTAGE_ESTIMATORS, AdvantageInputs
from mathrl.algo.kl import kl_penalty
from mathrl.algo.losses import aggregate
from mathrl.algo.policy_losses import cispo, gpg, gspo_token, ppo_clip
from mathrl.algo.rollout_correction import correction_weights, geo_rs_keep, icepop_keep
from mathrl.config import load_config

ONE_ROW = torch.ones(1, 3, dtype=torch.float64)
LN = math.log


def t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def token_mean(loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return aggregate(loss, mask, mode="token_mean", num_tokens=float(mask.sum()), num_seqs=float(mask.shape[0]))


def seq_mean(loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return aggregate(loss, mask, mode="seq_mean_token_mean", num_tokens=float(mask.sum()), num_seqs=float(mask.shape[0]))


# The shared data of F's cases: ratios ~ [0.5, 1, 1.5] (log(0.5) - 1, log(1) - 1, log(1.5) - 1), A [1, -1, 2].
ADV = t([[1.0, -1.0, 2.0]])
PREV = t([[-1.0, -1.0, -1.0]])
CURR = t([[-1.69315, -1.0, -0.59453]])
GEN = t([[-0.5, -1.5, -0.8]])


# ----------------------------------------------------------------------------- PPO, REINFORCE, on-policy ratio
def test_ppo_clipping():
    # F test_clipped_pg_loss_ppo_clipping: -min(r A, clip(r, 0.8, 1.2) A) = [-0.5, 1, -2.4], token mean -0.6333.
    loss, _ = ppo_clip(CURR, PREV, ADV, ONE_ROW, eps_low=0.2, eps_high=0.2)
    assert_close(loss, t([[-0.5, 1.0, -2.4]]), atol=1e-4, rtol=0)
    assert token_mean(loss, ONE_ROW).item() == pytest.approx(-1.9 / 3, abs=1e-4)


def test_reinforce_mode():
    # F test_clipped_pg_loss_reinforce_mode (disable_ppo_ratio): -A logp = [0.5, -1, 3], token mean 0.8333;
    # mathrl's `gpg` is the plain policy gradient.
    curr = t([[-0.5, -1.0, -1.5]])
    loss, _ = gpg(curr, torch.zeros(1, 3, dtype=torch.float64), ADV, ONE_ROW)
    assert_close(loss, t([[0.5, -1.0, 3.0]]))
    assert token_mean(loss, ONE_ROW).item() == pytest.approx(2.5 / 3)


def test_force_on_policy_ratio():
    # F test_clipped_pg_loss_force_on_policy_ratio: NeMo sets prev := sg(curr), so every ratio is 1. mathrl has
    # no such switch; its old logprobs equal the current ones (detached) whenever a batch meets the policy
    # that sampled it, as here: -A = [-1, 1, -2], mean -0.6667, and the gradient stays -A / 3 (the ratio's
    # gradient at 1 is the logprob's).
    lp = CURR.clone().requires_grad_(True)
    loss, stats = ppo_clip(lp, CURR, ADV, ONE_ROW, eps_low=0.2, eps_high=0.2)
    total = token_mean(loss, ONE_ROW)
    assert total.item() == pytest.approx(-2 / 3, abs=1e-9)
    total.backward()
    assert_close(lp.grad, -ADV / 3)
    assert float(stats["pg_clipfrac"].sum()) == 0.0


# ----------------------------------------------------------------------------- CISPO
def test_cispo_ratios():
    # F test_clipped_pg_loss_cispo: -A clip(r, 0.8, 1.2) logp, clipped weights [0.8, 1, 1.2]:
    # [1.35452, -1.0, 1.426872], token mean 0.593797.
    loss, _ = cispo(CURR, PREV, ADV, ONE_ROW, eps_low=0.2, eps_high=0.2)
    assert_close(loss, t([[0.8 * 1.69315, -1.0, 2 * 1.2 * 0.59453]]), atol=1e-4, rtol=0)
    assert token_mean(loss, ONE_ROW).item() == pytest.approx((1.35452 - 1.0 + 1.426872) / 3, abs=1e-4)


def test_cispo_with_the_importance_sampling_correction():
    # F test_clipped_pg_loss_cispo_with_importance_sampling_correction: NeMo multiplies each token by the
    # untruncated exp(prev - gen) = exp([-0.5, 0.5, -0.2]); mathrl's token TIS with a cap above every ratio
    # (10 > 1.65) is that weight.
    w, _ = correction_weights(PREV, GEN, ONE_ROW, mode="tis", level="token", cap=10.0)
    loss, _ = cispo(CURR, PREV, ADV, ONE_ROW, weights=w, eps_low=0.2, eps_high=0.2)
    per_token = [1.35452 * math.exp(-0.5), -1.0 * math.exp(0.5), 1.426872 * math.exp(-0.2)]
    assert token_mean(loss, ONE_ROW).item() == pytest.approx(sum(per_token) / 3, abs=1e-4)


# ----------------------------------------------------------------------------- the KL penalty
@pytest.mark.parametrize("estimator, nemo_unclamped, mathrl_unclamped, nemo_clamped, mathrl_clamped, why", [
    ("k1", [-1.0, 14.0, 29.0], [-1.0, 14.0, 29.0], [-1.0, 10.0, 10.0], [-1.0, 14.0, 29.0],
     "NeMo clamps every estimator's output at 10; mathrl (and verl) clamp only k3: k1 stays unclamped"),
    ("k2", [0.5, 98.0, 420.5], [0.5, 98.0, 420.5], [0.5, 10.0, 10.0], [0.5, 98.0, 420.5],
     "as k1: k2 is never clamped in mathrl"),
    ("k3", [0.7183, 13.0, 28.0], [0.7183, 13.0, 19.0], [0.7183, 10.0, 10.0], [0.7183, 10.0, 10.0],
     "mathrl always clamps k3's log ratio to [-20, 20] (verl's low_var_kl does too), so with NeMo's input "
     "clamp off, log ratio -29 gives e^-20 + 20 - 1 = 19, not 28; its output clamp 10 is mathrl's"),
])
def test_calculate_kl(estimator, nemo_unclamped, mathrl_unclamped, nemo_clamped, mathrl_clamped, why):
    # F test_calculate_kl: logprobs -1 against reference [0, -15, -30], unclamped and with NeMo's input clamp
    # 20 (mathrl's fixed log-ratio clamp) and output clamp 10. The peers agree where `why` does not say else.
    lp, ref = t([[-1.0, -1.0, -1.0]]), t([[0.0, -15.0, -30.0]])
    got = kl_penalty(lp, ref, estimator=estimator, clamp=None)
    assert_close(got, t([mathrl_unclamped]), rtol=1e-3, atol=0, msg=why)
    assert torch.allclose(got, t([nemo_unclamped]), rtol=1e-3) == (estimator != "k3"), why
    got = kl_penalty(lp, ref, estimator=estimator, clamp=10.0)
    assert_close(got, t([mathrl_clamped]), rtol=1e-3, atol=0, msg=why)
    assert torch.allclose(got, t([nemo_clamped]), rtol=1e-3) == (estimator == "k3"), why


def test_kl_penalty_value():
    # F test_clipped_pg_loss_kl_penalty: A = 0, so the loss is the KL term alone: beta 0.1 times the token
    # mean of k3 with ref - curr = [-1, 0, 1]: [0.368, 0, 0.718], mean 0.362: 0.0362.
    curr, ref, adv = t([[0.0, -1.0, -2.0]]), t([[-1.0, -1.0, -1.0]]), torch.zeros(1, 3, dtype=torch.float64)
    pg, _ = ppo_clip(curr, torch.zeros(1, 3, dtype=torch.float64), adv, ONE_ROW, eps_low=0.2, eps_high=0.2)
    kl = kl_penalty(curr, ref, estimator="k3")
    assert_close(kl, t([[0.368, 0.0, 0.718]]), rtol=1e-3, atol=1e-4)
    total = token_mean(pg, ONE_ROW) + 0.1 * token_mean(kl, ONE_ROW)
    assert total.item() == pytest.approx(0.0362, rel=1e-3)


@pytest.mark.parametrize("on_policy_approximation", [False, True])
def test_kl_gradient_includes_the_sampling_term(on_policy_approximation):
    # F test_clipped_pg_loss_kl_gradient_includes_sampling_term: NeMo differentiates E_pi[k3] with its score
    # term, beta w (k3 + 1 - exp(ref - curr)) / N per token, and k3 + 1 - exp(ref - curr) = curr - ref: the
    # gradient of k2, which is mathrl's `k3+` (k3's value, k2's gradient). mathrl's plain `k3` (verl's
    # low_var_kl) lacks the score term: its gradient is beta (1 - exp(ref - curr)) / N. With NeMo's on-policy
    # KL approximation w = exp(curr - gen); mathrl does not importance-weigh the KL term, so there its k3+
    # gradient is NeMo's divided by w.
    curr, gen = t([[-1.2, -0.7]]), t([[-1.5, -0.4]])
    ref, beta, mask = t([[-0.9, -1.1]]), 0.3, torch.ones(1, 2, dtype=torch.float64)
    log_ratio = ref - curr
    k3 = torch.exp(log_ratio) - 1 - log_ratio
    w = torch.exp(curr - gen) if on_policy_approximation else torch.ones_like(curr)
    nemo = beta * w * (k3 + (1 - torch.exp(log_ratio))) / curr.numel()

    def grad(estimator: str) -> torch.Tensor:
        lp = curr.clone().requires_grad_(True)
        (beta * token_mean(kl_penalty(lp, ref, estimator=estimator), mask)).backward()
        return lp.grad

    assert_close(grad("k3+"), nemo / w)
    assert_close(grad("k3"), beta * (1 - torch.exp(log_ratio)) / curr.numel())
    assert_close(grad("k3+") - grad("k3"), beta * k3 / curr.numel())  # the score term mathrl's k3 omits


# ----------------------------------------------------------------------------- truncated IS, ICEPOP, seq-mask-tis
def test_truncated_importance_sampling_token_level():
    # F test_clipped_pg_loss_on_policy_truncated_importance_sampling[False]: PPO's [-0.5, 1, -2.4] times
    # min(exp(prev - gen), 0.8) = [0.6065, 0.8, 0.8]: [-0.3033, 0.8, -1.92], token mean -0.4744. NeMo's cap
    # 0.8 is under 1; mathrl refuses a cap <= 1 (a ratio of 1 is on-policy), so the cap is applied by hand to
    # mathrl's untruncated weights, and the PPO part and the weighting are mathrl's.
    with pytest.raises(ValueError, match="cap must be"):
        correction_weights(PREV, GEN, ONE_ROW, mode="tis", level="token", cap=0.8)
    w, _ = correction_weights(PREV, GEN, ONE_ROW, mode="tis", level="token", cap=10.0)
    assert_close(w, t([[math.exp(-0.5), math.exp(0.5), math.exp(-0.2)]]))
    loss, _ = ppo_clip(CURR, PREV, ADV, ONE_ROW, weights=w.clamp(max=0.8), eps_low=0.2, eps_high=0.2)
    assert_close(loss, t([[-0.3033, 0.8, -1.92]]), atol=1e-4, rtol=0)
    assert token_mean(loss, ONE_ROW).item() == pytest.approx(-0.4744, abs=1e-4)


def test_truncated_importance_sampling_sequence_level():
    # F test_clipped_pg_loss_on_policy_truncated_importance_sampling[True]: the GSPO ratio exp(mean log r) =
    # 0.9086 (unclipped) with per-token advantages: mathrl's gspo_token; the sequence IS weight
    # exp(sum(prev - gen)) = exp(-0.2) = 0.8187, mathrl's sequence-level weight, truncated at 0.8 by hand
    # (see the token-level case): [-0.7268, 0.7268, -1.4537], mean -0.4846.
    w, _ = correction_weights(PREV, GEN, ONE_ROW, mode="tis", level="sequence", cap=10.0)
    assert_close(w, torch.full((1, 3), math.exp(-0.2), dtype=torch.float64))
    loss, _ = gspo_token(CURR, PREV, ADV, ONE_ROW, weights=w.clamp(max=0.8), eps_low=0.2, eps_high=0.2)
    assert_close(loss, t([[-0.7268, 0.7268, -1.4537]]), atol=1e-4, rtol=0)
    assert seq_mean(loss, ONE_ROW).item() == pytest.approx(-0.4846, abs=1e-4)


@pytest.mark.parametrize("tis_min, nemo_weights, mathrl_weights, oob", [
    (None, [0.1, 1.0, 2.0], [0.1, 1.0, 2.0], 1 / 3),
    (0.5, [0.5, 1.0, 2.0], [0.0, 1.0, 2.0], 2 / 3),
])
def test_tis_lower_bound(tis_min, nemo_weights, mathrl_weights, oob):
    # F test_clipped_pg_loss_tis_min_bound_defaults_to_zero (force_on_policy_ratio: the ratio is 1, the loss
    # -mean(w) with A = 1): weights exp(curr - gen) = [0.1, 1, 3] capped at 2. NeMo's lower bound CLAMPS
    # 0.1 up to 0.5; mathrl's `lower` REJECTS the token (weight 0), as verl's rejection does: the
    # out-of-bounds share is the same (NeMo's is_oob_ratio, mathrl's `rejected`), the weights are not.
    curr = torch.log(t([[0.1, 1.0, 3.0]]))
    w, rejected = correction_weights(curr, torch.zeros(1, 3, dtype=torch.float64), ONE_ROW, mode="tis",
                                     level="token", cap=2.0, lower=tis_min)
    assert_close(w, t([mathrl_weights]))
    assert float(rejected.mean()) == pytest.approx(oob)
    loss, _ = ppo_clip(curr, curr, torch.ones(1, 3, dtype=torch.float64), ONE_ROW, weights=w, eps_low=0.2,
                       eps_high=0.2)
    assert token_mean(loss, ONE_ROW).item() == pytest.approx(-sum(mathrl_weights) / 3)
    assert (-sum(nemo_weights) / 3 == pytest.approx(-sum(mathrl_weights) / 3)) == (tis_min is None)


def test_out_of_bounds_share_of_tis():
    # F test_clipped_pg_loss_reports_is_oob_ratio_tis: ratios [1, 3, 0.5] with cap 2: one token of three over.
    _, rejected = correction_weights(torch.log(t([[1.0, 3.0, 0.5]])), torch.zeros(1, 3, dtype=torch.float64),
                                     ONE_ROW, mode="tis", level="token", cap=2.0)
    assert float(rejected.mean()) == pytest.approx(1 / 3)


def test_icepop():
    # F test_clipped_pg_loss_icepop_importance_sampling: on-policy (the PPO loss is -A), weights
    # exp(prev - gen) = [0.6065, 12.18, 0.8187] outside [0.5, 5] zeroed: IcePop is mathrl's icepop rule times
    # token TIS with cap 5; the zeroed token stays in the normaliser (`rejected: zero`): mean of
    # [-0.6065, 0, -1.6375] = -0.748.
    gen = t([[-0.5, -3.5, -0.8]])
    w, _ = correction_weights(PREV, gen, ONE_ROW, mode="tis", level="token", cap=5.0)
    w = w * icepop_keep(PREV, gen, ONE_ROW, lower=0.5, upper=5.0)
    loss, _ = ppo_clip(PREV, PREV, ADV, ONE_ROW, weights=w, eps_low=0.2, eps_high=0.2)
    expected = (-math.exp(-0.5) - 2 * math.exp(-0.2)) / 3
    assert token_mean(loss, ONE_ROW).item() == pytest.approx(expected, abs=1e-6)


def test_seq_mask_tis():
    # F test_clipped_pg_loss_seq_mask_tis: the row is kept when the geometric mean of its token ratios is in
    # [0.999, 1.002] (mathrl's geo_rs bounds) and each token weighed by its untruncated ratio (mathrl's token
    # TIS, cap far over every ratio). gen = prev - 0.0005: geometric mean exp(0.0005) kept; on-policy the
    # loss is mean(exp(0.0005) (-A)) = -0.6670.
    gen = t([[-1.0005, -1.0005, -1.0005]])

    def loss_of(gen_lp):
        w, _ = correction_weights(PREV, gen_lp, ONE_ROW, mode="tis", level="token", cap=1e6)
        w = w * geo_rs_keep(PREV, gen_lp, ONE_ROW, lower=0.999, upper=1.002)
        return token_mean(ppo_clip(PREV, PREV, ADV, ONE_ROW, weights=w, eps_low=0.2, eps_high=0.2)[0], ONE_ROW)

    assert loss_of(gen).item() == pytest.approx(-2 * math.exp(0.0005) / 3, abs=1e-6)
    # NeMo's second half: a -inf generation logprob must leave the loss finite. In mathrl the token's log
    # ratio is clamped (to 20) in the geometric mean, which rejects the whole row: the loss is exactly 0.
    gen[0, 1] = float("-inf")
    assert loss_of(gen).item() == 0.0


# ----------------------------------------------------------------------------- dual clip, GSPO
def test_dual_clip():
    # F test_clipped_pg_loss_dual_clip: ratios [0.5, 1, 10], A [1, -1, -4], c = 3: [-0.5, 1, 12], token mean
    # 12.5 / 3 = 4.1667.
    lp, old, adv = t([[-1.69315, -1.0, -0.69741]]), t([[-1.0, -1.0, -3.0]]), t([[1.0, -1.0, -4.0]])
    loss, _ = ppo_clip(lp, old, adv, ONE_ROW, eps_low=0.2, eps_high=0.2, dual_clip_c=3.0)
    assert token_mean(loss, ONE_ROW).item() == pytest.approx(12.5 / 3, abs=1e-4)


@pytest.mark.parametrize("prev, loss_rows, mean, why", [
    ([[-1.0] * 3], [[-0.9086, 0.9086, -1.8171]], -0.6057, "batch 1: exp(mean log r) = 0.9086, inside [0.8, 1.2]"),
    ([[-1.0] * 3, [-2.0] * 3], [[-0.9086, 0.9086, -1.8171], [-1.2, 2.4697, -2.4]], -0.4912,
     "batch 2: row 1's ratio 2.4697 is clipped at 1.2 where A > 0 and kept where A < 0"),
])
def test_gspo(prev, loss_rows, mean, why):
    # F test_clipped_pg_loss_gspo / _gspo_batch_size_2: NeMo's sequence_level_importance_ratios with per-token
    # advantages and token-wise clipping of the sequence ratio is mathrl's gspo_token (eps 0.2 / 0.2, NeMo's,
    # not GSPO's published range); token_level_loss=False is seq_mean_token_mean.
    prev_t = t(prev)
    n = prev_t.shape[0]
    mask = torch.ones(n, 3, dtype=torch.float64)
    loss, _ = gspo_token(CURR.expand(n, 3), prev_t, ADV.expand(n, 3), mask, eps_low=0.2, eps_high=0.2)
    assert_close(loss, t(loss_rows), atol=1e-4, rtol=0, msg=why)
    assert seq_mean(loss, mask).item() == pytest.approx(mean, abs=1e-4), why


# ----------------------------------------------------------------------------- G: GDPO
def test_gdpo_multiple_rewards():
    # G test_gdpo_advantage_estimator_multiple_rewards: correctness [1, 1], integer [1, -1], format [1, 0] in
    # one group of two: each component normalised in its group sums to +-sqrt(2); NeMo whitens over the
    # responses: +-0.7071 on every token. mathrl's default whitens over the tokens (verl: +-0.9129);
    # algo.adv.gdpo_whiten=sequence is NeMo's.
    mask = torch.ones(2, 3)
    comps = {"correctness": torch.tensor([1.0, 1.0]), "integer": torch.tensor([1.0, -1.0]),
             "format": torch.tensor([1.0, 0.0])}
    x = AdvantageInputs(rewards=sum(comps.values()), response_mask=mask, loss_mask=mask, kl_rewards=torch.zeros(2, 3),
                        group_ids=torch.tensor([0, 0]), components=comps, component_weights={k: 1.0 for k in comps})
    cfg = load_config(None, ["algo.adv.estimator=gdpo", "algo.adv.gdpo_whiten=sequence"])
    out = ADVANTAGE_ESTIMATORS.get("gdpo").fn(x, cfg.algo).advantages
    assert_close(out, torch.tensor([[0.7071] * 3, [-0.7071] * 3]), atol=1e-4, rtol=0)
