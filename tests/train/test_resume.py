"""Exact resume: a run killed with SIGKILL (in the middle of a step, or while a checkpoint is being
written) and started again with the same command produces the same metrics, step for step, as a run
that was never interrupted. Also: atomic checkpoints, pruning, and the non-finite guard.

Each run is a separate process (`python DRIVER ...`), so the kill is a real SIGKILL of a real run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mathrl.run_dir import complete_checkpoints, latest_checkpoint
from mathrl.train.checkpoint import prune_checkpoints

DRIVER = r'''
import json, os, signal, sys
import torch
torch.set_num_threads(1)
from rich.console import Console
from mathrl.config import load_config
from mathrl.train import checkpoint, loop, step, trainer

overrides, mode, kill_step = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
if os.environ.get("FAST_SCALER"):  # float16: a scale that doubles after every good step, so that it moves
    # (up, and down after an overflow) from update to update and a resume must restore it exactly
    trainer.loss_scaler = lambda cfg, device, *, distributed: torch.amp.GradScaler(
        device.type, init_scale=2.0**20, growth_interval=1)
if mode == "kill_in_step":  # die in the middle of step K, after its rollout, inside the update
    real_update = step.update_policy
    def update_then_die(*args, step, **kwargs):
        if step == kill_step:
            os.kill(os.getpid(), signal.SIGKILL)
        return real_update(*args, step=step, **kwargs)
    step.update_policy = update_then_die
elif mode == "kill_in_save":  # die after checkpoint K's files are written, before the atomic rename
    real_replace = os.replace
    def replace_then_die(src, dst):
        if str(dst).endswith(f"step_{kill_step:06d}"):
            os.kill(os.getpid(), signal.SIGKILL)
        return real_replace(src, dst)
    checkpoint.os.replace = replace_then_die
loop.train(load_config(None, overrides), console=Console(quiet=True))
'''

OVERRIDES = [
    "base.steps=200", "base.max_digits=1", "data.arith.max_digits=1", "base.hidden_size=32",
    "base.intermediate_size=64", "base.num_layers=2", "base.num_heads=2", "base.num_kv_heads=1",
    "train.steps=6", "train.save_every=2", "rollout.prompts_per_step=4", "rollout.n=4",
    "train.mini_batch_size=8", "data.eval_size=4", "eval.n=2", "eval.every=3", "reward.num_workers=0",
    "algo.entropy.mode=adaptive", "algo.entropy.coef=0.001",  # controller state must survive the kill
]


# PPO with a critic: the critic's weights, optimizer and scheduler must come back too.
PPO = ["algo.adv.estimator=gae", "algo.critic.pretrain_steps=1", "algo.critic.lr=1e-3"]


def run(tmp_path: Path, run_dir: Path, mode: str = "plain", kill_step: int = 0, extra: tuple[str, ...] = (),
        env_extra: dict[str, str] | None = None) -> int:
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    env = {**os.environ, "MATHRL_CACHE": str(tmp_path / "cache"), **(env_extra or {})}
    args = [sys.executable, str(driver), json.dumps([*OVERRIDES, *extra, f"run_dir={run_dir}"]), mode, str(kill_step)]
    return subprocess.run(args, env=env, capture_output=True, timeout=600).returncode


def training_rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # wall-clock times differ between runs by nature; everything else must match exactly
    return [{k: v for k, v in r.items() if (not k.startswith("perf/") or k == "perf/skipped_steps") and not k.endswith("tool/seconds")}
            for r in rows]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("resume")
    assert run(tmp, tmp / "uninterrupted") == 0
    return tmp, training_rows(tmp / "uninterrupted")


@pytest.mark.slow
@pytest.mark.parametrize("mode, kill_step", [("kill_in_step", 4), ("kill_in_save", 4)])
def test_killed_and_resumed_run_matches_uninterrupted(reference, mode, kill_step):
    tmp, expected = reference
    run_dir = tmp / mode
    assert run(tmp, run_dir, mode, kill_step) == -signal.SIGKILL
    # the kill left a run behind: metrics up to the kill, and a complete checkpoint at step 2
    assert latest_checkpoint(run_dir / "checkpoints").name == "step_000002"
    if mode == "kill_in_save":  # the half-written step 4 exists only under a temporary name
        assert list((run_dir / "checkpoints").glob("step_000004.tmp-*"))
    assert run(tmp, run_dir) == 0  # the same command again resumes
    assert training_rows(run_dir) == expected
    assert not list((run_dir / "checkpoints").glob("*.tmp-*"))
    # Bug story: the wall time of summary.json (and the final table, and the report) was the last process's
    # alone, with no sign of the resume. It sums the processes, each recorded with the steps it ran.
    summary = json.loads((run_dir / "summary.json").read_text())
    processes = summary["processes"]
    assert [(p["first_step"], p["last_step"]) for p in processes] == [(1, 2), (3, 6)]
    assert summary["wall_seconds"] == pytest.approx(sum(p["wall_seconds"] for p in processes))
    assert all(p["wall_seconds"] > 0 for p in processes)
    assert all(p["machine"] == summary["machine"] for p in processes)  # each process records its CPU (mathrl/machine.py)
    assert summary["machine"]["cpu_type"] and summary["machine"]["threads"] >= 1
    uninterrupted = json.loads((tmp / "uninterrupted" / "summary.json").read_text())["processes"]
    assert [(p["first_step"], p["last_step"]) for p in uninterrupted] == [(1, 6)]


@pytest.mark.slow
def test_killed_ppo_run_with_a_critic_resumes_exactly(reference):
    tmp, _ = reference  # reuses the cached base model
    assert run(tmp, tmp / "ppo_uninterrupted", extra=tuple(PPO)) == 0
    expected = training_rows(tmp / "ppo_uninterrupted")
    assert any("critic/value_loss" in r for r in expected)
    run_dir = tmp / "ppo_killed"
    assert run(tmp, run_dir, "kill_in_step", 4, extra=tuple(PPO)) == -signal.SIGKILL
    assert (latest_checkpoint(run_dir / "checkpoints") / "critic" / "model.safetensors").is_file()
    assert run(tmp, run_dir, extra=tuple(PPO)) == 0
    assert training_rows(run_dir) == expected


@pytest.mark.slow
def test_killed_float16_run_resumes_with_its_loss_scales(reference):
    # model.dtype=float16 with a critic: the policy's and the critic's loss scalers (scale and growth
    # tracker) are in the checkpoint. A resume that restarted them at their initial scale would log other
    # actor/loss_scale values, skip other steps and train other weights.
    tmp, _ = reference  # reuses the cached base model
    extra, fast = ("model.dtype=float16", *PPO), {"FAST_SCALER": "1"}
    assert run(tmp, tmp / "fp16_uninterrupted", extra=extra, env_extra=fast) == 0
    expected = training_rows(tmp / "fp16_uninterrupted")
    scales = [r["actor/loss_scale"] for r in expected if "actor/loss_scale" in r]
    assert len(scales) == 6 and len(set(scales)) > 1 and all("critic/loss_scale" in r for r in expected if "actor/pg_loss" in r)
    run_dir = tmp / "fp16_killed"
    assert run(tmp, run_dir, "kill_in_step", 4, extra=extra, env_extra=fast) == -signal.SIGKILL
    saved = json.loads((latest_checkpoint(run_dir / "checkpoints") / "trainer_state.json").read_text())
    assert set(saved["loss_scalers"]) == {"policy", "critic"}
    assert run(tmp, run_dir, extra=extra, env_extra=fast) == 0
    assert training_rows(run_dir) == expected


@pytest.mark.slow
def test_a_finished_run_extended_and_killed_matches_the_uninterrupted_longer_run(reference):
    # A verl or TRL user raises the step count of a finished run and resumes. A 3-step run extended to 6
    # in the same directory, killed in the middle of step 5 and rerun, logs the metrics of the uninterrupted
    # 6-step run step for step: the optimizer and the schedule go on from step 3's checkpoint. The schedule
    # is train.warmup_steps of linear warm-up, then the constant train.lr: it depends on the optimizer step
    # count only, never on train.steps, so the learning rate of every step is the 6-step run's.
    tmp, expected = reference
    run_dir = tmp / "extended"
    assert run(tmp, run_dir, extra=("train.steps=3",)) == 0  # finished: step 3 evaluated (as eval.every=3 does in both)
    assert run(tmp, run_dir, "kill_in_step", 5) == -signal.SIGKILL  # extended to 6 (OVERRIDES), killed in step 5
    assert latest_checkpoint(run_dir / "checkpoints").name == "step_000004" and not (run_dir / "summary.json").exists()
    assert run(tmp, run_dir) == 0  # the same command resumes the extension
    assert training_rows(run_dir) == expected
    history = [json.loads(line) for line in (run_dir / "config_history.jsonl").read_text().splitlines()]
    assert [(h["step"], h["changes"], h["extended"]) for h in history] == [(4, {"train.steps": [3, 6]}, True)]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 6 and [(p["first_step"], p["last_step"]) for p in summary["processes"]] == [(1, 3), (4, 4), (5, 6)]
    assert json.loads((run_dir / "final" / "trainer_state.json").read_text())["step"] == 6


def test_a_resumed_runs_wall_time_names_each_process():
    from rich.console import Console

    from mathrl.run_dir import processes_note
    from mathrl.track.console import summary_table

    processes = [{"first_step": 1, "last_step": 20, "wall_seconds": 780.0},
                 {"first_step": 21, "last_step": 40, "wall_seconds": 1518.0},
                 {"first_step": 41, "last_step": 50, "wall_seconds": 822.0}]
    assert processes_note(processes) == "resumed 2x: steps 1-20 13.0 min, 21-40 25.3 min, 41-50 13.7 min"
    assert processes_note(processes[:1]) == processes_note(None) == ""  # one process: nothing to say
    console = Console(width=300, record=True)
    console.print(summary_table({}, {}, wall_seconds=3120.0, n=8, processes=processes))
    text = " ".join(console.export_text().split())  # the caption wraps at the table's width
    assert "wall time 52.0 min)" in text
    assert "wall time over 3 processes, resumed 2x: steps 1-20 13.0 min, 21-40 25.3 min, 41-50 13.7 min" in text


def test_partial_checkpoints_are_never_picked(tmp_path):
    ckpts = tmp_path / "checkpoints"
    for step in (2, 4):
        (ckpts / f"step_{step:06d}").mkdir(parents=True)
        (ckpts / f"step_{step:06d}" / "trainer_state.json").write_text("{}")
        torch.save({}, ckpts / f"step_{step:06d}" / "trainer_state.pt")
    (ckpts / "step_000006.tmp-abc").mkdir()  # a write that was cut off
    (ckpts / "step_000008").mkdir()  # a directory without its state files
    assert latest_checkpoint(ckpts).name == "step_000004"
    assert [s for s, _ in complete_checkpoints(ckpts)] == [2, 4]


def test_pruning_keeps_last_n_and_every_m(tmp_path):
    ckpts = tmp_path / "checkpoints"
    for step in range(2, 22, 2):
        d = ckpts / f"step_{step:06d}"
        d.mkdir(parents=True)
        (d / "trainer_state.json").write_text("{}")
        torch.save({}, d / "trainer_state.pt")
    (ckpts / "step_000010" / "model.safetensors").write_bytes(b"weights")
    (ckpts / "step_000010" / "optimizer").mkdir()  # a sharded (DCP) optimizer state
    prune_checkpoints(ckpts, keep_last=2, keep_every=10)
    assert [s for s, _ in complete_checkpoints(ckpts)] == [18, 20]  # the ones a resume may pick
    # step 10 keeps its weights and trainer_state.json for `mathrl eval RUN`, not its optimizer state
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_000010", "step_000018", "step_000020"]
    assert sorted(p.name for p in (ckpts / "step_000010").iterdir()) == ["model.safetensors", "trainer_state.json"]


@pytest.mark.slow
def test_consecutive_non_finite_steps_stop_the_run_with_its_checkpoint_intact(tmp_path, monkeypatch):
    # From step 3 on every advantage is NaN (as a broken reward would make it): steps 3 and 4 are
    # skipped, the run stops with a message naming the last good checkpoint, and that checkpoint
    # (step 2, written before the trouble) is still complete and loadable.
    from rich.console import Console

    from mathrl.algo.estimators import Estimator, grpo
    from mathrl.config import load_config
    from mathrl.registry import ADVANTAGE_ESTIMATORS
    from mathrl.train import loop

    monkeypatch.setenv("MATHRL_CACHE", str(tmp_path / "cache"))
    calls = {"n": 0}

    def nan_from_step_3(x, cfg):
        calls["n"] += 1
        out = grpo(x, cfg)
        if calls["n"] >= 3:
            out.advantages = out.advantages * float("nan")
        return out

    ADVANTAGE_ESTIMATORS.register("grpo_nan_from_step_3", Estimator(nan_from_step_3))
    # every group trains (dynamic sampling off): the skipped-step counts below assume the full batch
    try:
        cfg = load_config(None, [*OVERRIDES, "train.max_skipped_steps=2", "data.dynamic_sampling.mode=none",
                                 "algo.adv.estimator=grpo_nan_from_step_3", f"run_dir={tmp_path / 'run'}"])
        with pytest.raises(loop.NonFiniteError, match="step_000002"):
            loop.train(cfg, console=Console(quiet=True))
    finally:
        ADVANTAGE_ESTIMATORS.remove("grpo_nan_from_step_3")
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    # cumulative skipped optimizer steps: each RL step here makes 2 (16 samples / mini-batch 8)
    assert [r["perf/skipped_steps"] for r in rows if "perf/skipped_steps" in r] == [0.0, 0.0, 2.0, 4.0]
    assert latest_checkpoint(tmp_path / "run" / "checkpoints").name == "step_000002"


@pytest.mark.slow
def test_staged_growth_continues_a_finished_run_in_a_new_directory(reference, tmp_path):
    # 8k -> 16k style: a new run starts from the finished run's last checkpoint with a longer
    # response limit, keeps its optimizer (Adam moments, step count, warm-up done) and controller
    # state, and records its parent.
    tmp, _ = reference
    parent = tmp / "uninterrupted" / "checkpoints" / "step_000006"
    assert (parent / "trainer_state.pt").exists()  # a finished run keeps its last step resumable
    child = tmp_path / "child"
    driver = tmp / "driver.py"
    overrides = [*OVERRIDES, "train.steps=1", "rollout.max_new_tokens=64", f"train.init_from={parent}",
                 f"run_dir={child}"]
    env = {**os.environ, "MATHRL_CACHE": str(tmp / "cache")}
    proc = subprocess.run([sys.executable, str(driver), json.dumps(overrides), "plain", "0"], env=env,
                          capture_output=True, timeout=600)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    record = json.loads((child / "parent.json").read_text())
    assert record["checkpoint"] == str(parent.resolve()) and record["step"] == 6
    parent_state = torch.load(parent / "trainer_state.pt", weights_only=True)["optimizer"]["state"]
    child_state = torch.load(child / "checkpoints" / "step_000001" / "trainer_state.pt", weights_only=True)["optimizer"]["state"]
    # Adam's step count went on from the parent's (6 RL steps x 2 updates + 2 more), not from zero
    assert float(child_state[0]["step"]) == float(parent_state[0]["step"]) + 2
    child_ctl = json.loads((child / "checkpoints" / "step_000001" / "trainer_state.json").read_text())["controllers"]
    assert child_ctl["entropy"]["coef"] != 0.001  # the adaptive coefficient carried on from the parent's value


@pytest.mark.parametrize("where, state, expected", [
    ("runs/x/checkpoints/step_000020", {"step": 20}, "runs/x step 20"),  # a run's checkpoint: the run and its step
    ("runs/x/final", {"step": 40}, "runs/x step 40"),  # a finished run's final/ (train.init_from_mode=restart)
    ("models/m", None, "models/m"),  # a directory of no run, without a recorded step: its path as given
])
def test_an_init_from_run_names_its_parent_run_and_step(tmp_path, where, state, expected):
    # Bug story: a train.init_from run printed "evaluating the base model" and the checkpoint's path alone
    from mathrl.train.trainer import parent_label

    parent = tmp_path / where
    parent.mkdir(parents=True)
    if state is not None:
        (parent / "trainer_state.json").write_text(json.dumps(state))
    assert parent_label(parent) == (str(tmp_path / expected) if "step" in expected else str(parent))


@pytest.mark.slow
def test_restart_takes_the_weights_only_and_makes_them_the_kl_reference(reference, tmp_path):
    # DeepScaleR's later stages: a new model from the previous stage's checkpoint, a fresh optimizer,
    # and the KL reference is that checkpoint (so the first step's policy-to-reference KL is 0)
    tmp, _ = reference
    parent = tmp / "uninterrupted" / "checkpoints" / "step_000006"
    env = {**os.environ, "MATHRL_CACHE": str(tmp / "cache")}
    runs = {}
    for mode in ("restart", "continue"):
        child = tmp_path / mode
        overrides = [*OVERRIDES, "train.steps=1", f"train.init_from={parent}", f"train.init_from_mode={mode}",
                     "algo.kl.use=loss", f"run_dir={child}"]
        proc = subprocess.run([sys.executable, str(tmp / "driver.py"), json.dumps(overrides), "plain", "0"], env=env,
                              capture_output=True, timeout=600)
        assert proc.returncode == 0, proc.stderr.decode()[-2000:]
        runs[mode] = child
    step = {m: next(r for r in map(json.loads, (runs[m] / "metrics.jsonl").read_text().splitlines()) if "actor/ref_kl" in r)
            for m in runs}
    assert step["restart"]["actor/ref_kl"] == 0.0  # the reference is the starting checkpoint itself
    assert step["continue"]["actor/ref_kl"] != 0.0  # the reference stays the original base model (a k1 mean: either sign)
    state = torch.load(runs["restart"] / "checkpoints" / "step_000001" / "trainer_state.pt", weights_only=True)
    assert float(state["optimizer"]["state"][0]["step"]) == 2  # Adam started from zero: this run's 2 updates
    assert json.loads((runs["restart"] / "parent.json").read_text())["step"] == 6


@pytest.mark.slow
def test_grpo_run_continued_with_ppo_gets_a_fresh_critic_and_a_grpo_checkpoint_cannot_resume_as_ppo(reference, tmp_path):
    tmp, _ = reference
    parent = tmp / "uninterrupted" / "checkpoints" / "step_000006"  # a GRPO run: no critic/
    env = {**os.environ, "MATHRL_CACHE": str(tmp / "cache")}

    def drive(overrides):
        return subprocess.run([sys.executable, str(tmp / "driver.py"), json.dumps([*OVERRIDES, *overrides]), "plain", "0"],
                              env=env, capture_output=True, timeout=600)

    child = tmp_path / "ppo_child"
    proc = drive([*PPO, "train.steps=1", f"train.init_from={parent}", f"run_dir={child}"])
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    assert (child / "checkpoints" / "step_000001" / "critic" / "model.safetensors").is_file()
    # resuming a GRPO run in place with PPO switched on is refused with a message saying what to do
    unfinished = tmp_path / "unfinished"
    shutil.copytree(tmp / "uninterrupted", unfinished)
    (unfinished / "summary.json").unlink()  # as if it had been killed after its step-6 checkpoint
    proc = drive([*PPO, f"run_dir={unfinished}", "train.steps=8"])
    assert proc.returncode != 0
    assert "has no critic/" in proc.stderr.decode()


def test_disk_full_while_checkpointing_keeps_the_previous_checkpoint(tmp_path, monkeypatch, make_tiny_qwen2, char_tokenizer):
    # ENOSPC in the middle of writing step 4: the error reaches the caller, the half-written
    # temporary directory is removed, and step 2 is still the latest complete checkpoint.
    import errno

    from mathrl.train import checkpoint

    model = make_tiny_qwen2()
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    args = dict(model=model, tokenizer=char_tokenizer, optimizer=optimizer, scheduler=scheduler, state={})
    checkpoint.save_checkpoint(tmp_path, 2, **args)
    real_save = torch.save

    def disk_full(obj, path, *a, **kw):
        real_save(obj, path, *a, **kw)
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(checkpoint.torch, "save", disk_full)
    with pytest.raises(OSError, match="No space left"):
        checkpoint.save_checkpoint(tmp_path, 4, **args)
    assert latest_checkpoint(tmp_path).name == "step_000002"
    assert [p.name for p in tmp_path.iterdir()] == ["step_000002"]


# --------------------------------------------------------------------------------------------------
# a checkpoint where the training file's pass ends
# --------------------------------------------------------------------------------------------------
def _problems_file(path: Path, count: int) -> Path:
    """`count` one-digit additions in the tiny base model's own format, as a jsonl training file."""
    rows = [{"problem": f"{a}+{(3 * a + 1) % 10}", "answer": str(a + (3 * a + 1) % 10)} for a in range(count)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_stream_state_taken_where_a_pass_ends_resumes_into_the_next_pass(tmp_path, char_tokenizer):
    # Two batches of 3 use up a file of 6: the state is taken with the pass's order empty. Loaded into
    # a new stream, the next draws must be the second pass (every problem once, in the second pass's
    # order), the draws of the stream that went on, not a skipped or repeated pass.
    from mathrl.config import load_config
    from mathrl.tasks.sources import ProblemStream

    cfg = load_config(None, [f"data.train={_problems_file(tmp_path / 'six.jsonl', 6)}"])
    stream = ProblemStream(cfg, char_tokenizer)
    first = [p.id for _ in range(2) for p in stream.next_batch(3)[0]]
    state = json.loads(json.dumps(stream.state_dict()))  # as trainer_state.json stores it
    assert state["order"] == [] and state["epoch"] == 1
    resumed = ProblemStream(cfg, char_tokenizer)
    resumed.load_state_dict(state)
    went_on = [p.id for _ in range(2) for p in stream.next_batch(3)[0]]
    second = [p.id for _ in range(2) for p in resumed.next_batch(3)[0]]
    assert second == went_on
    assert sorted(second) == sorted(first) and second != first  # a whole new pass, shuffled anew
    assert resumed.state_dict() == stream.state_dict()


@pytest.mark.slow
def test_run_resumed_from_the_checkpoint_where_a_pass_ends_trains_on_the_next_pass(reference):
    # 8 problems, 4 per step, no refills: each pass over the file ends on an even step, exactly where a
    # checkpoint is written (train.save_every=2). Killed in step 3 and resumed from step 2's checkpoint,
    # the run must draw the second pass (steps 3-4), as the uninterrupted run does, and match it.
    tmp, _ = reference  # reuses the cached base model and the driver
    data = _problems_file(tmp / "eight.jsonl", 8)
    extra = (f"data.train={data}", "data.dynamic_sampling.mode=none", "log.rollouts_per_step=16")

    def steps_problems(run_dir: Path) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {}
        for row in map(json.loads, (run_dir / "rollouts.jsonl").read_text().splitlines()):
            out.setdefault(row["step"], []).append(row["problem_id"])
        return {step: ids[::4] for step, ids in out.items()}  # n = 4 samples per problem

    assert run(tmp, tmp / "passes", extra=extra) == 0
    expected = steps_problems(tmp / "passes")
    for first in (1, 3, 5):  # each pair of steps is one whole pass over the file
        assert len(set(expected[first] + expected[first + 1])) == 8
    run_dir = tmp / "passes_killed"
    assert run(tmp, run_dir, "kill_in_step", 3, extra=extra) == -signal.SIGKILL
    assert latest_checkpoint(run_dir / "checkpoints").name == "step_000002"
    state = json.loads((run_dir / "checkpoints" / "step_000002" / "trainer_state.json").read_text())["data"]
    assert state["order"] == [] and state["epoch"] == 1  # taken exactly where the first pass ends
    assert run(tmp, run_dir, extra=extra) == 0
    assert steps_problems(run_dir) == expected
    assert training_rows(run_dir) == training_rows(tmp / "passes")


# Tool episodes: the calls run in a pool, but the samples do not depend on how long a call took
# (the torch engine waits for a decode step's calls together), so a killed run resumes exactly too.
TOOLS = ["base.tool_share=0.5", "rollout.tools=[{name: python, fn: calculator}]", "rollout.max_new_tokens=40",
         "rollout.observation_max_tokens=30"]


@pytest.mark.slow
def test_killed_run_with_tools_resumes_exactly(tmp_path):
    assert run(tmp_path, tmp_path / "tools_uninterrupted", extra=tuple(TOOLS)) == 0
    expected = training_rows(tmp_path / "tools_uninterrupted")
    assert sum(r.get("tool/calls_mean", 0.0) for r in expected) > 0  # the tool base model calls its tool
    run_dir = tmp_path / "tools_killed"
    assert run(tmp_path, run_dir, "kill_in_step", 4, extra=tuple(TOOLS)) == -signal.SIGKILL
    assert run(tmp_path, run_dir, extra=tuple(TOOLS)) == 0
    assert training_rows(run_dir) == expected
