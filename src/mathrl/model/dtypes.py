"""The dtypes `model.dtype` names, as torch dtypes: read by the loaders (model/io.py, model/value.py) and
the random-weight builder (model/init.py), which import nothing else from each other for it.

float32 and bfloat16 are the weights' own dtype: the trainer holds and computes in it. float16 is
mixed precision (arXiv 2510.26788, "Defeating the Training-Inference Mismatch via FP16"): the trainer
holds float32 master weights and optimizer state and runs its forward/backward under float16 autocast,
the loss scaled by a dynamic loss scaler (train/update.py); the rollout engines hold float16 weights.
"""

from __future__ import annotations

import contextlib

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def trainer_dtype(name: str) -> str:
    """The dtype the trainer loads its models in for `model.dtype=name`: float32 master weights for
    float16, else `name` itself."""
    return "float32" if name == "float16" else name


def autocast(name: str, device: torch.device | str) -> contextlib.AbstractContextManager:
    """The context the trainer's forward passes run in for `model.dtype=name`: float16 autocast on
    `device` (float16 matrix products over the float32 master weights) for float16, else nothing."""
    if name != "float16":
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=torch.float16)
