"""LoRA adapters with peft: only the low-rank matrices train, the base weights stay frozen (docs/lora.md).

    model = add_adapters(base_model, cfg.model.lora)     # a peft PeftModel; model.lora.r > 0
    with model.disable_adapter():                         # the base model: the KL reference, no copy
        ...
    weights = plain_weights(model)                        # W + (alpha / r) B A, base model names
    engine.update_weights(stream_plain_weights(model))   # the same, one tensor at a time (sharded too)

A targeted linear layer computes `W x + (alpha / r) * B A x` (Hu et al. 2021, eq. 3; peft's `lora.Linear`
with `fan_in_fan_out=False`). An engine that holds plain weights (vLLM) gets the merged weights under the
base model's names after every update, computed from a state dict, so an FSDP2-sharded model works too
(tests/model/test_lora.py). `stream_plain_weights` gathers, merges and releases one tensor at a time as
the consumer pulls it (tests/model/test_lora_stream.py). On disk an adapter is peft's own format
(`adapter_config.json`, `adapter_model.safetensors`), what `PeftModel.from_pretrained` reads.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import torch

from mathrl.model.io import full_tensor

__all__ = ["ADAPTER_CONFIG", "add_adapters", "adapter_params", "has_adapter", "is_lora", "load_adapter_weights",
           "merge_lora", "merged_weights", "plain_weights", "stream_plain_weights", "unwrap"]

ADAPTER_CONFIG = "adapter_config.json"
_ADAPTER = "default"  # peft's name of the one adapter a run trains
_PREFIX = "base_model.model."  # what PeftModel puts before the base model's own names


class LoraError(ValueError):
    pass


def add_adapters(model, settings, *, seed: int = 0):
    """`model` (a Hugging Face causal LM, on the CPU) wrapped in a peft PeftModel with fresh LoRA
    adapters on `settings.target_modules`; every base parameter is frozen. B starts at zero, so the
    adapted model is the base model until the first update. A is drawn under `seed` in a private RNG
    scope: the same A whatever ran before (a freshly built base model, another copy), and the
    caller's random state is untouched."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=settings.r, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
                        target_modules=list(settings.target_modules), task_type="CAUSAL_LM", bias="none")
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return get_peft_model(model, config)
    except ValueError as e:  # e.g. "Target modules {...} not found in the base model"
        names = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
        raise LoraError(f"model.lora.target_modules={list(settings.target_modules)}: {str(e).splitlines()[0]}; "
                        f"the model's linear layers are named {names}") from None


def is_lora(model) -> bool:
    """Whether `model` is a peft PeftModel (FSDP2-sharded or not). A run without adapters never
    imports peft: until something has, no model can be one."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def unwrap(model):
    """The Hugging Face model inside a PeftModel (its LoRA layers still in place); `model` otherwise."""
    return model.get_base_model() if is_lora(model) else model


def has_adapter(directory: str | Path) -> bool:
    """Whether `directory` holds a peft adapter (a LoRA run's checkpoint, final/adapter)."""
    return (Path(str(directory)) / ADAPTER_CONFIG).is_file()


def load_adapter_weights(model, directory: str | Path) -> None:
    """Load the adapter saved in `directory` (PeftModel.save_pretrained) into `model`'s adapter."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    path = Path(directory) / "adapter_model.safetensors"
    if not path.is_file():
        raise LoraError(f"{directory} has {ADAPTER_CONFIG} but no adapter_model.safetensors")
    result = set_peft_model_state_dict(model, load_file(str(path)))
    wrong = list(result.unexpected_keys) + [k for k in result.missing_keys if ".lora_" in k]
    if wrong:
        raise LoraError(f"the adapter in {directory} does not fit the model (model.lora.target_modules or r "
                        f"differ from the run that saved it): {wrong[:3]}")


def adapter_params(model) -> list[torch.nn.Parameter]:
    """The parameters that train: the adapters' (every parameter of a model without adapters)."""
    return [p for p in model.parameters() if p.requires_grad]


def merge_lora(w: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, scaling: float) -> torch.Tensor:
    """One adapted layer's plain weight: W + scaling * B @ A, computed in float32, returned in W's dtype.

    w: [out, in] (the base layer's weight), a: [r, in] (lora_A), b: [out, r] (lora_B) -> [out, in].
    """
    delta = scaling * (b.detach().float() @ a.detach().float())  # [out, r] @ [r, in]
    return (w.detach().float() + delta).to(w.dtype)


def merged_weights(state: dict[str, torch.Tensor], *, scaling: float) -> dict[str, torch.Tensor]:
    """A PeftModel's state dict as the base model's state dict with the adapters merged in.

    state: PeftModel names (`base_model.model.<name>`; adapted layers hold `<layer>.base_layer.weight`
    [out, in], `<layer>.lora_A.default.weight` [r, in] and `<layer>.lora_B.default.weight` [out, r]).
    Returns `<name> -> tensor` with `<layer>.weight = W + scaling * B @ A` (`merge_lora`) and every
    other tensor unchanged (the same tensor objects).
    """
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if ".lora_" in name:
            continue
        plain, adapted = _plain_name(name)
        if adapted:
            a, b = _adapter_names(plain)
            tensor = merge_lora(tensor, state[a], state[b], scaling=scaling)
        out[plain] = tensor
    return out


def plain_weights(model, state: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The weights an engine without adapters (vLLM) loads to sample from `model`: for a PeftModel the
    merged weights under the base model's names, else the state dict itself. `state` is `model`'s state
    dict (default `model.state_dict()`; give the gathered full tensors of a sharded model)."""
    state = model.state_dict() if state is None else state
    if not is_lora(model):
        return dict(state)
    return merged_weights(state, scaling=lora_scaling(model))


def stream_plain_weights(model) -> Iterator[tuple[str, torch.Tensor]]:
    """`plain_weights(model, <its whole state dict>)`, one (name, tensor) at a time, in state dict order.

    Each tensor is made whole when the consumer pulls it: a DTensor (an FSDP2 shard) is gathered with
    `full_tensor()`, a collective, so every rank must pull the whole stream, as every rank's engine does;
    all ranks gather the same tensors in the same order. An adapted layer's weight gathers W [out, in],
    A [r, in] and B [out, r] and yields `merge_lora(W, A, B)`, bit for bit what `plain_weights` gives for
    the gathered state dict; the adapters themselves are not yielded. The stream keeps nothing it has
    yielded, so the extra memory is one module's whole tensors, not the model's. The gathered tensors
    stay on the shards' device. A model without adapters streams its own state dict (made whole).

    Checks (an unsupported adapter config) run at the call, before anything is pulled.
    """
    state = model.state_dict()  # the parameters themselves (a sharded model: its DTensor shards, no copy)
    scaling = lora_scaling(model) if is_lora(model) else None
    return _stream(state, scaling)


def _stream(state: dict[str, torch.Tensor], scaling: float | None) -> Iterator[tuple[str, torch.Tensor]]:
    for name, tensor in state.items():
        if scaling is None:  # no adapters: the state dict itself
            plain, adapted = name, False
        elif ".lora_" in name:  # an adapter matrix: gathered with its layer's weight
            continue
        else:
            plain, adapted = _plain_name(name)
        whole = full_tensor(tensor)
        if adapted:
            a, b = _adapter_names(plain)
            whole = merge_lora(whole, full_tensor(state[a]), full_tensor(state[b]), scaling=scaling)
        yield plain, whole
        del whole  # released before the next tensor is gathered (the consumer may still hold it)


def lora_scaling(model) -> float:
    """alpha / r of `model`'s adapter; raises LoraError for configs the merge does not cover."""
    config = model.peft_config[_ADAPTER]
    if config.use_rslora or config.rank_pattern or config.alpha_pattern:
        raise LoraError("merging supports one rank and alpha for every layer (no rslora, rank_pattern, alpha_pattern)")
    return config.lora_alpha / config.r


def _plain_name(name: str) -> tuple[str, bool]:
    """(the base model's name, whether it is an adapted layer's weight) of a PeftModel state dict entry
    that is not an adapter matrix: `base_model.model.<layer>.base_layer.<kind>` -> `<layer>.<kind>`."""
    name = name.removeprefix(_PREFIX)
    if ".base_layer." not in name:
        return name, False
    layer, kind = name.split(".base_layer.")
    return f"{layer}.{kind}", kind == "weight"


def _adapter_names(plain: str) -> tuple[str, str]:
    """The state dict names of A and B of adapted layer weight `plain` (`<layer>.weight`)."""
    layer = plain.removesuffix(".weight")
    return f"{_PREFIX}{layer}.lora_A.{_ADAPTER}.weight", f"{_PREFIX}{layer}.lora_B.{_ADAPTER}.weight"
