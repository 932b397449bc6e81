"""Real architectures with random weights, built from configs shipped in the package (no download).

`model.path=config:<name> model.init=random` trains, benchmarks or smoke-tests a model of real size
(Qwen2.5-0.5B ... Qwen2.5-Math-7B) with no network and no checkpoint: `configs/<name>.json` holds the
architecture numbers of each model's public `config.json`; `config:<path>.json` builds any other
Hugging Face causal-LM config file. The tokenizer is the tiny base model's character tokenizer
(`model.tiny.build_char_tokenizer`) padded with placeholder tokens `<id>` to the real vocabulary, so
compute and memory are the real model's; it knows nothing, and rewards stay at zero. Weights are drawn
with the architecture's own initialiser under a fixed seed in a private RNG scope: building twice gives
the same model, and the caller's random state is untouched. Details: docs/guide.md, "Real sizes without
downloads".

    from mathrl.model.init import build_random_model, architecture_names
    model, tokenizer = build_random_model("qwen2.5-0.5b", dtype="bfloat16", device="cuda")
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import torch

__all__ = [
    "CONFIG_PREFIX",
    "architecture_names",
    "architecture_config",
    "build_random_model",
    "random_init_tokenizer",
    "parse_config_path",
]

from mathrl.config import CONFIG_PREFIX, parse_config_path
from mathrl.model.dtypes import DTYPES
from mathrl.registry import ARCHITECTURES

CONFIG_DIR = Path(__file__).with_name("configs")


def architecture_names() -> list[str]:
    """Names of the architectures shipped in `model/configs/` (file stems), sorted."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.json"))


for _path in sorted(CONFIG_DIR.glob("*.json")):  # the names model.path=config:<name> accepts
    ARCHITECTURES.register(_path.stem, _path)


def _config_file(name_or_path: str) -> Path:
    if name_or_path in architecture_names():
        return CONFIG_DIR / f"{name_or_path}.json"
    path = Path(name_or_path).expanduser()
    if path.suffix == ".json" and path.is_file():
        return path
    raise ValueError(
        f"unknown architecture {name_or_path!r}: give one of {', '.join(architecture_names())} "
        "or the path of a Hugging Face config.json file"
    )


def architecture_config(name_or_path: str, *, vocab_size: int | None = None):
    """The transformers config of a shipped architecture (name) or of a config.json file (path).

    The EOS / BOS / pad ids are those of the random-init tokenizer (see the module docstring).
    `vocab_size` overrides the architecture's (tests build small variants this way).
    """
    from transformers import AutoConfig

    raw = json.loads(_config_file(name_or_path).read_text())
    raw.pop("_name_or_path", None)
    raw.pop("torch_dtype", None)  # the checkpoint's storage dtype; build_random_model chooses the dtype
    model_type = raw.pop("model_type", None)
    if model_type is None:
        raise ValueError(f"{name_or_path}: config has no model_type")
    if vocab_size is not None:
        raw["vocab_size"] = vocab_size
    raw.update(pad_token_id=_PAD_ID, eos_token_id=_EOS_ID, bos_token_id=None)
    return AutoConfig.for_model(model_type, **raw)


_PAD_ID, _EOS_ID = 0, 1  # ids of <pad> and <eos> in the character tokenizer (model.tiny)


@lru_cache(maxsize=4)
def random_init_tokenizer(vocab_size: int):
    """The character tokenizer padded with placeholder tokens `<id>` to `vocab_size` entries
    (`model.tiny.build_char_tokenizer`)."""
    from mathrl.model.tiny import build_char_tokenizer

    out = build_char_tokenizer(vocab_size)
    assert (out.pad_token_id, out.eos_token_id) == (_PAD_ID, _EOS_ID)
    return out


def build_random_model(
    name_or_config,
    *,
    dtype: str | torch.dtype = "float32",
    device: str | torch.device = "cpu",
    seed: int = 0,
    head=None,
    overrides: dict | None = None,
):
    """(model, tokenizer): the architecture `name_or_config` (a shipped name, a config.json path or
    a transformers config object) with weights drawn from its initialiser under `seed`.

    The model is built directly on `device` in `dtype` (a 7B model never exists in float32 on the
    CPU when asked for bfloat16 on a GPU). Same arguments, same weights. `head` is the transformers
    auto class to build (default `AutoModelForCausalLM`; the critic uses
    `AutoModelForTokenClassification`). `overrides` set fields of the config first.
    """
    from transformers import AutoModelForCausalLM

    head = head or AutoModelForCausalLM
    config = architecture_config(name_or_config) if isinstance(name_or_config, (str, Path)) else name_or_config
    for key, value in (overrides or {}).items():  # config fields changed at load time (model.max_position_embeddings)
        setattr(config, key, value)
    torch_dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype
    device = torch.device(device)
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        previous = torch.get_default_dtype()
        torch.set_default_dtype(torch_dtype)  # parameters are created in this dtype
        try:
            with device:
                model = head.from_config(config)
        finally:
            torch.set_default_dtype(previous)
    model.to(torch_dtype)  # transformers may also take a dtype from the config object; the caller's wins
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.pad_token_id = _PAD_ID
        model.generation_config.eos_token_id = _EOS_ID
    return model, random_init_tokenizer(config.vocab_size)
