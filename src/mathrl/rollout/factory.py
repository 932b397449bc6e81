"""`build_engine`: the configured rollout engine (rollout.engine) for a loaded policy.

The training loop, in-training evaluation and `mathrl eval` build their engine here and use it only
through the `rollout.base.Engine` protocol. Each engine is registered by name
(`mathrl.registry.ENGINES`) with its build function and whether its sampling logprobs are the
trainer's own; adding an engine is one build function and one registration.

    model, tokenizer = load_model_and_tokenizer(path)
    engine = build_engine(cfg, model=model, tokenizer=tokenizer, model_path=path)
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mathrl.config.shared import ConfigError
from mathrl.model.lora import plain_weights
from mathrl.registry import ENGINES
from mathrl.rollout.base import Engine
from mathrl.rollout.engine import TorchEngine
from mathrl.rollout.episodes import ToolUse, call_format, note_room


@dataclass(frozen=True)
class EngineSpec:
    build: Callable[..., Engine]  # (cfg, *, model, tokenizer, model_path) -> Engine
    # its sampling logprobs are the trainer's own to float rounding (same weights, same kernels), so they
    # may stand in for the old-policy logprobs (train.old_logprobs; Config.engine_logprobs_not_old)
    logprobs_match_trainer: bool
    # its settings' problems that can be judged before anything loads, one message each (Config.validate)
    check: Callable[..., list[str]] = lambda cfg: []
    # it samples from the trainer's torch module (so several ranks need an unsharded copy of it); vLLM
    # loads and holds its own weights
    samples_from_module: bool = False


def engine_samples_from_module(engine: str) -> bool:
    """Whether rollout.engine=`engine` samples from the trainer's torch module (so that several ranks
    need an unsharded copy of it)."""
    return ENGINES.get(engine).samples_from_module


def build_engine(cfg, *, model, tokenizer, model_path: str | Path) -> Engine:
    """The engine of `cfg.rollout.engine` sampling from `model` (a `config.Config`; `model_path` is the
    directory `model` was loaded from, e.g. the checkpoint a resumed run restored)."""
    return ENGINES.get(cfg.rollout.engine).build(cfg, model=model, tokenizer=tokenizer, model_path=model_path)


def build_tool_use(cfg, tokenizer) -> ToolUse | None:
    """The tools of `cfg.rollout.tools` in a pool, with the call format and the episode limits; None
    without tools (single-turn responses). The engine that holds it closes the pool."""
    r = cfg.rollout
    if not r.tools:
        return None
    need = note_room(tokenizer)  # the config's check counts a token per character; a tokenizer may spend more
    if r.observation_max_tokens < need:
        raise ConfigError(f"rollout.observation_max_tokens={r.observation_max_tokens} leaves no room for the note a cut "
                          f"observation carries ({need - 2} tokens with this tokenizer, and a token of output either "
                          f"side); use >= {need}")
    from mathrl.tools import ToolPool, ToolSpec

    pool = ToolPool([ToolSpec(name=t.name, fn=t.fn, kwargs=dict(t.kwargs), timeout_s=t.timeout_s,
                              description=t.description) for t in r.tools], workers=r.tool_workers)
    return ToolUse(fmt=call_format(r.tool_format, r.tool_tags), pool=pool, tokenizer=tokenizer, max_turns=r.max_turns,
                   max_tool_calls=r.max_tool_calls, observation_max_tokens=r.observation_max_tokens)


def build_torch_engine(cfg, *, model, tokenizer, model_path: str | Path) -> Engine:
    """Samples from `model` itself."""
    return TorchEngine(model, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                       batch_size=cfg.rollout.batch_size, tools=build_tool_use(cfg, tokenizer),
                       decode=cfg.rollout.decode, tool_delay_steps=cfg.rollout.tool_delay_steps, draws=cfg.rollout.draws)


def build_vllm_engine(cfg, *, model, tokenizer, model_path: str | Path) -> Engine:
    """A vLLM engine loaded from `model_path`; when that is not a local model directory (a random-init
    `config:<name>` model, a hub id) vLLM starts from the model's config with placeholder weights and
    the policy's weights are synced into it before it is returned."""
    from mathrl.rollout.vllm_engine import VLLMEngine

    common = dict(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                  settings=cfg.rollout.vllm, seed=cfg.seed, dtype=cfg.model.dtype,
                  max_position_embeddings=cfg.model.max_position_embeddings, tools=build_tool_use(cfg, tokenizer))
    local = Path(str(model_path)).expanduser()
    if (local / "config.json").is_file() and any(local.glob("*.safetensors")):
        return VLLMEngine(local, **common)
    config_dir = Path(tempfile.mkdtemp(prefix="mathrl-vllm-config-"))
    model.config.to_json_file(config_dir / "config.json")
    engine = VLLMEngine(config_dir, load_format="dummy", **common)
    engine.update_weights(plain_weights(model).items())  # a LoRA policy: merged, under the base model's names
    return engine


def check_vllm_settings(cfg) -> list[str]:
    """rollout.vllm: the settings that can be judged before vLLM (or the model) is loaded."""
    v, errors = cfg.rollout.vllm, []
    longest = max(cfg.rollout.max_new_tokens, cfg.eval_max_new_tokens)
    if v.max_model_len is not None and v.max_model_len <= longest:
        errors.append(f"rollout.vllm.max_model_len={v.max_model_len} leaves no room for a prompt before "
                      f"{longest} new tokens; raise it or lower rollout.max_new_tokens / eval.max_new_tokens")
    if v.tensor_parallel_size != 1:
        errors.append(f"rollout.vllm.tensor_parallel_size={v.tensor_parallel_size}: the colocated engine runs one "
                      "unsharded vLLM per training process; use 1 (scale out with more training processes)")
    if v.sleep_level != 1 and not v.enable_sleep_mode:
        errors.append("rollout.vllm.sleep_level is set but rollout.vllm.enable_sleep_mode is false")
    import importlib.util

    from mathrl.rollout.vllm_engine import INSTALL_HINT

    if importlib.util.find_spec("vllm") is None:  # cheap; an install that fails to import is caught at engine start
        errors.append(f"rollout.engine=vllm but vLLM is not installed; {INSTALL_HINT}")
    return errors


ENGINES.register("torch", EngineSpec(build_torch_engine, logprobs_match_trainer=True, samples_from_module=True))
ENGINES.register("vllm", EngineSpec(build_vllm_engine, logprobs_match_trainer=False, check=check_vllm_settings))

