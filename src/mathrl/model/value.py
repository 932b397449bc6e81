"""The critic of PPO: a causal LM backbone with a scalar head, one value per position.

It is transformers' `AutoModelForTokenClassification` with `num_labels=1` (for Qwen2,
`Qwen2ForTokenClassification`): loaded from a causal LM it keeps the backbone and gets a new
`score` head, which is zero-initialised here so that every value starts at 0 (the advantages of the
first step are then the plain returns). Loaded from a saved critic it is used as it is. Dropout on
the head is off, so the values of the training pass equal those of the scoring pass.

The head's [B, L, 1] output is a view (torch computes a one-wide product as a matrix-vector product
and reshapes it). Returned by an FSDP2-sharded critic, a view draws FSDP2's warning that an in-place
op on it would skip the pre-backward all-gather; `_own_output` makes the head return a tensor of its own.
"""

from __future__ import annotations

from pathlib import Path

import torch

from mathrl.model.dtypes import DTYPES
from mathrl.model.io import ModelLoadError
from mathrl.model.scoring import packed_inputs

__all__ = ["load_critic", "response_values"]


def load_critic(path: str | Path, *, dtype: str = "float32", device: str | torch.device = "cpu"):
    """A critic from a causal LM directory (new zero head) or a saved critic directory."""
    from transformers import AutoConfig, AutoModelForTokenClassification

    from mathrl.model.init import architecture_config, build_random_model, parse_config_path

    architecture = parse_config_path(str(path))
    if architecture is not None:  # model.init=random: a random backbone of that architecture, zero head
        config = architecture_config(architecture)
        config.num_labels, config.classifier_dropout = 1, 0.0
        critic = build_random_model(config, dtype=dtype, device=device, head=AutoModelForTokenClassification)[0]
        with torch.no_grad():
            critic.score.weight.zero_()
        return _own_output(critic)
    try:
        config = AutoConfig.from_pretrained(str(path), num_labels=1)
        config.classifier_dropout = 0.0
        critic, info = AutoModelForTokenClassification.from_pretrained(
            str(path), config=config, dtype=DTYPES[dtype], output_loading_info=True
        )
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"could not load a critic from {str(path)!r}: {e}") from None
    if any(key.startswith("score.") for key in info["missing_keys"]):  # a fresh head on an LM backbone
        with torch.no_grad():
            critic.score.weight.zero_()
            if critic.score.bias is not None:
                critic.score.bias.zero_()
    return _own_output(critic.to(device))


def _own_output(critic):
    """The critic with a head whose output is not a view (module docstring); [B, L, 1] floats copied."""
    critic.score.register_forward_hook(lambda _module, _args, output: output.clone() if output._base is not None else output)
    return critic


def response_values(
    critic,
    prompt_ids: torch.Tensor,  # [B, P] left-padded
    prompt_mask: torch.Tensor,  # [B, P]
    response_ids: torch.Tensor,  # [B, T] right-padded
    response_mask: torch.Tensor,  # [B, T]
) -> torch.Tensor:
    """[B, T] float32 V(s_t): the critic's output at the position before response token t (the state
    that token t is sampled from), with the same layout and position ids as `response_logprobs`.
    Differentiable when grad is enabled; values at masked positions are meaningless."""
    input_ids, attention_mask, position_ids = packed_inputs(critic, prompt_ids, prompt_mask, response_ids, response_mask)
    out = critic(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits  # [B, P+T, 1]
    p, t = prompt_ids.shape[1], response_ids.shape[1]
    return out[:, p - 1 : p + t - 1, 0].float()
