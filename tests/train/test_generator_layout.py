"""Where generator processes run and how weights reach them, as far as a CPU can show it
(train/generators/host.py, rollout/placement.py, rollout/weight_sync.py): each child's GPU through
CUDA_VISIBLE_DEVICES, sends through one staging bucket, every wait bounded by the timeout."""

from __future__ import annotations

import os
import socket
import time
from datetime import timedelta

import pytest
import torch

from mathrl.config import load_config
from mathrl.rollout import weight_sync as ws
from mathrl.rollout.placement import child_cuda_env, generator_gpus, weight_backend
from mathrl.train.generators.host import plan_placement, spawn_with_env


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- each child's GPU ------------------------------------------------------------------------------------
@pytest.mark.parametrize("trainer_gpus, gpus, devices, visible, expected", [
    # one GPU shared with the trainer: the child sees GPU 0 as its cuda:0
    ([0], 1, [], None, [("0", "cuda:0")]),
    # 8 GPUs, 4 trainer ranks, 2 generators: GPUs 4 and 5, each alone in its child
    ([0, 1, 2, 3], 8, [], None, [("4", "cuda:0"), ("5", "cuda:0")]),
    # the trainer itself sees a subset: the child gets the machine's name of the trainer's device 2 and 3
    ([0, 1], 4, [], "4,5,6,7", [("6", "cuda:0"), ("7", "cuda:0")]),
    # devices named by the user, fewer than the workers: they take them in turn
    ([0], 8, [6], "0,1,2,3,4,5,6,7", [("6", "cuda:0"), ("6", "cuda:0")]),
    # UUIDs in CUDA_VISIBLE_DEVICES pass through as they are
    ([0], 2, [], "GPU-aaa,GPU-bbb", [("GPU-bbb", "cuda:0")]),
])
def test_each_child_sees_only_its_own_gpu_as_cuda_0(trainer_gpus, gpus, devices, visible, expected):
    workers = len(expected)
    cfg = load_config(None, ["rollout.max_staleness=1", f"rollout.generator.workers={workers}",
                             "data.dynamic_sampling.mode=none", f"rollout.generator.devices={devices}"])
    placement = plan_placement(cfg, cpus=[0, 1], gpus=gpus, trainer_gpus=trainer_gpus)
    assert [child_cuda_env(d, visible) for d in placement.worker_devices] == expected


def test_a_cpu_child_sees_no_gpu_and_a_device_outside_the_visible_ones_is_an_error():
    assert child_cuda_env("cpu", "0,1") == ("", "cpu")
    with pytest.raises(ValueError, match="cuda:2 is not among the 2 GPU"):
        child_cuda_env("cuda:2", "0,1")


def test_weight_backend_is_nccl_only_when_every_generator_has_a_gpu_of_its_own():
    assert weight_backend(generator_gpus([], workers=2, gpus=8, trainer_gpus=[0, 1]), [0, 1]) == "nccl"
    assert weight_backend(generator_gpus([], workers=1, gpus=1, trainer_gpus=[0]), [0]) == "gloo"  # one GPU: shared
    assert weight_backend(generator_gpus([5], workers=2, gpus=8, trainer_gpus=[0]), [0]) == "gloo"  # two on GPU 5


def _report_env(out) -> None:
    out.put(os.environ.get("CUDA_VISIBLE_DEVICES"))


@pytest.mark.slow
def test_spawned_children_get_their_own_environment_and_the_parent_keeps_its(monkeypatch):
    import torch.multiprocessing as mp

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    seen = []
    for trainer_index in ("cuda:2", "cuda:3"):
        visible, device = child_cuda_env(trainer_index, os.environ["CUDA_VISIBLE_DEVICES"])
        p = ctx.Process(target=_report_env, args=(out,))
        spawn_with_env(p, {"CUDA_VISIBLE_DEVICES": visible})
        seen.append((out.get(timeout=60), device))
        p.join(timeout=60)
        assert p.exitcode == 0
    assert seen == [("6", "cuda:0"), ("7", "cuda:0")]
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"


# ---- sends through one staging bucket ----------------------------------------------------------------
def _receive_versions(port, buckets, specs, versions, out, go):
    group = ws.join_group("127.0.0.1", port, rank=1, world_size=2, backend="gloo", timeout_s=60)
    go.wait(60)  # a generator busy with its step until the test lets it receive: the sender must not wait for it
    for _ in range(versions):
        out.put({n: t.clone() for n, t in ws.unpack(buckets, specs, ws.receive_buckets(group, buckets, timeout_s=60))})
    ws.barrier(group, 60)


def test_staged_sends_deliver_every_version_exactly_without_blocking_the_sender():
    import torch.multiprocessing as mp

    torch.manual_seed(0)
    versions = [{"w": torch.randn(7, 3), "b": torch.randn(3), "h": torch.randn(2, 2, dtype=torch.float64),
                 "step": torch.tensor([v])} for v in range(3)]
    specs = ws.tensor_specs(versions[0].items())
    buckets = ws.plan_buckets(specs, bucket_bytes=64)  # several buckets of three dtypes through one buffer
    assert len(buckets) >= 3
    port = _port()
    ctx = mp.get_context("spawn")
    out, go = ctx.Queue(), ctx.Event()
    p = ctx.Process(target=_receive_versions, args=(port, buckets, specs, len(versions), out, go))
    p.start()
    group = ws.join_group("127.0.0.1", port, rank=0, world_size=2, backend="gloo", timeout_s=60)
    sender = ws.StagedSender(group, buckets, staging_device=torch.device("cpu"), timeout_s=60)
    assert sender.nbytes == max(b.nbytes for b in buckets)
    host = [ws.pack(buckets, list(v.values())) for v in versions]
    works = [sender.send(flats) for flats in host]
    # every send returned while the receiver has not received anything: none of them can have completed
    assert not any(w.future.done() for w in works)
    go.set()
    for w in works:
        w.wait(timedelta(seconds=60))
    got = [out.get(timeout=60) for _ in versions]
    ws.barrier(group, 60)
    p.join(timeout=60)
    sender.close()
    assert p.exitcode == 0
    for sent, received in zip(versions, got):
        for name, t in sent.items():
            assert torch.equal(received[name], t), name


def _join_then_hang(port, out):
    ws.join_group("127.0.0.1", port, rank=1, world_size=2, backend="gloo", timeout_s=60)
    out.put("joined")
    time.sleep(60)  # alive, never receives


def test_a_send_to_a_generator_that_never_receives_fails_within_the_timeout():
    import torch.multiprocessing as mp

    specs = ws.tensor_specs([("w", torch.zeros(4))])
    buckets = ws.plan_buckets(specs, bucket_bytes=1024)
    port = _port()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    p = ctx.Process(target=_join_then_hang, args=(port, out), daemon=True)
    p.start()
    group = ws.join_group("127.0.0.1", port, rank=0, world_size=2, backend="gloo", timeout_s=60)
    assert out.get(timeout=60) == "joined"
    sender = ws.StagedSender(group, buckets, staging_device=torch.device("cpu"), timeout_s=2)
    work = sender.send(ws.pack(buckets, [torch.ones(4)]))
    try:
        with pytest.raises(Exception):
            work.wait(timedelta(seconds=30))  # the sender's own 2 s bound fails first
    finally:
        sender.close()
        p.kill()
        p.join(timeout=10)


class _Work:
    def __init__(self):
        self.timeouts = []

    def wait(self, timeout=None):
        self.timeouts.append(timeout)
        return True


def test_every_wait_passes_the_timeout():
    # NCCL's Work.wait() with no timeout returns at once without the collective having finished (it only
    # orders the CUDA stream), so a dead peer would never be noticed: every wait passes the timeout
    works = [_Work(), _Work()]
    ws.wait_all(works, 7.5)
    assert [w.timeouts for w in works] == [[timedelta(seconds=7.5)]] * 2


# ---- the trainer's evaluation-only engine --------------------------------------------------------------
class _FakeEngine:
    seed_block = 3

    def __init__(self, log):
        self.log = log
        log.append("build")

    def generate(self, prompts, **kw):
        self.log.append(("generate", len(prompts)))
        return "batch"

    def update_weights(self, named):
        self.log.append(("weights", [n for n, _ in named]))

    def sleep(self):
        self.log.append("sleep")

    def wake_up(self):
        self.log.append("wake")

    def close(self):
        self.log.append("close")


@pytest.mark.parametrize("release, after", [("close", ["close"]), ("sleep", ["sleep"]), ("keep", [])])
def test_on_demand_engine_exists_only_while_used_and_always_samples_the_current_weights(release, after):
    from mathrl.rollout.on_demand import OnDemandEngine

    log, version = [], [0]
    engine = OnDemandEngine(lambda: _FakeEngine(log), weights=lambda: [(f"v{version[0]}", None)], release=release)
    version[0] = 1
    engine.update_weights(iter([]))  # the trainer's sync after a step: nothing built, nothing consumed
    assert log == []
    assert engine.generate([[1], [2]], max_new_tokens=4, seed=0) == "batch"
    assert log == ["build", ("weights", ["v1"]), ("generate", 2)]  # built, then the current weights, then samples
    log.clear()
    assert engine.generate([[1]], max_new_tokens=4, seed=0) == "batch"
    assert log == [("generate", 1)]  # nothing moved: no reload
    log.clear()
    engine.sleep()  # a training step begins
    assert log == after
    version[0] = 2
    engine.update_weights(iter([]))
    log.clear()
    engine.generate([[1]], max_new_tokens=4, seed=0)
    rebuilt = ["build"] if release == "close" else []
    assert log == [*rebuilt, ("weights", ["v2"]), ("generate", 1)]
    assert engine.builds == (2 if release == "close" else 1)
    engine.close()
    assert engine.engine is None


def test_a_trainer_whose_generators_use_vllm_builds_no_vllm_of_its_own(tmp_path, make_tiny_qwen2, char_tokenizer):
    # the generators hold vLLM's share of the GPU; the trainer's engine is built at its first evaluation only
    pytest.importorskip("vllm", reason="vLLM is not installed", exc_type=ImportError)
    from rich.console import Console

    from mathrl.rollout.on_demand import OnDemandEngine
    from mathrl.train.dist import Ranks
    from mathrl.train.trainer import build_trainer

    model_dir = tmp_path / "model"
    make_tiny_qwen2(seed=0).save_pretrained(model_dir)
    char_tokenizer.save_pretrained(model_dir)
    cfg = load_config(None, [f"model.path={model_dir}", "rollout.engine=vllm", "rollout.max_staleness=1",
                             "data.dynamic_sampling.mode=none", "reward.num_workers=0", "data.eval_size=4",
                             f"run_dir={tmp_path / 'run'}"])
    trainer = build_trainer(cfg, Ranks(), console=Console(quiet=True))
    try:
        assert isinstance(trainer.engine, OnDemandEngine) and trainer.engine.engine is None
        assert trainer.engine.release == "keep"  # on a CPU; on a GPU "close" (or "sleep" with vLLM's sleep mode)
    finally:
        trainer.engine.close()
        trainer.tracker.close()


def test_a_layout_that_cannot_fit_stops_before_any_generator_starts(monkeypatch):
    # one 80 GiB GPU shared by the 7B trainer, its evaluation engine and a vLLM generator, each vLLM holding 0.8
    # of it: a config error naming GPU 0
    from types import SimpleNamespace

    from mathrl.config import ConfigError
    from mathrl.train.generators.host import check_layout

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(total_memory=80 * 2**30))
    cfg = load_config("recipes/real/dapo_qwen2.5_math_7b.yaml", ["rollout.max_staleness=1"], check_paths=False)
    with pytest.raises(ConfigError, match=r"GPU 0: vLLM shares .* = 1.6 > 1"):
        check_layout(cfg, trainer_gpus=[0], gpus=1)
    check_layout(cfg, trainer_gpus=[], gpus=0)  # a CPU run: nothing to check
    check_layout(cfg, trainer_gpus=[0, 1, 2, 3, 4, 5, 6], gpus=8)  # a GPU of its own: fits
