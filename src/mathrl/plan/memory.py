"""Will this recipe fit? A per-device memory estimate from the config alone, before anything launches.

    mathrl plan recipes/deepscaler_1.5b_8k.yaml --gpus 8 --gpu-mem 80
    mathrl plan recipes/real/dapo_qwen2.5_math_7b.yaml rollout.max_staleness=1 --gpus 8 --trainer-gpus 7

Its last line is the setup time (`setup_time.setup_time`): a base model to build or download before
the first step, or none.

The architecture is built on the meta device (no memory, no weights, no download), so parameter
counts are exact. What the estimate assumes, term by term (GiB = 2^30 bytes, per GPU):

* params / grads: the master weights in `model.dtype`, and their gradients in the same dtype, sharded
  over the N GPUs (FSDP2 `fully_shard`, one shard per rank; N = 1 is plain single-device training).
  Gradients exist only while the policy updates (they are freed after each optimizer step).
* optimizer: torch AdamW keeps exp_avg and exp_avg_sq in the parameter dtype (float32 master weights:
  8 bytes per parameter) plus one float32 `step` per parameter tensor, sharded likewise.
* gathered weights: FSDP2 all-gathers one decoder layer at a time in the compute dtype, and the
  next one is prefetched (2 layers), plus the root module (embeddings, final norm, output head).
  The compute dtype is bfloat16 on GPUs when `model.dtype` is float32 (mixed precision), else
  `model.dtype`.
* activations: what autograd saves for the backward pass over one micro-batch of
  `train.micro_batch_tokens` tokens (`activation_bytes_per_token`, enumerated for the Hugging Face
  Qwen2/Llama decoder with SDPA/flash attention: no sequence-squared term). With gradient
  checkpointing only each layer's input is kept, plus one layer's activations during its recompute.
  The output head runs in chunks of `model.logprob_chunk_size` positions: its recompute in the
  backward holds the float32 logits, their shifted copy, the probabilities and a gradient (4 x chunk
  x vocab x 4 bytes).
* head gradients: the backward builds the full weight gradients of the output head and of the
  embeddings (vocab x hidden each, in the compute dtype; one tensor each even when tied) before
  they are accumulated and reduce-scattered.
* reference model: weights only, sharded, stored in `model.dtype` like the policy (FSDP2 keeps the
  shards in the dtype they were loaded in and casts to the compute dtype per layer; loaded when a KL
  or entropy term needs it).
* scoring passes (old and reference logprobs, no grad): one layer's working set plus the final hidden
  states and one logits chunk, below the update's activations, so they never set the peak. Only the
  decoder stack's last output is kept (`model.scoring.final_hidden`), not every layer's hidden states.
* runtime: the CUDA context, cuBLAS workspaces and NCCL buffers, a fixed allowance of
  `RUNTIME_GIB` per GPU (not derived from the config).
* LoRA (`model.lora.r` > 0): the frozen base weights plus the adapters' (params), gradients and AdamW
  states of the adapters only, no weight gradients of the (frozen) head and embeddings, and no
  reference copy: the reference is the policy with its adapters disabled. The adapters' own
  activations (r numbers per token per adapted layer) are left out. vLLM holds the merged weights
  (the base model's size).
* critic (PPO, `algo.adv.estimator: gae`): the same backbone with a scalar head, with its own
  grads, AdamW states and activations.
* rollout engine: vLLM claims `rollout.vllm.gpu_memory_utilization` of the GPU (its weights, KV cache
  and activations) for as long as it is awake; with `enable_sleep_mode` it frees the KV cache (level
  1 keeps the weights on the host, level 2 drops them) while the policy updates, so the peak is the
  larger of the generation phase and the update phase. vLLM loads its own weights: no trainer-side
  copy exists for it. The torch engine's KV cache is `rollout.batch_size` sequences of prompt +
  response tokens; with several GPUs it samples from its own unsharded copy of the policy in
  `model.dtype` (ranks finish their responses at different lengths, which a sharded model's
  collectives cannot follow), counted as "torch engine weights".
* generator processes (`rollout.max_staleness` >= 1, train/generators/host.py): each on the GPU that
  `rollout.placement.generator_gpus` gives it, or on the CPU in a CPU run. A vLLM generator claims its
  `gpu_memory_utilization` share of that GPU (on a CPU: its weights and `rollout.vllm.kv_cache_gb`); a
  torch generator holds its own copy of the policy in `model.dtype`, a KV cache of `rollout.batch_size`
  sequences in the same dtype and, on a GPU, the runtime allowance of its own process. The trainer's
  rank 0 keeps the last k + 1 policy versions (its state dict in `model.dtype`) in host memory, and with
  the NCCL weight backend (`rollout.placement.weight_backend`) stages them through one GPU bucket of
  `rollout.generator.bucket_mb` (or the largest tensor, which travels alone) on its own GPU. The
  trainer's engine then only evaluates: vLLM is on the GPU during evaluations only (asleep or closed in
  between), the torch engine's KV cache likewise. Every device's peak is the trainer's peak (on its
  GPUs) plus what else it holds; the plan fits when every device does. Not counted: a generator's
  received weights on their way into its engine.

The activation model is checked against autograd's saved tensors of a random-init model on a CPU in
tests/train/test_plan.py; parameter and optimizer bytes are checked exactly.

Where each part is computed: arch.py (the architecture, exact parameter counts), trainer.py
(the trainer's states and activations), engine.py (the trainer's and the generators' engines),
layout.py (the generators' placement and every device's peak); this module adds them up per phase.
format.py writes the plan as text, setup_time.py the setup-time line.
"""

from __future__ import annotations

from mathrl.config import Config
from mathrl.plan.arch import BYTES, Architecture, architecture_of
from mathrl.plan.engine import engine_owns_weights, trainer_engine
from mathrl.plan.layout import MemoryPlan, add_generators, device_loads
from mathrl.plan.trainer import trainer_states

__all__ = ["estimate_memory", "generator_layout_error"]


def estimate_memory(
    cfg: Config, *, gpus: int, gpu_mem_gib: float, arch: Architecture | None = None, mixed_precision: bool = True,
    trainer_gpus: list[int] | None = None, host_mem_gib: float | None = None,
) -> MemoryPlan:
    """The memory of training `cfg` on a machine of `gpus` GPUs of `gpu_mem_gib` GiB each (see the module
    docstring): the trainer's ranks on `trainer_gpus` (default: every GPU, one rank each; its states are
    sharded over them), generator processes where `rollout.placement.generator_gpus` puts them.
    `gpus=0` is a CPU run (everything in host memory, checked against `host_mem_gib` when given);
    `mixed_precision=False` computes in `model.dtype` instead of bfloat16 when that is float32 (as on a CPU).
    """
    from mathrl.model.dtypes import trainer_dtype  # here: the plan itself imports no torch
    tgpus = _check_machine(cfg, gpus, gpu_mem_gib, trainer_gpus, host_mem_gib)
    a = arch or architecture_of(cfg)
    n, on_gpu = max(1, len(tgpus)), gpus > 0
    pb = BYTES[trainer_dtype(cfg.model.dtype)]  # float16: float32 master weights and AdamW state
    cb = 2 if cfg.model.dtype == "float16" or (on_gpu and mixed_precision and cfg.model.dtype == "float32") else pb
    c, notes, other = trainer_states(cfg, a, n=n, pb=pb, cb=cb, on_gpu=on_gpu)
    # Gradients exist only during an update (zero_grad(set_to_none=True) frees them after each
    # optimizer step); weights and optimizer states stay for the whole run. The policy and the critic
    # update one after the other, so the larger of the two is the update's peak.
    policy_update = ("grads", "activations", "gathered weights", "head gradients")
    resident = sum(v for k, v in c.items() if k not in (*policy_update, "critic update"))
    transient = max(sum(c.get(k, 0) for k in policy_update), c.get("critic update", 0))
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
