"""The dtypes `model.dtype` names, as torch dtypes: read by the loaders (model/io.py, model/value.py) and
the random-weight builder (model/init.py), which import nothing else from each other for it."""

from __future__ import annotations

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
