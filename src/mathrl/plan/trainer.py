"""The trainer's own memory per GPU in the memory plan (plan/memory.py, whose docstring states every
term's assumptions): weights, gradients and AdamW states sharded over the ranks, the gathered layers,
the activations of one micro-batch (`activation_bytes_per_token`), the head gradients, the reference
model, the runtime allowance and the PPO critic.
"""

from __future__ import annotations

import math

from mathrl.config import Config
from mathrl.plan.arch import GIB, RUNTIME_GIB, Architecture

__all__ = ["activation_bytes_per_token", "teacher_states", "trainer_states"]


def activation_bytes_per_token(a: Architecture, compute_bytes: int) -> int:
    """Bytes autograd saves per token per decoder layer (HF Qwen2 layer, SDPA/flash attention).

    h = hidden, i = intermediate, b = compute bytes; every term is a tensor the backward reads:
      2 RMSNorms: the float32 input (4h; the layer input itself when b = 4, a float32 copy otherwise)
                  and the normalised output in b (b·h), plus the float32 1/rms (4 bytes)    2·(4h + b·h + 4)
      attention:  q, k and v after RoPE with k, v repeated to all heads (3·b·h), the output (b·h)
                  and its contiguous copy for o_proj (b·h); log-sum-exp per head (4·heads);
                  RoPE cos and sin (2·b·head_dim)                                           5·b·h + 4·heads + 2·b·head_dim
      SwiGLU MLP: gate, silu(gate), up and their product (4·b·i)                            4·b·i
    """
    h, i, b = a.hidden, a.intermediate, compute_bytes
    norms = 2 * (4 * h + b * h + 4)
    attention = 5 * b * h + 4 * a.heads + 2 * b * a.head_dim
    mlp = 4 * b * i
    return norms + attention + mlp


def trainer_states(cfg: Config, a: Architecture, *, n: int, pb: int, cb: int, on_gpu: bool
                    ) -> tuple[dict[str, int], dict[str, str], int]:
    """The trainer's components per GPU (params to critic, no engine), their notes, and the activations
    with the other gradient_checkpointing setting."""
    from mathrl.model.dtypes import trainer_dtype  # here: the plan itself imports no torch
    shard = lambda x: math.ceil(x / n)  # noqa: E731 - FSDP pads shards to equal size
    c: dict[str, int] = {}
    notes: dict[str, str] = {}
    lora = a.lora_params > 0  # model.lora: frozen base weights; adapters, their gradients and AdamW states
    trained, trained_tensors = (a.lora_params, a.lora_param_tensors) if lora else (a.params, a.param_tensors)
    c["params"] = shard((a.params + a.lora_params) * pb)
    notes["params"] = f"{a.params:,} x {pb} B ({trainer_dtype(cfg.model.dtype)}) / {n} GPUs"
    if lora:
        notes["params"] = f"({a.params:,} frozen + {a.lora_params:,} LoRA) x {pb} B ({trainer_dtype(cfg.model.dtype)}) / {n} GPUs"
    c["grads"] = shard(trained * pb)
    notes["grads"] = f"the LoRA adapters' only, {a.lora_params:,} x {pb} B / {n}" if lora else "same as params"
    c["optimizer"] = shard(2 * trained * pb + 4 * trained_tensors)
    notes["optimizer"] = (f"AdamW exp_avg + exp_avg_sq ({trainer_dtype(cfg.model.dtype)}) + float32 step per tensor"
                          + (f" of the {a.lora_param_tensors} LoRA tensors" if lora else "") + f", / {n}")
    gathered = (2 * a.layer_params + a.root_params) * cb
    if n > 1 or cb != pb:
        c["gathered weights"] = gathered
        notes["gathered weights"] = f"2 decoder layers + embeddings/head unsharded in {cb}-byte compute dtype (FSDP2 all-gather)"

    tokens = cfg.train.micro_batch_tokens
    per_layer = activation_bytes_per_token(a, cb)
    full = a.layers * per_layer * tokens
    ckpt = a.layers * a.hidden * cb * tokens + per_layer * tokens
    chunk = min(cfg.model.logprob_chunk_size, tokens)
    head = 4 * chunk * a.vocab * 4 + tokens * a.hidden * cb
    use_ckpt = cfg.model.gradient_checkpointing
    c["activations"] = (ckpt if use_ckpt else full) + head
    notes["activations"] = (
        f"{tokens:,} tokens x {a.layers} layers x {per_layer:,} B"
        + (" (checkpointed: layer inputs + one layer)" if use_ckpt else "")
        + f" + output head: final hidden states, and {chunk:,} x {a.vocab:,} float32 logits x 4 in the backward"
    )
    # The backward makes the output head's and the embeddings' weight gradients in full (vocab x hidden
    # each, unsharded until FSDP reduce-scatters them) before they are added up or sharded.
    c["head gradients"] = 0 if lora else 2 * a.vocab * a.hidden * cb
    notes["head gradients"] = f"2 x {a.vocab:,} x {a.hidden:,} x {cb} B: output head and embedding weight gradients before accumulation"
    if lora:
        notes["head gradients"] = "none: the head and embeddings are frozen under LoRA"

    if cfg.needs_reference and lora:  # the policy with its adapters disabled (peft's disable_adapter)
        c["reference model"] = 0
        notes["reference model"] = (f"the base with the adapters disabled: no copy (a copy would take "
                                    f"{shard(a.params * pb) / GIB:.2f} GiB)")
    elif cfg.needs_reference:
        c["reference model"] = shard(a.params * pb)
        notes["reference model"] = f"weights only, {trainer_dtype(cfg.model.dtype)} shards as loaded, / {n}"
        if n > 1 or cb != pb:  # its forward gathers layers in the compute dtype, as the policy's does
            c["reference model"] += gathered
            notes["reference model"] += " + its gathered layers while it scores"
    if on_gpu:
        c["runtime"] = int(RUNTIME_GIB * GIB)
        notes["runtime"] = "CUDA context, cuBLAS workspace, NCCL buffers (a fixed allowance)"
    if cfg.algo.adv.estimator == "gae":
        c["critic"] = shard(a.critic_params * pb * 3 + 4 * a.critic_param_tensors)
        notes["critic"] = f"{a.critic_params:,} params: weights and AdamW states / {n}"
        c["critic update"] = shard(a.critic_params * pb) + (ckpt if use_ckpt else full)
        notes["critic update"] = f"its gradients / {n}, and the backbone's activations"
    return c, notes, (full if use_ckpt else ckpt) + head


def teacher_states(cfg: Config, t: Architecture | None, *, n: int, pb: int, cb: int,
                   gpu_mem_gib: float | None = None) -> tuple[dict[str, int], dict[str, str]]:
    """The distillation teacher's bytes per GPU (`t`: its architecture, the policy's for teacher.self and
    teacher.url; None: no teacher). `teacher model`: frozen weights in the trainer's dtype, sharded over the
    ranks and gathered while it scores like the reference model's (none for teacher.self_update, nor for
    teacher.url: it is on its server). `teacher logits`: one micro-batch's full log-softmax
    [train.micro_batch_tokens x vocabulary] in float32, held by its scoring pass (every mode: it reads the
    sampled token's logprob and argmax from it) and by the update of the top-k modes (the student's).
    teacher.engine=vllm: `teacher vLLM (weights + KV cache)`, its engine's share of the GPU
    (teacher.gpu_memory_utilization x `gpu_mem_gib`), or on a CPU (`gpu_mem_gib` None) its weights and KV cache."""
    from mathrl.model.dtypes import trainer_dtype  # here: the plan itself imports no torch
    if t is None:
        return {}, {}
    c: dict[str, int] = {}
    notes: dict[str, str] = {}
    topk = cfg.algo.distill.mode in ("forward_kl_topk", "jsd")
    tokens = cfg.train.micro_batch_tokens
    away = cfg.teacher.url is not None or cfg.teacher.engine == "vllm"
    if cfg.teacher.url is not None:  # on its server: only the top-k modes' update holds logits here
        c["teacher model"] = 0
        notes["teacher model"] = f"none here: it runs on its server ({cfg.teacher.url})"
    elif cfg.teacher.engine == "vllm":
        key, weights = "teacher vLLM (weights + KV cache)", t.params * pb
        if gpu_mem_gib is None:
            from mathrl.rollout.vllm_engine import CPU_DEFAULT_KV_GB

            kv_gb = cfg.rollout.vllm.kv_cache_gb if cfg.rollout.vllm.kv_cache_gb is not None else CPU_DEFAULT_KV_GB
            c[key] = weights + int(kv_gb * 2**30)
            notes[key] = f"on the CPU: weights {t.params:,} x {pb} B + KV cache {kv_gb:g} GiB (rollout.vllm.kv_cache_gb)"
        else:
            util = cfg.teacher.gpu_memory_utilization
            c[key] = int(util * gpu_mem_gib * 2**30)
            notes[key] = (f"teacher.gpu_memory_utilization {util} x {gpu_mem_gib} GiB, its weights "
                          f"{weights / 2**30:.1f} GiB among them, unsharded")
    if away:
        if topk:
            c["teacher logits"] = tokens * t.vocab * 4
            notes["teacher logits"] = f"{tokens:,} tokens x {t.vocab:,} float32: the student's log-softmax in the update"
        return c, notes
    if cfg.teacher.self_update:
        c["teacher model"] = 0
        notes["teacher model"] = "none: the current policy is the teacher (teacher.self_update)"
    else:
        where = "the starting model" if cfg.teacher.self else "teacher.path's model"
        c["teacher model"] = math.ceil(t.params * pb / n)
        notes["teacher model"] = (f"frozen, {where}: {t.params:,} x {pb} B ({trainer_dtype(cfg.model.dtype)}) / {n}, "
                                  "as the reference model")
        if n > 1 or cb != pb:  # its forward gathers layers in the compute dtype, as the reference's does
            c["teacher model"] += (2 * t.layer_params + t.root_params) * cb
            notes["teacher model"] += " + its gathered layers while it scores"
    c["teacher logits"] = tokens * t.vocab * 4
    notes["teacher logits"] = (f"{tokens:,} tokens x {t.vocab:,} float32: the teacher's log-softmax of one micro-batch"
                               + (", and the student's in the update (top-k modes)" if topk else ""))
    return c, notes
