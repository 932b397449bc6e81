"""Which model a config names, and what its files say before anything loads: the cached tiny base
model (built on first use) or `model.path`; whether a path can be loaded at all, and its context
length, read from config.json without loading or downloading the model.

The config checks both before anything loads (`Config.validate`, through `config.MODEL_FILES`: the
config is a lower layer than model/), and `mathrl plan` builds its architecture from the same files.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from mathrl.config import MODEL_FILES, TINY_BASE, Config, parse_config_path
from mathrl.registry import ARCHITECTURES

if TYPE_CHECKING:
    from mathrl.model.tiny import PretrainingText

__all__ = ["TINY_BASE", "context_length", "looks_like_hub_id", "model_path_problem", "resolve_model_path", "shipped_architecture_of"]

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # org/name
_OFFLINE_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


def resolve_model_path(cfg: Config, console: Console, *, pretraining_text: PretrainingText) -> str:
    """The model directory to load: the cached tiny base model (built now from `pretraining_text`,
    `tasks/arithmetic.py:base_pretraining_text(cfg.base)`, if missing) or `model.path`."""
    if cfg.model.path != TINY_BASE:
        return cfg.model.path
    from mathrl.model.tiny import base_model_dir, ensure_base_model, is_built
    from mathrl.track.console import BuildProgress

    out = base_model_dir(cfg.base)
    if is_built(out):
        console.print(f"using the cached tiny base model {out}")
        return str(out)
    with contextlib.ExitStack() as stack:
        bars = []

        def start(path) -> None:  # only the process that builds it shows a bar; the others wait (one line)
            console.print(f"[bold]building the tiny base model[/bold] (once; cached at {path})")
            bars.append(stack.enter_context(BuildProgress(console, total=cfg.base.steps)))

        path = ensure_base_model(cfg.base, pretraining_text=pretraining_text, on_build_start=start,
                                 progress=lambda *a: bars[0].update(*a),
                                 on_wait=lambda line: console.print(line, markup=False, highlight=False))
    return str(path)


def looks_like_hub_id(path: str) -> bool:
    """Whether `path` reads as a Hugging Face hub id `org/name` rather than a local path."""
    return not path.startswith(("/", ".", "~")) and bool(_HUB_ID.match(path))


def model_path_problem(path: str) -> str | None:
    """Why `path` cannot be a model to load, or None: a local Hugging Face directory (with config.json),
    or a hub id `org/name` (which must be in the local cache when the hub cannot be reached: HF_HUB_OFFLINE
    set, or no connection to it). Checked before
    anything loads: a bare name that is neither would otherwise be tried against the hub, with retries."""
    local = Path(path).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            return ("is a directory but not a Hugging Face model (no config.json); give the directory that holds "
                    "config.json, the weights and the tokenizer files")
        return None
    if local.exists():
        return "is a file; give a Hugging Face model directory (with config.json) or a hub id such as Qwen/Qwen2.5-Math-1.5B"
    hint = f"give a Hugging Face model directory, a hub id such as Qwen/Qwen2.5-Math-1.5B, or {TINY_BASE}"
    if not looks_like_hub_id(path) or Path(path.split("/")[0]).is_dir():
        return f"does not exist ({hint})"
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - transformers depends on it
        return None
    if isinstance(try_to_load_from_cache(path, "config.json"), str):
        return None  # cached: loads without the network
    offline = offline_variable()
    why = f"offline: {offline} is set" if offline else hub_unreachable()
    if why is None:
        return None  # the hub answers: the model is downloaded when the run loads it
    return (f"looks like a hub id but is not in the local Hugging Face cache and the hub is unreachable ({why}): "
            f"download it first with `hf download {path}` where the hub is reachable (copy the cache, "
            "HF_HUB_CACHE, here if that is another machine), or give a local model directory")


def offline_variable() -> str | None:
    """The variable that keeps the Hugging Face libraries offline here (HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE), or None."""
    return next((v for v in _OFFLINE_VARS if os.environ.get(v, "").lower() in ("1", "true", "yes", "on")), None)


def hub_unreachable(timeout_s: float = 3.0) -> str | None:
    """Why the Hugging Face hub (HF_ENDPOINT) cannot be reached from here, or None when a TCP connection
    to it opens within `timeout_s`. Checked only for a hub id that is not cached: without it an offline
    machine would fail after the run directory was made, and name the id a missing path."""
    import socket
    from urllib.parse import urlparse

    endpoint = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = endpoint.hostname or "huggingface.co", endpoint.port or (80 if endpoint.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as e:
        return f"offline: no connection to {host}:{port}, {e.strerror or type(e).__name__}"
    return None


def shipped_architecture_of(hub_id: str) -> str | None:
    """The shipped architecture (`registry.ARCHITECTURES`: name -> config.json path) whose source model
    is the Hugging Face hub id `hub_id` (the `_name_or_path` in its config file, compared
    case-insensitively), or None. Lets a recipe that names a hub model be checked and planned on a
    machine that has never downloaded it."""
    for name in ARCHITECTURES.names():
        source = json.loads(Path(ARCHITECTURES.get(name)).read_text()).get("_name_or_path", "")
        if source.lower() == hub_id.lower():
            return name
    return None


def context_length(model_path: str) -> int | None:
    """max_position_embeddings of `model_path` (see `config_value`)."""
    return config_value(model_path, "max_position_embeddings")


def vocab_size(model_path: str) -> int | None:
    """vocab_size of `model_path`'s config.json (see `config_value`): a teacher must share the student's."""
    return config_value(model_path, "vocab_size")


def config_value(model_path: str, key: str) -> int | None:
    """An integer entry (`key`) of the config of `model_path` without loading or downloading anything: a shipped
    architecture (config:<name>, or a hub id it was taken from), a config:<file>.json, or a local model
    directory's config.json (also the Hugging Face cache's copy of a hub id); None when unknown."""
    arch = parse_config_path(model_path) or shipped_architecture_of(model_path)
    if arch is not None:
        files = [Path(ARCHITECTURES.get(arch)) if arch in ARCHITECTURES.names() else Path(arch).expanduser()]
    else:
        files = [Path(model_path).expanduser() / "config.json"]
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(model_path, "config.json")
            if isinstance(cached, str):
                files.append(Path(cached))
        except Exception:  # not a hub id, or no hub library: unknown
            pass
    for f in files:
        if f.is_file():
            data = json.loads(f.read_text())
            value = data.get("text_config", data).get(key)
            return int(value) if value is not None else None
    return None


MODEL_FILES.register("path_problem", model_path_problem)
MODEL_FILES.register("context_length", context_length)
MODEL_FILES.register("vocab_size", vocab_size)
