"""Tools through the whole loop: `mathrl train` with rollout.tools (synchronous and with a generator
process), evaluation with tools, and SFT on tool traces with the outputs masked.

The base model is a 200-step, hidden-32 tiny model on 1-2 digit sums, half of its pretraining
solutions written as python tool calls (base.tool_share=0.5), built into a temporary MATHRL_CACHE; it
calls its tool in a good share of its samples at temperature 1. The calls go to the calculator.

Run: python -m pytest tests/train/test_tools_e2e.py -q
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from test_train_e2e import TINY_BASE, quiet_console

from mathrl.config import load_config
from mathrl.track.sinks import read_metrics

TOOLS = [
    *TINY_BASE,
    "base.steps=200",
    "base.max_digits=2",
    "base.tool_share=0.5",
    "data.arith.max_digits=2",
    "rollout.prompts_per_step=4",
    "rollout.n=8",
    "train.mini_batch_size=16",
    "data.eval_size=8",
    "eval.n=2",
    "eval.every=1",
    "data.dynamic_sampling.mode=none",
    "reward.timeout_s=60",
    "rollout.max_new_tokens=40",
    "rollout.tools=[{name: python, fn: calculator}]",
    "rollout.observation_max_tokens=30",
    "train.steps=2",
]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("tools_cache")


def run(cache, tmp_path, *extra):
    from mathrl.train.loop import train

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MATHRL_CACHE", str(cache))
        cfg = load_config(None, [*TOOLS, *extra, f"run_dir={tmp_path / 'run'}"])
        return cfg, train(cfg, console=quiet_console())


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "generator", "row draws"])
def test_a_run_with_tools_logs_tool_metrics_and_masked_episodes(cache, tmp_path, mode):
    extra = {"sync": [], "generator": ["rollout.max_staleness=1"], "row draws": ["rollout.draws=row"]}[mode]
    cfg, result = run(cache, tmp_path, *extra)
    rows = read_metrics(result.run_dir / "metrics.jsonl")
    for row in rows:
        for key, value in row.items():
            assert isinstance(value, (int, float)) and math.isfinite(value), (row["step"], key, value)
    trained = [r for r in rows if "actor/entropy" in r]
    assert [r["step"] for r in trained] == [1, 2]
    for r in trained:
        for key in ("tool/calls_mean", "tool/call_rate", "tool/error_rate", "tool/timeout_rate", "tool/seconds",
                    "tool/void_turn_rate", "rollout/turns_mean", "rollout/turns_max", "rollout/observation_token_share"):
            assert key in r, key
        assert 0 <= r["tool/call_rate"] <= 1 and r["rollout/turns_max"] <= cfg.rollout.max_turns
    assert sum(r["tool/calls_mean"] for r in trained) > 0, "the tool base model should call its tool"
    evals = [r for r in rows if "eval/arith_heldout/tool/call_rate" in r]
    assert [r["step"] for r in evals] == [0, 1, 2]
    # rollouts.jsonl marks which tokens a tool wrote; each call is a python block then its output
    records = [json.loads(line) for line in (result.run_dir / "rollouts.jsonl").read_text().splitlines()]
    called = [r for r in records if r["tool_calls"]]
    for r in called:
        assert len(r["observation"]) == len(r["token_ids"])
        seen = "".join(t for t, o in zip(r["response"], r["observation"]) if o)  # a char model: one char per token
        # an observation cut by rollout.max_new_tokens ends the response, possibly inside its opening tag
        assert seen.startswith("```output\n") or ("```output\n".startswith(seen) and r["observation"][-1]), seen


def test_sft_on_tool_traces_learns_the_calls_not_the_outputs(char_tokenizer):
    from mathrl.rollout.episodes import python_blocks
    from mathrl.train.sft import Example, collate, encode_trace

    trace = "```python\n12+30\n```\n```output\n42\n```\n\\boxed{42}"
    ids, observation = encode_trace(trace, char_tokenizer, python_blocks())
    assert char_tokenizer.decode(ids) == trace  # the char model: the pieces join back exactly
    seen = "".join(ch for ch, o in zip(trace, observation) if o)
    assert seen == "```output\n42\n```\n"  # exactly the observation, tags included
    plain, none = encode_trace(trace, char_tokenizer, None)
    assert plain == ids and none == []
    eos = char_tokenizer.eos_token_id
    batch = collate([Example([5, 6], ids + [eos], observation + [0]), Example([7], [8, eos], None)], pad_id=0)
    assert torch.equal(batch.loss_mask[0, : len(ids) + 1], 1 - torch.tensor(observation + [0], dtype=torch.float32))
    assert torch.equal(batch.context_mask[0, : len(ids) + 1], torch.ones(len(ids) + 1))
    assert batch.loss_mask[1].tolist()[:2] == [1.0, 1.0] and batch.observation_mask[1].sum() == 0



def test_sft_encodes_an_observation_as_an_episode_does(char_tokenizer):
    # Bug story: SFT tokenized an observation block in one piece with the tokenizer's defaults, so an
    # output that printed the EOS string became the EOS token in the training ids, where an episode
    # (rollout/episodes.py) spells it out as characters: the model would learn a turn end no turn made.
    from mathrl.rollout.episodes import ToolUse, python_blocks
    from mathrl.train.sft import encode_trace

    eos_text = char_tokenizer.eos_token
    trace = f"```python\nprint(tag)\n```\n```output\n{eos_text}\n```\n\\boxed{{1}}"
    ids, observation = encode_trace(trace, char_tokenizer, python_blocks())
    assert char_tokenizer.eos_token_id not in ids
    tools = ToolUse(fmt=python_blocks(), pool=None, tokenizer=char_tokenizer)
    seen = [t for t, o in zip(ids, observation) if o]
    assert seen == tools.opening + tools.encode_text(eos_text) + tools.closing
