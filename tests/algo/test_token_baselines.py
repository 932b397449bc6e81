"""The optimal token baseline (and its tool-integrated variant) and ReMax on hand-computed cases, and the
OTB against a plain loop over groups and steps written from verl's formula (B_t = Σ G W / Σ W)."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from mathrl.algo.estimators import AdvantageInputs
from mathrl.algo.token_baselines import optimal_token_baseline_advantages, path_variance_weights, remax_advantages
from mathrl.registry import ADVANTAGE_ESTIMATORS

LOG_HALF, LOG_QUARTER = torch.log(torch.tensor(0.5)).item(), torch.log(torch.tensor(0.25)).item()


def test_path_variance_is_the_running_sum_of_the_score_norms():
    # pi = 1/2 with sum pi^2 = 1/2: ||s||^2 = 1 - 1 + 1/2 = 1/2; pi = 1/4 with sum pi^2 = 1/4: 1 - 1/2 + 1/4 = 3/4.
    # A masked position adds nothing; an importance weight 2 multiplies its term by 4.
    lp = torch.tensor([[LOG_HALF, LOG_QUARTER, LOG_HALF]])
    spp = torch.tensor([[0.5, 0.25, 0.5]])
    assert_close(path_variance_weights(lp, spp, torch.ones(1, 3)), torch.tensor([[0.5, 1.25, 1.75]]))
    assert_close(path_variance_weights(lp, spp, torch.tensor([[1.0, 0.0, 1.0]])), torch.tensor([[0.5, 0.5, 1.0]]))
    assert_close(path_variance_weights(lp, spp, torch.ones(1, 3), is_weights=torch.tensor([[1.0, 2.0, 1.0]])),
                 torch.tensor([[0.5, 3.5, 4.0]]))


HALF = (LOG_HALF, 0.5)  # (log pi, sum pi^2): ||s||^2 = 1/2
QUARTER = (LOG_QUARTER, 0.25)  # ||s||^2 = 3/4


def _stats(rows):
    lp = torch.tensor([[c[0] for c in r] for r in rows])
    spp = torch.tensor([[c[1] for c in r] for r in rows])
    return lp, spp


OTB_CASES = [
    # (returns, per-token (log pi, sum pi^2), mask, group ids, kwargs, expected, why)
    ([[1.0, 1.0], [0.0, 0.0]], [[HALF, HALF], [QUARTER, HALF]], [[1, 1], [1, 1]], [0, 0], {},
     [[0.6, 1 - 1 / 2.25], [-0.4, -1 / 2.25]],
     "W = [.5, 1] and [.75, 1.25]: B_1 = .5 / 1.25 = 0.4, B_2 = 1 / 2.25 = 0.4444"),
    ([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]], [[HALF] * 3, [HALF] * 3], [[1, 1, 1], [1, 0, 0]], [0, 0], {},
     [[0.5, 1.0, 1.0], [-0.5, 0.0, 0.0]],
     "row 0 is the only one past step 1: zero tail, its baseline there is 0, A = G"),
    ([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]], [[HALF] * 3, [HALF] * 3], [[1, 1, 1], [1, 0, 0]], [0, 0],
     {"handle_zero_tail": False}, [[0.5, 0.0, 0.0], [-0.5, 0.0, 0.0]],
     "without the zero tail row 0 is its own baseline past step 1 (G W / (W + 1e-8): A ~ 1e-8)"),
    ([[2.0, 2.0], [0.0, 0.0]], [[HALF] * 2, [HALF] * 2], [[1, 1], [1, 1]], [0, 1], {},
     [[2.0, 2.0], [0.0, 0.0]], "groups of one get no baseline"),
    ([[1.0], [0.0]], [[HALF], [HALF]], [[1], [1]], [0, 0], {"is_weights": torch.tensor([[1.0], [2.0]])},
     [[0.8], [-0.2]], "importance weight 2 on row 1: W = .5 and 2, B = .5 / 2.5 = 0.2"),
    # a tool observation at row 0's position 1: aligned by position, step 2 holds row 0 alone; by token,
    # row 0's second model token meets row 1's second
    ([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]], [[HALF] * 3, [HALF] * 3], [[1, 0, 1], [1, 1, 0]], [0, 0],
     {"align": "token"}, [[0.5, 0.0, 0.5], [-0.5, -0.5, 0.0]], "W = [.5, 1] for both in token steps: B = 0.5 at each"),
    ([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]], [[HALF] * 3, [HALF] * 3], [[1, 0, 1], [1, 1, 0]], [0, 0],
     {"align": "position"}, [[0.5, 0.0, 0.0], [-0.5, 0.0, 0.0]],
     "by position, position 1 holds row 1 alone (B = 0 = G) and position 2 row 0 alone (B = G)"),
]


@pytest.mark.parametrize("returns, stats, mask, groups, kwargs, expected, why", OTB_CASES,
                         ids=[str(i) for i in range(len(OTB_CASES))])
def test_optimal_token_baseline_by_hand(returns, stats, mask, groups, kwargs, expected, why):
    lp, spp = _stats(stats)
    got = optimal_token_baseline_advantages(torch.tensor(returns), lp, spp, torch.tensor(mask, dtype=torch.float32),
                                            torch.tensor(groups), **kwargs)
    assert_close(got, torch.tensor(expected), atol=1e-6, rtol=1e-6, msg=why)


def _loop_reference(returns, lp, spp, mask, groups):
    """verl's formula as a plain loop (position-aligned, zero tail on): B_t = Σ_i G W m / (Σ_i W m + 1e-8)."""
    w = ((1 - 2 * lp.exp() + spp) * mask).cumsum(-1)
    out = torch.zeros_like(returns)
    for g in groups.unique():
        rows = [i for i in range(len(groups)) if groups[i] == g]
        lengths = sorted((int(mask[i].sum()) for i in rows), reverse=True)
        for i in rows:
            for t in range(returns.shape[1]):
                if not mask[i, t]:
                    continue
                num = sum(float(returns[j, t] * w[j, t] * mask[j, t]) for j in rows)
                den = sum(float(w[j, t] * mask[j, t]) for j in rows) + 1e-8
                b = num / den if len(rows) > 1 else 0.0
                alone = int(mask[i].sum()) == lengths[0] and (len(lengths) > 1 and lengths[0] > lengths[1])
                if alone and t >= lengths[1]:
                    b = 0.0
                out[i, t] = returns[i, t] - b
    return out


def test_optimal_token_baseline_matches_the_loop_on_random_inputs():
    gen = torch.Generator().manual_seed(0)
    n, t = 12, 7
    lengths = torch.randint(1, t + 1, (n,), generator=gen)
    mask = (torch.arange(t)[None] < lengths[:, None]).double()
    probs = torch.softmax(torch.randn(n, t, 5, generator=gen, dtype=torch.float64), -1)
    lp, spp = probs[..., 0].log(), probs.square().sum(-1)
    returns = torch.randn(n, t, generator=gen, dtype=torch.float64) * mask
    groups = torch.tensor([0, 0, 0, 1, 1, 1, 1, 2, 3, 3, 4, 4])
    got = optimal_token_baseline_advantages(returns, lp, spp, mask, groups)
    want = _loop_reference(returns, lp, spp, mask, groups)
    assert (got - want).abs().max() < 1e-12


def test_remax_subtracts_the_greedy_reward():
    # returns 1 (correct) and 0 on every token; the greedy responses scored 1 and 0: A = 0 and -1 for the
    # first prompt's sample (greedy 1), and 0 for the second's (greedy 0).
    returns = torch.tensor([[1.0, 1.0], [0.0, 0.0], [0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    got = remax_advantages(returns, torch.tensor([1.0, 1.0, 0.0]), mask)
    assert_close(got, torch.tensor([[0.0, 0.0], [-1.0, 0.0], [0.0, 0.0]]))
    with pytest.raises(ValueError, match="greedy_rewards"):
        remax_advantages(returns, torch.ones(2), mask)


def _inputs(**extra):
    mask = torch.ones(2, 2)
    return AdvantageInputs(rewards=torch.tensor([1.0, 0.0]), response_mask=mask, loss_mask=mask,
                           kl_rewards=torch.zeros(2, 2), group_ids=torch.tensor([0, 0]), **extra)


def test_the_estimators_are_registered_and_read_their_inputs():
    lp, spp = _stats([[HALF, HALF], [QUARTER, HALF]])
    otb = ADVANTAGE_ESTIMATORS.get("optimal_token_baseline")
    assert otb.needs_policy_stats and not otb.needs_greedy
    got = otb.fn(_inputs(old_logprobs=lp, sum_pi_squared=spp), None).advantages
    assert_close(got, torch.tensor([[0.6, 1 - 1 / 2.25], [-0.4, -1 / 2.25]]))  # the first hand case
    assert ADVANTAGE_ESTIMATORS.get("tir_optimal_token_baseline").needs_policy_stats
    rmx = ADVANTAGE_ESTIMATORS.get("remax")
    assert rmx.needs_greedy and not rmx.needs_groups
    assert_close(rmx.fn(_inputs(greedy_rewards=torch.tensor([0.5, 0.5])), None).advantages,
                 torch.tensor([[0.5, 0.5], [-0.5, -0.5]]))
    with pytest.raises(ValueError, match="sum_pi_squared"):
        otb.fn(_inputs(), None)
    with pytest.raises(ValueError, match="greedy"):
        rmx.fn(_inputs(), None)


TINY = [
    "base.steps=200", "base.max_digits=1", "data.arith.max_digits=1", "base.hidden_size=32",
    "base.intermediate_size=64", "base.num_layers=2", "base.num_heads=2", "base.num_kv_heads=1",
    "train.steps=2", "rollout.prompts_per_step=4", "rollout.n=4", "train.mini_batch_size=8", "data.eval_size=4",
    "eval.n=2", "eval.every=2", "reward.num_workers=0", "data.dynamic_sampling.mode=none", "train.save_every=0",
]


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.mark.slow
@pytest.mark.parametrize("overrides", [
    ["algo.adv.estimator=optimal_token_baseline"],
    ["algo.adv.estimator=tir_optimal_token_baseline"],
    ["algo.adv.estimator=remax"],
    ["algo.adv.estimator=remax", "rollout.n=1", "train.mini_batch_size=4"],
], ids=["otb", "tir_otb", "remax", "remax-n1"])
def test_training_with_each_estimator(overrides, shared_cache, tmp_path, monkeypatch):
    import io
    import math

    from rich.console import Console

    from mathrl.config import load_config
    from mathrl.track.sinks import read_metrics
    from mathrl.train.loop import train

    monkeypatch.setenv("MATHRL_CACHE", str(shared_cache))
    cfg = load_config(None, [*TINY, *overrides, f"run_dir={tmp_path / 'run'}"])
    result = train(cfg, console=Console(file=io.StringIO()))
    rows = [r for r in read_metrics(result.run_dir / "metrics.jsonl") if "actor/pg_loss" in r]
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert all(math.isfinite(v) for v in row.values() if isinstance(v, (int, float)))
        assert ("reward/greedy" in row) == ("algo.adv.estimator=remax" in overrides)
