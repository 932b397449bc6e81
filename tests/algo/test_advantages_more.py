"""The verl / prime-rl / SkyRL group estimators (grpo_passk, reinforce_pp_baseline, opo, gpg, maxrl,
gdpo) against values computed by hand, their invariances, and two training steps with each.

Run: python -m pytest tests/algo/test_advantages_more.py -q -m "not slow"   (the e2e test: -m slow)
"""

from __future__ import annotations

import io
import math
from dataclasses import replace

import pytest
import torch
from rich.console import Console
from torch.testing import assert_close

from mathrl.algo.advantages import (
    gdpo_advantages,
    gpg_advantages,
    group_advantages,
    maxrl_advantages,
    opo_advantages,
    passk_advantages,
    reinforce_pp_baseline_advantages,
)
from mathrl.algo.estimators import AdvantageInputs
from mathrl.config import ConfigError, load_config
from mathrl.registry import ADVANTAGE_ESTIMATORS

NEW = ["grpo_passk", "reinforce_pp_baseline", "opo", "gpg", "maxrl", "gdpo"]
SQRT_HALF = math.sqrt(0.5)


def t(*xs: float) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.float64)


def ids(*xs: int) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.long)


def lengths_mask(*lengths: int, width: int = 4) -> torch.Tensor:
    """[N, width] float mask with the first `lengths[i]` positions of row i set."""
    return (torch.arange(width)[None] < torch.tensor(lengths)[:, None]).double()


# ---------------------------------------------------------------------------------------- grpo_passk


def test_passk_only_the_unique_best_of_a_group_gets_an_advantage():
    # Group 5 = [0, 2, 4]: best 4, runner-up 2, gap 2; mean 2, unbiased var (4 + 0 + 4) / 2 = 4,
    # std 2, so the best gets 2 / 2 = 1 and the others 0.
    # Group 9 = [1, 0, 0, 0]: gap 1 - 0 = 1; mean 1/4, unbiased var (9/16 + 3/16) / 3 = 1/4, std 1/2,
    # so the correct one gets 1 / (1/2) = 2.
    # Group 2 = [1, 1, 0, 0]: the best is tied, r_max - r_second = 0: nobody gets an advantage.
    r = t(0, 2, 4, 1, 0, 0, 0, 1, 1, 0, 0)
    g = ids(5, 5, 5, 9, 9, 9, 9, 2, 2, 2, 2)
    assert_close(passk_advantages(r, g, eps=0.0), t(0, 0, 1, 2, 0, 0, 0, 0, 0, 0, 0))
    # Without the std: the gap itself.
    assert_close(passk_advantages(r, g, std_normalize=False), t(0, 0, 2, 1, 0, 0, 0, 0, 0, 0, 0))


def test_passk_eps_is_added_to_the_std_and_batch_scope_uses_the_batch_std():
    # [0, 2 | 1, 1]: group 0's best (2) has gap 2 and group std sqrt(2); group 1 ties.
    r, g = t(0, 2, 1, 1), ids(0, 0, 1, 1)
    assert_close(passk_advantages(r, g, eps=0.5), t(0, 2 / (math.sqrt(2) + 0.5), 0, 0))
    # Batch scope: batch mean 1, deviations (-1, 1, 0, 0), unbiased var 2/3: 2 / sqrt(2/3) = sqrt(6).
    assert_close(passk_advantages(r, g, std_scope="batch", eps=0.0), t(0, math.sqrt(6), 0, 0))


def test_passk_single_sample_and_empty_batches():
    # verl raises on a group of one; here it has no second sample to compare with and gets 0.
    assert_close(passk_advantages(t(3, 1, 0), ids(0, 1, 1), eps=0.0), t(0, 1 / math.sqrt(0.5), 0))
    assert passk_advantages(t(), ids()).numel() == 0


# ----------------------------------------------------------------------------- reinforce_pp_baseline


def test_reinforce_pp_baseline_centres_per_group_then_whitens_the_batch_tokens():
    # Group means: [1, 0] -> 0.5, [0.5, 0.5] -> 0.5, so the centred rewards are (0.5, -0.5, 0, 0).
    # Token counts (loss mask) 2, 1, 1, 0: the counted tokens are 0.5, 0.5, -0.5, 0.
    # Their mean is 0.5 / 4 = 0.125; deviations 0.375, 0.375, -0.625, -0.125; sum of squares
    # 0.140625 + 0.140625 + 0.390625 + 0.015625 = 0.6875; unbiased var 0.6875 / 3 (verl's masked_var).
    # Row 4 has no counted token: 0 everywhere. The all-equal group is whitened too (-0.125 / std).
    mask = lengths_mask(2, 1, 1, 0, width=3)
    out = reinforce_pp_baseline_advantages(t(1, 0, 0.5, 0.5), ids(0, 0, 1, 1), mask)
    s = math.sqrt(0.6875 / 3 + 1e-8)
    expected = torch.tensor([[0.375 / s, 0.375 / s, 0], [-0.625 / s, 0, 0], [-0.125 / s, 0, 0], [0, 0, 0]],
                            dtype=torch.float64)
    assert_close(out, expected)


def test_reinforce_pp_baseline_ignores_group_offsets_and_the_reward_scale():
    # The group mean removes a per-group offset; the batch whitening removes a common scale
    # (up to the 1e-8 added to the variance).
    mask = lengths_mask(3, 1, 2, 2)
    r, g = t(1, 0, 0.3, 0.9), ids(0, 0, 1, 1)
    base = reinforce_pp_baseline_advantages(r, g, mask)
    assert_close(reinforce_pp_baseline_advantages(r + t(5, 5, -2, -2), g, mask), base)
    assert_close(reinforce_pp_baseline_advantages(10 * r, g, mask), base, atol=1e-6, rtol=1e-6)


# ---------------------------------------------------------------------------------------------- opo


def test_opo_baseline_is_the_length_weighted_group_mean():
    # Group [1, 0, 1] with lengths [2, 4, 6]: baseline (2*1 + 4*0 + 6*1) / 12 = 2/3,
    # so A = (1/3, -2/3, 1/3); the plain mean (2/3 as well here) would differ with other lengths.
    # Group [1, 0] with lengths [1, 3]: baseline 1/4, A = (3/4, -1/4) (the plain mean gives +-1/2).
    r, g = t(1, 0, 1, 1, 0), ids(0, 0, 0, 1, 1)
    assert_close(opo_advantages(r, g, torch.tensor([2, 4, 6, 1, 3])), t(1 / 3, -2 / 3, 1 / 3, 0.75, -0.25))


def test_opo_with_equal_lengths_is_dr_grpo_and_zero_lengths_fall_back_to_the_mean():
    r, g = t(0.2, 0.9, 0.4, 1, 0), ids(0, 0, 0, 1, 1)
    dr_grpo = group_advantages(r, g, std_normalize=False)
    assert_close(opo_advantages(r, g, torch.full((5,), 7)), dr_grpo)
    # Group 1's lengths are all 0: no weights, so its baseline is the plain mean 1/2 (verl: 0/0).
    assert_close(opo_advantages(r, g, torch.tensor([1, 1, 1, 0, 0])), dr_grpo)


def test_opo_estimator_counts_generated_tokens_not_the_loss_mask():
    # Row 1's tokens are all filtered out of the loss; its length (generated tokens) still weighs in
    # the baseline: (3*1 + 1*0) / 4 = 3/4, so row 0 gets 1/4 on each of its tokens and row 1 gets 0.
    cfg = load_config(None, ["algo.adv.estimator=opo"])
    response = lengths_mask(3, 1)
    x = AdvantageInputs(rewards=torch.tensor([1.0, 0.0]), response_mask=response.float(),
                        loss_mask=torch.tensor([[1.0, 1, 1, 0], [0, 0, 0, 0]]), kl_rewards=torch.zeros(2, 4),
                        group_ids=ids(0, 0))
    out = ADVANTAGE_ESTIMATORS.get("opo").fn(x, cfg.algo).advantages
    assert_close(out, torch.tensor([[0.25, 0.25, 0.25, 0], [0, 0, 0, 0]]))


# ---------------------------------------------------------------------------------------------- gpg


@pytest.mark.parametrize(
    ("alpha", "scale", "why"),
    [
        ("valid_groups", 2.0, "N = 8 samples, M = 4 of them in the all-correct group: 8 / (8 - 4) = 2 (GPG paper)"),
        ("nonzero_rewards", 1.6, "5 nonzero rewards among 8: 8 / 5 = 1.6 (verl)"),
        ("none", 1.0, "Dr. GRPO's advantage"),
    ],
)
def test_gpg_scales_the_centred_reward_by_alpha(alpha, scale, why):
    # Group 0 = [1, 0, 0, 0]: mean 1/4, centred (3/4, -1/4, -1/4, -1/4). Group 1 = [1, 1, 1, 1]: 0.
    r, g = t(1, 0, 0, 0, 1, 1, 1, 1), ids(0, 0, 0, 0, 1, 1, 1, 1)
    expected = scale * t(0.75, -0.25, -0.25, -0.25, 0, 0, 0, 0)
    assert_close(gpg_advantages(r, g, alpha=alpha), expected, msg=why)


def test_gpg_without_any_signal_is_zero_and_an_unknown_alpha_is_an_error():
    assert_close(gpg_advantages(t(1, 1, 0, 0), ids(0, 0, 1, 1)), t(0, 0, 0, 0))  # valid = 0: alpha 1, all 0
    with pytest.raises(ValueError, match="alpha must be"):
        gpg_advantages(t(1, 0), ids(0, 0), alpha="paper")
    with pytest.raises(ConfigError, match="algo.adv.gpg_alpha"):
        load_config(None, ["algo.adv.gpg_alpha=paper"])


# -------------------------------------------------------------------------------------------- maxrl


def test_maxrl_divides_the_centred_reward_by_the_group_mean():
    # [1, 0, 0, 0]: mean 1/4 (the pass rate): (1 - 1/4) / (1/4) = 3 and (0 - 1/4) / (1/4) = -1,
    # the numbers prime-rl's test expects. [2, 4]: mean 3, (-1/3, 1/3).
    # [0, 0] (mean 0) and [1, 1] (all equal): 0. [-1, 0]: mean -1/2 <= 0: 0 (prime-rl's rule).
    r = t(1, 0, 0, 0, 2, 4, 0, 0, 1, 1, -1, 0)
    g = ids(0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4)
    assert_close(maxrl_advantages(r, g, eps=0.0), t(3, -1, -1, -1, -1 / 3, 1 / 3, 0, 0, 0, 0, 0, 0))
    # The default eps = 1e-6 (SkyRL's) is added to the mean.
    assert_close(maxrl_advantages(t(1, 0), ids(0, 0)), t(0.5 / (0.5 + 1e-6), -0.5 / (0.5 + 1e-6)))


def test_maxrl_weighs_hard_prompts_more_than_grpo():
    # One success in 4 (p = 1/4) gets 3; one failure in 4 (p = 3/4) costs -1: the success on the
    # hard prompt counts 3x as much, where GRPO gives both the same magnitude (0.75 / 0.5 = 1.5).
    adv = maxrl_advantages(t(1, 0, 0, 0, 0, 1, 1, 1), ids(0, 0, 0, 0, 1, 1, 1, 1), eps=0.0)
    assert_close(adv, t(3, -1, -1, -1, -1, 1 / 3, 1 / 3, 1 / 3))
    grpo = group_advantages(t(1, 0, 0, 0, 0, 1, 1, 1), ids(0, 0, 0, 0, 1, 1, 1, 1), eps=0.0)
    assert_close(grpo[0], -grpo[4])


# --------------------------------------------------------------------------------------------- gdpo


def test_gdpo_normalises_each_component_then_sums_with_weights():
    # acc = [1, 1, 0, 0]: mean 1/2, unbiased var 4 * (1/4) / 3 = 1/3, normalised +-(1/2) / sqrt(1/3) = +-sqrt(3)/2.
    # fmt = [1, 0, 1, 1]: mean 3/4, deviations (1/4, -3/4, 1/4, 1/4), var (3/16 + 9/16) / 3 = 1/4, std 1/2,
    # normalised (1/2, -3/2, 1/2, 1/2); weight 1/2 -> (1/4, -3/4, 1/4, 1/4).
    h = math.sqrt(3) / 2
    comps = torch.stack([t(1, 1, 0, 0), t(1, 0, 1, 1)])
    out = gdpo_advantages(comps, ids(0, 0, 0, 0), weights=t(1, 0.5), eps=0.0)
    assert_close(out, t(h + 0.25, h - 0.75, -h + 0.25, -h + 0.25))


def test_gdpo_keeps_apart_the_reward_combinations_that_grpo_collapses():
    # The GDPO paper's fig. 2: two binary rewards, two rollouts per prompt. Prompt 0's rollouts score
    # (1, 0) and (0, 0), sums 1 and 0; prompt 1's score (1, 1) and (0, 0), sums 2 and 0. GRPO normalises
    # the sums and gives both prompts +-sqrt(1/2); GDPO gives +-sqrt(1/2) and +-2 sqrt(1/2).
    comps = torch.stack([t(1, 0, 1, 0), t(0, 0, 1, 0)])
    g = ids(0, 0, 1, 1)
    grpo = group_advantages(comps.sum(0), g, eps=0.0)
    assert_close(grpo, t(SQRT_HALF, -SQRT_HALF, SQRT_HALF, -SQRT_HALF))
    assert_close(gdpo_advantages(comps, g, eps=0.0), t(SQRT_HALF, -SQRT_HALF, 2 * SQRT_HALF, -2 * SQRT_HALF))


def test_gdpo_with_one_component_is_grpo():
    r, g = t(0.1, 0.7, 0.4, 1, 0, 0, 5), ids(0, 0, 0, 1, 1, 1, 2)
    for kwargs in ({}, {"std_normalize": False}, {"std_scope": "batch"}):
        assert_close(gdpo_advantages(r[None], g, **kwargs), group_advantages(r, g, **kwargs))


def test_gdpo_centres_the_shaping_rest_without_scaling_it():
    # Components [1, 0] normalise to +-sqrt(1/2); the shaping rest (-0.2, 0), e.g. an overlong
    # penalty, is only centred on its mean -0.1: (-0.1, +0.1).
    out = gdpo_advantages(t(1, 0)[None], ids(0, 0), shaping=t(-0.2, 0), eps=0.0)
    assert_close(out, t(SQRT_HALF - 0.1, -SQRT_HALF + 0.1))
    # Without std division everything is only centred, and the sum is Dr. GRPO on the summed reward.
    comps, w, shaping, g = torch.stack([t(1, 0, 1, 0), t(0, 1, 1, 1)]), t(1, 0.5), t(-0.2, 0, 0, -0.05), ids(0, 0, 1, 1)
    out = gdpo_advantages(comps, g, weights=w, shaping=shaping, std_normalize=False)
    assert_close(out, group_advantages((w[:, None] * comps).sum(0) + shaping, g, std_normalize=False))


def gdpo_cfg(*extra: str):
    return load_config(None, ["algo.adv.estimator=gdpo",
                              "reward.functions=[{name: acc, fn: math}, {name: fmt, fn: format, weight: 0.5}]", *extra])


def test_gdpo_estimator_reads_the_components_and_their_weights():
    # The numbers of test_gdpo_normalises_each_component_then_sums_with_weights, on every counted token;
    # the sequence reward is the weighted sum (no shaping), so nothing else is added.
    h = math.sqrt(3) / 2
    acc, fmt = torch.tensor([1.0, 1, 0, 0]), torch.tensor([1.0, 0, 1, 1])
    mask = lengths_mask(2, 1, 3, 0).float()
    x = AdvantageInputs(rewards=acc + 0.5 * fmt, response_mask=mask, loss_mask=mask, kl_rewards=torch.zeros(4, 4),
                        group_ids=ids(0, 0, 0, 0), components={"acc": acc, "fmt": fmt},
                        component_weights={"acc": 1.0, "fmt": 0.5})
    out = ADVANTAGE_ESTIMATORS.get("gdpo").fn(x, gdpo_cfg("algo.adv.gdpo_whiten=none").algo).advantages
    seq = torch.tensor([h + 0.25, h - 0.75, -h + 0.25, -h + 0.25])
    assert_close(out, seq[:, None] * mask, atol=1e-5, rtol=1e-5)  # eps = 1e-6 in the std


def test_gdpo_estimator_whitens_over_the_batch_tokens():
    # One component [1, 0]: GRPO gives +-a, a = sqrt(1/2). With 2 and 1 counted tokens the tokens are
    # (a, a, -a): mean a/3, deviations (2a/3, 2a/3, -4a/3), sum of squares 24 a^2 / 9 = 4/3, unbiased
    # var 2/3: whitened 1/sqrt(3), 1/sqrt(3), -2/sqrt(3).
    mask = lengths_mask(2, 1, width=2).float()
    x = AdvantageInputs(rewards=torch.tensor([1.0, 0.0]), response_mask=mask, loss_mask=mask,
                        kl_rewards=torch.zeros(2, 2), group_ids=ids(0, 0), components=None)
    out = ADVANTAGE_ESTIMATORS.get("gdpo").fn(x, load_config(None, ["algo.adv.estimator=gdpo"]).algo).advantages
    r3 = 1 / math.sqrt(3)
    assert_close(out, torch.tensor([[r3, r3], [-2 * r3, 0]]), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("whiten, value, why", [
    ("token", math.sqrt(2) / math.sqrt(12 / 5),
     "verl's compute_gdpo_outcome_advantage (masked_whiten over the tokens): +-sqrt(2) on 6 tokens, unbiased var "
     "2*6/5 = 12/5: +-0.9129"),
    ("sequence", math.sqrt(2) / 2,
     "NeMo-RL test_grpo.py test_gdpo_advantage_estimator_multiple_rewards (TRL's normalize_then_sum whitens per "
     "response too): +-sqrt(2) over 2 responses, unbiased std 2: +-0.7071"),
    ("none", math.sqrt(2), "the decoupled sum: 0 + 1/sqrt(2) + 1/sqrt(2)"),
])
def test_gdpo_whitens_per_token_as_verl_or_per_sequence_as_trl(whiten, value, why):
    # one group of two responses of 3 tokens; components correctness [1, 1] (constant: 0), integer [1, -1]
    # (+-1/sqrt(2), unbiased group std sqrt(2)) and format [1, 0] (+-1/sqrt(2), std 1/sqrt(2)): sum +-sqrt(2)
    mask = torch.ones(2, 3)
    comps = {"correctness": torch.tensor([1.0, 1.0]), "integer": torch.tensor([1.0, -1.0]), "format": torch.tensor([1.0, 0.0])}
    x = AdvantageInputs(rewards=sum(comps.values()), response_mask=mask, loss_mask=mask, kl_rewards=torch.zeros(2, 3),
                        group_ids=ids(0, 0), components=comps, component_weights={k: 1.0 for k in comps})
    cfg = load_config(None, ["algo.adv.estimator=gdpo", f"algo.adv.gdpo_whiten={whiten}"])
    out = ADVANTAGE_ESTIMATORS.get("gdpo").fn(x, cfg.algo).advantages
    assert_close(out, torch.tensor([[value] * 3, [-value] * 3]), atol=1e-5, rtol=1e-5, msg=why)


def test_gdpo_estimator_with_one_component_and_no_whitening_is_the_grpo_estimator():
    mask = lengths_mask(3, 2, 1, 4).float()
    r = torch.tensor([1.0, 0.0, 0.0, 1.0])
    x = AdvantageInputs(rewards=r, response_mask=mask, loss_mask=mask, kl_rewards=torch.zeros(4, 4),
                        group_ids=ids(0, 0, 1, 1), components={"math": r})
    cfg = load_config(None, ["algo.adv.estimator=gdpo", "algo.adv.gdpo_whiten=none"])
    assert_close(ADVANTAGE_ESTIMATORS.get("gdpo").fn(x, cfg.algo).advantages, ADVANTAGE_ESTIMATORS.get("grpo").fn(x, cfg.algo).advantages)


# ------------------------------------------------------------------------------- all six estimators


def random_inputs(seed: int, *, n_groups: int = 3, n: int = 4) -> AdvantageInputs:
    gen = torch.Generator().manual_seed(seed)
    size = n_groups * n
    acc = torch.randint(0, 2, (size,), generator=gen).float()
    fmt = torch.rand(size, generator=gen)
    mask = lengths_mask(*torch.randint(1, 6, (size,), generator=gen).tolist(), width=5).float()
    loss_mask = mask * (torch.rand(size, 1, generator=gen) > 0.2)  # some rows filtered out of the loss
    return AdvantageInputs(rewards=acc + 0.5 * fmt, response_mask=mask, loss_mask=loss_mask,
                           kl_rewards=torch.zeros_like(mask), group_ids=torch.arange(n_groups).repeat_interleave(n),
                           components={"acc": acc, "fmt": fmt}, component_weights={"acc": 1.0, "fmt": 0.5})


def run(name: str, x: AdvantageInputs) -> torch.Tensor:
    return ADVANTAGE_ESTIMATORS.get(name).fn(x, gdpo_cfg(f"algo.adv.estimator={name}").algo).advantages


def permuted(x: AdvantageInputs, perm: torch.Tensor, relabel=lambda g: g) -> AdvantageInputs:
    return AdvantageInputs(rewards=x.rewards[perm], response_mask=x.response_mask[perm], loss_mask=x.loss_mask[perm],
                           kl_rewards=x.kl_rewards[perm], group_ids=relabel(x.group_ids[perm]),
                           components={k: v[perm] for k, v in x.components.items()}, component_weights=x.component_weights)


@pytest.mark.parametrize("name", NEW)
def test_permuting_the_rows_permutes_the_advantages(name):
    # No estimator may depend on where a response sits in the batch or what its group is called.
    x = random_inputs(0)
    perm = torch.randperm(len(x.rewards), generator=torch.Generator().manual_seed(1))
    out = run(name, x)
    assert_close(run(name, permuted(x, perm)), out[perm])
    assert_close(run(name, permuted(x, perm, relabel=lambda g: 100 - 7 * g)), out[perm])


@pytest.mark.parametrize("name", NEW)
def test_advantages_are_zero_outside_the_loss_mask_and_finite(name):
    for seed in range(5):
        x = random_inputs(seed)
        out = run(name, x)
        assert out.shape == x.loss_mask.shape
        assert torch.isfinite(out).all()
        assert (out[x.loss_mask == 0] == 0).all()


@pytest.mark.parametrize("name", NEW)
def test_a_batch_without_signal_has_zero_advantages(name):
    # Every group all-correct or all-wrong on every component: nothing to learn from, exactly 0.
    x = random_inputs(0)
    acc = torch.tensor([1.0, 0.0, 1.0]).repeat_interleave(4)
    fmt = torch.zeros(12)
    flat = AdvantageInputs(rewards=acc, response_mask=x.response_mask, loss_mask=x.loss_mask, kl_rewards=x.kl_rewards,
                           group_ids=x.group_ids, components={"acc": acc, "fmt": fmt})
    assert (run(name, flat) == 0).all()


@pytest.mark.parametrize("name", NEW)
def test_the_new_estimators_need_groups_and_no_critic(name):
    est = ADVANTAGE_ESTIMATORS.get(name)
    assert est.needs_groups and not est.needs_critic
    with pytest.raises(ConfigError, match="needs groups"):
        load_config(None, [f"algo.adv.estimator={name}", "rollout.n=1", "train.mini_batch_size=16",
                           "data.dynamic_sampling.mode=none"])


# ---------------------------------------------------------------------------------------- end to end

TINY = [
    "base.steps=200", "base.max_digits=1", "data.arith.max_digits=1", "base.hidden_size=32",
    "base.intermediate_size=64", "base.num_layers=2", "base.num_heads=2", "base.num_kv_heads=1",
    "train.steps=2", "rollout.prompts_per_step=4", "rollout.n=4", "train.mini_batch_size=8", "data.eval_size=4",
    "eval.n=2", "eval.every=2", "reward.num_workers=0", "data.dynamic_sampling.mode=none", "train.save_every=0",
]


@pytest.mark.slow
@pytest.mark.parametrize("name", NEW)
def test_two_training_steps_with_each_new_estimator(name, tmp_path, monkeypatch):
    from mathrl.track.sinks import read_metrics
    from mathrl.train.loop import train

    monkeypatch.setenv("MATHRL_CACHE", str(tmp_path / "cache"))
    extra = ["reward.functions=[{name: math, fn: math}, {name: format, fn: format, weight: 0.5}]"] if name == "gdpo" else []
    cfg = load_config(None, [*TINY, *extra, f"algo.adv.estimator={name}", f"run_dir={tmp_path / 'run'}"])
    builtin, seen = ADVANTAGE_ESTIMATORS.get(name), []
    ADVANTAGE_ESTIMATORS.register(name, replace(builtin, fn=lambda x, c: seen.append(x) or builtin.fn(x, c)), replace=True)
    try:
        result = train(cfg, console=Console(file=io.StringIO()))
    finally:
        ADVANTAGE_ESTIMATORS.register(name, builtin, replace=True)
    assert len(seen) == 2  # once per step
    if name == "gdpo":  # the step handed over both components' raw scores, [N] each
        assert all(set(x.components) == {"math", "format"} and x.components["format"].shape == (16,) for x in seen)
    rows = read_metrics(result.run_dir / "metrics.jsonl")
    assert {r["step"] for r in rows} >= {1, 2}
    for row in rows:  # the JSONL sink writes NaN/inf as strings, so a non-number is a NaN too
        for key, value in row.items():
            assert isinstance(value, (int, float)) and not isinstance(value, bool), (row["step"], key, value)
            assert math.isfinite(value), (row["step"], key, value)
