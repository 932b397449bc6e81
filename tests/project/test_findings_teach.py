"""scripts/findings teach: each arm's compute, counted by hand on hand-written run directories.

The student's final/ holds 100 parameters and the teacher's 300, so every FLOP count below is a sum
written out from the module's rule: an RL token costs 10 N (sample, score, train), a teacher's pass 2 N
of the teacher (the starting model's own N for self-distillation), an SFT token 6 N after the teacher's
2 N_teacher per sampled trace token.

Run: python -m pytest tests/project/test_findings_teach.py -q
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import save_file

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

from findings.teach import parameters, read_arm, run_teach  # noqa: E402

PASS1 = "eval/arith_heldout/pass@1"


def make_run(path: Path, *, params: int, train: dict[int, dict], pass1: dict[int, float], config: dict) -> Path:
    """A finished run: final/ with `params` parameters, metrics.jsonl, config.yaml, summary.json."""
    (path / "final").mkdir(parents=True)
    save_file({"w": torch.zeros(params)}, str(path / "final" / "model.safetensors"))
    rows = [{"step": s, **train[s]} for s in sorted(train)]
    rows += [{"step": s, PASS1: v, "eval/arith_heldout/pass@8": 1.0} for s, v in sorted(pass1.items())]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    (path / "summary.json").write_text(json.dumps({"machine": {"cpu_type": "AMD EPYC"}}))
    return path


def tokens(*per_step: int) -> dict[int, dict]:
    return {i + 1: {"rollout/generated_tokens": float(t), "actor/entropy": 0.5} for i, t in enumerate(per_step)}


@pytest.fixture
def runs(tmp_path):
    teacher = make_run(tmp_path / "teacher", params=300, train=tokens(10, 10), pass1={0: 0.5, 2: 0.8}, config={})
    distill = {"algo": {"distill": {"mode": "reverse_kl"}}, "teacher": {"path": str(teacher / "final")}}
    traces = tmp_path / "traces.jsonl"
    traces.write_text("")
    (tmp_path / "traces.summary.json").write_text(json.dumps({"sampled_tokens": 50}))
    return {
        "teacher": teacher,
        "grpo": make_run(tmp_path / "grpo", params=100, train=tokens(5, 7), pass1={0: 0.5, 2: 0.7},
                         config={"algo": {"distill": {"mode": "none"}}}),
        "opd": make_run(tmp_path / "opd", params=100, train=tokens(5, 7), pass1={0: 0.5, 1: 0.7, 2: 0.8}, config=distill),
        "self": make_run(tmp_path / "self", params=100, train=tokens(5, 7), pass1={0: 0.5, 2: 0.6},
                         config={"algo": {"distill": {"mode": "reverse_kl"}}, "teacher": {"self": True}}),
        "sft": make_run(tmp_path / "sft", params=100, train={1: {"sft/response_tokens": 20.0}, 2: {"sft/response_tokens": 20.0}},
                        pass1={0: 0.5, 2: 0.9}, config={"data": {"train": str(traces)}}),
    }


def test_parameters_are_counted_from_the_safetensors_file(runs):
    assert parameters(runs["teacher"] / "final") == 300
    assert parameters(runs["grpo"] / "final") == 100


def test_each_arm_costs_what_its_passes_cost(runs):
    grpo = read_arm(runs["grpo"], teacher_params=300)
    assert grpo.kind == "rl" and grpo.flops == {0: 0.0, 1: 5_000.0, 2: 12_000.0}  # 10 x 100 per token
    assert grpo.tokens == {0: 0.0, 1: 5.0, 2: 12.0}
    opd = read_arm(runs["opd"], teacher_params=300)
    assert opd.flops == {0: 0.0, 1: 8_000.0, 2: 19_200.0}  # + 2 x 300 per token: the teacher's pass
    own = read_arm(runs["self"], teacher_params=300)
    assert own.flops == {0: 0.0, 1: 6_000.0, 2: 14_400.0}  # + 2 x 100: the teacher is the starting model
    sft = read_arm(runs["sft"], teacher_params=300)
    assert sft.kind == "sft" and sft.flops == {0: 30_000.0, 1: 42_000.0, 2: 54_000.0}  # traces 2 x 300 x 50, then 6 x 100 x 20
    assert set(sft.tokens.values()) == {0.0}  # the student sampled nothing


def test_the_table_reads_threshold_steps_and_flops_to_it(runs, tmp_path):
    names = ["grpo", "opd", "self", "sft"]
    text = run_teach([runs[n] for n in names], teacher=runs["teacher"], fig_path=tmp_path / "t.png",
                     labels=names, versus="grpo")
    assert "Threshold: 0.95 x 0.800 = 0.760" in text and "AMD EPYC" in text
    assert "its own RL 6.00e+04 FLOPs" in text  # 10 x 300 x 20 tokens
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in text.splitlines() if line.startswith("| ")}
    assert rows["opd"][4:7] == ["2 (1/1)", "1.20e+01 (1/1)", "1.92e+04 (1/1)"]  # first reached at step 2
    assert rows["grpo"][4] == "— (0/1)" and rows["self"][4] == "— (0/1)"
    assert rows["sft"][4:7] == ["2 SFT (1/1)", "0 (the teacher's)", "5.40e+04 (1/1)"]
    assert (tmp_path / "t.png").is_file() and (tmp_path / "t.md").read_text() == text


def test_traces_without_a_token_count_and_unknown_arms_are_one_line_errors(runs, tmp_path):
    (tmp_path / "traces.summary.json").write_text(json.dumps({"kept": 3}))
    with pytest.raises(ValueError, match="no sampled_tokens"):
        read_arm(runs["sft"], teacher_params=300)
    with pytest.raises(ValueError, match="none of the arms"):
        run_teach([runs["grpo"]], teacher=runs["teacher"], fig_path=tmp_path / "t.png", versus="nope")
