"""Each extension point is one registration: this module adds a rollout engine, a reward shaping term,
a loss term and a prompt template (a task format) from outside the package, then trains two steps
with all four and finds each one used and logged. docs/architecture.md ("Where to add") counts the
files each one costs; a new advantage estimator has its own test (tests/algo/test_estimator_registry.py).

Run: python -m pytest tests/project/test_extension_points.py -q
"""

from __future__ import annotations

import io

import pytest
import torch
from rich.console import Console

from mathrl.config import load_config
from mathrl.registry import ENGINES, LOSS_TERMS, PROMPT_TEMPLATES, SHAPING_TERMS
from mathrl.reward import shaping
from mathrl.rollout.factory import EngineSpec
from mathrl.tasks.prompts import render_prompt
from mathrl.train import update

TINY = [
    "base.steps=200", "base.max_digits=1", "data.arith.max_digits=1", "base.hidden_size=32",
    "base.intermediate_size=64", "base.num_layers=2", "base.num_heads=2", "base.num_kv_heads=1",
    "train.steps=2", "rollout.prompts_per_step=4", "rollout.n=4", "train.mini_batch_size=8", "data.eval_size=4",
    "eval.n=2", "eval.every=2", "reward.num_workers=0", "data.dynamic_sampling.mode=none", "train.save_every=0",
]


@pytest.fixture
def extensions(monkeypatch):
    """Register one of each; `seen` records what each was called with."""
    seen: dict[str, list] = {"engine": [], "shaping": [], "loss": []}

    def build_counting(cfg, *, model, tokenizer, model_path):  # the torch engine, counting its calls
        engine = ENGINES.get("torch").build(cfg, model=model, tokenizer=tokenizer, model_path=model_path)
        real = engine.generate

        def generate(prompts, **kwargs):
            seen["engine"].append(len(prompts))
            return real(prompts, **kwargs)

        engine.generate = generate
        return engine

    ENGINES.register("counting", EngineSpec(build_counting, logprobs_match_trainer=True, samples_from_module=True))
    PROMPT_TEMPLATES.register("sum_is", "{question} is ")

    def tenth(x: shaping.ShapingInputs) -> torch.Tensor:
        seen["shaping"].append(x.lengths.shape)
        return torch.full_like(x.lengths, 0.1, dtype=torch.float32)

    SHAPING_TERMS.register("tenth", shaping.ShapingTerm(lambda cfg: True, tenth))

    def tokens_seen(x: update.TermInputs):
        seen["loss"].append(x.logprobs.shape)
        return update.Term(loss=None, value=float(x.mask.sum()))  # adds nothing to the loss; logs the counted tokens

    LOSS_TERMS.register("tokens_seen", update.LossTerm(lambda cfg: True, tokens_seen))
    yield seen
    SHAPING_TERMS.remove("tenth")
    LOSS_TERMS.remove("tokens_seen")
    ENGINES.remove("counting")
    PROMPT_TEMPLATES.remove("sum_is")


def test_a_registered_template_renders_and_is_a_config_choice(extensions):
    assert render_prompt("2+3", template="sum_is") == "2+3 is "
    assert load_config(None, ["data.template=sum_is"]).data.template == "sum_is"


@pytest.mark.slow
def test_training_with_one_of_each(extensions, tmp_path, monkeypatch):
    from mathrl.track.sinks import read_metrics
    from mathrl.train.loop import train

    monkeypatch.setenv("MATHRL_CACHE", str(tmp_path / "cache"))
    cfg = load_config(None, [*TINY, "rollout.engine=counting", "data.template=sum_is", f"run_dir={tmp_path / 'run'}"])
    result = train(cfg, console=Console(file=io.StringIO()))
    assert 16 in extensions["engine"]  # each step's 4 prompts x 4 samples came from the registered engine
    assert extensions["shaping"] and all(s == (16,) for s in extensions["shaping"])
    assert extensions["loss"]
    rows = [r for r in read_metrics(result.run_dir / "metrics.jsonl") if "reward/mean" in r]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["reward/tenth"] == pytest.approx(0.1)  # the shaping term's mean, under its name
        assert r["actor/tokens_seen"] > 0  # the loss term's logged value
    rollouts = (result.run_dir / "rollouts.jsonl").read_text()
    assert " is " in rollouts  # the prompts were rendered with the registered template
