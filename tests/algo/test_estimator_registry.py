"""A new advantage estimator is one function and one registration: this module registers one and
trains with it, editing no other file; the built-in names are the registry's, not a list in the config."""

from __future__ import annotations

import io

import pytest
import torch
from rich.console import Console
from torch.testing import assert_close

from mathrl.algo.advantages import expand_to_tokens, group_advantages, rloo_advantages
from mathrl.algo.estimators import AdvantageInputs, Advantages, Estimator
from mathrl.config import ConfigError, load_config
from mathrl.registry import ADVANTAGE_ESTIMATORS

TINY = [
    "base.steps=200", "base.max_digits=1", "data.arith.max_digits=1", "base.hidden_size=32",
    "base.intermediate_size=64", "base.num_layers=2", "base.num_heads=2", "base.num_kv_heads=1",
    "train.steps=2", "rollout.prompts_per_step=4", "rollout.n=4", "train.mini_batch_size=8", "data.eval_size=4",
    "eval.n=2", "eval.every=2", "reward.num_workers=0", "data.dynamic_sampling.mode=none", "train.save_every=0",
]


def batch_mean_baseline(x: AdvantageInputs, cfg) -> Advantages:
    """The reward minus the batch's mean reward, on every token: a baseline without groups."""
    seq = x.rewards - x.rewards.mean()  # [N]
    return Advantages(expand_to_tokens(seq, x.loss_mask), metrics={"actor/batch_baseline": float(x.rewards.mean())})


@pytest.fixture
def registered():
    calls = []

    def recorded(x: AdvantageInputs, cfg) -> Advantages:
        calls.append(x)
        return batch_mean_baseline(x, cfg)

    ADVANTAGE_ESTIMATORS.register("batch_mean", Estimator(recorded, needs_groups=False))
    yield calls
    ADVANTAGE_ESTIMATORS.remove("batch_mean")


def test_a_registered_estimator_is_a_config_choice(registered):
    cfg = load_config(None, ["algo.adv.estimator=batch_mean", "rollout.n=1", "train.mini_batch_size=16",
                             "data.dynamic_sampling.mode=none"])  # needs_groups=False: one sample per prompt is fine
    assert cfg.algo.adv.estimator == "batch_mean"


def test_an_unregistered_estimator_names_the_field_and_the_choices():
    with pytest.raises(ConfigError, match=r"algo.adv.estimator='batch_mean': must be a registered advantage "
                                          r"estimator: grpo, rloo, reinforce_pp, gae, grpo_passk, "
                                          r"reinforce_pp_baseline, opo, gpg, maxrl, gdpo"):
        load_config(None, ["algo.adv.estimator=batch_mean"])


@pytest.mark.slow
def test_training_with_a_registered_estimator(registered, tmp_path, monkeypatch):
    from mathrl.model.io import load_model_and_tokenizer
    from mathrl.model.tiny import base_model_dir
    from mathrl.track.sinks import read_metrics
    from mathrl.train.loop import train

    monkeypatch.setenv("MATHRL_CACHE", str(tmp_path / "cache"))
    cfg = load_config(None, [*TINY, "algo.adv.estimator=batch_mean", f"run_dir={tmp_path / 'run'}"])
    result = train(cfg, console=Console(file=io.StringIO()))
    assert len(registered) == 2  # once per step
    for x in registered:  # 4 prompts x 4 samples
        assert x.rewards.shape == (16,) and x.group_ids.tolist() == [g for g in range(4) for _ in range(4)]
        assert x.values is None  # no critic
    rows = [r for r in read_metrics(result.run_dir / "metrics.jsonl") if "actor/batch_baseline" in r]
    assert [r["step"] for r in rows] == [1, 2]  # the estimator's own metric is logged
    base, _ = load_model_and_tokenizer(base_model_dir(cfg.base))
    final, _ = load_model_and_tokenizer(result.run_dir / "final")
    moved = any(not torch.equal(a, b) for a, b in zip(base.state_dict().values(), final.state_dict().values()))
    some_signal = any(bool((x.rewards != x.rewards.mean()).any()) for x in registered)
    assert moved == some_signal  # non-zero advantages moved the weights; all-zero ones rightly do not


def inputs(rewards: list[float], n: int) -> AdvantageInputs:
    r = torch.tensor(rewards)
    mask = torch.tensor([[1.0, 1.0, 0.0]] * len(rewards))
    return AdvantageInputs(rewards=r, response_mask=mask, loss_mask=mask, kl_rewards=torch.zeros_like(mask),
                           group_ids=torch.arange(len(rewards) // n).repeat_interleave(n))


@pytest.mark.parametrize("name", ["grpo", "rloo"])
def test_the_group_estimators_are_the_group_functions_on_every_token(name):
    cfg = load_config(None, [])
    x = inputs([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0], n=4)
    seq = (group_advantages(x.rewards, x.group_ids) if name == "grpo" else rloo_advantages(x.rewards, x.group_ids))
    out = ADVANTAGE_ESTIMATORS.get(name).fn(x, cfg.algo)
    assert_close(out.advantages, seq[:, None] * x.loss_mask)
    assert out.returns is None


def test_the_builtins_declare_what_they_need():
    assert [n for n in ADVANTAGE_ESTIMATORS.names() if ADVANTAGE_ESTIMATORS.get(n).needs_critic] == ["gae"]
    assert [n for n in ADVANTAGE_ESTIMATORS.names() if ADVANTAGE_ESTIMATORS.get(n).needs_groups] == [
        "grpo", "rloo", "grpo_passk", "reinforce_pp_baseline", "opo", "gpg", "maxrl", "gdpo", "optimal_token_baseline",
        "tir_optimal_token_baseline"]
    assert [n for n in ADVANTAGE_ESTIMATORS.names() if ADVANTAGE_ESTIMATORS.get(n).needs_policy_stats] == [
        "optimal_token_baseline", "tir_optimal_token_baseline"]
    assert [n for n in ADVANTAGE_ESTIMATORS.names() if ADVANTAGE_ESTIMATORS.get(n).needs_greedy] == ["remax"]
