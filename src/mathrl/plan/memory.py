"""Will this recipe fit? A per-device memory estimate from the config alone, before anything launches.

    mathrl plan recipes/deepscaler_1.5b_8k.yaml --gpus 8 --gpu-mem 80
    mathrl plan recipes/real/dapo_qwen2.5_math_7b.yaml rollout.max_staleness=1 --gpus 8 --trainer-gpus 7

The architecture is built on the meta device (no memory, no weights, no download). This module adds up
per phase (generation, update) what arch.py, trainer.py, engine.py and layout.py compute: parameters,
gradients, AdamW states, gathered layers, activations, reference model, critic, engines, generator
processes, the distillation teacher, per device; format.py writes the plan, setup_time.py its last line (the setup time).
It allocates no device memory and loads no weights. What each term assumes, and how it is checked:
docs/performance.md, "What the estimate assumes, term by term".
"""

from __future__ import annotations

from mathrl.config import Config
from mathrl.plan.arch import BYTES, Architecture, architecture_of
from mathrl.plan.engine import engine_owns_weights, trainer_engine
from mathrl.plan.layout import MemoryPlan, add_generators, device_loads
from mathrl.plan.trainer import teacher_states, trainer_states

__all__ = ["estimate_memory", "generator_layout_error"]


def estimate_memory(
    cfg: Config, *, gpus: int, gpu_mem_gib: float, arch: Architecture | None = None, mixed_precision: bool = True,
    trainer_gpus: list[int] | None = None, host_mem_gib: float | None = None, teacher_arch: Architecture | None = None,
) -> MemoryPlan:
    """The memory of training `cfg` on a machine of `gpus` GPUs of `gpu_mem_gib` GiB each (see the module
    docstring): the trainer's ranks on `trainer_gpus` (default: every GPU, one rank each; its states are
    sharded over them), generator processes where `rollout.placement.generator_gpus` puts them.
    `gpus=0` is a CPU run (everything in host memory, checked against `host_mem_gib` when given);
    `mixed_precision=False` computes in `model.dtype` instead of bfloat16 when that is float32 (as on a CPU).
    `teacher_arch`: teacher.path's architecture (default: built from its config, as the policy's).
    """
    from mathrl.model.dtypes import trainer_dtype  # here: the plan itself imports no torch
    tgpus = _check_machine(cfg, gpus, gpu_mem_gib, trainer_gpus, host_mem_gib)
    a = arch or architecture_of(cfg)
    n, on_gpu = max(1, len(tgpus)), gpus > 0
    pb = BYTES[trainer_dtype(cfg.model.dtype)]  # float16: float32 master weights and AdamW state
    cb = 2 if cfg.model.dtype == "float16" or (on_gpu and mixed_precision and cfg.model.dtype == "float32") else pb
    c, notes, other = trainer_states(cfg, a, n=n, pb=pb, cb=cb, on_gpu=on_gpu)
    teacher_c, teacher_notes = teacher_states(cfg, teacher_arch or _teacher_architecture(cfg, a), n=n, pb=pb, cb=cb,
                                              gpu_mem_gib=gpu_mem_gib if on_gpu else None)
    c.update(teacher_c)
    notes.update(teacher_notes)
    # Gradients exist only during an update (zero_grad(set_to_none=True) frees them after each
    # optimizer step); weights and optimizer states stay for the whole run. The policy and the critic
    # update one after the other, so the larger of the two is the update's peak; the teacher's scoring
    # pass (its logits) comes before them, and the top-k modes' update holds the student's logits too.
    policy_update = ("grads", "activations", "gathered weights", "head gradients")
    resident = sum(v for k, v in c.items() if k not in (*policy_update, "critic update", "teacher logits"))
    logits = c.get("teacher logits", 0)
    topk = logits if cfg.algo.distill.mode in ("forward_kl_topk", "jsd") else 0
    transient = max(sum(c.get(k, 0) for k in policy_update) + topk, c.get("critic update", 0), logits)
    warnings: list[str] = []
    engine, engine_notes, generating, updating = trainer_engine(
        cfg, a, n=n, pb=pb, cb=cb, gpu_mem_gib=gpu_mem_gib if on_gpu else None, warnings=warnings)
    c.update(engine)
    notes.update(engine_notes)
    if cfg.generator_workers:  # generator processes sample: the trainer's engine only evaluates
        away = engine_owns_weights(cfg) and on_gpu  # built for an evaluation, asleep or closed in between
        updating = 0 if away else updating
        for key in engine:
            notes[key] += ("; it only evaluates (generator processes sample the rollouts)"
                           + ("; on the GPU during evaluations only" if away else ""))
        phases = (0, resident + transient + updating, resident + generating if cfg.data.eval else 0)
    else:
        phases = (resident + generating, resident + transient + updating, 0)
    plan = MemoryPlan(
        gpus=gpus, gpu_mem_gib=gpu_mem_gib, components=c, notes=notes, generation_peak=phases[0],
        update_peak=phases[1], evaluation_peak=phases[2], activations_other_setting=other,
        checkpointing=cfg.model.gradient_checkpointing, arch=a, warnings=warnings, trainer_gpus=tgpus,
    )
    add_generators(plan, cfg, pb=pb)
    plan.loads = device_loads(plan, host_mem_gib=host_mem_gib)
    return plan


def _teacher_architecture(cfg: Config, a: Architecture) -> Architecture | None:
    """The teacher's architecture: teacher.path's, or the policy's own (teacher.self: a frozen copy of the starting
    model, or with teacher.self_update the policy itself; teacher.url: the student's, whose vocabulary the
    server shares); None without a distillation mode."""
    if not cfg.needs_teacher:
        return None
    return a if cfg.teacher.self or cfg.teacher.url is not None else architecture_of(cfg, teacher=True)


def _check_machine(cfg: Config, gpus: int, gpu_mem_gib: float, trainer_gpus: list[int] | None,
                   host_mem_gib: float | None) -> list[int]:
    """The trainer's GPUs (default: all `gpus`); a ValueError naming the option for an impossible machine."""
    if gpus < 0:
        raise ValueError(f"--gpus must be >= 0 (0: a CPU run), got {gpus}")
    if not gpu_mem_gib > 0:
        raise ValueError(f"--gpu-mem must be > 0 GiB, got {gpu_mem_gib}")
    if host_mem_gib is not None and not host_mem_gib > 0:
        raise ValueError(f"--host-mem must be > 0 GiB, got {host_mem_gib}")
    tgpus = list(range(gpus)) if trainer_gpus is None else list(trainer_gpus)
    if gpus and (not tgpus or any(not 0 <= g < gpus for g in tgpus)):
        raise ValueError(f"--trainer-gpus must be between 1 and --gpus ({gpus}), got {len(tgpus)} ({tgpus})")
    devices = list(cfg.rollout.generator.devices)
    if cfg.generator_workers and devices and any(not 0 <= d < gpus for d in devices):
        fix = f"use indices below {gpus} (--gpus)" if gpus else "clear it for a CPU run"
        raise ValueError(f"rollout.generator.devices={devices} names a GPU the {gpus}-GPU machine lacks; {fix}")
    return tgpus if gpus else []


def generator_layout_error(cfg: Config, *, trainer_gpus: list[int], gpus: int, gpu_mem_gib: float,
                           arch: Architecture | None = None) -> str | None:
    """One line naming the GPU(s) where the generator processes of `cfg` cannot fit beside what else runs
    there (the trainer's ranks on `trainer_gpus` of a machine of `gpus` GPUs of `gpu_mem_gib` GiB each),
    else None: vLLM shares of one GPU (generators', and the trainer's evaluation engine's) that sum above
    1, or a GPU holding a generator whose planned peak exceeds its memory. None without generators or
    without GPUs (`trainer_gpus` empty)."""
    if not cfg.generator_workers or not trainer_gpus:
        return None
    plan = estimate_memory(cfg, gpus=gpus, gpu_mem_gib=gpu_mem_gib, trainer_gpus=trainer_gpus, arch=arch)
    problems = []
    for load in plan.loads:
        if load.name == "host" or not any(who.startswith("generator") for who, _ in load.parts):
            continue
        gpu = int(load.name.split()[1])
        shares = [(f"generator {u.index}", u.share) for u in plan.generators if u.gpu == gpu and u.share is not None]
        if shares and cfg.data.eval and gpu in plan.trainer_gpus and engine_owns_weights(cfg):
            shares.insert(0, ("the trainer's evaluation engine", cfg.rollout.vllm.gpu_memory_utilization))
        if sum(s for _, s in shares) > 1:
            listed = " + ".join(f"{who} {s:g}" for who, s in shares)
            problems.append(f"{load.name}: vLLM shares {listed} = {sum(s for _, s in shares):g} > 1")
        elif not load.fits:
            problems.append(load.describe())
    if not problems:
        return None
    lower = "rollout.vllm.gpu_memory_utilization" if engine_owns_weights(cfg) else "rollout.batch_size"
    return (f"rollout.generator: the generators do not fit: {'; '.join(problems)}; lower {lower} or give each "
            "generator a GPU of its own (rollout.generator.devices, fewer trainer ranks)")
