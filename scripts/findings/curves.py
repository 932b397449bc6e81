"""`curves`: training and evaluation curves of a grid's variants, mean over seeds with a 95% CI band.

    python scripts/findings curves GRID.yaml --out runs/x --fig x.png [--metrics m1 m2] [--x tokens]

Per run, metrics.jsonl gives the training metrics (one row per step) and the `eval/<set>/*` rows;
evals.jsonl fills in evaluations that metrics.jsonl lacks. Per metric and variant:

* plot: training metrics smoothed per seed with a trailing rolling mean of `smooth` steps, then the
  mean over seeds at each step with a Student-t 95% band; eval metrics unsmoothed at their eval steps.
  With x = tokens the x value of a step is the cumulative `rollout/generated_tokens` through that step
  (every token sampled, dropped dynamic-sampling rounds included), averaged over the seeds.
* table: the final value per seed (training metric: mean over the last `last` training steps; eval
  metric: at the last evaluation), then mean ± ci95 over seeds; for eval pass@1 also the best
  evaluation and the change from step 0, and with `--threshold T` the first evaluation step at which
  pass@1 >= T (over the seeds that reach it, "k/n reached") and the seeds that collapsed (an evaluation
  more than COLLAPSE below the best one before it); with `--versus V`, for each variant against V the
  one-sided exact permutation p of "final pass@1 higher" (and of "fewer steps to T"): the share of the
  C(n+m, n) splits of the pooled seeds whose mean difference is at least the observed one. "—": no seed
  logged it.
"""

from __future__ import annotations

import itertools
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

from findings.common import MISSING, band, ci_cell, color, markdown_table, new_figure, variant_name, write_outputs
from mathrl.evaluation.evaluate import EvalResult
from mathrl.run_dir import RunDir

TOKENS = "rollout/generated_tokens"
UNRECORDED = "machine not recorded"
COLLAPSE = 0.2  # a run collapsed when an evaluation's pass@1 falls more than this below its best so far


@dataclass
class RunSeries:
    """One run's logged values. Each series maps step -> value, finite or nan."""

    name: str
    train: dict[str, dict[int, float]] = field(default_factory=dict)
    evals: dict[str, dict[int, float]] = field(default_factory=dict)
    machine: str = UNRECORDED  # the CPU type it ran on (summary.json; mathrl/machine.py)

    def series(self, metric: str) -> dict[int, float]:
        return (self.evals if is_eval(metric) else self.train).get(metric, {})

    def tokens_at(self) -> dict[int, float]:
        """step -> cumulative generated tokens through that step (0 at step 0); {} when not logged."""
        per_step = self.train.get(TOKENS, {})
        if not per_step:
            return {}
        out, total = {0: 0.0}, 0.0
        for step in sorted(self.train_steps()):
            total += per_step.get(step, 0.0) if math.isfinite(per_step.get(step, 0.0)) else 0.0
            out[step] = total
        return out

    def train_steps(self) -> list[int]:
        return sorted({s for values in self.train.values() for s in values})


def is_eval(metric: str) -> bool:
    return metric.startswith("eval/")


def _number(value) -> float | None:
    """A logged value as a float: numbers as they are, "nan"/"inf" strings (JSON has no NaN) parsed."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _eval_row_metrics(row: dict) -> dict[str, float]:
    """The `eval/<set>/*` metrics of one evals.jsonl row, as the training loop logs them."""
    fields = set(EvalResult.__dataclass_fields__) - {"samples"}
    result = EvalResult(**{k: v for k, v in row.items() if k in fields})
    result.pass_at_k = {int(k): v for k, v in result.pass_at_k.items()}  # JSON object keys are strings
    metrics = result.metrics(f"eval/{row['set']}")
    if "reflection_rate" not in row:  # older rows: the default 0.0 is not a measurement
        metrics.pop(f"eval/{row['set']}/reflection_rate")
    return metrics


def read_run(path: Path) -> RunSeries:
    """metrics.jsonl (training rows and eval rows) and evals.jsonl of one run directory."""
    run = RunDir(path)
    out = RunSeries(Path(path).name)
    for row in run.metrics():
        step = int(row["step"])
        for key, value in row.items():
            number = _number(value)
            if key != "step" and number is not None:
                (out.evals if is_eval(key) else out.train).setdefault(key, {})[step] = number
    for row in run.evals():
        for key, value in _eval_row_metrics(row).items():
            out.evals.setdefault(key, {}).setdefault(int(row["step"]), float(value))
    out.machine = machine_of(run.summary())
    return out


def machine_of(summary: dict | None) -> str:
    """The CPU type a run ran on, from its summary.json: every process's ("mixed: A + B" when a resume
    moved it to another type), else the summary's own; UNRECORDED for runs of earlier versions."""
    summary = summary or {}
    types = [p["machine"]["cpu_type"] for p in summary.get("processes", []) if isinstance(p.get("machine"), dict)]
    if not types and isinstance(summary.get("machine"), dict):
        types = [summary["machine"]["cpu_type"]]
    types = list(dict.fromkeys(types))
    if not types:
        return UNRECORDED
    return types[0] if len(types) == 1 else "mixed: " + " + ".join(types)


def by_machine(variants: dict[str, list[RunSeries]]) -> dict[str, dict[str, list[RunSeries]]]:
    """The variants split by the CPU type their runs ran on (one entry when all ran on one type), each
    variant kept in every type, empty where none of its runs ran there."""
    types = list(dict.fromkeys(r.machine for runs in variants.values() for r in runs)) or [UNRECORDED]
    return {t: {name: [r for r in runs if r.machine == t] for name, runs in variants.items()} for t in types}


# ---- per seed -------------------------------------------------------------------------------------


def smooth(values: list[float], window: int) -> list[float]:
    """Trailing rolling mean over `window` values (fewer at the start); nan values are left out of the
    mean, and a window of nothing but nan stays nan."""
    out = []
    for i in range(len(values)):
        kept = [v for v in values[max(0, i - window + 1) : i + 1] if math.isfinite(v)]
        out.append(sum(kept) / len(kept) if kept else math.nan)
    return out


def final_value(run: RunSeries, metric: str, last: int) -> float | None:
    """Eval metric: the value at the last evaluation. Training metric: the mean over the run's last
    `last` training steps of the values logged there (None when none was)."""
    series = run.series(metric)
    if is_eval(metric):
        return series[max(series)] if series else None
    values = [series[s] for s in run.train_steps()[-last:] if s in series and math.isfinite(series[s])]
    return sum(values) / len(values) if values else None


def best_and_change(run: RunSeries, metric: str) -> tuple[float | None, float | None]:
    """(best evaluation, last evaluation minus the one at step 0) of an eval metric."""
    series = {s: v for s, v in run.series(metric).items() if math.isfinite(v)}
    if not series:
        return None, None
    return max(series.values()), (series[max(series)] - series[0] if 0 in series else None)


def steps_to(run: RunSeries, metric: str, threshold: float) -> int | None:
    """The first evaluation step at which `metric` >= threshold; None when it never does."""
    series = run.series(metric)
    return next((s for s in sorted(series) if math.isfinite(series[s]) and series[s] >= threshold), None)


def collapsed(run: RunSeries, metric: str, drop: float = COLLAPSE) -> bool:
    """Whether some evaluation of `metric` is more than `drop` below the best evaluation before it."""
    best, series = -math.inf, run.series(metric)
    for step in sorted(series):
        value = series[step]
        if not math.isfinite(value):
            continue
        if value < best - drop:
            return True
        best = max(best, value)
    return False


def permutation_p(a: list[float], b: list[float]) -> float:
    """One-sided exact permutation p of "mean(a) > mean(b)": the share of the ways to split a + b into
    groups of len(a) and len(b) whose mean difference is at least the observed one (5 and 5 seeds: 252
    splits, so the smallest p is 1/252)."""
    pooled, n = a + b, len(a)
    if not a or not b:
        return math.nan
    observed = math.fsum(a) / n - math.fsum(b) / len(b)
    total = math.fsum(pooled)
    hits = 0
    for chosen in itertools.combinations(range(len(pooled)), n):
        first = math.fsum(pooled[i] for i in chosen)
        hits += first / n - (total - first) / len(b) >= observed - 1e-12
    return hits / math.comb(len(pooled), n)


def curve(run: RunSeries, metric: str, *, window: int, x_tokens: bool) -> dict[float, float] | None:
    """x -> y of one seed: training metrics smoothed, eval metrics as logged. None when x = tokens and
    the run did not log generated tokens."""
    series = run.series(metric)
    steps = sorted(series)
    values = [series[s] for s in steps]
    if not is_eval(metric):
        values = smooth(values, window)
    if not x_tokens:
        return dict(zip(steps, values))
    tokens = run.tokens_at()
    if not tokens:
        return None
    return {s: v for s, v in zip(steps, values) if s in tokens}  # keyed by step; x is mapped below


# ---- over seeds -----------------------------------------------------------------------------------


def mean_curve(per_seed: list[dict[int, float]], x_of: list[dict[int, float]] | None = None):
    """(xs, mean, low, high) over seeds at every step some seed logged. x is the step, or with `x_of`
    (step -> x of each seed) the mean x of the seeds at that step. low/high are nan where fewer than
    two seeds have a finite value (no band)."""
    xs, means, lows, highs = [], [], [], []
    for step in sorted({s for c in per_seed for s in c}):
        seeds = [i for i, c in enumerate(per_seed) if step in c and math.isfinite(c[step])]
        if not seeds:
            continue
        mean, low, high = band([per_seed[i][step] for i in seeds])
        xs.append(step if x_of is None else sum(x_of[i][step] for i in seeds) / len(seeds))
        means.append(mean)
        lows.append(low)
        highs.append(high)
    return xs, means, lows, highs


def summary_table(variants: dict[str, list[RunSeries]], metrics: list[str], last: int,
                  threshold: float | None = None, versus: str | None = None) -> str:
    """One row per variant; per metric mean ± ci95 over its seeds (pass@1 evals: also best, change, and
    with `threshold` the steps to reach it and the collapsed seeds; with `versus`, the one-sided
    permutation p against that variant)."""
    if versus is not None and versus not in variants:
        raise ValueError(f"--versus {versus}: no such variant (the variants: {', '.join(variants)})")
    header = ["variant"]
    for m in metrics:
        header.append(m)
        if is_eval(m) and m.endswith("/pass@1"):
            header += [f"{m} best", f"{m} Δ from step 0"]
            if threshold is not None:
                header += [f"steps to {threshold:g}", f"collapsed (> {COLLAPSE:g} below best)"]
            if versus is not None:
                header.append(f"p, higher than {versus}")
                if threshold is not None:
                    header.append(f"p, fewer steps to {threshold:g} than {versus}")
    rows = []
    for name, runs in variants.items():
        row = [name]
        for m in metrics:
            row.append(ci_cell([v for r in runs if (v := final_value(r, m, last)) is not None]))
            if is_eval(m) and m.endswith("/pass@1"):
                extras = [best_and_change(r, m) for r in runs]
                row.append(ci_cell([b for b, _ in extras if b is not None]))
                row.append(ci_cell([d for _, d in extras if d is not None]))
                if threshold is not None:
                    reached = [s for r in runs if (s := steps_to(r, m, threshold)) is not None]
                    row.append(f"{ci_cell(reached)}, {len(reached)}/{len(runs)} reached" if runs else MISSING)
                    row.append(f"{sum(collapsed(r, m) for r in runs)}/{len(runs)}" if runs else MISSING)
                if versus is not None:
                    row += versus_cells(runs, variants[versus], m, last, threshold, same=name == versus)
        rows.append(row)
    return markdown_table(header, rows)


def versus_cells(runs: list[RunSeries], base: list[RunSeries], metric: str, last: int, threshold: float | None, *,
                 same: bool) -> list[str]:
    """The permutation p of this variant's final `metric` above the baseline's, and (with `threshold`) of
    fewer steps to it; a seed that never reaches it counts as one evaluation interval past the last."""
    if same:
        return [MISSING] * (1 + (threshold is not None))

    def finals(rs):
        return [v for r in rs if (v := final_value(r, metric, last)) is not None]

    def cell(p: float) -> str:
        return MISSING if math.isnan(p) else f"{p:.3f}"

    cells = [cell(permutation_p(finals(runs), finals(base)))]
    if threshold is not None:
        def steps(rs):
            out = []
            for r in rs:
                evals = sorted(r.series(metric))
                late = evals[-1] + (evals[-1] - evals[-2] if len(evals) > 1 else 1) if evals else math.inf
                reached = steps_to(r, metric, threshold)
                out.append(-(late if reached is None else reached))  # fewer steps = a higher negative
            return out
        cells.append(cell(permutation_p(steps(runs), steps(base))))
    return cells


def plot(variants: dict[str, list[RunSeries]], metrics: list[str], *, window: int, x_tokens: bool):
    fig, axes = new_figure(len(metrics))
    for ax, metric in zip(axes, metrics):
        drawn = False
        for i, (name, runs) in enumerate(variants.items()):
            pairs = [(c, r) for r in runs if (c := curve(r, metric, window=window, x_tokens=x_tokens))]
            if not pairs:
                continue
            drawn = True
            x_of = [r.tokens_at() for _, r in pairs] if x_tokens else None
            xs, mean, low, high = mean_curve([c for c, _ in pairs], x_of)
            ax.plot(xs, mean, color=color(i), label=f"{name} (n={len(pairs)})", linewidth=1.4,
                    marker="o" if is_eval(metric) else None, markersize=3)
            if len(pairs) > 1:
                ax.fill_between(xs, low, high, color=color(i), alpha=0.2, linewidth=0)
        if not drawn:
            ax.text(0.5, 0.5, "no run logged it", transform=ax.transAxes, ha="center", va="center", color="grey")
        ax.set_title(metric if is_eval(metric) else f"{metric} (rolling mean {window})", fontsize=9, family="monospace")
        ax.set_xlabel("generated tokens" if x_tokens else "step")
        ax.grid(alpha=0.3)
    if axes:
        axes[0].legend(fontsize=7)
    return fig


# ---- the command ----------------------------------------------------------------------------------


def load_variants(sources: list[Path], *, out: Path | None, labels: list[str] | None,
                  unfinished: bool = False) -> tuple[dict[str, list[RunSeries]], list[str]]:
    """(variant -> its runs' series, the grid's columns or []) from a grid file (runs under `out`) or
    run directories. A run that is missing or has logged nothing is left out, with a note, and so is
    one still going (no summary.json: its "final" values would be from an earlier step than its
    seeds') unless `unfinished`."""
    columns: list[str] = []
    if len(sources) == 1 and sources[0].suffix in (".yaml", ".yml"):
        from ablate import load_grid  # the sibling script: grid names exactly as ablate.py gives them

        if out is None:
            raise ValueError("a grid file needs --out, the directory ablate.py wrote its runs to")
        _, grid_variants, columns = load_grid(sources[0])
        paths = [out / v.name for v in grid_variants]
    else:
        paths = sources
    if labels and len(labels) != len(paths):
        raise ValueError(f"--group needs one label per run: {len(labels)} labels for {len(paths)} runs")
    variants: dict[str, list[RunSeries]] = {}
    for i, path in enumerate(paths):
        name = labels[i] if labels else variant_name(path.name)
        runs = variants.setdefault(name, [])
        if not RunDir(path).is_run():
            print(f"note: {path} holds no run; variant {name} is reported without it", file=sys.stderr)
            continue
        if not unfinished and not RunDir(path).summary_path.exists():
            print(f"note: {path} is not finished (no summary.json); variant {name} is reported without it "
                  "(--unfinished includes it)", file=sys.stderr)
            continue
        runs.append(read_run(path))
    return variants, columns


def default_metrics(variants: dict[str, list[RunSeries]], columns: list[str]) -> list[str]:
    """Every eval pass@1 the runs logged, then the grid's columns."""
    evals = sorted({m for runs in variants.values() for r in runs for m in r.evals if m.endswith("/pass@1")})
    return evals + [c for c in columns if c not in evals]


def run_curves(sources: list[Path], *, fig_path: Path, out: Path | None = None, metrics: list[str] | None = None,
               x: str = "step", window: int = 5, last: int = 10, labels: list[str] | None = None,
               unfinished: bool = False, threshold: float | None = None, versus: str | None = None) -> str:
    """Plot and tabulate; returns the table (also written next to the figure)."""
    if window < 1 or last < 1:
        raise ValueError("--smooth and --last must be >= 1")
    variants, columns = load_variants(sources, out=out, labels=labels, unfinished=unfinished)
    metrics = metrics or default_metrics(variants, columns)
    if not metrics:
        raise ValueError("no metrics to plot: give --metrics, or a grid with columns")
    x_tokens = x == "tokens"
    if x_tokens:
        for runs in variants.values():
            for r in runs:
                if not r.tokens_at():
                    print(f"note: {r.name} did not log {TOKENS}; it is left out of the token-axis plot",
                          file=sys.stderr)
    groups = by_machine(variants)
    if len(groups) == 1:
        table = summary_table(variants, metrics, last, threshold, versus)
        write_outputs(fig_path, plot(variants, metrics, window=window, x_tokens=x_tokens), table)
        return table
    # runs of several CPU types: one table and one figure per type (<fig>_<type>.png), a verdict per machine
    parts = []
    for machine, group in groups.items():
        parts.append(f"### {machine}\n\n" + summary_table(group, metrics, last, threshold, versus))
        write_outputs(fig_path.with_name(f"{fig_path.stem}_{slug(machine)}{fig_path.suffix}"),
                      plot(group, metrics, window=window, x_tokens=x_tokens), parts[-1])
    table = "\n".join(parts)
    write_outputs(fig_path, plot(variants, metrics, window=window, x_tokens=x_tokens), table)
    return table


def slug(text: str) -> str:
    """A file-name piece of a CPU type: "Intel Xeon (AMX)" -> "intel_xeon_amx"."""
    return "_".join("".join(c if c.isalnum() else " " for c in text.lower()).split())


__all__ = ["COLLAPSE", "MISSING", "UNRECORDED", "RunSeries", "best_and_change", "by_machine", "collapsed", "curve", "default_metrics", "final_value",
           "load_variants", "machine_of", "mean_curve", "permutation_p", "read_run", "run_curves", "smooth", "steps_to", "summary_table"]
