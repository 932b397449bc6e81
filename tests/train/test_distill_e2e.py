"""On-policy distillation end to end on CPU (every test here runs `mathrl train` on tiny models: slow):

- 2 training steps with each mode (reverse_kl, reverse_kl + task reward, forward_kl_topk, jsd) from a teacher
  directory, and self-distillation (the frozen start, and the current policy), every metric finite, the
  distillation metrics logged every step, the weights moved;
- a run with a teacher killed in a step and run again resumes exactly (the teacher is frozen: it holds no state);
- 1 process against 2 ranks (torchrun, gloo) for reverse_kl: the same samples and the same losses.

The teacher is a tiny base model pretrained twice as long as the student's, with the same character tokenizer.
Run: python -m pytest tests/train/test_distill_e2e.py -q
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from run_helpers import assert_same_steps, launch_train, metrics

BASE = ["base.max_digits=1", "base.hidden_size=32", "base.intermediate_size=64", "base.num_layers=2",
        "base.num_heads=2", "base.num_kv_heads=1"]
OVERRIDES = [
    *BASE, "base.steps=200", "data.arith.max_digits=1", "train.steps=2", "train.save_every=1", "train.keep_last=10",
    "rollout.prompts_per_step=4", "rollout.n=4", "rollout.batch_size=8", "train.mini_batch_size=8",
    "data.eval_size=4", "eval.n=2", "eval.every=2", "reward.num_workers=0", "log.rollouts_per_step=4",
    "data.dynamic_sampling.mode=none",
]
HANG_GUARD_S = 600  # a hang fails the test instead of blocking; never a performance threshold

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    return {**os.environ, "MATHRL_CACHE": str(cache), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


@pytest.fixture(scope="module")
def teacher(env) -> str:
    """A tiny base model pretrained for 400 steps (the student's: 200), built into the test's cache."""
    from mathrl.config import load_config
    from mathrl.model.tiny import ensure_base_model
    from mathrl.tasks.arithmetic import base_pretraining_text

    cfg = load_config(None, [*BASE, "base.steps=400"])
    return str(ensure_base_model(cfg.base, pretraining_text=base_pretraining_text(cfg.base),
                                 cache_root=Path(env["MATHRL_CACHE"])))


def mathrl_train(env, run_dir: Path, *extra: str, nproc: int = 1, wait: bool = True):
    return launch_train(env, run_dir, OVERRIDES, *extra, nproc=nproc, wait=wait, timeout=HANG_GUARD_S)


def starting_weights(env) -> dict[str, torch.Tensor]:
    from mathrl.config import load_config
    from mathrl.model.tiny import base_model_dir

    cfg = load_config(None, OVERRIDES)
    return load_file(str(base_model_dir(cfg.base, Path(env["MATHRL_CACHE"])) / "model.safetensors"))


DISTILL_METRICS = ("distill/reverse_kl_k1", "distill/reverse_kl_k3", "distill/teacher_logprob",
                   "distill/teacher_argmax_frac")


@pytest.mark.parametrize("extra, term", [
    (("algo.distill.mode=reverse_kl",), "distill_reverse_kl"),
    (("algo.distill.mode=reverse_kl", "algo.distill.reward_weight=1.0", "algo.distill.student=current"),
     "distill_reverse_kl"),
    (("algo.distill.mode=forward_kl_topk", "algo.distill.topk=8"), "distill_forward_kl_topk"),
    (("algo.distill.mode=jsd", "algo.distill.beta=0.5", "algo.distill.topk=200"), "distill_jsd"),
    (("algo.distill.mode=reverse_kl", "teacher.self=true"), "distill_reverse_kl"),
    (("algo.distill.mode=jsd", "teacher.self=true", "teacher.self_update=true"), "distill_jsd"),
], ids=["reverse_kl", "reverse_kl_reward", "forward_kl_topk", "jsd_full_vocab", "self", "self_update"])
def test_two_steps_with_each_mode(env, teacher, tmp_path, extra, term):
    teacher_arg = () if "teacher.self=true" in extra else (f"teacher.path={teacher}",)
    run = tmp_path / "run"
    mathrl_train(env, run, *extra, *teacher_arg)
    rows = metrics(run)
    for step in (1, 2):
        row = rows[step]
        for key in (*DISTILL_METRICS, f"actor/{term}"):
            assert key in row and isinstance(row[key], float) and row[key] == row[key], (step, key)
        assert all(isinstance(v, (int, float)) and abs(v) != float("inf") and v == v for v in row.values()), step
        assert 0.0 <= row["distill/teacher_argmax_frac"] <= 1.0
        assert row["distill/reverse_kl_k3"] >= 0.0
        if "algo.distill.reward_weight=1.0" not in extra:
            assert row["actor/pg_loss"] == 0.0  # reward_weight 0: the task's advantage is 0, distillation alone
    glossary = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    assert [k for k in rows[1] if "distill" in k and f"`{k}`" not in glossary] == []  # each defined in the glossary
    final = load_file(str(run / "final" / "model.safetensors"))
    start = starting_weights(env)
    assert any(not torch.equal(final[k], start[k]) for k in start)  # the student moved
    if "teacher.self=true" in extra:  # the answer went to the teacher's prompt only: the student's never holds it
        records = [json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()]
        assert records and all(":" not in r["prompt"] and r["prompt"].endswith("=") for r in records)


def training_rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("perf/") or k == "perf/skipped_steps"} for r in rows]


DRIVER = r'''
import json, os, signal, sys
import torch
torch.set_num_threads(1)
from rich.console import Console
from mathrl.config import load_config
from mathrl.train import loop, step

overrides, kill_step = json.loads(sys.argv[1]), int(sys.argv[2])
real_update = step.update_policy
def update_then_die(*args, step, **kwargs):  # die in the middle of step K, after its rollout and teacher pass
    if step == kill_step:
        os.kill(os.getpid(), signal.SIGKILL)
    return real_update(*args, step=step, **kwargs)
step.update_policy = update_then_die
loop.train(load_config(None, overrides), console=Console(quiet=True))
'''


def test_a_run_with_a_teacher_resumes_exactly(env, teacher, tmp_path):
    extra = ["algo.distill.mode=forward_kl_topk", "algo.distill.topk=8", f"teacher.path={teacher}", "train.steps=4",
             "train.save_every=2"]
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)

    def run(run_dir: Path, kill_step: int) -> int:
        args = [sys.executable, str(driver), json.dumps([*OVERRIDES, *extra, f"run_dir={run_dir}"]), str(kill_step)]
        return subprocess.run(args, env=env, capture_output=True, timeout=HANG_GUARD_S).returncode

    assert run(tmp_path / "straight", 0) == 0
    assert run(tmp_path / "killed", 3) == -signal.SIGKILL
    assert run(tmp_path / "killed", 0) == 0  # the same command again resumes from step 2's checkpoint
    expected = training_rows(tmp_path / "straight")
    assert any("actor/distill_forward_kl_topk" in r for r in expected)
    assert training_rows(tmp_path / "killed") == expected


def test_reverse_kl_two_ranks_match_one_process(env, teacher, tmp_path):
    extra = ("algo.distill.mode=reverse_kl", "algo.distill.reward_weight=0.5", f"teacher.path={teacher}")
    one, two = tmp_path / "one", tmp_path / "two"
    mathrl_train(env, one, *extra)
    mathrl_train(env, two, *extra, nproc=2)
    a, b = metrics(one), metrics(two)
    assert_same_steps(a, b, steps=[1, 2])
    for step in (1, 2):
        for key in (*DISTILL_METRICS, "actor/distill_reverse_kl", "actor/pg_loss"):
            assert b[step][key] == pytest.approx(a[step][key], rel=1e-5, abs=1e-6), (step, key)
    first = [json.loads(line) for line in (one / "rollouts.jsonl").read_text().splitlines()]
    second = [json.loads(line) for line in (two / "rollouts.jsonl").read_text().splitlines()]
    assert [r["token_ids"] for r in first if r["step"] == 1] == [r["token_ids"] for r in second if r["step"] == 1]
