"""Generate while training (train/generators/host.py, rollout/weight_sync.py).

The same quantity two ways: staleness 0 through a generator process is the synchronous loop (same
metrics, same final weights); with fixed lag k = 1 every consumed sample comes from version step - 2
(steps count from 1; the trainer holds version step - 1), and a run killed with SIGKILL and started
again produces the uninterrupted run's metrics. A generator that dies stops the trainer with one line
naming it. Each run is a process of its own (`python DRIVER ...`), as in tests/train/test_resume.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mathrl.config import ConfigError, load_config
from mathrl.rollout import weight_sync as ws
from mathrl.run_dir import latest_checkpoint
from mathrl.train.generators.host import needed_version, plan_placement
from mathrl.train.step import staleness_metrics

DRIVER = r'''
import json, os, signal, sys
import torch
torch.set_num_threads(1)
from mathrl.train import loop, step
from mathrl.train.generators import host as generator

if __name__ == "__main__":  # spawned generators import this file again: only the run's process runs it

    overrides, mode, kill_step, record = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    real_rl_step = loop.rl_step
    def recording_rl_step(trainer, step_no, collected=None):  # every consumed sample's policy version
        if collected is not None and collected.versions is not None:
            with open(record, "a") as f:
                f.write(json.dumps({"step": step_no, "versions": collected.versions.tolist()}) + "\n")
        return real_rl_step(trainer, step_no, collected)
    loop.rl_step = recording_rl_step
    real_start = generator.start_generator
    def start_and_note(trainer):  # the generators' pids, to check that they do not outlive the trainer
        gen = real_start(trainer)
        if gen is not None:
            with open(record + ".pids", "a") as f:
                f.write(" ".join(str(p.pid) for p in gen.processes) + "\n")
        return gen
    loop.start_generator = start_and_note
    if mode == "kill_in_step":  # the trainer dies in the middle of step K, inside the update
        real_update = step.update_policy
        def update_then_die(*args, step, **kwargs):
            if step == kill_step:
                os.kill(os.getpid(), signal.SIGKILL)
            return real_update(*args, step=step, **kwargs)
        step.update_policy = update_then_die
    elif mode == "kill_generator":  # generator 0 dies (SIGKILL) when the trainer asks for step K's batch
        real_get = generator.Generator.get
        def kill_then_get(self, step_no):
            if step_no == kill_step:
                os.kill(self.processes[0].pid, signal.SIGKILL)
                self.processes[0].join(timeout=30)
            return real_get(self, step_no)
        generator.Generator.get = kill_then_get
    elif mode == "stop_generator":  # generator 0 hangs (SIGSTOP) when the trainer asks for step K's batch
        real_get = generator.Generator.get
        def stop_then_get(self, step_no):
            if step_no == kill_step:
                os.kill(self.processes[0].pid, signal.SIGSTOP)
            return real_get(self, step_no)
        generator.Generator.get = stop_then_get
    elif mode == "empty_step":  # step K's batch keeps no group (as when dynamic sampling drops them all)
        real_rl = loop.rl_step
        def empty_then_step(trainer, step_no, collected=None):
            if step_no == kill_step:
                collected.problems = []
                for k in ("all_wrong", "all_correct", "out_of_band"):
                    collected.metrics.setdefault(f"filter/dropped_{k}", 0.0)
                collected.metrics["filter/kept_groups"] = 0.0
            return real_rl(trainer, step_no, collected)
        loop.rl_step = empty_then_step
    elif mode == "ctrl_c":  # Ctrl-C in a terminal: SIGINT to the whole process group, generators included
        real_rl = loop.rl_step
        def interrupt_then_step(trainer, step_no, collected=None):
            if step_no == kill_step:
                os.killpg(os.getpgid(0), signal.SIGINT)
            return real_rl(trainer, step_no, collected)
        loop.rl_step = interrupt_then_step
    elif mode == "sigterm":  # `timeout` or a scheduler: SIGTERM to the whole process group, generators included
        real_rl = loop.rl_step
        def terminate_then_step(trainer, step_no, collected=None):
            if step_no == kill_step:
                os.killpg(os.getpgid(0), signal.SIGTERM)
            return real_rl(trainer, step_no, collected)
        loop.rl_step = terminate_then_step
    from mathrl.cli import main
    sys.exit(main(["train", *overrides]))
'''

OVERRIDES = [
    "base.steps=200", "base.max_digits=1", "data.arith.max_digits=1", "base.hidden_size=32",
    "base.intermediate_size=64", "base.num_layers=2", "base.num_heads=2", "base.num_kv_heads=1",
    "train.steps=6", "train.save_every=2", "rollout.prompts_per_step=4", "rollout.n=4",
    "train.mini_batch_size=8", "data.eval_size=4", "eval.n=2", "eval.every=3", "reward.num_workers=0",
    "train.dist.timeout_s=120",
]
LAG1 = ("rollout.max_staleness=1",)
ASYNC_KEYS = ("rollout/staleness_mean", "rollout/staleness_max", "rollout/mismatch_kl")


def run(tmp: Path, run_dir: Path, extra=(), mode: str = "plain", kill_step: int = 0) -> subprocess.CompletedProcess:
    driver = tmp / "driver.py"
    driver.write_text(DRIVER)
    env = {**os.environ, "MATHRL_CACHE": str(tmp / "cache")}
    args = [sys.executable, str(driver), json.dumps([*OVERRIDES, *extra, f"run_dir={run_dir}"]), mode, str(kill_step),
            str(run_dir) + ".versions.jsonl"]
    # its own session: a Ctrl-C it sends to its process group reaches it and its generators, not pytest; and
    # SIGINT at its default even when pytest itself runs with it ignored (started in the background by a script)
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=600, start_new_session=True,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def rows(run_dir: Path, drop=()) -> list[dict]:
    out = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not (k.startswith("perf/") and k != "perf/skipped_steps") and k not in drop}
            for r in out]


def consumed_versions(run_dir: Path) -> dict[int, list[int]]:
    path = Path(str(run_dir) + ".versions.jsonl")
    return {r["step"]: r["versions"] for r in map(json.loads, path.read_text().splitlines())}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped) counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


# ---- pure pieces ----------------------------------------------------------------------------------------
def test_buckets_round_trip_and_respect_dtype_and_size():
    tensors = {"a": torch.arange(6.0).view(2, 3), "b": torch.arange(4), "c": torch.full((5,), 2.0),
               "d": torch.ones(3, dtype=torch.float32)}
    specs = ws.tensor_specs(tensors.items())
    buckets = ws.plan_buckets(specs, bucket_bytes=40)
    # a (24 B) | b (int64, other dtype) | c (20 B, would make 44 B with a) | d joins c (32 B <= 40)
    assert [b.members for b in buckets] == [(0,), (1,), (2, 3)]
    assert [b.offsets for b in buckets][2] == (0, 5)
    flats = ws.pack(buckets, list(tensors.values()))
    back = ws.unpack(buckets, specs, flats)
    assert [n for n, _ in back] == list(tensors)
    for (name, t) in back:
        torch.testing.assert_close(t, tensors[name], rtol=0, atol=0)
    tensors["a"].add_(1)  # the packed copy does not follow the original (the optimizer changes it)
    assert float(flats[0].sum()) == 15.0
    # one tensor larger than the bucket size gets a bucket of its own
    assert [b.members for b in ws.plan_buckets(specs, bucket_bytes=8)] == [(0,), (1,), (2,), (3,)]


def test_needed_version_is_the_fixed_lag():
    # steps count from 1 and step t starts from version t-1: lag 0 samples that one, lag k the k-th before
    assert [needed_version(t, 0) for t in (1, 2, 3)] == [0, 1, 2]
    assert [needed_version(t, 1) for t in (1, 2, 3, 4)] == [0, 0, 1, 2]
    assert [needed_version(t, 3) for t in (1, 4, 5, 9)] == [0, 0, 1, 5]


def test_placement_two_cores_one_each_and_gpu_splits():
    cfg = load_config(None, ["rollout.max_staleness=1"])
    p = plan_placement(cfg, cpus=[0, 1], gpus=0, trainer_gpus=[])
    assert (p.trainer_threads, p.trainer_cores, p.worker_threads, p.worker_cores) == (1, [0], 1, [[1]])
    assert p.backend == "gloo" and p.worker_devices == ["cpu"]
    p = plan_placement(cfg, cpus=[0, 1, 2, 3, 4, 5, 6, 7], gpus=0, trainer_gpus=[])
    assert (p.trainer_threads, p.trainer_cores, p.worker_cores) == (4, [0, 1, 2, 3], [[4, 5, 6, 7]])
    p = plan_placement(cfg, cpus=[0], gpus=0, trainer_gpus=[])  # not enough cores to pin: shared, unpinned
    assert (p.trainer_threads, p.trainer_cores, p.worker_cores) == (1, None, [None])
    # one GPU: the generator shares the trainer's, the weights go through gloo (NCCL refuses one device twice)
    p = plan_placement(cfg, cpus=[0, 1], gpus=1, trainer_gpus=[0])
    assert (p.worker_devices, p.backend) == (["cuda:0"], "gloo")
    # 8 GPUs, 4 trainer ranks: the generator takes the first free one, over NCCL
    p = plan_placement(cfg, cpus=[0, 1], gpus=8, trainer_gpus=[0, 1, 2, 3])
    assert (p.worker_devices, p.backend) == (["cuda:4"], "nccl")
    cfg = load_config(None, ["rollout.max_staleness=1", "rollout.generator.workers=2", "data.dynamic_sampling.mode=none",
                             "rollout.generator.devices=[6,7]"])
    p = plan_placement(cfg, cpus=[0, 1], gpus=8, trainer_gpus=[0, 1, 2, 3, 4, 5])
    assert (p.worker_devices, p.backend) == (["cuda:6", "cuda:7"], "nccl")


@pytest.mark.parametrize("overrides, words", [
    (["rollout.max_staleness=-1"], "rollout.max_staleness=-1: must be >= 0"),
    (["rollout.max_staleness=1", "rollout.generator.workers=0"], "rollout.generator.workers=0"),
    (["rollout.async_mode=free"], "rollout.async_mode=free needs rollout.max_staleness >= 1"),
    # the next step's problems depend on this step's refill rounds, generated by another worker
    (["rollout.max_staleness=1", "rollout.generator.workers=2"], "data.dynamic_sampling.mode=nonconstant"),
    # the engine's logprobs are the behaviour policy's, not the trainer's: they cannot be the old logprobs
    (["rollout.max_staleness=1", "train.old_logprobs=reuse_engine"], "train.old_logprobs=reuse_engine with rollout.max_staleness=1"),
    (["rollout.max_staleness=1", "rollout.generator.devices=[1]", "train.device=cpu"], "rollout.generator.devices=[1]"),
])
def test_async_config_errors_name_the_setting(overrides, words):
    with pytest.raises(ConfigError, match=None) as e:
        load_config(None, overrides).validate()
    assert words in str(e.value)


def test_async_turns_auto_old_logprobs_into_a_scoring_pass():
    assert load_config(None, []).engine_logprobs_not_old() is None
    assert load_config(None, ["rollout.max_staleness=2"]).engine_logprobs_not_old()[0] == "rollout.max_staleness=2"


def test_staleness_metrics_by_hand():
    versions = torch.tensor([3, 3, 4])  # step 6: the trainer holds version 5
    behaviour = torch.log(torch.tensor([[0.5, 0.5], [0.25, 1.0], [0.5, 1.0]]))
    trainer = torch.log(torch.tensor([[0.25, 0.5], [0.25, 1.0], [1.0, 1.0]]))
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 0.0]])
    m = staleness_metrics(6, versions, behaviour, trainer, mask)
    assert m["rollout/staleness_mean"] == pytest.approx(5 / 3) and m["rollout/staleness_max"] == 2.0
    # k3 = r - 1 - log r with r = trainer / behaviour: r = 0.5 -> 0.5 - 1 + log 2; r = 2 -> 1 - log 2; r = 1 -> 0
    import math
    expected = ((0.5 - 1 + math.log(2)) + 0 + 0 + (2 - 1 - math.log(2))) / 4
    assert m["rollout/mismatch_kl"] == pytest.approx(expected)


def _receive(port, buckets, specs, out):
    group = ws.join_group("127.0.0.1", port, rank=1, world_size=2, backend="gloo", timeout_s=60)
    out.put({n: t.clone() for n, t in ws.unpack(buckets, specs, ws.receive_buckets(group, buckets, timeout_s=60))})
    ws.barrier(group, 60)


def test_weights_reach_another_process_over_gloo_in_buckets():
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tensors = {"w": torch.randn(7, 3), "b": torch.randn(3), "step": torch.tensor([5])}
    specs = ws.tensor_specs(tensors.items())
    buckets = ws.plan_buckets(specs, bucket_bytes=64)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    p = ctx.Process(target=_receive, args=(port, buckets, specs, out))
    p.start()
    group = ws.join_group("127.0.0.1", port, rank=0, world_size=2, backend="gloo", timeout_s=60)
    for work in ws.broadcast_buckets(group, ws.pack(buckets, list(tensors.values()))):
        work.wait()
    got = out.get(timeout=60)
    ws.barrier(group, 60)
    p.join(timeout=60)
    assert p.exitcode == 0
    for name, t in tensors.items():
        torch.testing.assert_close(got[name], t, rtol=0, atol=0)


# ---- whole runs ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("async")
    out = {}
    for name, extra in (("sync", ()), ("lag1", LAG1)):
        done = run(tmp, tmp / name, extra)
        assert done.returncode == 0, done.stderr[-3000:]
        out[name] = tmp / name
    return tmp, out


@pytest.mark.slow
def test_staleness_zero_in_a_generator_process_is_the_synchronous_loop(runs):
    tmp, done = runs
    result = run(tmp, tmp / "gen0", ("rollout.max_staleness=0", "rollout.generator.workers=1"))
    assert result.returncode == 0, result.stderr[-3000:]
    # the generator sampled every step with the trainer's current weights, received over gloo
    assert all(set(v) == {step - 1} for step, v in consumed_versions(tmp / "gen0").items())
    assert rows(tmp / "gen0", drop=ASYNC_KEYS) == rows(done["sync"])
    from safetensors.torch import load_file

    a, b = load_file(done["sync"] / "final" / "model.safetensors"), load_file(tmp / "gen0" / "final" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_fixed_lag_one_trains_on_the_version_before_the_trainers(runs):
    _, done = runs
    versions = consumed_versions(done["lag1"])
    assert sorted(versions) == list(range(1, 7))
    for step, v in versions.items():
        assert set(v) == {max(0, step - 2)}, step  # one step off-policy from step 2 on
    logged = [r for r in rows(done["lag1"]) if "rollout/staleness_max" in r]
    assert [r["rollout/staleness_max"] for r in logged] == [0.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert all(r["rollout/mismatch_kl"] >= -1e-6 for r in logged)
    assert rows(done["lag1"], drop=ASYNC_KEYS) != rows(done["sync"])  # it did train on older samples


@pytest.mark.slow
@pytest.mark.parametrize("lag, kill_step", [(1, 4), (2, 5)])
def test_fixed_lag_run_killed_mid_step_resumes_step_for_step(runs, lag, kill_step):
    # the last checkpoint, of step s, holds versions s-k .. s-1, which steps s+1 .. s+k sample from
    tmp, done = runs
    extra = (f"rollout.max_staleness={lag}",)
    if lag == 2:  # decoupled PPO across the version gap: the proximal policy and the behaviour weight resume too
        extra += ("algo.off_policy=decoupled", "algo.rollout_correction.lower=0.5")
    if lag == 1:
        expected = rows(done["lag1"])
    else:
        full = run(tmp, tmp / f"lag{lag}", extra)
        assert full.returncode == 0, full.stderr[-3000:]
        expected = rows(tmp / f"lag{lag}")
    run_dir = tmp / f"lag{lag}_killed"
    killed = run(tmp, run_dir, extra, "kill_in_step", kill_step)
    assert killed.returncode == -signal.SIGKILL
    assert (latest_checkpoint(run_dir / "checkpoints") / "generator_versions.safetensors").is_file()
    pids = [int(x) for x in Path(str(run_dir) + ".versions.jsonl.pids").read_text().split()]
    deadline = time.time() + 30
    while any(alive(p) for p in pids) and time.time() < deadline:  # they die with the trainer
        time.sleep(0.2)
    assert not any(alive(p) for p in pids)
    resumed = run(tmp, run_dir, extra)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert rows(run_dir) == expected
    if lag == 2:
        weights = [r["actor/rollout_is_weight"] for r in expected if "actor/pg_loss" in r]
        assert len(weights) == 6 and all(0 < w < 2 for w in weights), weights


@pytest.mark.slow
def test_a_finished_fixed_lag_run_extended_matches_the_longer_run(runs):
    # A finished run's last checkpoint also holds the versions the next k steps sample from, so a longer
    # train.steps extends it step for step (without them, steps 4.. sampled the step-3 weights, with a warning).
    tmp, done = runs
    run_dir = tmp / "lag1_extended"
    assert run(tmp, run_dir, (*LAG1, "train.steps=3")).returncode == 0
    assert (latest_checkpoint(run_dir / "checkpoints") / "generator_versions.safetensors").is_file()
    extended = run(tmp, run_dir, LAG1)  # OVERRIDES' train.steps=6
    assert extended.returncode == 0, extended.stderr[-3000:]
    assert "lacks policy versions" not in extended.stdout
    assert rows(run_dir) == rows(done["lag1"])


@pytest.mark.slow
def test_a_dead_generator_stops_the_trainer_with_one_line_naming_it(runs):
    tmp, _ = runs
    t0 = time.time()
    result = run(tmp, tmp / "dead", LAG1, "kill_generator", 3)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert "rollout generator 0 (pid" in last and "SIGKILL" in last, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert time.time() - t0 < 120 + 60  # within train.dist.timeout_s (120) plus the run's start


def pids_of(run_dir: Path) -> list[int]:
    return [int(x) for x in Path(str(run_dir) + ".versions.jsonl.pids").read_text().split()]


def all_gone(pids: list[int], within_s: float = 30) -> bool:
    deadline = time.time() + within_s
    while any(alive(p) for p in pids) and time.time() < deadline:
        time.sleep(0.2)
    return not any(alive(p) for p in pids)


@pytest.mark.slow
def test_a_hung_generator_stops_the_trainer_within_the_timeout_naming_it(runs):
    # a generator that is alive but sends nothing (stopped): the trainer gives up after train.dist.timeout_s,
    # names it, and the stopped process does not outlive the run
    tmp, _ = runs
    # never a hang: the run's own timeout (600 s) would fail the test; the message shows the timeout path stopped it
    result = run(tmp, tmp / "hung", (*LAG1, "train.dist.timeout_s=15"), "stop_generator", 3)
    assert result.returncode == 1, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert "step 3's batch within train.dist.timeout_s=15s" in last and "rollout generator 0 (pid" in last, last
    assert "Traceback" not in result.stderr
    assert all_gone(pids_of(tmp / "hung"))


@pytest.mark.slow
@pytest.mark.parametrize("mode, code, line", [
    # Ctrl-C: SIGINT to the process group; the step in progress is abandoned, the rerun resumes from step 4
    ("ctrl_c", 130, ("mathrl: interrupted at step 5; rerun ", " to resume from step 4 ")),
    # a scheduler's SIGTERM to the process group: the trainer ends step 5 and saves it, the generators leave it to it
    ("sigterm", 143, ("mathrl: stopped by SIGTERM after step 5; rerun ", " to resume from step 5 ")),
])
def test_a_signal_stops_trainer_and_generators_and_the_rerun_resumes_step_for_step(runs, mode, code, line):
    tmp, done = runs
    run_dir = tmp / mode
    result = run(tmp, run_dir, LAG1, mode, 5)
    assert result.returncode == code, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and "KeyboardInterrupt" not in result.stderr, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(line[0]) and line[1] in last, last
    assert all_gone(pids_of(run_dir))
    resumed = run(tmp, run_dir, LAG1)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert rows(run_dir) == rows(done["lag1"])


@pytest.mark.slow
def test_a_step_that_keeps_no_group_still_sends_its_version(runs):
    # the generators count versions by sends: an empty step sends the unchanged weights as its version, so the
    # later steps sample the versions fixed lag says, and step 4's checkpoint holds version 3
    tmp, _ = runs
    result = run(tmp, tmp / "empty", LAG1, "empty_step", 3)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "step 3: dynamic sampling kept no group" in result.stdout
    versions = consumed_versions(tmp / "empty")
    assert sorted(versions) == list(range(1, 7))
    for step, v in versions.items():
        assert set(v) == {max(0, step - 2)}, step
    assert (tmp / "empty" / "final" / "model.safetensors").is_file()
    assert (tmp / "empty" / "checkpoints" / "step_000004" / "generator_versions.safetensors").is_file()


@pytest.mark.slow
def test_free_mode_never_trains_on_samples_older_than_the_bound(runs):
    # free mode: as fresh as the generator has, never older than k; which version a step gets depends on timing
    tmp, _ = runs
    # and the generator scores with a verifier pool of its own (processes of a process)
    result = run(tmp, tmp / "free", ("rollout.max_staleness=2", "rollout.async_mode=free", "reward.num_workers=1"))
    assert result.returncode == 0, result.stderr[-3000:]
    versions = consumed_versions(tmp / "free")
    assert sorted(versions) == list(range(1, 7))
    for step, v in versions.items():
        assert len(set(v)) == 1, step  # a step's samples, refills included, come from one version
        assert max(0, step - 3) <= v[0] <= step - 1, (step, v)
    logged = [r for r in rows(tmp / "free") if "rollout/staleness_max" in r]
    assert len(logged) == 6 and all(0 <= r["rollout/staleness_max"] <= 2 for r in logged)


@pytest.mark.slow
def test_two_trainer_ranks_with_a_generator_match_one_process(runs):
    # torchrun ranks: rank 0 takes each batch from the generator and hands it to the other rank; all ranks
    # gather the full weights that rank 0 sends. Same samples as one process; the update differs only by
    # the order of FSDP's float reductions
    tmp, done = runs
    env = {**os.environ, "MATHRL_CACHE": str(tmp / "cache"), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "mathrl.train",
           *OVERRIDES, *LAG1, "--run-dir", str(tmp / "lag1_dp2")]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    one, two = rows(done["lag1"]), rows(tmp / "lag1_dp2")
    assert [r["step"] for r in one] == [r["step"] for r in two]
    for a, b in zip(one, two):
        assert a.keys() == b.keys()
        for k in a:
            assert b[k] == pytest.approx(a[k], rel=1e-4, abs=1e-6), (a["step"], k)
