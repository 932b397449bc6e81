"""The tiny base model: a ~1M-parameter Qwen2 with a character tokenizer, pretrained on arithmetic.

`mathrl train` with no arguments starts from it, so a complete RL experiment runs on a CPU in minutes
with nothing downloaded. It is an ordinary Hugging Face model directory, cached under $MATHRL_CACHE and
keyed by a hash of its recipe (`BaseModelConfig`); concurrent processes build it once
(`mathrl.cache.build_once`). Its pretraining text comes from a `pretraining_text(count, rng)` callable
that the caller passes in (`tasks/arithmetic.py:base_pretraining_text(cfg.base)`): (prompt, solution)
text pairs; the model learns the solution and EOS. What the slips (`slip_prob`), the self-checks
(`check_prob`) and the decimals (`decimal_share`) of that text teach it: docs/guide.md, "The tiny base model".

    mathrl base            # build (or find) the cached base model and print its path
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import random
import string
import time
from collections.abc import Callable
from pathlib import Path

import torch

from mathrl.cache import build_once
from mathrl.cache import cache_root as default_cache_root
from mathrl.config import TINY_BASE

BASE_FORMAT_VERSION = 2  # bump when the build code changes what a given recipe produces
PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
PretrainingText = Callable[[int, random.Random], list[tuple[str, str]]]
"""(count, rng) -> `count` (prompt, solution) text pairs, drawn from `rng` only."""


def build_char_tokenizer(vocab_size: int | None = None):
    """A character-level tokenizer over printable ASCII (one token per character), built locally.

    Tokens are spelled in the byte-level alphabet (space is "Ġ", newline "Ċ") with a byte-level
    pre-tokenizer and decoder: transformers 5 loads any `model_type: qwen2` directory with the
    Qwen2 byte-level tokenizer class, which would silently drop whitespace from a vocabulary written
    in plain characters. A BPE model with no merges then gives exactly one token per character.

    `vocab_size` pads the vocabulary with placeholder tokens `<id>` up to that many entries (a
    random-init model's, `model.init.random_init_tokenizer`): encoding is unchanged (the placeholders
    have no merges, so text never maps onto them); a sampled placeholder decodes as its id in angle
    brackets.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    to_symbol = _byte_level_symbols()
    chars = list(string.printable[:95]) + ["\n"]  # digits, letters, punctuation, space, newline
    tokens = [PAD, EOS, UNK, *(to_symbol[ord(c)] for c in chars)]
    if vocab_size is not None:
        if vocab_size < len(tokens):
            raise ValueError(f"vocab_size {vocab_size} is smaller than the character tokenizer ({len(tokens)} tokens)")
        tokens += [f"<{i}>" for i in range(len(tokens), vocab_size)]
    tok = Tokenizer(models.BPE({token: i for i, token in enumerate(tokens)}, [], unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=EOS, unk_token=UNK)


def _byte_level_symbols() -> dict[int, str]:
    """GPT-2's byte -> printable-symbol table used by byte-level tokenizers (its location inside
    transformers moves between versions, so it is spelled out here)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def recipe_hash(cfg) -> str:
    fields = dataclasses.asdict(cfg)
    for key in ("check_prob", "decimal_share", "tool_share"):  # added later: left out at 0 so the models built before them keep their hash
        if not fields.get(key):
            fields.pop(key, None)
    if not fields.get("mul_share"):  # likewise, with the factor size that only products use
        fields.pop("mul_share", None)
        fields.pop("mul_digits", None)
    payload = json.dumps({"version": BASE_FORMAT_VERSION, **fields}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def base_model_dir(cfg, cache_root: Path | None = None) -> Path:
    return (cache_root or default_cache_root()) / "base" / f"{TINY_BASE}-{recipe_hash(cfg)}"


def _encode_batch(tokenizer, pretraining_text: PretrainingText, rng: random.Random, batch_size: int):
    """A batch of pretraining pairs as (input_ids, labels) with loss on the solution and EOS only."""
    rows = []
    for prompt, solution in pretraining_text(batch_size, rng):
        rows.append((tokenizer(prompt)["input_ids"], tokenizer(solution)["input_ids"] + [tokenizer.eos_token_id]))
    width = max(len(p) + len(s) for p, s in rows)
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (p, s) in enumerate(rows):
        input_ids[i, : len(p) + len(s)] = torch.tensor(p + s)
        labels[i, len(p) : len(p) + len(s)] = torch.tensor(s)
    return input_ids, labels


def build_base_model(
    cfg,
    out_dir: Path,
    *,
    pretraining_text: PretrainingText,
    progress: Callable[[int, int, float], None] | None = None,
) -> Path:
    """Pretrain the tiny model described by `cfg` (a `BaseModelConfig`) on `pretraining_text` and
    save it into `out_dir`. The text must follow `cfg` (`base_pretraining_text(cfg)`): the cache key
    is the recipe's hash. `ensure_base_model` passes a temporary directory that it renames into the
    cache once the model is complete.
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    tokenizer = build_char_tokenizer()
    model_cfg = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    model = Qwen2ForCausalLM(model_cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), weight_decay=0.01)

    def lr_at(step: int) -> float:  # linear warm-up, then cosine decay to 10% of the peak
        if step < cfg.warmup_steps:
            return cfg.lr * (step + 1) / cfg.warmup_steps
        frac = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
        return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))

    model.train()
    for step in range(cfg.steps):
        input_ids, labels = _encode_batch(tokenizer, pretraining_text, rng, cfg.batch_size)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        loss = model(input_ids=input_ids, attention_mask=(input_ids != tokenizer.pad_token_id).long(), labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if progress is not None:
            progress(step + 1, cfg.steps, loss.item())

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    (out_dir / "mathrl_base.json").write_text(
        json.dumps({"recipe": dataclasses.asdict(cfg), "version": BASE_FORMAT_VERSION, "built_at": time.time()}, indent=2)
    )
    return out_dir


def is_built(path: Path) -> bool:
    """True when `path` holds a finished base model (its weights are written last, then it is renamed in)."""
    return (Path(path) / "model.safetensors").exists()


def ensure_base_model(cfg, *, pretraining_text: PretrainingText, cache_root: Path | None = None, progress=None,
                      on_build_start=None, on_wait=None) -> Path:
    """Path of the cached base model for `cfg`, building it first (from `pretraining_text`) if it is
    not cached yet. Safe with several processes at once (`cache.build_once`): one builds, calling
    `on_build_start(path)` first; the others pass one line to `on_wait` (default: stderr), wait for it
    and use its model."""
    out = base_model_dir(cfg, cache_root)

    def build(tmp: Path) -> None:
        if on_build_start is not None:
            on_build_start(out)
        build_base_model(cfg, tmp, pretraining_text=pretraining_text, progress=progress)

    return build_once(out, build, is_complete=is_built, on_wait=on_wait)
