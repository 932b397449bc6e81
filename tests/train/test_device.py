"""One device decision for the whole run (train.device), and the process group's backend for it.

The decision is a pure function of the setting, the local rank and whether CUDA exists, so every case
a GPU machine meets is checked here on a CPU: one process without torchrun, a torchrun rank, a
process group that vLLM created for itself, with and without CUDA.
"""

from __future__ import annotations

import pytest
import torch

from mathrl.model.scoring import input_device
from mathrl.train.dist import DistributedError, decide_device, init_distributed, process_group_backend


@pytest.mark.parametrize(
    "setting, local_rank, cuda, expected",
    [
        ("auto", 0, True, torch.device("cuda", 0)),  # one process on a GPU machine trains on its GPU, not its CPU
        ("auto", 3, True, torch.device("cuda", 3)),  # a torchrun rank takes the GPU of its LOCAL_RANK
        ("auto", 0, False, torch.device("cpu")),  # no CUDA: the CPU, silently
        ("cpu", 2, True, torch.device("cpu")),  # asked for the CPU on a GPU machine: the CPU
        ("cuda", 1, True, torch.device("cuda", 1)),
    ],
)
def test_decide_device(setting, local_rank, cuda, expected):
    assert decide_device(setting, local_rank=local_rank, cuda_available=cuda) == expected


def test_cuda_without_a_gpu_is_a_clear_error():
    with pytest.raises(DistributedError, match="train.device=cuda but torch sees no CUDA device"):
        decide_device("cuda", local_rank=0, cuda_available=False)


def test_backend_is_mixed_on_cuda_so_cpu_tensors_have_gloo():
    # FSDP2's CPU-offloaded DTensors reduce over the group in clip_grad_norm_ and full_tensor: NCCL alone
    # cannot take CPU tensors, so a CUDA job's group has a gloo half for them
    assert process_group_backend(torch.device("cuda", 0)) == "cpu:gloo,cuda:nccl"
    assert process_group_backend(torch.device("cpu")) == "gloo"


def test_one_process_gets_the_decided_device(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    ranks = init_distributed(timeout_s=10, device="cpu")
    assert (ranks.device, ranks.distributed, ranks.world_size) == (torch.device("cpu"), False, 1)
    if not torch.cuda.is_available():
        assert init_distributed(timeout_s=10, device="auto").device == torch.device("cpu")


def test_inputs_follow_the_model_not_a_process_group(monkeypatch):
    # vLLM on a GPU creates a 1-rank NCCL group of its own; the inputs of an unsharded model must still go
    # where its parameters are (the old rule sent them to CUDA whenever the group's backend was NCCL)
    import torch.distributed as dist

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    assert input_device(torch.nn.Linear(2, 2)) == torch.device("cpu")


def _offload_worker(rank: int, world_size: int, init_file: str, out_file: str) -> None:
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from mathrl.model.io import full_tensor
    from mathrl.train.dist import close_distributed, exit_rank, total_norm

    # the CPU half of a CUDA job's mixed group, named the way init_distributed names it there
    dist.init_process_group("cpu:gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 3))
        reference = [p.detach().clone() for p in model.parameters()]
        for layer in model:
            fully_shard(layer)
        fully_shard(model)
        x = torch.randn(5, 4, generator=torch.Generator().manual_seed(rank))
        model(x).pow(2).sum().backward()
        # what crashed on NCCL alone with CPU-offloaded shards: a norm over DTensors, then gathering them
        norm = total_norm(torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9))
        gathered = [full_tensor(p.detach()) for p in model.parameters()]
        if rank == 0:
            torch.save({"norm": norm, "gathered": gathered, "reference": reference}, out_file)
    except BaseException:
        dist.destroy_process_group()
        raise
    # a finished rank ends as mathrl's ranks do: a barrier, the group destroyed, then no interpreter
    # shutdown, during which gloo's worker threads can abort the process (train/dist.py)
    close_distributed()
    exit_rank(0)


@pytest.mark.slow
def test_cpu_half_reduces_sharded_cpu_tensors(tmp_path):
    import torch.multiprocessing as mp

    out = tmp_path / "out.pt"
    mp.spawn(_offload_worker, args=(2, str(tmp_path / "store"), str(out)), nprocs=2, join=True)
    got = torch.load(out)
    for a, b in zip(got["gathered"], got["reference"]):
        torch.testing.assert_close(a, b)  # full_tensor rebuilt every unsharded parameter
    # the norm over shards equals one process's norm of the rank-averaged gradient (FSDP averages)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 3))
    loss = sum(model(torch.randn(5, 4, generator=torch.Generator().manual_seed(r))).pow(2).sum() for r in range(2)) / 2
    loss.backward()
    expected = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
    torch.testing.assert_close(got["norm"], expected)
