"""Policy weights from the trainer to generator processes over a torch.distributed group, in buckets,
never through disk.

    specs = tensor_specs(model.state_dict().items())              # names, shapes, dtypes: known to both sides
    buckets = plan_buckets(specs, bucket_bytes=256 * 2**20)
    group = join_group(host, port, rank=0, world_size=1 + workers, backend="gloo", timeout_s=1800)
    works = broadcast_buckets(group, pack(buckets, tensors))          # trainer (rank 0): async works
    flats = receive_buckets(group, buckets, device)                   # each generator (rank >= 1)
    engine.update_weights(unpack(buckets, specs, flats))

The group is its own `ProcessGroupGloo` / `ProcessGroupNCCL` over a `TCPStore`, not the default
process group: a trainer launched by torchrun keeps its default group for its own ranks, and a
one-process trainer keeps `torch.distributed` uninitialised, so every collective helper of
train/dist.py still sees only the trainer's ranks. A bucket holds tensors of one dtype flattened end to
end (a tensor larger than the bucket size gets a bucket of its own): one collective per bucket instead
of one per tensor.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from mathrl.rollout.base import full_tensor


@dataclass(frozen=True)
class TensorSpec:
    name: str  # Hugging Face parameter name
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class Bucket:
    """Tensors `members` (indices into the specs) flattened end to end into one [numel] tensor of `dtype`."""

    dtype: torch.dtype
    members: tuple[int, ...]
    offsets: tuple[int, ...]  # start of each member in the flat tensor
    numel: int

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=self.dtype).element_size()


def tensor_specs(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> list[TensorSpec]:
    return [TensorSpec(name, tuple(t.shape), t.dtype) for name, t in named_tensors]


def plan_buckets(specs: list[TensorSpec], *, bucket_bytes: int) -> list[Bucket]:
    """Cut the specs, in order, into buckets of one dtype and at most `bucket_bytes` (a tensor larger than
    that alone in its bucket). The same specs give the same plan on every process."""
    buckets: list[Bucket] = []
    current: list[int] = []

    def close() -> None:
        if current:
            offsets, total = [], 0
            for i in current:
                offsets.append(total)
                total += specs[i].numel
            buckets.append(Bucket(specs[current[0]].dtype, tuple(current), tuple(offsets), total))
            current.clear()

    size = 0
    for i, spec in enumerate(specs):
        nbytes = spec.numel * torch.empty((), dtype=spec.dtype).element_size()
        if current and (spec.dtype != specs[current[0]].dtype or size + nbytes > bucket_bytes):
            close()
            size = 0
        current.append(i)
        size += nbytes
    close()
    return buckets


def pack(buckets: list[Bucket], tensors: list[torch.Tensor], *, device: torch.device | str = "cpu") -> list[torch.Tensor]:
    """One new flat tensor per bucket holding copies of `tensors` (in specs order; DTensors are gathered):
    the copies stay valid while the optimizer changes the originals."""
    flats = []
    for b in buckets:
        flat = torch.empty(b.numel, dtype=b.dtype, device=device)
        for i, offset in zip(b.members, b.offsets):
            t = full_tensor(tensors[i]).detach()
            flat[offset: offset + t.numel()].copy_(t.reshape(-1))
        flats.append(flat)
    return flats


def unpack(buckets: list[Bucket], specs: list[TensorSpec], flats: list[torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs, views into the flat bucket tensors, in specs order."""
    out: list[tuple[int, str, torch.Tensor]] = []
    for b, flat in zip(buckets, flats):
        for i, offset in zip(b.members, b.offsets):
            s = specs[i]
            out.append((i, s.name, flat[offset: offset + s.numel].view(s.shape)))
    return [(name, t) for _, name, t in sorted(out, key=lambda x: x[0])]


@dataclass
class WeightGroup:
    """The trainer (rank 0) and the generators (ranks 1..W) of one run."""

    group: object  # a ProcessGroupGloo or ProcessGroupNCCL
    store: object  # its TCPStore (hosted by rank 0), kept alive as long as the group
    rank: int
    world_size: int


def join_group(host: str, port: int, *, rank: int, world_size: int, backend: str, timeout_s: float) -> WeightGroup:
    """A process group of its own (not the default one) over a TCPStore that rank 0 hosts at host:port.
    Every collective on it fails after timeout_s when a member died or stopped answering."""
    timeout = timedelta(seconds=timeout_s)
    store = dist.TCPStore(host, port, world_size, is_master=rank == 0, timeout=timeout)
    prefixed = dist.PrefixStore("mathrl-weights", store)
    if backend == "nccl":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        group = dist.ProcessGroupNCCL(prefixed, rank, world_size, opts)
    else:
        group = dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)
    return WeightGroup(group, store, rank, world_size)


def broadcast_buckets(wg: WeightGroup, flats: list[torch.Tensor]) -> list:
    """Rank 0 sends every bucket; returns the collectives' works (wait on them before reusing `flats`)."""
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    return [wg.group.broadcast([flat], opts) for flat in flats]


def receive_buckets(wg: WeightGroup, buckets: list[Bucket], *, device: torch.device | str = "cpu") -> list[torch.Tensor]:
    """A generator's side of `broadcast_buckets`: the flat buckets, received."""
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    flats = [torch.empty(b.numel, dtype=b.dtype, device=device) for b in buckets]
    for work in [wg.group.broadcast([flat], opts) for flat in flats]:
        work.wait()
    return flats


def barrier(wg: WeightGroup) -> None:
    """Every member meets here (the first step of a generator's teardown, as in train/dist.py)."""
    wg.group.barrier().wait()
