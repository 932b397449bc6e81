"""Load and save Hugging Face causal LMs (safetensors weights, tokenizer files beside them); `full_tensor`
gathers a sharded (FSDP2) tensor whole, for saving and for the engines' weight sync."""

from __future__ import annotations

from pathlib import Path

import torch

from mathrl.cache import umask_modes
from mathrl.config import Config
from mathrl.model.dtypes import DTYPES
from mathrl.model.paths import looks_like_hub_id


class ModelLoadError(ValueError):
    pass


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor behind `t` (a DTensor, e.g. an FSDP2-sharded parameter, is gathered; a
    collective, so every rank must call it in the same order)."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def load_model_and_tokenizer(path: str | Path, *, dtype: str = "float32", device: str | torch.device = "cpu",
                             overrides: dict | None = None):
    """(model, tokenizer) from a local Hugging Face directory (or a hub id, where the machine has network).
    A directory holding a peft LoRA adapter (a LoRA run's checkpoint) gives its base model with the
    adapter merged in.

    `overrides` replace fields of the model's config.json at load time (e.g. max_position_embeddings,
    from model.max_position_embeddings).

    The tokenizer gets a pad token if it has none (the EOS token), since batched rollouts pad.
    `config:<name>` (with `model.init=random`) builds a shipped architecture with random weights
    instead (`model.init.build_random_model`, fixed seed: every load gives the same weights).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mathrl.model.init import build_random_model, parse_config_path

    architecture = parse_config_path(str(path))
    if architecture is not None:
        try:
            return build_random_model(architecture, dtype=dtype, device=device, overrides=overrides)
        except ValueError as e:
            raise ModelLoadError(f"model.path {str(path)!r}: {e}") from None
    local = Path(path)
    # a suffix marks a file name (model.bin), but not in a hub id: "Qwen/Qwen2.5-0.5B" has the suffix ".5-0"
    if not local.exists() and (str(path).startswith((".", "/", "~")) or (local.suffix and not looks_like_hub_id(str(path)))):
        raise ModelLoadError(f"model.path {str(path)!r} does not exist; give a Hugging Face model directory or hub id")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        if (local / "adapter_config.json").is_file() and not (local / "config.json").is_file():
            # a LoRA run's checkpoint (model.lora): its base model with the adapter merged in
            from peft import AutoPeftModelForCausalLM

            model = AutoPeftModelForCausalLM.from_pretrained(str(path), dtype=DTYPES[dtype], **(overrides or {})).merge_and_unload()
        else:
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=DTYPES[dtype], **(overrides or {}))
    except OSError as e:
        raise ModelLoadError(f"could not load a causal LM from {str(path)!r}: {e}") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.eos_token_id is None:
        raise ModelLoadError(f"the tokenizer at {str(path)!r} has no EOS token; rollouts could never stop")
    return model.to(device), tokenizer


def model_overrides(cfg: Config) -> dict | None:
    """Changes to the model's config.json made at load time (model.max_position_embeddings), for the
    trainer's models and the generators' copies; the vLLM engine gets the same through hf_overrides."""
    if cfg.model.max_position_embeddings is None:
        return None
    return {"max_position_embeddings": cfg.model.max_position_embeddings}


def save_model(model, tokenizer, out_dir: str | Path) -> Path:
    """Save as a standard Hugging Face directory: config.json, model.safetensors, tokenizer files."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    umask_modes(out)
    return out
