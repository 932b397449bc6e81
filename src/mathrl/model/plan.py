"""Will this recipe fit? A per-GPU memory estimate from the config alone, before anything launches.

    mathrl plan recipes/deepscaler_1.5b_8k.yaml --gpus 8 --gpu-mem 80

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

The activation model is checked against autograd's saved tensors of a random-init model on a CPU in
tests/test_plan.py; parameter and optimizer bytes are checked exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from mathrl.config import Config

__all__ = ["Architecture", "MemoryPlan", "activation_bytes_per_token", "architecture_of", "estimate_memory", "format_plan"]

GIB = 2**30
RUNTIME_GIB = 1.0  # CUDA context + cuBLAS workspace + NCCL buffers per GPU: an allowance, not a derivation
_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class Architecture:
    """The numbers of a decoder-only model that memory depends on; `params` are exact counts."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    params: int  # all parameters of the causal LM
    param_tensors: int  # parameter tensors (AdamW keeps one `step` per tensor)
    layer_params: int  # parameters of one decoder layer
    critic_params: int  # the same backbone with a scalar value head (PPO critic)
    critic_param_tensors: int
    lora_params: int = 0  # the LoRA adapters' parameters (model.lora.r > 0), the only ones that train
    lora_param_tensors: int = 0

    @property
    def root_params(self) -> int:
        """Parameters outside the decoder layers: embeddings, final norm, untied output head."""
        return self.params - self.layers * self.layer_params


def _hf_config(cfg: Config):
    """The transformers config of `model.path`, without downloading anything."""
    from transformers import AutoConfig, Qwen2Config

    from mathrl.config import shipped_architecture_of
    from mathrl.model.init import architecture_config, parse_config_path

    arch = parse_config_path(cfg.model.path) or shipped_architecture_of(cfg.model.path)
    if arch is not None:  # config:<name>, or a hub id whose architecture ships with mathrl
        return architecture_config(arch)
    if cfg.model.path == "tiny-arith":
        b = cfg.base
        # the tiny base model: the character tokenizer's 99 tokens (model.tiny.build_char_tokenizer), tied head
        return Qwen2Config(vocab_size=99, hidden_size=b.hidden_size, intermediate_size=b.intermediate_size,
                           num_hidden_layers=b.num_layers, num_attention_heads=b.num_heads,
                           num_key_value_heads=b.num_kv_heads, max_position_embeddings=b.max_positions,
                           tie_word_embeddings=True)
    try:
        return AutoConfig.from_pretrained(cfg.model.path, local_files_only=True)
    except OSError:
        raise ValueError(
            f"model.path={cfg.model.path!r}: its config.json is not on this machine; give a local model directory, "
            "or plan with the architecture alone: model.path=config:<name> model.init=random"
        ) from None


def architecture_of(cfg: Config) -> Architecture:
    """Exact parameter counts of the policy (and of its critic), from modules built on the meta device."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    hf = _hf_config(cfg)
    with torch.device("meta"):
        lm = AutoModelForCausalLM.from_config(hf)
        hf.num_labels = 1
        critic = AutoModelForTokenClassification.from_config(hf)
    layer = lm.model.layers[0]
    lora = [0, 0]
    if cfg.model.lora.r > 0:  # the adapters peft builds on these modules (still on the meta device)
        from mathrl.model.lora import adapter_params, add_adapters

        with torch.device("meta"):
            adapters = adapter_params(add_adapters(AutoModelForCausalLM.from_config(hf), cfg.model.lora))
        lora = [sum(p.numel() for p in adapters), len(adapters)]
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    return Architecture(
        hidden=hf.hidden_size, intermediate=hf.intermediate_size, layers=hf.num_hidden_layers,
        heads=hf.num_attention_heads, kv_heads=hf.num_key_value_heads, head_dim=head_dim, vocab=hf.vocab_size,
        tied=bool(hf.tie_word_embeddings),
        params=sum(p.numel() for p in lm.parameters()), param_tensors=len(list(lm.parameters())),
        layer_params=sum(p.numel() for p in layer.parameters()),
        critic_params=sum(p.numel() for p in critic.parameters()), critic_param_tensors=len(list(critic.parameters())),
        lora_params=lora[0], lora_param_tensors=lora[1],
    )


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


@dataclass
class MemoryPlan:
    """Per-GPU bytes of each component; `total` is the peak over the generation and update phases."""

    gpus: int
    gpu_mem_gib: float
    components: dict[str, int]  # name -> bytes per GPU
    notes: dict[str, str]  # name -> how it was computed
    generation_peak: int
    update_peak: int
    activations_other_setting: int  # the activations with the other gradient_checkpointing setting
    checkpointing: bool
    arch: Architecture
    warnings: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return max(self.generation_peak, self.update_peak)

    @property
    def capacity(self) -> int:
        return int(self.gpu_mem_gib * GIB)

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity


def estimate_memory(
    cfg: Config, *, gpus: int, gpu_mem_gib: float, arch: Architecture | None = None, mixed_precision: bool = True
) -> MemoryPlan:
    """The per-GPU memory of training `cfg` on `gpus` GPUs of `gpu_mem_gib` GiB each (see the module docstring).

    `mixed_precision=False` computes in `model.dtype` (a CPU run) instead of bfloat16 when that is float32.
    """
    if gpus < 1:
        raise ValueError(f"--gpus must be >= 1, got {gpus}")
    if not gpu_mem_gib > 0:
        raise ValueError(f"--gpu-mem must be > 0 GiB, got {gpu_mem_gib}")
    a = arch or architecture_of(cfg)
    n = gpus
    pb = _BYTES[cfg.model.dtype]
    cb = 2 if mixed_precision and cfg.model.dtype == "float32" else pb  # bf16 mixed precision on GPUs
    shard = lambda x: math.ceil(x / n)  # noqa: E731 - FSDP pads shards to equal size

    c: dict[str, int] = {}
    notes: dict[str, str] = {}
    lora = a.lora_params > 0  # model.lora: frozen base weights; adapters, their gradients and AdamW states
    trained, trained_tensors = (a.lora_params, a.lora_param_tensors) if lora else (a.params, a.param_tensors)
    c["params"] = shard((a.params + a.lora_params) * pb)
    notes["params"] = f"{a.params:,} x {pb} B ({cfg.model.dtype}) / {n} GPUs"
    if lora:
        notes["params"] = f"({a.params:,} frozen + {a.lora_params:,} LoRA) x {pb} B ({cfg.model.dtype}) / {n} GPUs"
    c["grads"] = shard(trained * pb)
    notes["grads"] = f"the LoRA adapters' only, {a.lora_params:,} x {pb} B / {n}" if lora else "same as params"
    c["optimizer"] = shard(2 * trained * pb + 4 * trained_tensors)
    notes["optimizer"] = (f"AdamW exp_avg + exp_avg_sq ({cfg.model.dtype}) + float32 step per tensor"
                          + (f" of the {a.lora_param_tensors} LoRA tensors" if lora else "") + f", / {n}")
    if n > 1 or cb != pb:
        c["gathered weights"] = (2 * a.layer_params + a.root_params) * cb
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
    other = (full if use_ckpt else ckpt) + head
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
        notes["reference model"] = f"weights only, {cfg.model.dtype} shards as loaded, / {n}"
        if n > 1 or cb != pb:  # its forward gathers layers in the compute dtype, as the policy's does
            c["reference model"] += (2 * a.layer_params + a.root_params) * cb
            notes["reference model"] += " + its gathered layers while it scores"
    c["runtime"] = int(RUNTIME_GIB * GIB)
    notes["runtime"] = "CUDA context, cuBLAS workspace, NCCL buffers (a fixed allowance)"
    if cfg.algo.adv.estimator == "gae":
        c["critic"] = shard(a.critic_params * pb * 3 + 4 * a.critic_param_tensors)
        notes["critic"] = f"{a.critic_params:,} params: weights and AdamW states / {n}"
        c["critic update"] = shard(a.critic_params * pb) + (ckpt if use_ckpt else full)
        notes["critic update"] = f"its gradients / {n}, and the backbone's activations"

    # Gradients exist only during an update (zero_grad(set_to_none=True) frees them after each
    # optimizer step); weights and optimizer states stay for the whole run. The policy and the critic
    # update one after the other, so the larger of the two is the update's peak.
    policy_update = ("grads", "activations", "gathered weights", "head gradients")
    trainer_resident = sum(v for k, v in c.items() if k not in (*policy_update, "critic update"))
    update_transient = max(sum(c.get(k, 0) for k in policy_update), c.get("critic update", 0))
    warnings: list[str] = []
    kv_per_token = 2 * a.layers * a.kv_heads * a.head_dim  # elements of K and V per token, all layers
    seq_len = cfg.data.max_prompt_tokens + cfg.rollout.max_new_tokens
    if cfg.rollout.engine == "vllm":
        v = getattr(cfg.rollout, "vllm", None)
        util = getattr(v, "gpu_memory_utilization", 0.5)
        sleep = bool(getattr(v, "enable_sleep_mode", False))
        level = getattr(v, "sleep_level", 1)
        vdtype = getattr(v, "dtype", "auto")
        vb = _BYTES.get(cfg.model.dtype if vdtype == "auto" else vdtype, 2)
        pool = int(util * gpu_mem_gib * GIB)
        c["vLLM (weights + KV cache)"] = pool
        weights = a.params * vb
        kv_bytes = pool - weights
        notes["vLLM (weights + KV cache)"] = f"gpu_memory_utilization {util} x {gpu_mem_gib} GiB"
        seqs = math.ceil(cfg.rollout_batch_size / n)
        if kv_bytes <= 0:
            warnings.append(f"vLLM's share ({util} x {gpu_mem_gib} GiB) does not hold the weights ({weights / GIB:.1f} GiB): "
                            "raise rollout.vllm.gpu_memory_utilization")
        else:
            kv_tokens = kv_bytes // (kv_per_token * vb)
            notes["vLLM (weights + KV cache)"] += (
                f"; weights {weights / GIB:.1f} GiB, KV cache {kv_bytes / GIB:.1f} GiB ~ {kv_tokens:,} tokens "
                f"= {kv_tokens // seq_len:,} sequences of {seq_len:,} (this GPU's batch: {seqs:,})"
            )
        generation_peak = trainer_resident + pool
        # asleep, vLLM holds neither its KV cache nor its weights on the GPU (level 1: on the host, 2: dropped)
        update_peak = trainer_resident + update_transient + (0 if sleep else pool)
        if sleep:
            notes["vLLM (weights + KV cache)"] += f"; asleep during the update (level {level})"
    else:
        rows = min(cfg.rollout.batch_size, math.ceil(cfg.rollout_batch_size / n))
        if n > 1:
            c["torch engine weights"] = (a.params + a.lora_params) * pb
            notes["torch engine weights"] = f"an unsharded copy of the policy, {a.params + a.lora_params:,} x {pb} B, on every GPU"
        c["torch engine KV cache"] = rows * seq_len * kv_per_token * cb
        notes["torch engine KV cache"] = f"{rows:,} sequences x {seq_len:,} tokens x {kv_per_token:,} x {cb} B"
        engine_weights = c.get("torch engine weights", 0)
        generation_peak = trainer_resident + engine_weights + c["torch engine KV cache"]
        update_peak = trainer_resident + engine_weights + update_transient
    return MemoryPlan(
        gpus=n, gpu_mem_gib=gpu_mem_gib, components=c, notes=notes, generation_peak=generation_peak,
        update_peak=update_peak, activations_other_setting=other, checkpointing=use_ckpt, arch=a, warnings=warnings,
    )


def format_plan(plan: MemoryPlan, name: str = "") -> str:
    """The plan as plain text: one line per component, the two phase peaks and the verdict."""
    a = plan.arch
    lines = [
        f"{name or 'model'}: {a.params / 1e9:.2f}B parameters ({a.layers} layers, hidden {a.hidden}, "
        f"{a.heads} heads / {a.kv_heads} kv, vocab {a.vocab:,}) on {plan.gpus} GPU(s) of {plan.gpu_mem_gib:g} GiB",
        f"{'component':<28}{'GiB/GPU':>10}  how",
    ]
    for key, value in plan.components.items():
        lines.append(f"{key:<28}{value / GIB:>10.2f}  {plan.notes.get(key, '')}")
    other = "with" if not plan.checkpointing else "without"
    lines += [
        f"{'peak while generating':<28}{plan.generation_peak / GIB:>10.2f}",
        f"{'peak while updating':<28}{plan.update_peak / GIB:>10.2f}",
        f"activations {other} gradient checkpointing would be {plan.activations_other_setting / GIB:.2f} GiB "
        f"(model.gradient_checkpointing={str(not plan.checkpointing).lower()})",
        *(f"warning: {w}" for w in plan.warnings),
        f"{'fits' if plan.fits else 'DOES NOT FIT'}: peak {plan.total / GIB:.2f} GiB of {plan.gpu_mem_gib:g} GiB "
        f"({100 * plan.total / plan.capacity:.0f}%)",
    ]
    return "\n".join(lines)
