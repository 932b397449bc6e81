"""What the terminal shows: a progress bar with the key metrics of each step, and the final table."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table


class BuildProgress:
    """Progress of the tiny base model's pretraining."""

    def __init__(self, console: Console, total: int):
        self._progress = Progress(
            TextColumn("pretraining"), BarColumn(), MofNCompleteColumn(), TextColumn("loss {task.fields[loss]:.3f}"),
            TimeElapsedColumn(), TimeRemainingColumn(), console=console,
        )
        self._task = self._progress.add_task("pretrain", total=total, loss=float("nan"))

    def __enter__(self):
        self._progress.__enter__()
        return self

    def __exit__(self, *exc):
        return self._progress.__exit__(*exc)

    def update(self, step: int, total: int, loss: float) -> None:
        self._progress.update(self._task, completed=step, loss=loss)


class StepProgress:
    """One bar for the RL steps; its text shows the latest reward, held-out pass@1, entropy and length."""

    def __init__(self, console: Console, total: int, completed: int = 0):
        self.console = console
        self._progress = Progress(
            TextColumn("[bold]RL"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(), TimeRemainingColumn(), console=console,
        )
        self._task = self._progress.add_task("rl", total=total, completed=completed, info="")

    def __enter__(self):
        self._progress.__enter__()
        return self

    def __exit__(self, *exc):
        return self._progress.__exit__(*exc)

    def note(self, text: str) -> None:
        self._progress.update(self._task, info=text)

    def advance_empty(self) -> None:
        self._progress.update(self._task, advance=1, info="no group kept this step")

    def advance(self, metrics: dict[str, float], eval_metrics: dict[str, float]) -> None:
        held = [f"{k.split('/')[1]} {v:.3f}" for k, v in eval_metrics.items() if k.endswith("/pass@1")]
        info = (
            f"reward {metrics['reward/mean']:.3f} | eval pass@1 {', '.join(held)} | "
            f"entropy {metrics['actor/entropy']:.3f} | clip {metrics['actor/pg_clipfrac']:.3f} | "
            f"len {metrics['rollout/response_length']:.1f} | {metrics['perf/step_seconds']:.1f}s/step"
        )
        self._progress.update(self._task, advance=1, info=info)


def summary_table(base: dict, final: dict, *, wall_seconds: float, n: int) -> Table:
    table = Table(title=f"held-out results (n={n} samples per problem; wall time {wall_seconds / 60:.1f} min)")
    table.add_column("set")
    table.add_column("metric")
    table.add_column("base", justify="right")
    table.add_column("final", justify="right")
    table.add_column("change", justify="right")
    for name, b in base.items():
        f = final[name]
        rows = [(f"pass@1 (avg@{n})", b.pass_at_1, f.pass_at_1)]
        rows += [(f"pass@{k}", b.pass_at_k[k], f.pass_at_k[k]) for k in b.pass_at_k if k > 1]
        rows += [(f"maj@{n}", b.maj_at_n, f.maj_at_n)]
        for metric, bv, fv in rows:
            table.add_row(name, metric, f"{bv:.3f}", f"{fv:.3f}", f"{fv - bv:+.3f}")
    return table
