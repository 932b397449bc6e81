"""`teach`: finding 19's arms against their compute: held-out pass@1 and pass@8 by step, by student-sampled
token and by FLOP, and the steps, tokens and FLOPs each arm takes to reach a share of the teacher's pass@1.

    python scripts/findings teach --teacher runs/teach_teacher RUN ... --group LABEL ... --fig teach.png

What an arm is, read from each run directory: an SFT run (its metrics hold `sft/loss`), or an RL run
whose config.yaml says whether a teacher scored its tokens (`algo.distill.mode` with `teacher.path`:
a second model; `teacher.self`: the starting model itself).

FLOPs are model FLOPs, 2 N per token of a forward pass and 6 N per token of a trained one (N: the
model's parameters, from its final/model.safetensors), over response tokens only (the prompts, a few
tokens each here, are left out for every arm alike); evaluations are not counted:
* an RL step: every sampled token (`rollout/generated_tokens`) once sampled (2 N), scored (2 N) and
  trained (6 N): 10 N; with a teacher, plus its scoring pass (2 N_teacher; self-distillation: 2 N);
* an SFT step: its trained tokens (`sft/response_tokens`, 6 N), after the teacher sampled the traces
  (2 N_teacher times `sampled_tokens` of the traces' summary, counted at step 0);
* the teacher's own training is not counted (it is given; the table's note states its cost).
The threshold is `--share` (0.95) of the teacher's last held-out pass@1 (its evals.jsonl). A seed reaches
it at its first evaluation at or above it; the columns give the median over the seeds that do and how
many did. p: one-sided exact permutation p against `--versus` (final pass@1 higher).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

import yaml

from findings.common import MISSING, band, ci_cell, color, group_runs, markdown_table, new_figure, write_outputs
from findings.curves import RunSeries, by_machine, final_value, permutation_p, read_run, steps_to
from mathrl.run_dir import RunDir

PASS1, PASS8, ENTROPY = "eval/arith_heldout/pass@1", "eval/arith_heldout/pass@8", "actor/entropy"
TOKENS, SFT_TOKENS = "rollout/generated_tokens", "sft/response_tokens"
RL_PER_TOKEN = 10  # sample (2) + score (2) + train (6), in units of N
SFT_PER_TOKEN = 6
TEACHER_PER_TOKEN = 2


def parameters(model_dir: Path) -> int:
    """Parameters of a saved model (its safetensors files' tensors; a tied embedding is stored once)."""
    from safetensors import safe_open

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise ValueError(f"{model_dir}: no .safetensors file to count parameters from")
    total = 0
    for f in files:
        with safe_open(str(f), "pt") as st:
            total += sum(math.prod(st.get_slice(k).get_shape()) for k in st.keys())
    return total


@dataclass
class Arm:
    """One run with its compute per step: FLOPs through each step, and student-sampled tokens."""

    series: RunSeries
    kind: str  # rl | sft
    flops: dict[int, float]  # step -> cumulative FLOPs through that step (0: before any)
    tokens: dict[int, float]  # step -> cumulative student-sampled tokens (SFT: 0)


def _config(run: Path) -> dict:
    text = (run / "config.yaml").read_text()
    return yaml.safe_load(text) or {}


def _cumulative(per_step: dict[int, float], start: float) -> dict[int, float]:
    out, total = {0: start}, start
    for step in sorted(per_step):
        value = per_step[step]
        total += value if math.isfinite(value) else 0.0
        out[step] = total
    return out


def read_arm(run: Path, *, teacher_params: int) -> Arm:
    """A run's series and its compute (module docstring)."""
    series = read_run(run)
    n = parameters(run / "final")
    if SFT_TOKENS in series.train:
        cfg = _config(run)
        summary = Path(cfg["data"]["train"]).with_suffix(".summary.json")
        sampled = json.loads(summary.read_text()).get("sampled_tokens") if summary.is_file() else None
        if not sampled:
            raise ValueError(f"{run}: the traces' summary {summary} has no sampled_tokens (made by mathrl distill-data)")
        flops = {s: SFT_PER_TOKEN * n * t for s, t in series.train[SFT_TOKENS].items()}
        return Arm(series, "sft", _cumulative(flops, TEACHER_PER_TOKEN * teacher_params * sampled),
                   dict.fromkeys([0, *series.train[SFT_TOKENS]], 0.0))
    cfg = _config(run)
    distill, teacher = cfg.get("algo", {}).get("distill", {}), cfg.get("teacher", {})
    per_token = RL_PER_TOKEN * n
    if distill.get("mode", "none") != "none":
        per_token += TEACHER_PER_TOKEN * (n if teacher.get("self") else teacher_params)
    sampled = series.train.get(TOKENS, {})
    return Arm(series, "rl", _cumulative({s: per_token * t for s, t in sampled.items()}, 0.0), _cumulative(sampled, 0.0))


def teacher_pass1(teacher: Path) -> float:
    """The teacher run's last held-out pass@1."""
    series = read_run(teacher).series(PASS1)
    if not series:
        raise ValueError(f"{teacher}: no held-out pass@1 evaluation to set the threshold")
    return series[max(series)]


def _at(mapping: dict[int, float], step: int | None) -> float | None:
    """The cumulative value through `step` (the last logged step at or before it)."""
    if step is None:
        return None
    before = [s for s in mapping if s <= step]
    return mapping[max(before)] if before else None


def _median_cell(values: list[float | None], fmt_one) -> str:
    got = [v for v in values if v is not None]
    if not got:
        return f"— (0/{len(values)})"
    return f"{fmt_one(statistics.median(got))} ({len(got)}/{len(values)})"


def _sci(x: float) -> str:
    return f"{x:.2e}"


def table(arms: dict[str, list[Arm]], *, threshold: float, versus: str | None) -> str:
    header = ["arm", "final pass@1", "final pass@8", "entropy (last 10 steps)", "steps to threshold",
              "student tokens to it", "FLOPs to it", "FLOPs in all"]
    if versus:
        header.append(f"p (pass@1 > {versus})")
    rows = []
    base = [final_value(a.series, PASS1, 10) for a in arms.get(versus, [])] if versus else []
    for name, runs in arms.items():
        if not runs:
            continue
        finals = [final_value(a.series, PASS1, 10) for a in runs]
        reach = [steps_to(a.series, PASS1, threshold) for a in runs]
        sft = runs[0].kind == "sft"
        row = [name, ci_cell([v for v in finals if v is not None]),
               ci_cell([v for a in runs if (v := final_value(a.series, PASS8, 10)) is not None]),
               ci_cell([v for a in runs if (v := final_value(a.series, ENTROPY, 10)) is not None]) if not sft else MISSING,
               _median_cell(reach, lambda s: f"{s:.0f}" + (" SFT" if sft else "")),
               "0 (the teacher's)" if sft else _median_cell([_at(a.tokens, s) for a, s in zip(runs, reach)], _sci),
               _median_cell([_at(a.flops, s) for a, s in zip(runs, reach)], _sci),
               _sci(statistics.mean(a.flops[max(a.flops)] for a in runs))]
        if versus:
            got = [v for v in finals if v is not None]
            row.append("—" if name == versus or not base else f"{permutation_p(got, [b for b in base if b is not None]):.3f}")
        rows.append(row)
    return markdown_table(header, rows)


def _mean_curve(runs: list[Arm], metric: str, x: str) -> tuple[list[float], list[tuple[float, float, float]]]:
    """Eval steps common to the seeds, x = the mean step / tokens / FLOPs there, y = mean ± CI band."""
    steps = sorted(set.intersection(*(set(a.series.series(metric)) for a in runs)))
    xs, ys = [], []
    for s in steps:
        if x == "step":
            xs.append(float(s))
        else:
            xs.append(statistics.mean(_at(a.flops if x == "flops" else a.tokens, s) or 0.0 for a in runs))
        ys.append(band([a.series.series(metric)[s] for a in runs]))
    return xs, ys


def plot(arms: dict[str, list[Arm]], *, threshold: float):
    panels = [(PASS1, "step"), (PASS1, "tokens"), (PASS1, "flops"), (PASS8, "flops"), (ENTROPY, "step")]
    fig, axes = new_figure(len(panels))
    for ax, (metric, x) in zip(axes, panels):
        for i, (name, runs) in enumerate(arms.items()):
            runs = [a for a in runs if a.series.series(metric)]
            if not runs or (x == "tokens" and runs[0].kind == "sft"):
                continue
            if metric == ENTROPY:
                steps = sorted(set.intersection(*(set(a.series.series(metric)) for a in runs)))
                ax.plot(steps, [statistics.mean(a.series.series(metric)[s] for a in runs) for s in steps],
                        color=color(i), label=name)
                continue
            xs, ys = _mean_curve(runs, metric, x)
            ax.plot(xs, [y[0] for y in ys], marker=".", color=color(i), label=name)
            ax.fill_between(xs, [y[1] for y in ys], [y[2] for y in ys], color=color(i), alpha=0.15)
        if metric == PASS1:
            ax.axhline(threshold, color="grey", linestyle=":", linewidth=1)
        ax.set_title(f"{metric.split('/')[-1]} by {'student-sampled token' if x == 'tokens' else x}")
        ax.set_xlabel({"step": "step (SFT: SFT step)", "tokens": "student-sampled tokens", "flops": "FLOPs"}[x])
    axes[0].legend(fontsize=7)
    return fig


def run_teach(runs: list[Path], *, teacher: Path, fig_path: Path, labels: list[str] | None = None,
              share: float = 0.95, versus: str | None = None) -> str:
    """The table (one per CPU type when the runs ran on several) and the figure; returns the table."""
    for run in [teacher, *runs]:
        if RunDir(run).summary() is None:
            raise ValueError(f"{run}: not a finished run (no summary.json)")
    groups = group_runs(runs, labels)
    if versus and versus not in groups:
        raise ValueError(f"--versus {versus!r} is none of the arms {list(groups)}")
    t_params, t_pass1 = parameters(teacher / "final"), teacher_pass1(teacher)
    threshold = share * t_pass1
    arms = {name: [read_arm(r, teacher_params=t_params) for r in rs] for name, rs in groups.items()}
    by_type = by_machine({name: [a.series for a in a_runs] for name, a_runs in arms.items()})
    teacher_flops = sum(RL_PER_TOKEN * t_params * v for v in read_run(teacher).train.get(TOKENS, {}).values())
    parts = [f"Teacher {teacher.name}: held-out pass@1 {t_pass1:.3f}, {t_params:,} parameters, its own RL "
             f"{teacher_flops:.2e} FLOPs (not counted in the arms). Threshold: {share:g} x {t_pass1:.3f} = "
             f"{threshold:.3f}.\n"]
    for cpu, variants in by_type.items():
        kept = {name: [a for a in arms[name] if a.series in variants[name]] for name in arms}
        parts.append(f"\n{cpu}:\n\n" + table(kept, threshold=threshold, versus=versus))
    text = "".join(parts)
    write_outputs(fig_path, plot(arms, threshold=threshold), text)
    return text


__all__ = ["Arm", "parameters", "read_arm", "run_teach", "table", "teacher_pass1"]
