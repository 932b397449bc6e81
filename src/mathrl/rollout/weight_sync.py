"""Policy weights from the trainer to generator processes over a torch.distributed group, in buckets,
never through disk.

    specs = tensor_specs(model.state_dict().items())              # names, shapes, dtypes: known to both sides
    buckets = plan_buckets(specs, bucket_bytes=256 * 2**20)
    group = join_group(host, port, rank=0, world_size=1 + workers, backend="gloo", timeout_s=1800)
    works = broadcast_buckets(group, pack(buckets, tensors))          # trainer (rank 0): async works
    flats = receive_buckets(group, buckets, timeout_s=1800)           # each generator (rank >= 1): host memory
    engine.update_weights(unpack(buckets, specs, flats))

The group is its own `ProcessGroupGloo` / `ProcessGroupNCCL` over a `TCPStore`, not the default process
group, so train/dist.py's collective helpers still see only the trainer's ranks. A bucket holds tensors of
one dtype flattened end to end: one collective per bucket. With NCCL each side passes buckets through one
staging buffer on its GPU (`StagedSender`, `receive_buckets(staging=...)`); one GPU shared by the trainer
and a generator uses gloo through host memory. Why, and the memory: docs/async.md, "How it runs" (Weights).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from mathrl.model.io import full_tensor


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
    the copies stay valid while the optimizer changes the originals. On the CPU of a machine with CUDA
    they are pinned (page-locked), so that a copy to a GPU staging bucket runs at full speed."""
    flats = []
    pin = torch.device(device).type == "cpu" and torch.cuda.is_available()
    for b in buckets:
        flat = torch.empty(b.numel, dtype=b.dtype, device=device, pin_memory=pin)
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


def join_group(host: str, port: int, *, rank: int, world_size: int, backend: str, timeout_s: float,
               device: torch.device | str | None = None) -> WeightGroup:
    """A process group of its own (not the default one) over a TCPStore that rank 0 hosts at host:port.
    Every collective on it fails after timeout_s when a member died or stopped answering. NCCL (on
    `device`, this process's GPU): its communicator is set up here, not lazily at the first weight send,
    and that setup is bounded by timeout_s too (a nonblocking communicator, waited on with the timeout)."""
    timeout = timedelta(seconds=timeout_s)
    store = dist.TCPStore(host, port, world_size, is_master=rank == 0, timeout=timeout)
    prefixed = dist.PrefixStore("mathrl-weights", store)
    if backend != "nccl":
        return WeightGroup(dist.ProcessGroupGloo(prefixed, rank, world_size, timeout), store, rank, world_size)
    opts = dist.ProcessGroupNCCL.Options()
    opts._timeout = timeout
    with contextlib.suppress(AttributeError):  # NCCL >= 2.14: init returns at once, torch polls it up to the timeout
        opts.config.blocking = 0
    wg = WeightGroup(dist.ProcessGroupNCCL(prefixed, rank, world_size, opts), store, rank, world_size)
    opts_b = dist.BroadcastOptions()
    opts_b.rootRank = 0
    wait_all([wg.group.broadcast([torch.zeros(1, device=device)], opts_b)], timeout_s)  # the communicator, now
    return wg


def broadcast_buckets(wg: WeightGroup, flats: list[torch.Tensor]) -> list:
    """Rank 0 sends every bucket; returns the collectives' works (wait on them before reusing `flats`)."""
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    return [wg.group.broadcast([flat], opts) for flat in flats]


def wait_all(works: list, timeout_s: float) -> None:
    """Wait for every work, each at most timeout_s. With a timeout NCCL's `Work.wait` blocks the calling
    thread until the collective finished or raises (without one it only orders the current CUDA stream
    after it, and returns at once); gloo's raises after the timeout too."""
    for w in works:
        w.wait(timedelta(seconds=timeout_s))


class StagedSender:
    """Rank 0's sends through one reusable bucket on `staging_device` (a GPU, for NCCL): the versions stay
    in host memory, and a background thread copies each bucket into the staging buffer, broadcasts it,
    and waits for it (at most `timeout_s`) before the next. `send` returns at once; the one work it
    returns raises, on `wait`, what went wrong in the thread.

        sender = StagedSender(wg, buckets, staging_device=torch.device("cuda:0"), timeout_s=1800)
        work = sender.send(pack(buckets, tensors))     # host flats, kept unchanged until work.wait() returns
        work.wait(timedelta(seconds=1800))
    """

    def __init__(self, wg: WeightGroup, buckets: list[Bucket], *, staging_device: torch.device, timeout_s: float):
        from concurrent.futures import ThreadPoolExecutor

        self.wg, self.timeout_s, self.device = wg, timeout_s, torch.device(staging_device)
        self.staging = staging_buffer(buckets, self.device)  # one buffer for every dtype: viewed per bucket
        self.nbytes = self.staging.numel()
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mathrl-weight-send",
                                       initializer=self._bind_device)

    def _bind_device(self) -> None:
        if self.device.type == "cuda":  # a new thread's current device is cuda:0, not the trainer's
            torch.cuda.set_device(self.device)

    def send(self, flats: list[torch.Tensor]) -> _Future:
        return _Future(self.pool.submit(self._send, flats))

    def _send(self, flats: list[torch.Tensor]) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        for flat in flats:
            view = self.staging[: flat.numel() * flat.element_size()].view(flat.dtype)
            view.copy_(flat, non_blocking=True)
            wait_all([self.wg.group.broadcast([view], opts)], self.timeout_s)  # the staging buffer is reused next

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


@dataclass
class _Future:
    """A StagedSender send, waited on like a torch.distributed work."""

    future: object

    def wait(self, timeout: timedelta | None = None) -> bool:
        self.future.result(timeout=timeout.total_seconds() if timeout else None)
        return True


def staging_buffer(buckets: list[Bucket], device: torch.device | str) -> torch.Tensor:
    """One byte buffer on `device` that holds any of the buckets (viewed with its dtype)."""
    return torch.empty(max((b.nbytes for b in buckets), default=0), dtype=torch.uint8, device=device)


def receive_buckets(wg: WeightGroup, buckets: list[Bucket], *, timeout_s: float,
                    staging: torch.Tensor | None = None) -> list[torch.Tensor]:
    """A generator's side of `broadcast_buckets` (and of a StagedSender): the flat buckets in host memory,
    each received within timeout_s. With `staging` (a `staging_buffer` on this process's GPU, for NCCL)
    each bucket arrives there and is copied to host memory before the next."""
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    pin = staging is not None and staging.is_cuda
    flats = [torch.empty(b.numel, dtype=b.dtype, pin_memory=pin) for b in buckets]
    if staging is None:
        wait_all([wg.group.broadcast([flat], opts) for flat in flats], timeout_s)
        return flats
    for flat in flats:
        view = staging[: flat.numel() * flat.element_size()].view(flat.dtype)
        wait_all([wg.group.broadcast([view], opts)], timeout_s)
        flat.copy_(view)  # synchronous: the staging buffer is reused by the next bucket
    return flats


def barrier(wg: WeightGroup, timeout_s: float) -> None:
    """Every member meets here (the first step of a generator's teardown, as in train/dist.py)."""
    wait_all([wg.group.barrier()], timeout_s)
