"""The memory plan as the text `mathrl plan` prints: one line per component, the phase peaks, the
generators, each device's peak and the verdict (fits, or what does not and how to free a shared GPU).
"""

from __future__ import annotations

from mathrl.plan.arch import GIB
from mathrl.plan.layout import DeviceLoad, MemoryPlan

__all__ = ["format_plan"]


def _grouped(loads: list[DeviceLoad]) -> list[tuple[str, DeviceLoad]]:
    """Adjacent GPUs holding the same parts as one row: ("GPU 1-7", load); other devices as they are."""
    rows: list[tuple[list[int], DeviceLoad]] = []
    for load in loads:
        if not load.name.startswith("GPU "):
            rows.append(([], load))
            continue
        index = int(load.name.split()[1])
        if rows and rows[-1][0] and rows[-1][0][-1] == index - 1 and rows[-1][1].parts == load.parts:
            rows[-1][0].append(index)
        else:
            rows.append(([index], load))
    return [(load.name if not ids else f"GPU {ids[0]}" + (f"-{ids[-1]}" if len(ids) > 1 else ""), load)
            for ids, load in rows]


def _format_generators(plan: MemoryPlan) -> list[str]:
    """The generator-side rows: each generator's engine, the staging bucket, the kept versions."""
    lines = [f"generator processes: {len(plan.generators)}, weights over {plan.backend}"
             + (" (a generator shares a GPU: NCCL refuses two ranks on one device)" if plan.backend == "gloo" and plan.gpus else "")]
    for use in plan.generators:
        lines.append(f"{use.label:<28}{use.bytes / GIB:>10.2f}  {use.where}: {use.note}")
    if plan.staging:
        lines.append(f"{'weight staging bucket':<28}{plan.staging / GIB:>10.2f}  GPU {plan.trainer_gpus[0]}: "
                     f"{plan.notes['weight staging bucket']}")
    for key, value in plan.host.items():
        lines.append(f"{key:<28}{value / GIB:>10.2f}  host memory: {plan.notes.get(key, '')}")
    return lines


def format_plan(plan: MemoryPlan, name: str = "") -> str:
    """The plan as plain text: one line per component, the phase peaks, the generators, each device's
    peak when there is more than the trainer's, and the verdict."""
    a = plan.arch
    where = f"on {plan.gpus} GPU(s) of {plan.gpu_mem_gib:g} GiB" if plan.gpus else "on the CPU (host memory)"
    if plan.gpus and len(plan.trainer_gpus) < plan.gpus:
        where = f"trainer on GPU(s) {', '.join(map(str, plan.trainer_gpus))} " + where
    lines = [
        f"{name or 'model'}: {a.params / 1e9:.2f}B parameters ({a.layers} layers, hidden {a.hidden}, "
        f"{a.heads} heads / {a.kv_heads} kv, vocab {a.vocab:,}) {where}",
        f"{'component':<28}{'GiB/GPU' if plan.gpus else 'GiB':>10}  how",
    ]
    for key, value in plan.components.items():
        lines.append(f"{key:<28}{value / GIB:>10.2f}  {plan.notes.get(key, '')}")
    other = "with" if not plan.checkpointing else "without"
    peaks = [("generating", plan.generation_peak), ("updating", plan.update_peak), ("evaluating", plan.evaluation_peak)]
    lines += [f"{'peak while ' + phase:<28}{value / GIB:>10.2f}" for phase, value in peaks if value]
    lines += [
        f"activations {other} gradient checkpointing would be {plan.activations_other_setting / GIB:.2f} GiB "
        f"(model.gradient_checkpointing={str(not plan.checkpointing).lower()})",
        *(f"warning: {w}" for w in plan.warnings),
    ]
    if plan.generators:
        lines += _format_generators(plan)
    if plan.generators or not plan.gpus:
        lines += ["per device, at its peak:", *(load.describe(label) for label, load in _grouped(plan.loads))]
    return "\n".join([*lines, _verdict(plan)])


def _verdict(plan: MemoryPlan) -> str:
    """`fits: peak ...` or `DOES NOT FIT: <each device over its memory>`, and how to free a shared GPU."""
    if not plan.fits:
        text = "DOES NOT FIT: " + "; ".join(load.describe(label) for label, load in _grouped(plan.loads) if not load.fits)
        shared = {u.gpu for u in plan.generators} & set(plan.trainer_gpus)
        free = plan.gpus - len(plan.generators)
        if shared and free >= 1 and any(load.name == f"GPU {g}" and not load.fits for load in plan.loads for g in shared):
            text += (f"\nhint: a GPU of its own for each generator: --trainer-gpus {free} (torchrun --nproc-per-node {free}),"
                     " or rollout.generator.devices")
        return text
    checked = [load for load in plan.loads if load.capacity is not None]
    if not checked:
        host = next(load for load in plan.loads if load.name == "host")
        return f"fits on no checked device: {host.total / GIB:.2f} GiB of host memory (give --host-mem to check it)"
    top = max(checked, key=lambda load: load.total / load.capacity)
    at = f", {top.name}" if len(checked) > 1 and plan.generators else ""
    return f"fits: peak {top.total / GIB:.2f} GiB of {top.capacity / GIB:g} GiB ({100 * top.total / top.capacity:.0f}%{at})"
