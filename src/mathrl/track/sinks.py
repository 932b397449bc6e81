"""Metric sinks. `metrics.jsonl` is always written; TensorBoard, Weights & Biases and MLflow when asked
(`log.tensorboard`, `log.wandb`, `log.mlflow`), each with the same keys and steps.

Each jsonl record is one JSON object per line: {"step": int, "<namespace>/<name>": float, ...}. Names
are defined in docs/metrics.md. A resumed run logs to the same W&B / MLflow run: their ids are kept in
`<run_dir>/trackers.json`.
"""

from __future__ import annotations

import json
import math
import re
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


def _require(module: str, switch: str, package: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"{switch} needs the {package} package: pip install {package}") from e


class TensorBoardSink:
    def __init__(self, log_dir: Path):
        _require("tensorboard", "log.tensorboard", "tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(str(log_dir))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for k, v in metrics.items():
            self._writer.add_scalar(k, v, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """{"algo": {"clip": {"eps_high": 0.28}}} -> {"algo.clip.eps_high": 0.28}; lists (and empty dicts) stay
    values. A config's parameters for MLflow, and the report's config table."""
    if not isinstance(tree, dict) or (prefix and not tree):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for k, v in tree.items():
        out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


class _TrackerIds:
    """Run ids of the external trackers, kept in <run_dir>/trackers.json so a resumed run continues them."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / "trackers.json"
        self.ids = json.loads(self.path.read_text()) if self.path.exists() else {}

    def save(self, name: str, run_id: str) -> None:
        self.ids[name] = run_id
        self.path.write_text(json.dumps(self.ids, indent=2))


class WandbSink:
    """Weights & Biases: project `log.wandb_project`, run name = the run directory's name, the
    resolved config as the run config. WANDB_MODE=offline (or `wandb offline`) keeps it local."""

    def __init__(self, run_dir: Path, *, project: str, config: dict[str, Any], ids: _TrackerIds):
        wandb = _require("wandb", "log.wandb", "wandb")
        self.run = wandb.init(project=project, name=Path(run_dir).name, id=ids.ids.get("wandb"), resume="allow",
                              dir=str(run_dir), config=config)
        ids.save("wandb", self.run.id)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(dict(metrics), step=step)

    def close(self) -> None:
        self.run.finish()


_MLFLOW_KEY = re.compile(r"[^A-Za-z0-9_\-. /]")


def mlflow_key(name: str) -> str:
    """MLflow accepts letters, digits, _ - . space and / in metric names: "pass@4" becomes "pass_at_4"."""
    return _MLFLOW_KEY.sub("_", name.replace("@", "_at_"))


class MlflowSink:
    """MLflow: experiment `log.mlflow_experiment` on the tracking server of MLFLOW_TRACKING_URI, run name
    = the run directory's name, the flattened config as params. Metric names go through `mlflow_key`."""

    def __init__(self, run_dir: Path, *, experiment: str, config: dict[str, Any], ids: _TrackerIds):
        mlflow = _require("mlflow", "log.mlflow", "mlflow-skinny")
        self._mlflow = mlflow
        mlflow.set_experiment(experiment)
        resumed = ids.ids.get("mlflow")
        self.run = mlflow.start_run(run_id=resumed, run_name=None if resumed else Path(run_dir).name)
        if not resumed:
            mlflow.log_params({k: str(v)[:500] for k, v in flatten(config).items()})
        ids.save("mlflow", self.run.info.run_id)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self._mlflow.log_metrics({mlflow_key(k): float(v) for k, v in metrics.items()}, step=step)

    def close(self) -> None:
        self._mlflow.end_run()


class Tracker:
    """Fans one metrics dict out to every sink."""

    def __init__(self, run_dir: Path, *, tensorboard: bool = False, wandb: bool = False, mlflow: bool = False,
                 wandb_project: str = "mathrl", mlflow_experiment: str = "mathrl",
                 config: dict[str, Any] | None = None):
        self.sinks: list[Any] = [JsonlSink(Path(run_dir) / "metrics.jsonl")]
        if tensorboard:
            self.sinks.append(TensorBoardSink(Path(run_dir) / "tensorboard"))
        ids = _TrackerIds(run_dir)
        if wandb:
            self.sinks.append(WandbSink(run_dir, project=wandb_project, config=config or {}, ids=ids))
        if mlflow:
            self.sinks.append(MlflowSink(run_dir, experiment=mlflow_experiment, config=config or {}, ids=ids))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for sink in self.sinks:
            sink.log(step, metrics)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
