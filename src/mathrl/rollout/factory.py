"""`build_engine`: the configured rollout engine (rollout.engine) for a loaded policy.

The training loop, in-training evaluation and `mathrl eval` build their engine here and use it only
through the `rollout.base.Engine` protocol; adding an engine means one module and one branch below.

    model, tokenizer = load_model_and_tokenizer(path)
    engine = build_engine(cfg, model=model, tokenizer=tokenizer, model_path=path)
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from mathrl.rollout.base import Engine
from mathrl.rollout.engine import TorchEngine


def engine_samples_from_module(engine: str) -> bool:
    """Whether rollout.engine=`engine` samples from the trainer's torch module (so that several ranks
    need an unsharded copy of it): the torch engine does; vLLM loads and holds its own weights."""
    return engine == "torch"


def build_engine(cfg, *, model, tokenizer, model_path: str | Path) -> Engine:
    """The engine of `cfg.rollout.engine` sampling from `model` (a `config.Config`; `model_path` is the
    directory `model` was loaded from, e.g. the checkpoint a resumed run restored).

    torch: samples from `model` itself. vllm: a vLLM engine loaded from `model_path`; when that is not a
    local model directory (a random-init `config:<name>` model, a hub id) vLLM starts from the model's
    config with placeholder weights and the policy's weights are synced into it before it is returned.
    """
    if cfg.rollout.engine == "torch":
        return TorchEngine(model, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                           batch_size=cfg.rollout.batch_size)
    if cfg.rollout.engine == "vllm":
        from mathrl.rollout.vllm_engine import VLLMEngine

        common = dict(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                      settings=cfg.rollout.vllm, seed=cfg.seed, dtype=cfg.model.dtype,
                      max_position_embeddings=cfg.model.max_position_embeddings)
        local = Path(str(model_path)).expanduser()
        if (local / "config.json").is_file() and any(local.glob("*.safetensors")):
            return VLLMEngine(local, **common)
        config_dir = Path(tempfile.mkdtemp(prefix="mathrl-vllm-config-"))
        model.config.to_json_file(config_dir / "config.json")
        engine = VLLMEngine(config_dir, load_format="dummy", **common)
        engine.update_weights(model.state_dict().items())
        return engine
    raise ValueError(f"rollout.engine={cfg.rollout.engine!r} is not an engine; choose torch or vllm")
