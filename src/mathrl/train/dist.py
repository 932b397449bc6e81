"""Ranks and sharding for data-parallel training on PyTorch's own stack (torch.distributed, FSDP2).

    torchrun --nproc_per_node 2 -m mathrl.train train.steps=20      # or: mathrl train --nproc 2 ...

One process (no torchrun, WORLD_SIZE unset or 1) uses none of this: `init_distributed` returns rank 0 of
1 and every helper below is the identity. Under torchrun every rank joins one process group (gloo on
CPU, NCCL on CUDA) with a collective timeout (train.dist.timeout_s): a rank that dies or stops answering
makes the others fail with an error naming the timeout instead of waiting for ever, and torchrun then
stops the job. `shard_model` applies FSDP2's `fully_shard` to every decoder layer and then to the root
module, with bf16 parameters and fp32 gradient reduction on CUDA (train.dist.mixed_precision) and optional
CPU offload (train.dist.cpu_offload); master weights and optimizer state stay fp32 and sharded. Which rows
each rank takes (and with which seeds) is shards.py's rule. `close_distributed` (a barrier, then
`destroy_process_group`) ends a rank's teardown; `exit_rank` then ends a torchrun rank's process without
the interpreter's shutdown (why: docs/architecture.md, "The run's teardown").
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NoReturn

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Ranks:
    """This process's place in the job."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    joined: bool = False  # part of a torchrun job (a process group), even one of a single rank

    @property
    def main(self) -> bool:
        """Rank 0: the only rank that writes the run directory, logs, prints and evaluates."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """Sharded training: under torchrun (any world size, so that 1 and N ranks run the same code)."""
        return self.joined


class DistributedError(RuntimeError):
    """The job's ranks could not be set up or went out of step."""


def decide_device(setting: str, *, local_rank: int, cuda_available: bool) -> torch.device:
    """The one device this process trains, scores and (with the torch engine) samples on.

    setting is train.device: "cpu"; "cuda" (an error without a GPU); "auto" = this rank's GPU
    (LOCAL_RANK) when CUDA is available, else the CPU. The same rule holds for one process without
    torchrun and for every torchrun rank, so a GPU machine never trains on its CPU by accident.
    """
    if setting == "cuda" and not cuda_available:
        raise DistributedError("train.device=cuda but torch sees no CUDA device (torch.cuda.is_available() is False); "
                               "use train.device=auto or cpu")
    if setting == "cpu" or not cuda_available:
        return torch.device("cpu")
    return torch.device("cuda", local_rank)


def process_group_backend(device: torch.device) -> str:
    """The process group's backend for `device`: gloo on CPU; on CUDA both, "cpu:gloo,cuda:nccl", so
    that collectives over CPU tensors (FSDP2's CPU-offloaded DTensors in clip_grad_norm_ and
    full_tensor, small Python objects) go through gloo and GPU tensors through NCCL."""
    return "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"


def init_distributed(*, timeout_s: float, device: str = "auto") -> Ranks:
    """Join the torchrun job described by the environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
    MASTER_PORT), or return the single-process Ranks when there is none (no torchrun, or WORLD_SIZE=1
    outside torchrun). `device` is train.device (`decide_device`): one process on a GPU machine trains
    on its GPU too."""
    if not joined_job():
        chosen = decide_device(device, local_rank=0, cuda_available=torch.cuda.is_available())
        if chosen.type == "cuda":
            torch.cuda.set_device(chosen)
        return Ranks(device=chosen)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    for key in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        if key not in os.environ:
            raise DistributedError(f"WORLD_SIZE={world_size} but {key} is not set; start the job with torchrun "
                                   "(torchrun --nproc_per_node N -m mathrl.train ...) or mathrl train --nproc N")
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    chosen = decide_device(device, local_rank=local_rank, cuda_available=torch.cuda.is_available())
    if chosen.type == "cuda":
        torch.cuda.set_device(chosen)
    if not dist.is_initialized():
        dist.init_process_group(process_group_backend(chosen), timeout=timedelta(seconds=timeout_s),
                                device_id=chosen if chosen.type == "cuda" else None)
    return Ranks(rank=rank, world_size=world_size, local_rank=local_rank, device=chosen, joined=True)


def close_distributed() -> None:
    """Leave the job's process group once every rank has finished the run: all ranks meet at a barrier,
    then the group is destroyed (the last step of the teardown in the module docstring)."""
    if dist.is_initialized():
        barrier()
        dist.destroy_process_group()


def joined_job() -> bool:
    """Whether this process is a rank started by torchrun (the test `init_distributed` uses)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 or "TORCHELASTIC_RUN_ID" in os.environ


def exit_rank(code: int) -> NoReturn:
    """End a torchrun rank's process with `code` once its teardown is done: the standard streams are
    flushed, then the process exits without Python's interpreter shutdown, where gloo's worker threads
    can abort the process (module docstring)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or its reader has gone
            pass
    os._exit(code)


def active() -> bool:
    """Whether collectives have other ranks to talk to."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def collective_failure(e: BaseException) -> bool:
    """Whether `e` is a collective that failed or timed out (a rank died or hangs), as raised by
    torch.distributed's backends."""
    if isinstance(e, getattr(dist, "DistError", ())):
        return True
    text = str(e).lower()
    return isinstance(e, RuntimeError) and any(
        w in text for w in ("gloo", "nccl", "timed out", "connection closed", "connection reset", "broken pipe"))


# ---- collectives on Python objects and small numbers (identity in one process) ------------------------
def all_gather_objects(obj: Any) -> list[Any]:
    """[obj of rank 0, obj of rank 1, ...] on every rank; [obj] in one process."""
    if not active():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any, *, src: int = 0) -> Any:
    """Rank `src`'s obj on every rank."""
    if not active():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def _reduce_device() -> torch.device:
    """Where the small reductions below run: on the GPU when the group has only NCCL, else on the CPU
    (gloo, or the gloo half of a "cpu:gloo,cuda:nccl" group)."""
    if dist.get_backend() == "nccl":  # NCCL reduces CUDA tensors only
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_sums(values: dict[str, float]) -> dict[str, float]:
    """Each value summed over ranks (every rank passes the same keys, in the same order)."""
    if not active() or not values:
        return dict(values)
    t = torch.tensor(list(values.values()), dtype=torch.float64, device=_reduce_device())
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return dict(zip(values, t.tolist()))


def all_reduce_max(value: int) -> int:
    if not active():
        return value
    t = torch.tensor([value], dtype=torch.int64, device=_reduce_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def all_reduce_sum_tensor(t: torch.Tensor) -> torch.Tensor:
    """`t` summed over ranks (a new tensor on t's device); `t` itself in one process."""
    if not active():
        return t
    work = t.to(_reduce_device(), copy=True)
    dist.all_reduce(work, op=dist.ReduceOp.SUM)
    return work.to(t.device)


def barrier() -> None:
    if active():
        dist.barrier()


# ---- FSDP2 -----------------------------------------------------------------------------------------------
def decoder_layers(model) -> list[torch.nn.Module]:
    """The transformer blocks of a Hugging Face causal LM or token-classification model (Qwen2, Llama,
    Mistral, ...: `<backbone>.layers`), also inside a peft PeftModel (LoRA)."""
    from mathrl.model.lora import unwrap

    model = unwrap(model)
    backbone = getattr(model, "model", None) or getattr(model, "transformer", None)
    layers = getattr(backbone, "layers", None) or getattr(backbone, "h", None)
    if layers is None:
        raise DistributedError(f"cannot find the decoder layers of {type(model).__name__} (looked for "
                               "model.layers and transformer.h); FSDP sharding needs them")
    return list(layers)


def shard_model(model, ranks: Ranks, *, mixed_precision: bool, cpu_offload: bool, float16: bool = False):
    """`fully_shard` each decoder layer, then the root; returns the (same, now sharded) model.

    On CUDA with mixed_precision the forward/backward run in bf16 while the sharded master weights,
    gradients' reduction and the optimizer stay fp32. On CPU (gloo) the model runs in its own dtype.
    `float16` (model.dtype=float16): fp16 parameters in forward/backward, fp32 reduction, on any device
    (gloo included), the loss scaled by train/update.py's loss scaler.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    model.to(ranks.device)
    # the mesh names the device explicitly: fully_shard's default mesh is the GPU whenever CUDA exists,
    # which would move a train.device=cpu run onto it
    kwargs: dict[str, Any] = {"mesh": init_device_mesh(ranks.device.type, (ranks.world_size,))}
    if float16:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.float16, reduce_dtype=torch.float32)
    elif mixed_precision and ranks.device.type == "cuda":
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    # offloading moves shards between CPU and GPU memory; on CPU (gloo) everything already lives there
    kwargs["offload_policy"] = CPUOffloadPolicy() if cpu_offload and ranks.device.type == "cuda" else OffloadPolicy()
    for layer in decoder_layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model


def is_sharded(model) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def full_weights(model) -> list[tuple[str, torch.Tensor]]:
    """The policy's full weights (Hugging Face names): gathered on rank 0 when sharded (a collective:
    every rank calls it; the others get []), the model's own tensors in one process."""
    if is_sharded(model):
        return list(full_state_dict(model).items())
    return list(model.state_dict().items())


def full_state_dict(model) -> dict[str, torch.Tensor]:
    """The model's whole (unsharded) state dict on CPU, Hugging Face names, on rank 0 only (other ranks
    get {}); a collective when the model is sharded. An engine on every rank (vLLM under torchrun) loads
    `model.lora.stream_plain_weights` instead, which gathers one tensor at a time."""
    if not is_sharded(model):
        return {k: v.detach().cpu() for k, v in model.state_dict().items()}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def total_norm(grad_norm: torch.Tensor) -> torch.Tensor:
    """`clip_grad_norm_`'s result as a plain tensor (with sharded parameters it is a DTensor)."""
    return grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
