"""Reading the run directories that `mathrl train` writes (layout in src/mathrl/run_dir.py) into the
`Run` records that `mathrl report` compares: metrics, evaluations, summary, config, token maps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mathrl.run_dir import RunDir
from mathrl.track.sinks import flatten


@dataclass
class EvalPoint:
    """One evaluation of one held-out set (a row of evals.jsonl, or half of summary.json)."""

    step: int | None
    n: int | None  # samples per problem
    num_problems: int | None
    pass_at_1: float
    pass_at_k: dict[int, float]  # k > 1 only
    maj_at_n: float | None


@dataclass
class Run:
    label: str  # short unique name shown in legends and tables
    path: Path
    color: str
    rows: list[dict[str, Any]]  # metrics.jsonl
    evals: dict[str, tuple[EvalPoint, EvalPoint]]  # set -> (first evaluation, last evaluation)
    summary: dict[str, Any] | None  # summary.json (None while the run is still going)
    config: dict[str, Any]  # config.yaml flattened to dotted keys
    config_text: str | None
    inspect_pages: list[Path] = field(default_factory=list)
    sweep: dict[str, Any] | None = None  # `mathrl eval`'s results.json in <run>/eval/, when it was run

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """Steps and values of one metric, in step order; non-finite values kept as nan/inf."""
        points = [(int(r["step"]), v) for r in self.rows if (v := _as_float(r.get(key))) is not None]
        points.sort(key=lambda p: p[0])
        return [s for s, _ in points], [v for _, v in points]

    @property
    def last_train_step(self) -> int | None:
        steps = [int(r["step"]) for r in self.rows if any(not k.startswith("eval/") and k != "step" for k in r)]
        return max(steps) if steps else None


def _as_float(value: Any) -> float | None:
    """A logged value as a float: numbers, and the strings "nan"/"inf"/"-inf" that JsonlSink writes."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and value in ("nan", "inf", "-inf"):
        return float(value)
    return None


def _eval_point_from_row(row: dict[str, Any]) -> EvalPoint:
    return EvalPoint(
        step=row.get("step"), n=row.get("n"), num_problems=row.get("num_problems"),
        pass_at_1=float(row["pass_at_1"]),
        pass_at_k={int(k): float(v) for k, v in (row.get("pass_at_k") or {}).items() if int(k) > 1},
        maj_at_n=row.get("maj_at_n"),
    )


def _eval_point_from_summary(entry: dict[str, Any], step: int | None) -> EvalPoint:
    return EvalPoint(
        step=step, n=None, num_problems=None, pass_at_1=float(entry["pass@1"]),
        pass_at_k={int(k): float(v) for k, v in (entry.get("pass@k") or {}).items() if int(k) > 1},
        maj_at_n=entry.get("maj@n"),
    )


def read_evals(run_dir: Path, summary: dict[str, Any] | None) -> dict[str, tuple[EvalPoint, EvalPoint]]:
    """Per held-out set: (first, last) evaluation, from evals.jsonl, else from summary.json."""
    by_set: dict[str, list[dict[str, Any]]] = {}
    for row in RunDir(run_dir).evals():
        by_set.setdefault(row["set"], []).append(row)
    if by_set:
        out = {}
        for name, rows in by_set.items():
            rows.sort(key=lambda r: r["step"])
            out[name] = (_eval_point_from_row(rows[0]), _eval_point_from_row(rows[-1]))
        return out
    if summary and "base" in summary and "final" in summary:
        return {
            name: (_eval_point_from_summary(summary["base"][name], 0),
                   _eval_point_from_summary(summary["final"][name], summary.get("steps")))
            for name in summary["base"] if name in summary["final"]
        }
    return {}


def run_labels(paths: list[Path]) -> list[str]:
    """Short unique names: the directory name, with as many parent folders as it takes to be unique."""
    parts = [p.resolve().parts for p in paths]
    depth = [1] * len(parts)
    while True:
        labels = ["/".join(p[-d:]) for p, d in zip(parts, depth)]
        clashing = [i for i, label in enumerate(labels) if labels.count(label) > 1]
        if not clashing:
            return labels
        grown = [i for i in clashing if depth[i] < len(parts[i])]
        if not grown:  # the same directory given twice
            return [f"{label} #{i + 1}" if i in clashing else label for i, label in enumerate(labels)]
        for i in grown:
            depth[i] += 1


def load_run(path: Path, *, label: str, color: str) -> Run:
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"run directory {path} does not exist")
    run = RunDir(path)
    if not run.is_run():
        raise ValueError(f"{path} is not a run directory: it has no metrics.jsonl, evals.jsonl or summary.json")
    summary = run.summary()
    config_text = run.config_text()
    return Run(
        label=label, path=path, color=color,
        rows=run.metrics(),
        evals=read_evals(path, summary),
        summary=summary,
        config=flatten(yaml.safe_load(config_text) or {}) if config_text else {},
        config_text=config_text,
        inspect_pages=sorted(path.glob("inspect*.html")),
        sweep=run.sweep_results(),
    )

