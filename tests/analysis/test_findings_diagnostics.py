"""Diagnostics of the findings against hand-computed values: how answers are written (the integer
hack), the top-entropy tokens of a set of responses, and the critic's curves in positions.jsonl."""

from __future__ import annotations

import pytest
import torch

from mathrl.analysis.entropy_probe import entropy_by_token, top_entropy_tokens
from mathrl.analysis.tokens import TokenScores
from mathrl.evaluation.metrics import answer_forms
from mathrl.reward.numeric import answer_form


@pytest.mark.parametrize("text, form", [
    ("12", "integer"), ("-3", "integer"), ("1,000", "integer"), ("$7$", "integer"),
    ("2.5", "decimal"), ("3.0", "decimal"), (".5", "decimal"), ("3{,}14", "decimal"),
    ("7/2", "fraction"), (r"\frac{7}{2}", "fraction"), (r"3\frac{1}{2}", "fraction"),
    ("x+1", "other"), ("", "other"), ("0,111", "other"),
])
def test_answer_form_reads_the_written_form(text, form):
    assert answer_form(text) == form


def test_answer_forms_share_over_completions_by_hand():
    texts = ["so \\boxed{3}", "\\boxed{2.5}", "x \\boxed{\\frac{7}{2}}", "no box", "\\boxed{x+1}",
             "\\boxed{2.5} then \\boxed{3}", "\\boxed{4"]  # the last box decides; an unclosed box is no answer
    forms = answer_forms(texts)
    assert forms == pytest.approx({"integer": 2 / 7, "decimal": 1 / 7, "fraction": 1 / 7, "other": 1 / 7, "none": 2 / 7})
    assert answer_forms([]) == dict.fromkeys(("integer", "decimal", "fraction", "other", "none"), 0.0)


def _scores(tokens, entropy):
    n = len(tokens)
    return TokenScores(prompt="", prompt_ids=[], token_ids=list(range(n)), tokens=tokens,
                       logprobs=torch.zeros(n), entropy=torch.tensor(entropy))


def test_entropy_by_token_by_hand():
    responses = [
        _scores(["wait", ",", "7", ","], [0.1, 2.0, 0.3, 0.5]),
        _scores(["wait", ",", "7"], [0.2, 4.0, 0.1]),
        _scores(["7", ","], [0.6, 0.7]),
    ]
    rows = entropy_by_token(responses, k=3, min_count=2)
    # (wait, ","): (2 + 4) / 2 = 3.0; ("7", ","): (0.5 + 0.7) / 2 = 0.6; ("", wait): 0.15; (",", 7): 0.2
    assert [(r.previous, r.token, r.count) for r in rows] == [("wait", ",", 2), ("7", ",", 2), (",", "7", 2)]
    assert [r.entropy for r in rows] == pytest.approx([3.0, 0.6, 0.2])
    assert entropy_by_token(responses, k=10, min_count=3) == []  # no pair is seen 3 times


def test_top_entropy_tokens_over_steps_by_hand():
    by_step = {
        100: [_scores(["wait", ",", "7"], [0.1, 0.2, 0.3]), _scores(["wait", ",", "7"], [0.3, 0.4, 0.1])],
        0: [_scores(["wait", ",", "7"], [0.5, 0.02, 0.6]), _scores(["7", "+"], [0.4, 0.0])],
        200: [_scores(["wait", ",", "7"], [0.1, 1.5, 0.1]), _scores(["wait", ",", "8"], [0.1, 2.5, 0.2])],
    }
    got = top_entropy_tokens(by_step, k=1, min_count=1)
    assert got.steps == [0, 100, 200]  # ascending whatever the mapping's order
    # step 0: ("", "wait") 0.5 vs (",", "7") 0.6 vs ("", "7") 0.4 -> (",", "7"); step 100: (wait, ",") (0.2 + 0.4) / 2 = 0.3
    # ties (",", "7") at 0.2 by count -> (wait, ","); step 200: (wait, ",") (1.5 + 2.5) / 2 = 2.0
    assert [(r.previous, r.token, r.count) for s in got.steps for r in got.top[s]] == [
        (",", "7", 1), ("wait", ",", 2), ("wait", ",", 2)]
    assert [r.entropy for s in got.steps for r in got.top[s]] == pytest.approx([0.6, 0.3, 2.0])
    # the comma after "wait" through every step, first in the order: highest at the last step
    assert list(got.tracked) == [("wait", ","), (",", "7")]
    comma = got.tracked[("wait", ",")]
    assert {s: (round(r.entropy, 6), r.count) for s, r in comma.items()} == {0: (0.02, 1), 100: (0.3, 2), 200: (2.0, 2)}
    seven = got.tracked[(",", "7")]
    assert {s: (round(r.entropy, 6), r.count) for s, r in seven.items()} == {0: (0.6, 1), 100: (0.2, 2), 200: (0.1, 1)}
    # min_count applies to the top of each step, not to tracking: step 0's comma (seen once) is still shown
    got = top_entropy_tokens(by_step, k=1, min_count=2)
    assert got.top[0] == [] and list(got.tracked) == [("wait", ",")] and 0 in got.tracked[("wait", ",")]
    assert top_entropy_tokens({}, k=3).tracked == {}


def test_ppo_run_writes_value_and_advantage_by_position(tmp_path, monkeypatch):
    import io
    import json

    from rich.console import Console

    from mathrl.config import load_config
    from mathrl.train.loop import train

    monkeypatch.setenv("MATHRL_CACHE", str(tmp_path / "cache"))
    cfg = load_config(None, [
        "base.steps=20", "base.hidden_size=32", "base.intermediate_size=64", "base.num_layers=2", "base.num_heads=2",
        "base.num_kv_heads=1", "train.steps=2", "rollout.prompts_per_step=4", "rollout.n=4", "train.mini_batch_size=8",
        "data.eval_size=4", "eval.n=1", "eval.every=2", "rollout.max_new_tokens=16", "train.save_every=0",
        "reward.num_workers=0", "log.rollouts_per_step=0", "data.dynamic_sampling.mode=none",
        "algo.adv.estimator=gae", f"run_dir={tmp_path / 'run'}",
    ])
    train(cfg, console=Console(file=io.StringIO(), width=120))
    rows = [json.loads(line) for line in (tmp_path / "run" / "positions.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert len(r["value"]) == len(r["advantage"]) == len(r["count"]) <= 16
        assert r["count"][0] == 16  # every one of the 4 x 4 responses has a first token
        assert r["count"] == sorted(r["count"], reverse=True)  # responses are right-padded
        assert all(isinstance(v, float) for v in r["value"] + r["advantage"])
    # scripts/findings positions reads them: one table row per step, a cell per bucket
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    from findings.positions import run_positions

    table = run_positions([tmp_path / "run"], fig_path=tmp_path / "pos.png", steps=[1, 2], edges=[0, 4, 16])
    assert [line.split(" | ")[1:2] for line in table.splitlines()[2:]] == [["1"], ["2"]]
    assert "(n=1)" in table and (tmp_path / "pos.png").is_file()
