"""The model side of the memory plan (plan/memory.py): the numbers of a decoder-only model that memory
depends on, with exact parameter counts from modules built on the meta device (no memory, no weights,
no download), and the byte sizes the plan counts in.
"""

from __future__ import annotations

from dataclasses import dataclass

from mathrl.config import TINY_BASE, Config, parse_config_path

__all__ = ["Architecture", "architecture_of"]

GIB = 2**30
RUNTIME_GIB = 1.0  # CUDA context + cuBLAS workspace + NCCL buffers per GPU: an allowance, not a derivation
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


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


def hf_config(cfg: Config, path: str | None = None, field: str = "model.path"):
    """The transformers config of `path` (default `model.path`; `field` names it in the error), without
    downloading anything."""
    from transformers import AutoConfig, Qwen2Config

    from mathrl.model.init import architecture_config
    from mathrl.model.paths import shipped_architecture_of

    path = cfg.model.path if path is None else path
    arch = parse_config_path(path) or shipped_architecture_of(path)
    if arch is not None:  # config:<name>, or a hub id whose architecture ships with mathrl
        return architecture_config(arch)
    if path == TINY_BASE:
        b = cfg.base
        # the tiny base model: the character tokenizer's 99 tokens (model.tiny.build_char_tokenizer), tied head
        return Qwen2Config(vocab_size=99, hidden_size=b.hidden_size, intermediate_size=b.intermediate_size,
                           num_hidden_layers=b.num_layers, num_attention_heads=b.num_heads,
                           num_key_value_heads=b.num_kv_heads, max_position_embeddings=b.max_positions,
                           tie_word_embeddings=True)
    try:
        return AutoConfig.from_pretrained(path, local_files_only=True)
    except OSError:
        raise ValueError(
            f"{field}={path!r}: its config.json is not on this machine; give a local model directory, "
            f"or plan with the architecture alone: {field}=config:<name>"
            + (" model.init=random" if field == "model.path" else "")
        ) from None


def architecture_of(cfg: Config, teacher: bool = False) -> Architecture:
    """Exact parameter counts of the policy (and of its critic), from modules built on the meta device;
    `teacher`: of teacher.path's model instead (no LoRA adapters: it is frozen)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    hf = hf_config(cfg, cfg.teacher.path, "teacher.path") if teacher else hf_config(cfg)
    with torch.device("meta"):
        lm = AutoModelForCausalLM.from_config(hf)
        hf.num_labels = 1
        critic = AutoModelForTokenClassification.from_config(hf)
    layer = lm.model.layers[0]
    lora = [0, 0]
    if cfg.model.lora.r > 0 and not teacher:  # the adapters peft builds on these modules (still on the meta device)
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
