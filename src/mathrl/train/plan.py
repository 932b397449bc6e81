"""Will this recipe fit? A per-device memory estimate from the config alone, before anything launches.

    mathrl plan recipes/deepscaler_1.5b_8k.yaml --gpus 8 --gpu-mem 80
    mathrl plan recipes/real/dapo_qwen2.5_math_7b.yaml rollout.max_staleness=1 --gpus 8 --trainer-gpus 7

Its last line is the setup time (`setup_time`, at the end of this file): a base model to build or
download before the first step, or none.

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
* generator processes (`rollout.max_staleness` >= 1, train/generator.py): each on the GPU that
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
tests/test_plan.py; parameter and optimizer bytes are checked exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from mathrl.config import TINY_BASE, Config, parse_config_path
from mathrl.registry import ENGINES
from mathrl.rollout.placement import generator_gpus, weight_backend

__all__ = [
    "Architecture", "DeviceLoad", "GeneratorUse", "MemoryPlan", "activation_bytes_per_token", "architecture_of",
    "estimate_memory", "format_plan", "generator_layout_error",
]

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

    from mathrl.model.init import architecture_config
    from mathrl.model.paths import shipped_architecture_of

    arch = parse_config_path(cfg.model.path) or shipped_architecture_of(cfg.model.path)
    if arch is not None:  # config:<name>, or a hub id whose architecture ships with mathrl
        return architecture_config(arch)
    if cfg.model.path == TINY_BASE:
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


@dataclass(frozen=True)
class GeneratorUse:
    """One generator process's engine: where it samples and the bytes it holds there."""

    index: int
    gpu: int | None  # the machine's GPU index; None: on the CPU (host memory)
    engine: str  # "vLLM" or "torch"
    bytes: int
    share: float | None  # vLLM on a GPU: its rollout.vllm.gpu_memory_utilization; else None
    note: str

    @property
    def label(self) -> str:
        return f"generator {self.index} {self.engine}"

    @property
    def where(self) -> str:
        return "host" if self.gpu is None else f"GPU {self.gpu}"


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
    pb = _BYTES[trainer_dtype(cfg.model.dtype)]  # float16: float32 master weights and AdamW state
    cb = 2 if cfg.model.dtype == "float16" or (on_gpu and mixed_precision and cfg.model.dtype == "float32") else pb
    c, notes, other = _trainer_states(cfg, a, n=n, pb=pb, cb=cb, on_gpu=on_gpu)
    # Gradients exist only during an update (zero_grad(set_to_none=True) frees them after each
    # optimizer step); weights and optimizer states stay for the whole run. The policy and the critic
    # update one after the other, so the larger of the two is the update's peak.
    policy_update = ("grads", "activations", "gathered weights", "head gradients")
    resident = sum(v for k, v in c.items() if k not in (*policy_update, "critic update"))
    transient = max(sum(c.get(k, 0) for k in policy_update), c.get("critic update", 0))
    warnings: list[str] = []
    engine, engine_notes, generating, updating = _trainer_engine(
        cfg, a, n=n, pb=pb, cb=cb, gpu_mem_gib=gpu_mem_gib if on_gpu else None, warnings=warnings)
    c.update(engine)
    notes.update(engine_notes)
    if cfg.generator_workers:  # generator processes sample: the trainer's engine only evaluates
        away = _engine_owns_weights(cfg) and on_gpu  # built for an evaluation, asleep or closed in between
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
    _add_generators(plan, cfg, pb=pb)
    plan.loads = _device_loads(plan, host_mem_gib=host_mem_gib)
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


def _trainer_states(cfg: Config, a: Architecture, *, n: int, pb: int, cb: int, on_gpu: bool
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


def _engine_owns_weights(cfg: Config) -> bool:
    """The rollout engine loads and holds its own copy of the weights in the share of memory rollout.vllm
    gives it (vLLM), rather than sampling from the trainer's module (the torch engine): the registry's
    `samples_from_module` (rollout/factory.py), not the engine's name."""
    return not ENGINES.get(cfg.rollout.engine).samples_from_module


def _kv_bytes_per_token(a: Architecture) -> int:
    """Elements of K and V per token over all layers (multiply by the cache's element size)."""
    return 2 * a.layers * a.kv_heads * a.head_dim


def _torch_cache(cfg: Config, rows: int, seq_len: int) -> tuple[int, int, str]:
    """(rows, tokens per row, how) of the torch engine's KV cache: rollout.decode=lean preallocates it
    for a batch bucket of rows and whole blocks of columns (rollout/lean.py: bucket, cache_columns)."""
    if cfg.rollout.decode != "lean":
        return rows, seq_len, ""
    from mathrl.rollout.lean import bucket, cache_columns

    return bucket(rows), cache_columns(seq_len), " (lean: preallocated, rows in a batch bucket, columns in blocks)"


def _vllm_bytes(cfg: Config) -> int:
    """Bytes per element of vLLM's weights and KV cache (rollout.vllm.dtype; auto: model.dtype)."""
    vdtype = cfg.rollout.vllm.dtype
    return _BYTES[cfg.model.dtype if vdtype == "auto" else vdtype]


def _trainer_engine(cfg: Config, a: Architecture, *, n: int, pb: int, cb: int, gpu_mem_gib: float | None,
                    warnings: list[str]) -> tuple[dict[str, int], dict[str, str], int, int]:
    """The trainer's own rollout engine: (components, notes, bytes while it samples, bytes during the
    update). `gpu_mem_gib=None`: a CPU run."""
    c: dict[str, int] = {}
    notes: dict[str, str] = {}
    seq_len = cfg.data.max_prompt_tokens + cfg.rollout.max_new_tokens
    kv_per_token = _kv_bytes_per_token(a)
    if _engine_owns_weights(cfg):
        v, key = cfg.rollout.vllm, "vLLM (weights + KV cache)"
        vb = _vllm_bytes(cfg)
        weights = a.params * vb
        if gpu_mem_gib is None:  # vLLM on a CPU: a fixed KV cache, not a share of all host memory
            from mathrl.rollout.vllm_engine import CPU_DEFAULT_KV_GB

            kv_gb = v.kv_cache_gb if v.kv_cache_gb is not None else CPU_DEFAULT_KV_GB
            c[key] = weights + int(kv_gb * GIB)
            notes[key] = f"on the CPU: weights {a.params:,} x {vb} B + KV cache {kv_gb:g} GiB (rollout.vllm.kv_cache_gb)"
            return c, notes, c[key], c[key]
        util = v.gpu_memory_utilization
        pool = int(util * gpu_mem_gib * GIB)
        c[key] = pool
        kv_bytes = pool - weights
        notes[key] = f"gpu_memory_utilization {util} x {gpu_mem_gib} GiB"
        if kv_bytes <= 0:
            warnings.append(f"vLLM's share ({util} x {gpu_mem_gib} GiB) does not hold the weights ({weights / GIB:.1f} GiB): "
                            "raise rollout.vllm.gpu_memory_utilization")
        else:
            kv_tokens = kv_bytes // (kv_per_token * vb)
            notes[key] += (f"; weights {weights / GIB:.1f} GiB, KV cache {kv_bytes / GIB:.1f} GiB ~ {kv_tokens:,} tokens "
                           f"= {kv_tokens // seq_len:,} sequences of {seq_len:,} (this GPU's batch: "
                           f"{math.ceil(cfg.rollout_batch_size / n):,})")
        if v.enable_sleep_mode:  # asleep, vLLM holds neither its KV cache nor its weights on the GPU
            notes[key] += f"; asleep during the update (level {v.sleep_level})"
        return c, notes, pool, 0 if v.enable_sleep_mode else pool
    rows = min(cfg.rollout.batch_size, math.ceil(cfg.rollout_batch_size / n))
    if n > 1 or cfg.model.dtype == "float16":  # float16: the engine samples from a float16 copy
        eb = _BYTES[cfg.model.dtype]
        c["torch engine weights"] = (a.params + a.lora_params) * eb
        notes["torch engine weights"] = f"an unsharded copy of the policy, {a.params + a.lora_params:,} x {eb} B, on every GPU"
    rows, seq_len, how = _torch_cache(cfg, rows, seq_len)
    c["torch engine KV cache"] = rows * seq_len * kv_per_token * cb
    notes["torch engine KV cache"] = f"{rows:,} sequences x {seq_len:,} tokens x {kv_per_token:,} x {cb} B{how}"
    weights = c.get("torch engine weights", 0)
    return c, notes, weights + c["torch engine KV cache"], weights


def _generator_engine(cfg: Config, a: Architecture, index: int, gpu: int | None, *, gpu_mem_gib: float,
                      pb: int) -> GeneratorUse:
    """The engine of generator `index` on GPU `gpu` (None: the CPU). vLLM on a GPU claims its
    gpu_memory_utilization share; on the CPU its weights and a fixed KV cache. The torch engine holds its
    own copy of the policy in model.dtype, a KV cache of rollout.batch_size sequences in the same dtype
    (no autocast in a generator), and on a GPU a CUDA-context allowance of its own process."""
    seq_len = cfg.data.max_prompt_tokens + cfg.rollout.max_new_tokens
    if _engine_owns_weights(cfg):
        v = cfg.rollout.vllm
        if gpu is not None:
            util = v.gpu_memory_utilization
            return GeneratorUse(index, gpu, "vLLM", int(util * gpu_mem_gib * GIB), util,
                                f"gpu_memory_utilization {util:g} x {gpu_mem_gib:g} GiB (weights, KV cache, activations)")
        from mathrl.rollout.vllm_engine import CPU_DEFAULT_KV_GB

        kv_gb = v.kv_cache_gb if v.kv_cache_gb is not None else CPU_DEFAULT_KV_GB
        vb = _vllm_bytes(cfg)
        return GeneratorUse(index, None, "vLLM", a.params * vb + int(kv_gb * GIB), None,
                            f"weights {a.params:,} x {vb} B + KV cache {kv_gb:g} GiB (rollout.vllm.kv_cache_gb)")
    rows, seq_len, how = _torch_cache(cfg, min(cfg.rollout.batch_size, cfg.rollout_batch_size), seq_len)
    kv_per_token = _kv_bytes_per_token(a)
    runtime = int(RUNTIME_GIB * GIB) if gpu is not None else 0
    note = (f"its own copy {a.params:,} x {pb} B + KV cache {rows:,} sequences x {seq_len:,} tokens x "
            f"{kv_per_token:,} x {pb} B{how}" + (f" + {RUNTIME_GIB:g} GiB runtime" if runtime else ""))
    return GeneratorUse(index, gpu, "torch", a.params * pb + rows * seq_len * kv_per_token * pb + runtime, None, note)


def _add_generators(plan: MemoryPlan, cfg: Config, *, pb: int) -> None:
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
    plan.generators = [_generator_engine(cfg, a, i, g, gpu_mem_gib=plan.gpu_mem_gib, pb=_BYTES[cfg.model.dtype]) for i, g in enumerate(chosen)]
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


def _device_loads(plan: MemoryPlan, *, host_mem_gib: float | None) -> list[DeviceLoad]:
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
        if shares and cfg.data.eval and gpu in plan.trainer_gpus and _engine_owns_weights(cfg):
            shares.insert(0, ("the trainer's evaluation engine", cfg.rollout.vllm.gpu_memory_utilization))
        if sum(s for _, s in shares) > 1:
            listed = " + ".join(f"{who} {s:g}" for who, s in shares)
            problems.append(f"{load.name}: vLLM shares {listed} = {sum(s for _, s in shares):g} > 1")
        elif not load.fits:
            problems.append(load.describe())
    if not problems:
        return None
    lower = "rollout.vllm.gpu_memory_utilization" if _engine_owns_weights(cfg) else "rollout.batch_size"
    return (f"rollout.generator: the generators do not fit: {'; '.join(problems)}; lower {lower} or give each "
            "generator a GPU of its own (rollout.generator.devices, fewer trainer ranks)")


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


# ---------------------------------------------------------------------------------------------------
# setup time: what the run does before its first step that the memory plan does not show
# ---------------------------------------------------------------------------------------------------
# Measured builds of the tiny base model, by its cache key (model/tiny.py:recipe_hash): minutes, and where.
# A test checks that the shipped recipes' keys are here, so a change of the base-model recipe shows.
MEASURED_BUILDS: dict[str, tuple[float, str]] = {
    "710f9396d286": (1.35, "the default recipe, 800 steps: 1 min 21 s on 2 AMD EPYC cores (README)"),
    "eb26bbf81fe3": (5.5, "recipes/arith_tools.yaml, 1500 steps: 5.5 min on 2 AMD EPYC cores (docs/findings.md)"),
    "72ba9bbaf988": (17.5, "recipes/arith_tools_mul.yaml, 1500 steps of 192 positions: 17.5 min on one AMD EPYC core "
                           "with the other busy (docs/findings.md)"),
}
_STEPS_OF_MEASURED = {"710f9396d286": 800, "eb26bbf81fe3": 1500, "72ba9bbaf988": 1500}


def setup_time(cfg: Config) -> str:
    """One line on what the run does before its first step: with the tiny base model, whether this
    recipe's base is cached, else how long its build took where it was measured, or an estimate from
    the measured builds (labelled so); with a hub id, whether it is in the local Hugging Face cache."""
    if cfg.model.path == TINY_BASE:
        from mathrl.model.tiny import base_model_dir, is_built, recipe_hash

        path = base_model_dir(cfg.base)
        if is_built(path):
            return f"setup: the tiny base model of this recipe is cached ({path}): no build"
        key = recipe_hash(cfg.base)
        first = f"setup: the tiny base model of this recipe is not cached: the run builds it first ({cfg.base.steps} pretraining steps"
        if key in MEASURED_BUILDS:
            return f"{first}; measured: {MEASURED_BUILDS[key][1]}; other CPUs and loads differ)"
        rates = [MEASURED_BUILDS[k][0] * 60 / n for k, n in _STEPS_OF_MEASURED.items()]  # seconds per pretraining step
        low, high = (cfg.base.steps * r / 60 for r in (min(rates), max(rates)))
        return (f"{first}; an estimate, not a measurement: {low:.0f}-{high:.0f} min, at the {min(rates):.2f}-{max(rates):.2f} s "
                "per step of the measured builds)")
    if parse_config_path(cfg.model.path) is not None:
        return "setup: random weights of a shipped architecture (model.init=random): nothing to download or build"
    from mathrl.model.paths import looks_like_hub_id

    if not looks_like_hub_id(cfg.model.path):
        return f"setup: loads {cfg.model.path} (a local directory): nothing to download or build"
    try:
        from huggingface_hub import try_to_load_from_cache
        cached = isinstance(try_to_load_from_cache(cfg.model.path, "config.json"), str)
    except Exception:  # pragma: no cover - transformers depends on it
        cached = False
    if cached:
        return f"setup: {cfg.model.path} is in the local Hugging Face cache: nothing to download"
    return f"setup: {cfg.model.path} is not in the local Hugging Face cache: the run downloads it first"

