"""Where the memory plan's bytes sit (plan/memory.py): the plan record (`MemoryPlan`), the generator
processes placed on their GPUs (rollout.placement) with their engines, the kept policy versions and the
weight staging bucket, and every device's peak (`DeviceLoad`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mathrl.config import Config
from mathrl.plan.arch import BYTES, GIB, Architecture
from mathrl.plan.engine import GeneratorUse, generator_engine
from mathrl.rollout.placement import generator_gpus, weight_backend

__all__ = ["DeviceLoad", "MemoryPlan"]


@dataclass(frozen=True)
class DeviceLoad:
    """What one device holds at its peak: named parts in bytes, against `capacity` bytes (None: not checked)."""

    name: str  # "GPU <i>" or "host"
    parts: tuple[tuple[str, int], ...]
    capacity: int | None

    @property
    def total(self) -> int:
        return sum(b for _, b in self.parts)

    @property
    def over(self) -> int:
        """Bytes beyond the capacity (<= 0: it fits; 0 when unchecked)."""
        return 0 if self.capacity is None else self.total - self.capacity

    @property
    def fits(self) -> bool:
        return self.over <= 0

    def describe(self, name: str | None = None) -> str:
        """`GPU 0: trainer 61.20 GiB + generator 0 vLLM 40.00 GiB = 101.20 GiB > 80 GiB (over by 21.20 GiB)`."""
        text = " + ".join(f"{who} {b / GIB:.2f} GiB" for who, b in self.parts)
        if len(self.parts) > 1:
            text += f" = {self.total / GIB:.2f} GiB"
        text = f"{name or self.name}: {text}"
        if self.capacity is None:
            return text + " (not checked: give --host-mem)"
        if self.fits:
            return text + f" of {self.capacity / GIB:g} GiB ({100 * self.total / self.capacity:.0f}%)"
        return text + f" > {self.capacity / GIB:g} GiB (over by {self.over / GIB:.2f} GiB)"


@dataclass
class MemoryPlan:
    """The trainer's bytes per GPU of each component (`components`; host memory on a CPU run) and its phase
    peaks; with generator processes also their engines, the kept policy versions and the staging bucket;
    `loads` is every device's peak, and the plan fits when every device does."""

    gpus: int  # the machine's GPUs; 0: a CPU run
    gpu_mem_gib: float
    components: dict[str, int]  # name -> bytes per trainer GPU
    notes: dict[str, str]  # name -> how it was computed (the generator-side names included)
    generation_peak: int  # the trainer's while its own engine samples the rollouts (0: generator processes do)
    update_peak: int
    activations_other_setting: int  # the activations with the other gradient_checkpointing setting
    checkpointing: bool
    arch: Architecture
    warnings: list[str] = field(default_factory=list)
    evaluation_peak: int = 0  # with generator processes: the trainer's while its own engine evaluates
    trainer_gpus: list[int] = field(default_factory=list)  # the trainer's ranks' GPUs (empty on a CPU run)
    generators: list[GeneratorUse] = field(default_factory=list)
    backend: str = ""  # the weight group's backend (with generator processes)
    host: dict[str, int] = field(default_factory=dict)  # name -> bytes of host memory (the kept versions)
    staging: int = 0  # bytes of the weight staging bucket on the trainer's first GPU (NCCL only)
    loads: list[DeviceLoad] = field(default_factory=list)  # every device's peak

    @property
    def total(self) -> int:
        """The trainer's peak per GPU (the larger phase)."""
        return max(self.generation_peak, self.update_peak, self.evaluation_peak)

    @property
    def capacity(self) -> int:
        return int(self.gpu_mem_gib * GIB)

    @property
    def fits(self) -> bool:
        return all(load.fits for load in self.loads)


def add_generators(plan: MemoryPlan, cfg: Config, *, pb: int) -> None:
    """Fill in `plan`'s generators, weight backend, kept versions (host) and staging bucket (NCCL)."""
    from mathrl.model.dtypes import trainer_dtype  # here: the plan itself imports no torch
    workers, a = cfg.generator_workers, plan.arch
    if not workers:
        return
    if plan.gpus:
        chosen: list[int | None] = list(generator_gpus(list(cfg.rollout.generator.devices), workers=workers,
                                                       gpus=plan.gpus, trainer_gpus=plan.trainer_gpus))
        plan.backend = weight_backend(chosen, plan.trainer_gpus)
    else:
        chosen, plan.backend = [None] * workers, "gloo"
    plan.generators = [generator_engine(cfg, a, i, g, gpu_mem_gib=plan.gpu_mem_gib, pb=BYTES[cfg.model.dtype]) for i, g in enumerate(chosen)]
    # the trainer's rank 0 keeps the last k + 1 versions, as its state dict holds them (a tied head is a
    # second tensor there), in pinned host memory
    k = cfg.rollout.max_staleness
    elements = a.params + (a.vocab * a.hidden if a.tied else 0)
    plan.host["kept policy versions"] = (k + 1) * elements * pb
    plan.notes["kept policy versions"] = (f"{k + 1} versions (rollout.max_staleness + 1) x {elements:,} x {pb} B "
                                          f"({trainer_dtype(cfg.model.dtype)}), pinned, on the trainer's rank 0")
    if plan.backend == "nccl":  # one reusable GPU bucket; a tensor larger than a bucket travels alone
        largest = max(a.vocab, a.intermediate) * a.hidden * pb
        plan.staging = min(max(int(cfg.rollout.generator.bucket_mb * 2**20), largest), elements * pb)
        plan.notes["weight staging bucket"] = (f"rollout.generator.bucket_mb={cfg.rollout.generator.bucket_mb:g} MiB, "
                                               f"or the largest tensor ({largest / GIB:.2f} GiB) when larger")


def device_loads(plan: MemoryPlan, *, host_mem_gib: float | None) -> list[DeviceLoad]:
    """Each device's peak: every trainer GPU holds the trainer's peak (its first also the staging bucket),
    a generator's GPU its engine; host memory the kept versions, and everything of a CPU run."""
    trainer = ("trainer", plan.total)
    gpus: dict[int, list[tuple[str, int]]] = {g: [trainer] for g in plan.trainer_gpus}
    if plan.staging:
        gpus[plan.trainer_gpus[0]].append(("weight staging bucket", plan.staging))
    host = [] if plan.gpus else [trainer]
    for use in plan.generators:
        (host if use.gpu is None else gpus.setdefault(use.gpu, [])).append((use.label, use.bytes))
    host += list(plan.host.items())
    loads = [DeviceLoad(f"GPU {g}", tuple(parts), plan.capacity) for g, parts in sorted(gpus.items())]
    if host:
        loads.append(DeviceLoad("host", tuple(host), None if host_mem_gib is None else int(host_mem_gib * GIB)))
    return loads
