"""Metric sinks. `metrics.jsonl` is always written; TensorBoard when asked.

Each record is one JSON object per line: {"step": int, "<namespace>/<name>": float, ...}. Names are
defined in docs/metrics.md.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf; keep them visible rather than dropping the key
    return value


class JsonlSink:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = self.path.open("a")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self._f.write(json.dumps({"step": step, **{k: _clean(v) for k, v in metrics.items()}}) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


class TensorBoardSink:
    def __init__(self, log_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(str(log_dir))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for k, v in metrics.items():
            self._writer.add_scalar(k, v, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class Tracker:
    """Fans one metrics dict out to every sink."""

    def __init__(self, run_dir: Path, *, tensorboard: bool = False):
        self.sinks: list[Any] = [JsonlSink(Path(run_dir) / "metrics.jsonl")]
        if tensorboard:
            self.sinks.append(TensorBoardSink(Path(run_dir) / "tensorboard"))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for sink in self.sinks:
            sink.log(step, metrics)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
