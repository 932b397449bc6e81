"""Metric sinks beyond metrics.jsonl: TensorBoard, MLflow and Weights & Biases get the same keys and
steps, read back through each library's own reader, and a resumed run continues the same tracker run.

Run: python -m pytest tests/track/test_trackers.py -q
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from mathrl.config import Config, to_dict
from mathrl.track.sinks import Tracker, mlflow_key, read_metrics

ROWS = [
    (1, {"actor/entropy": 0.5, "reward/mean": 0.25}),
    (1, {"eval/arith_heldout/pass@1": 0.3, "eval/arith_heldout/pass@4": 0.6}),
    (2, {"actor/entropy": 0.4, "reward/mean": 0.5}),
]


def log_rows(tracker: Tracker, rows=ROWS) -> None:
    for step, metrics in rows:
        tracker.log(step, metrics)
    tracker.close()


def test_tensorboard_scalars_read_back(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log_rows(Tracker(tmp_path, tensorboard=True))
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, round(e.value, 6)) for e in events.Scalars("actor/entropy")] == [(1, 0.5), (2, 0.4)]
    assert [(e.step, round(e.value, 6)) for e in events.Scalars("eval/arith_heldout/pass@1")] == [(1, 0.3)]
    assert len(read_metrics(tmp_path / "metrics.jsonl")) == 3  # the jsonl is written as always


def test_mlflow_metrics_params_and_resume(tmp_path: Path, monkeypatch) -> None:
    mlflow = pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    uri = f"file://{tmp_path / 'mlruns'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # a local store for the test; real use: a server
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    log_rows(Tracker(run_dir, mlflow=True, mlflow_experiment="tests", config=to_dict(Config())))
    run_id = json.loads((run_dir / "trackers.json").read_text())["mlflow"]
    client = MlflowClient(uri)
    history = lambda key: [(m.step, round(m.value, 6)) for m in client.get_metric_history(run_id, key)]  # noqa: E731
    assert history("actor/entropy") == [(1, 0.5), (2, 0.4)]
    assert history("eval/arith_heldout/pass_at_4") == [(1, 0.6)]
    params = client.get_run(run_id).data.params
    assert params["algo.clip.eps_high"] == "0.28" and params["rollout.n"] == "8"
    assert client.get_run(run_id).info.run_name == "run"

    # the same run directory again (a resumed run): the same MLflow run goes on
    log_rows(Tracker(run_dir, mlflow=True, mlflow_experiment="tests", config=to_dict(Config())),
             [(3, {"actor/entropy": 0.3})])
    assert json.loads((run_dir / "trackers.json").read_text())["mlflow"] == run_id
    assert history("actor/entropy") == [(1, 0.5), (2, 0.4), (3, 0.3)]
    assert mlflow.active_run() is None


def test_wandb_offline_run_and_resume(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    tracker = Tracker(run_dir, wandb=True, wandb_project="tests", config=to_dict(Config()))
    (sink,) = [s for s in tracker.sinks if type(s).__name__ == "WandbSink"]
    for step, metrics in ROWS:
        tracker.log(step, metrics)
    # W&B commits a step's row when a later step arrives (so a step's training and eval rows merge)
    tracker.log(3, {"reward/mean": 0.75})
    assert sink.run.summary["actor/entropy"] == pytest.approx(0.4)
    assert sink.run.summary["eval/arith_heldout/pass@1"] == pytest.approx(0.3)
    assert sink.run.config["algo"]["clip"]["eps_high"] == 0.28
    assert sink.run.name == "run"
    tracker.close()
    run_id = json.loads((run_dir / "trackers.json").read_text())["wandb"]
    assert list((run_dir / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))

    again = Tracker(run_dir, wandb=True, wandb_project="tests", config=to_dict(Config()))
    (sink,) = [s for s in again.sinks if type(s).__name__ == "WandbSink"]
    assert sink.run.id == run_id
    again.close()


def test_a_missing_tracker_package_says_what_to_install(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb now raises ImportError
    with pytest.raises(ImportError, match=r"log.wandb needs the wandb package: pip install wandb"):
        Tracker(tmp_path, wandb=True)


def test_mlflow_key() -> None:
    assert mlflow_key("eval/math500/pass@16") == "eval/math500/pass_at_16"
    assert mlflow_key("actor/pg_clipfrac") == "actor/pg_clipfrac"
    assert mlflow_key("eval/a+b/maj@8") == "eval/a_b/maj_at_8"
