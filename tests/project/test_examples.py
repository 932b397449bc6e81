"""examples/: every user-written reward and its recipe runs. The recipe trains two steps of the
default task (a shrunk tiny base model, built into a temporary MATHRL_CACHE) with the user's reward
beside the math checker, and its components are logged, finite and never failed.

Run: python -m pytest tests/project/test_examples.py -q
"""

from __future__ import annotations

import io
import math
from pathlib import Path

import pytest
from rich.console import Console

from mathrl.config import load_config

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted((ROOT / "examples").rglob("*.yaml"))
TINY = ["base.steps=200", "base.max_digits=1", "data.arith.max_digits=1", "base.hidden_size=32",
        "base.intermediate_size=64", "base.num_layers=2", "base.num_heads=2", "base.num_kv_heads=1"]


def test_there_are_examples():
    assert RECIPES, "examples/ holds no recipe"


@pytest.mark.parametrize("recipe", RECIPES, ids=[str(r.relative_to(ROOT)) for r in RECIPES])
def test_every_example_recipe_loads_from_the_repository_root(recipe, monkeypatch):
    monkeypatch.chdir(ROOT)  # the recipes name their functions by paths relative to the root
    from mathrl.config import resolve_reward_function

    cfg = load_config(recipe)
    # every user-written function the recipe names resolves to a callable (a path typo fails here)
    assert all(callable(resolve_reward_function(f.fn)) for f in cfg.reward.functions)


def test_the_digits_reward_scores_partial_credit():
    import importlib.util

    spec = importlib.util.spec_from_file_location("digits", ROOT / "examples" / "rewards" / "digits.py")
    digits = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(digits)
    out = digits.digit_credit(["", "", "", ""], [r"=...,\boxed{0936}", r"\boxed{926}", "no box", r"\boxed{7}"],
                              [{"answer": "936"}] * 3 + [{"answer": "17"}], [[]] * 4)
    # right; 2 of 3 digits (the tens is off by one); nothing boxed; units right, tens 0 vs 1
    assert out == [{"score": 1.0, "abs_error": 0.0}, {"score": 2 / 3, "abs_error": 10.0},
                   {"score": 0.0, "abs_error": 936.0}, {"score": 0.5, "abs_error": 10.0}]


@pytest.mark.slow
def test_the_digits_recipe_trains(tmp_path, monkeypatch):
    from mathrl.track.sinks import read_metrics
    from mathrl.train.loop import train

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("MATHRL_CACHE", str(tmp_path / "cache"))
    cfg = load_config(ROOT / "examples" / "rewards" / "digits.yaml", [
        *TINY, "train.steps=2", "rollout.prompts_per_step=4", "rollout.n=4", "train.mini_batch_size=16",
        "data.eval_size=4", "eval.n=2", "eval.every=2", "data.dynamic_sampling.mode=none", "reward.timeout_s=60",
        f"run_dir={tmp_path / 'run'}",
    ])
    train(cfg, console=Console(file=io.StringIO()))
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    steps = [r for r in rows if "actor/entropy" in r]
    assert len(steps) == 2
    for r in steps:
        assert 0 <= r["reward/math/mean"] <= r["reward/digits/mean"] <= 1  # a right sum has every digit right
        assert math.isfinite(r["reward/digits/abs_error"])
        assert r["reward/digits/errors"] == r["reward/digits/timeouts"] == r["reward/math/errors"] == 0
        # the total is math + 0.25 x digits (no shaping in this recipe)
        assert r["reward/mean"] == pytest.approx(r["reward/math/mean"] + 0.25 * r["reward/digits/mean"], abs=1e-6)
    evals = [r for r in rows if "eval/arith_heldout/reward/digits/mean" in r]
    assert [r["step"] for r in evals] == [0, 2]  # mathrl's evaluation scores every component too
    # every component key is defined in the glossary, as reward/<name>/... (the test of the default run's keys
    # is in tests/train/test_train_e2e.py)
    glossary = (ROOT / "docs" / "metrics.md").read_text()
    keys = {k.replace("eval/arith_heldout/", "eval/<set>/") for r in rows for k in r if "/math/" in k or "/digits/" in k}
    generic = {k.replace("/math/", "/<name>/").replace("/digits/", "/<name>/").replace("/abs_error", "/<key>")
               for k in keys}
    assert generic and all(f"`{k}`" in glossary for k in generic), sorted(generic)
