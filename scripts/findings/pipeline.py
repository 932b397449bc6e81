"""`all`: every run and every analysis of docs/findings.md, as one list of jobs with one progress bar.

    python scripts/findings all                         # runs/findings, figures to docs/findings, 2 at once
    python scripts/findings all --dry-run               # every command, and how many
    python scripts/findings all --only entropy ppo      # these findings' runs and analyses

What runs is data: `FINDINGS` below, one `Finding` per experiment: its grid (recipes/findings/*.yaml,
expanded by ablate.py's `load_grid` and `train_command`, exactly the `mathrl train` commands ablate.py
runs), or explicit run commands (finding 6: the SFT traces, `mathrl sft` and the RL runs from its
model), and the analyses docs/findings.md shows for it (`python scripts/findings curves | passk |
overconfidence | entropy-tokens ...`). Placeholders in the commands: {out} (the runs' directory, --out),
{fig} (the figures' directory, --fig-dir), {python} (this interpreter).

Jobs run `--jobs` at a time (each with cores/jobs torch threads, as ablate.py), each as a subprocess
whose output goes to a log file ({out}/<run>.log, {out}/logs/<analysis>.log). A run whose directory
holds summary.json is finished and kept; a killed one resumes from its last checkpoint (mathrl train's
auto-resume); an analysis is redone unless its output is newer than every run it reads. A job starts
when the jobs it needs have finished; when one fails, the jobs that need it are skipped, the others
go on, and the command exits 1 naming them.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GRID_DIR = REPO / "recipes" / "findings"
RECIPE = "recipes/arith_check_grpo.yaml"
FINDINGS_CMD = ("{python}", "scripts/findings")


def seeds(name: str, count: int, *, zero_suffix: bool = False) -> list[str]:
    """{out}/<name> run directories of seeds 0..count-1, named as ablate.py names them (seed 0 plain,
    `_seed<N>` after), or with `zero_suffix` `<name>_seed0` too (finding 6's runs)."""
    return [f"{{out}}/{name}" + ("" if s == 0 and not zero_suffix else f"_seed{s}") for s in range(count)]


@dataclass(frozen=True)
class Analysis:
    name: str  # unique over the registry; the log is {out}/logs/<name>.log
    argv: tuple[str, ...]  # with placeholders
    output: str  # the file it writes (with placeholders): the analysis is up to date when it is newer than its runs
    needs: tuple[str, ...] = ()  # findings whose runs it reads (default: its own)


@dataclass(frozen=True)
class RunStep:
    """A run that is not a grid variant: a command, the file that exists once it finished, what it needs."""

    name: str
    argv: tuple[str, ...]
    done: str  # path (with placeholders) present once it finished
    after: tuple[str, ...] = ()  # names of the runs it needs


@dataclass(frozen=True)
class Finding:
    name: str  # the --only name
    grid: str | None = None  # recipes/findings/<grid>.yaml, run through ablate.py's functions
    runs: tuple[RunStep, ...] = ()  # runs that are not grid variants
    analyses: tuple[Analysis, ...] = ()


def curves(grid: str, *extra: str) -> Analysis:
    """`scripts/findings curves recipes/findings/<grid>.yaml --out {out} --fig {fig}/<grid>.png`, as docs/findings.md runs it."""
    return Analysis(f"curves_{grid}", (*FINDINGS_CMD, "curves", f"recipes/findings/{grid}.yaml", "--out", "{out}",
                                       "--fig", f"{{fig}}/{grid}.png", *extra), f"{{fig}}/{grid}.png")


R1_SEEDS = 5  # seeds 0..4 of finding 6 (3 left it inconclusive)
GRPO_SEEDS = 5  # entropy.yaml's seeds: the R1-Zero runs of findings 1, 2 and 6
BASE = "tiny-arith"  # the runs' cached base model, the same as $(mathrl base base.check_prob=0.3 base.steps=1500)


def _r1_runs() -> tuple[RunStep, ...]:
    """Finding 6: the reflective SFT traces, SFT per seed, RL from the SFT model, and R1-Zero at its compute."""
    traces = "{out}/reflective_traces.jsonl"
    steps = [RunStep("reflective_traces", ("{python}", "-m", "mathrl.train.sft", traces, "--rows", "4000",
                                           "--slip-prob", "0.3", "--check-prob", "1.0"), traces)]
    for s in range(R1_SEEDS):
        sft, r1, zero = f"sft_seed{s}", f"r1_path_seed{s}", f"r1_zero_100steps_seed{s}"
        steps.append(RunStep(sft, ("{python}", "-m", "mathrl.cli", "sft", RECIPE, f"data.train={traces}", f"seed={s}",
                                   "--run-dir", f"{{out}}/{sft}"), f"{{out}}/{sft}/summary.json", ("reflective_traces",)))
        steps.append(RunStep(r1, ("{python}", "-m", "mathrl.cli", "train", RECIPE, f"model.path={{out}}/{sft}/final",
                                  "eval.every=10", "data.eval_size=100", f"seed={s}", "--run-dir", f"{{out}}/{r1}"),
                             f"{{out}}/{r1}/summary.json", (sft,)))
        steps.append(RunStep(zero, ("{python}", "-m", "mathrl.cli", "train", RECIPE, "train.steps=100", "eval.every=10",
                                    "data.eval_size=100", f"seed={s}", "--run-dir", f"{{out}}/{zero}"),
                             f"{{out}}/{zero}/summary.json"))
    return tuple(steps)


TOOL_SEEDS = 5


def _tool_runs(recipe: str, prefix: str, trace_args: tuple[str, ...]) -> tuple[RunStep, ...]:
    """Finding 14's guided start on one task: a few hundred tool traces (`trace_args`: the task's
    operands), SFT on them per seed (the SFT model's own held-out pass@1 is arm d), then RL with the
    tool from the SFT model (arm c). Run names start with `prefix`. Arm c never stops for steps that
    train nothing (`max_empty_steps=0`): an SFT model that gets every sample right is a result of the
    arm, not a failed run (the setting decides only whether such a run stops)."""
    traces = f"{{out}}/{prefix}tool_traces.jsonl"
    steps = [RunStep(f"{prefix}tool_traces", ("{python}", "-m", "mathrl.train.sft", traces, "--rows", "500",
                                              *trace_args, "--tool-share", "1.0"), traces)]
    for s in range(TOOL_SEEDS):
        sft, rl = f"{prefix}tools_sft_seed{s}", f"{prefix}tools_sft_rl_seed{s}"
        steps.append(RunStep(sft, ("{python}", "-m", "mathrl.cli", "sft", recipe, f"data.train={traces}", "sft.steps=300",
                                   "eval.every=100", "data.eval_size=100", f"seed={s}", "--run-dir", f"{{out}}/{sft}"),
                             f"{{out}}/{sft}/summary.json", (f"{prefix}tool_traces",)))
        steps.append(RunStep(rl, ("{python}", "-m", "mathrl.cli", "train", recipe, f"model.path={{out}}/{sft}/final",
                                  "eval.every=10", "data.eval_size=100", "data.dynamic_sampling.max_empty_steps=0",
                                  f"seed={s}", "--run-dir", f"{{out}}/{rl}"),
                             f"{{out}}/{rl}/summary.json", (sft,)))
    return tuple(steps)


def _tool_curves(finding: str, prefix: str) -> Analysis:
    """The four arms' curves of one task of finding 14 (grid recipes/findings/<finding>.yaml: no_<...>, <...>_from_base)."""
    return Analysis(f"curves_{finding}", (
        *FINDINGS_CMD, "curves", *seeds(f"no_{prefix}tools", TOOL_SEEDS), *seeds(f"{prefix}tools_from_base", TOOL_SEEDS),
        *seeds(f"{prefix}tools_sft_rl", TOOL_SEEDS, zero_suffix=True),
        "--group", *["(a) RL without tools"] * TOOL_SEEDS, *["(b) RL with the tool, from base"] * TOOL_SEEDS,
        *["(c) SFT on tool traces, then RL"] * TOOL_SEEDS,
        "--metrics", "eval/arith_heldout/pass@1", "eval/arith_heldout/tool/call_rate", "tool/call_rate",
        "tool/void_turn_rate", "actor/grad_norm",
        "--fig", f"{{fig}}/{finding}.png"), f"{{fig}}/{finding}.png", needs=(finding,))


TEACH_SEEDS = 5
TEACHER = "teach_teacher"
TEACH_ARMS = (  # finding 19: run-name prefix, label, the RL run's overrides (None: SFT on the teacher's traces)
    ("teach_grpo", "GRPO (reward only)", ()),
    ("teach_sft", "SFT on the teacher's correct traces", None),
    ("teach_opd", "OPD reverse KL", ("algo.distill.mode=reverse_kl", f"teacher.path={{out}}/{TEACHER}/final")),
    ("teach_opd_reward", "OPD + reward", ("algo.distill.mode=reverse_kl", "algo.distill.reward_weight=1",
                                          f"teacher.path={{out}}/{TEACHER}/final")),
    ("teach_topk", "top-k forward KL", ("algo.distill.mode=forward_kl_topk", f"teacher.path={{out}}/{TEACHER}/final")),
    ("teach_self", "self-distillation", ("algo.distill.mode=reverse_kl", "teacher.self=true")),
)


def _teach_runs() -> tuple[RunStep, ...]:
    """Finding 19: a teacher (the default run: 50 RL steps from the base, seed 100, not one of the arms' seeds), its
    checked answers to 2000 training prompts (4 samples each, at most one kept), then per seed 0-4 each
    arm from the base: 50 RL steps (evaluated every 5), or SFT on the traces (300 steps, evaluated every 25)."""
    traces = "{out}/teach_traces.jsonl"
    steps = [RunStep(TEACHER, ("{python}", "-m", "mathrl.cli", "train", RECIPE, "eval.every=10",
                               "data.eval_size=100", "seed=100", "--run-dir", f"{{out}}/{TEACHER}"),
                     f"{{out}}/{TEACHER}/summary.json"),
             RunStep("teach_traces", ("{python}", "-m", "mathrl.cli", "distill-data", RECIPE, "--teacher",
                                      f"{{out}}/{TEACHER}/final", "--out", traces, "--n", "4", "--prompts", "2000",
                                      "--seed", "100", "--force"), traces, (TEACHER,))]
    for prefix, _, overrides in TEACH_ARMS:
        for s in range(TEACH_SEEDS):
            name = f"{prefix}_seed{s}"
            if overrides is None:
                argv = ("{python}", "-m", "mathrl.cli", "sft", RECIPE, f"data.train={traces}", "eval.every=25",
                        "data.eval_size=100", f"seed={s}", "--run-dir", f"{{out}}/{name}")
                after = ("teach_traces",)
            else:
                argv = ("{python}", "-m", "mathrl.cli", "train", RECIPE, *overrides, "eval.every=5", "data.eval_size=100",
                        f"seed={s}", "--run-dir", f"{{out}}/{name}")
                after = (TEACHER,) if any(TEACHER in o for o in overrides) else ()
            steps.append(RunStep(name, argv, f"{{out}}/{name}/summary.json", after))
    return tuple(steps)


def _teach_analysis() -> Analysis:
    runs = [r for prefix, _, _ in TEACH_ARMS for r in seeds(prefix, TEACH_SEEDS, zero_suffix=True)]
    labels = [label for _, label, _ in TEACH_ARMS for _ in range(TEACH_SEEDS)]
    return Analysis("teach", (*FINDINGS_CMD, "teach", "--teacher", f"{{out}}/{TEACHER}", *runs, "--group", *labels,
                              "--versus", TEACH_ARMS[0][1], "--fig", "{fig}/teach.png"), "{fig}/teach.png")


FINDINGS: tuple[Finding, ...] = (
    Finding("entropy", "entropy", analyses=(
        curves("entropy"),
        Analysis("passk", (*FINDINGS_CMD, "passk", "--base", BASE, *seeds("grpo", GRPO_SEEDS),
                           *seeds("sft", R1_SEEDS, zero_suffix=True), *seeds("r1_path", R1_SEEDS, zero_suffix=True),
                           "--group", *["R1-Zero: RL from base"] * GRPO_SEEDS, *["SFT only"] * R1_SEEDS,
                           *["R1: SFT then RL"] * R1_SEEDS, "--n", "64", "--limit", "100", "--fig", "{fig}/passk.png"),
                 "{fig}/passk.png", needs=("entropy", "r1_path")),
        Analysis("overconfidence", (*FINDINGS_CMD, "overconfidence", "--base", BASE, *seeds("grpo", GRPO_SEEDS),
                                    "--limit", "100", "--fig", "{fig}/overconfidence.png"), "{fig}/overconfidence.png"),
    )),
    Finding("length", "length", analyses=(curves("length"),)),
    Finding("dynamic_sampling", "dynamic_sampling", analyses=(curves("dynamic_sampling", "--x", "tokens"),)),
    Finding("r1_path", runs=_r1_runs(), analyses=(
        Analysis("curves_r1_path", (*FINDINGS_CMD, "curves", *seeds("grpo", GRPO_SEEDS),
                                    *seeds("r1_zero_100steps", R1_SEEDS, zero_suffix=True),
                                    *seeds("r1_path", R1_SEEDS, zero_suffix=True),
                                    "--group", *["R1-Zero, 50 steps"] * GRPO_SEEDS, *["R1-Zero, 100 steps"] * R1_SEEDS,
                                    *["R1: SFT, then 50 RL steps"] * R1_SEEDS,
                                    "--metrics", "eval/arith_heldout/pass@1", "eval/arith_heldout/pass@8",
                                    "eval/arith_heldout/reflection_rate", "eval/arith_heldout/response_length",
                                    "--fig", "{fig}/r1_path.png"), "{fig}/r1_path.png", needs=("entropy", "r1_path")),
    )),
    Finding("updates", "updates", analyses=(curves("updates"),)),
    Finding("ppo", "ppo", analyses=(
        curves("ppo"),
        Analysis("positions_ppo", (*FINDINGS_CMD, "positions", "recipes/findings/ppo.yaml", "--out", "{out}",
                                   "--steps", "1", "3", "50", "--fig", "{fig}/ppo_positions.png"), "{fig}/ppo_positions.png"),
    )),
    Finding("kl_drag", "kl_drag", analyses=(curves("kl_drag"),)),
    Finding("integer_hack", "integer_hack", analyses=(curves("integer_hack"),)),
    Finding("difficulty", "difficulty", analyses=(curves("difficulty"),)),
    Finding("clip_binds", "clip_binds", analyses=(curves("clip_binds"),)),
    Finding("tools", "tools", runs=_tool_runs("recipes/arith_tools.yaml", "", ("--min-digits", "5", "--max-digits", "6")),
            analyses=(_tool_curves("tools", ""),)),
    Finding("tools_mul", "tools_mul", runs=_tool_runs("recipes/arith_tools_mul.yaml", "mul_", (
        "--min-digits", "3", "--max-digits", "4", "--mul-share", "1.0")), analyses=(
        _tool_curves("tools_mul", "mul_"),
        Analysis("curves_tools_mul_void", (
            *FINDINGS_CMD, "curves", *seeds("mul_tools_from_base", TOOL_SEEDS), *seeds("mul_tools_void_filter", TOOL_SEEDS),
            "--group", *["(b) RL with the tool, from base"] * TOOL_SEEDS, *["(b) with the void-turn filter"] * TOOL_SEEDS,
            "--metrics", "eval/arith_heldout/pass@1", "tool/void_turn_rate", "actor/grad_norm", "filter/void_turn",
            "--fig", "{fig}/tools_mul_void.png"), "{fig}/tools_mul_void.png"),
    )),
    Finding("passk_training", "passk_training", analyses=(
        curves("passk_training", "--metrics", "eval/arith_heldout/pass@1", "eval/arith_heldout/pass@8",
               "eval/arith_heldout/maj@8", "actor/entropy"),
        Analysis("passk_training_passk", (*FINDINGS_CMD, "passk", "--base", BASE, *seeds("grpo", GRPO_SEEDS),
                                          *seeds("grpo_passk", 5), *seeds("maxrl", 5),
                                          "--group", *["GRPO"] * GRPO_SEEDS, *["pass@k advantage"] * 5,
                                          *["MaxRL"] * 5, "--n", "64", "--limit", "100",
                                          "--fig", "{fig}/passk_training_passk.png"),
                 "{fig}/passk_training_passk.png"),
    )),
    Finding("trust_regions", "trust_regions", analyses=(curves("trust_regions", "--threshold", "0.85", "--versus", "grpo"),)),
    Finding("trust_regions_offpolicy", "trust_regions_offpolicy",
            analyses=(curves("trust_regions_offpolicy", "--threshold", "0.85", "--versus", "clip_0.2_0.28"),)),
    Finding("offpolicy_masks", "offpolicy_masks",
            analyses=(curves("offpolicy_masks", "--threshold", "0.8", "--versus", "k4_none"),)),
    Finding("entropy_controls", "entropy_controls",
            analyses=(curves("entropy_controls", "--threshold", "0.85", "--versus", "long_none"),)),
    Finding("teach", runs=_teach_runs(), analyses=(_teach_analysis(),)),
    Finding("entropy_long", "entropy_long", analyses=(
        curves("entropy_long"),
        Analysis("entropy_tokens", (*FINDINGS_CMD, "entropy-tokens", *seeds("entropy_adaptive_long", 5),
                                    *seeds("entropy_adaptive_long_refclip", 5), "--steps", "0", "100", "200", "300",
                                    "--limit", "100", "--out", "{fig}/entropy_tokens.md"), "{fig}/entropy_tokens.md"),
    )),
)


# ---- jobs -------------------------------------------------------------------------------------------


@dataclass
class Job:
    name: str
    argv: list[str]
    kind: str  # "run" or "analysis"
    log: Path
    after: set[str] = field(default_factory=set)  # jobs that must finish first
    marker: Path | None = None  # a run: the file present once it finished; an analysis: the file it writes
    up_to_date: bool = False  # an analysis: its output is newer than every run it reads

    @property
    def done(self) -> bool:
        """Finished earlier: nothing to do."""
        if self.kind == "analysis":
            return self.up_to_date
        return self.marker is not None and self.marker.is_file()


def _fill(text: str, values: dict[str, str]) -> str:
    return text.format(**values)


def grid_findings(grids: Sequence[Path]) -> tuple[Finding, ...]:
    """Findings for grid files given on the command line: a registered grid keeps its analyses, any
    other gets its curves (`curves <grid> --out {out} --fig {fig}/<stem>.png`)."""
    registered = {f.grid: f for f in FINDINGS if f.grid}
    out = []
    for g in grids:
        f = registered.get(g.stem)
        if f is not None and g.resolve() == (GRID_DIR / f"{g.stem}.yaml").resolve():
            out.append(f)
            continue
        out.append(Finding(g.stem, str(g), analyses=(Analysis(
            f"curves_{g.stem}", (*FINDINGS_CMD, "curves", str(g), "--out", "{out}", "--fig", f"{{fig}}/{g.stem}.png"),
            f"{{fig}}/{g.stem}.png"),)))
    return tuple(out)


def _grid_path(finding: Finding) -> Path:
    g = Path(finding.grid)
    return g if g.suffix in (".yaml", ".yml") else GRID_DIR / f"{g}.yaml"


def build_jobs(findings: Sequence[Finding], *, out: Path, fig_dir: Path, only: Iterable[str] | None = None,
               validate: bool = True) -> list[Job]:
    """The jobs of `findings` (or of the --only ones among them), runs first, in the registry's order; an
    analysis that reads another finding's runs brings those runs along. Every grid variant's config is
    validated first (ablate.py's `validate`): a typo fails before anything runs. A run shared by several
    grids (the recipe's `grpo`) is one job; the same name with other overrides is an error. `out` and
    `fig_dir` go into the commands as given, which run in the repository root (REPO)."""
    from ablate import load_grid, train_command
    from ablate import validate as validate_grid

    names = [f.name for f in findings]
    if only:
        unknown = sorted(set(only) - set(names))
        if unknown:
            raise ValueError(f"--only names no finding: {unknown}; the findings are {names}")
        findings = [f for f in findings if f.name in set(only)]
    values = {"out": str(out), "fig": str(fig_dir), "python": sys.executable}
    known = {x.name: x for x in FINDINGS} | {x.name: x for x in findings}
    runs: dict[str, Job] = {}
    cache: dict[str, list[Job]] = {}  # finding -> its run jobs

    def add_run(job: Job) -> None:
        same = runs.get(job.name)
        if same is not None and same.argv != job.argv:
            raise ValueError(f"run {job.name!r} is defined twice with different commands:\n  {shlex.join(same.argv)}\n"
                             f"  {shlex.join(job.argv)}")
        runs.setdefault(job.name, job)

    def runs_of_finding(f: Finding) -> list[Job]:
        if f.name in cache:
            return cache[f.name]
        jobs = cache.setdefault(f.name, [])
        if f.grid:
            recipe, variants, _ = load_grid(_grid_path(f))
            if validate:
                validate_grid(recipe, variants)
            jobs += [Job(v.name, train_command(recipe, v, out / v.name), "run", REPO / out / f"{v.name}.log",
                         marker=REPO / out / v.name / "summary.json") for v in variants]
        jobs += [Job(step.name, [_fill(a, values) for a in step.argv], "run", REPO / out / f"{step.name}.log",
                     set(step.after), marker=REPO / _fill(step.done, values)) for step in f.runs]
        return jobs

    for f in findings:
        for job in runs_of_finding(f):
            add_run(job)
    analyses = []
    for f in findings:
        for a in f.analyses:
            argv = [_fill(x, values) for x in a.argv]
            candidates = {j.name: j for n in (a.needs or (f.name,)) for j in runs_of_finding(known[n])}
            # the runs it reads: those whose directory is an argument, or all of them (a grid file's curves)
            read = [n for n in candidates if str(out / n) in argv] or list(candidates)
            after, todo = set(), list(read)
            while todo:  # and what those runs need (finding 6's RL runs: their SFT run and its traces)
                name = todo.pop()
                if name not in after:
                    after.add(name)
                    add_run(candidates[name])
                    todo += candidates[name].after
            output = REPO / _fill(a.output, values)
            up_to_date = output.is_file() and all(runs[r].done for r in after) and all(
                output.stat().st_mtime > runs[r].marker.stat().st_mtime for r in after)
            analyses.append(Job(a.name, argv, "analysis", REPO / out / "logs" / f"{a.name}.log", after, marker=output,
                                up_to_date=up_to_date))
    return list(runs.values()) + analyses


def describe(jobs: Sequence[Job]) -> str:
    """The dry run: every command, one per line, with its kind and whether it is already done; then the counts."""
    lines = []
    for j in jobs:
        state = "done" if j.done else "todo"
        shown = ["python" if a == sys.executable else a for a in j.argv]
        lines.append(f"[{j.kind} {state}] {j.name}: {shlex.join(shown)}")
    runs = [j for j in jobs if j.kind == "run"]
    analyses = [j for j in jobs if j.kind == "analysis"]
    lines.append(f"{len(jobs)} commands: {len(runs)} runs ({sum(j.done for j in runs)} finished earlier), "
                 f"{len(analyses)} analyses ({sum(j.done for j in analyses)} up to date)")
    return "\n".join(lines) + "\n"


# ---- running them -----------------------------------------------------------------------------------


def run_jobs(jobs: Sequence[Job], *, parallel: int, console, env: dict[str, str], cwd: Path = REPO,
             poll_s: float = 0.5) -> list[str]:
    """Run the jobs that are not done, `parallel` at a time, each when its `after` jobs have finished,
    with one progress bar (done / total, what is running, elapsed, ETA). Returns the names of the jobs
    that failed or were skipped because one they need failed."""
    from mathrl.track.console import make_progress

    finished = {j.name for j in jobs if j.done}
    pending = [j for j in jobs if not j.done]
    failed: list[str] = []
    running: dict[str, tuple[Job, subprocess.Popen, float]] = {}
    with make_progress(console, "findings", every_s=0.0) as bar:
        task = bar.add_task("findings", total=len(jobs), completed=len(finished), info="")

        def show() -> None:
            names = ", ".join(running) or "—"
            bar.update(task, info=f"running: {names}")

        while pending or running:
            for name, (job, proc, started) in list(running.items()):
                if proc.poll() is None:
                    continue
                del running[name]
                seconds = time.monotonic() - started
                if proc.returncode == 0:
                    finished.add(name)
                    console.print(f"{job.kind} {name}: done in {seconds:.0f} s", markup=False, highlight=False)
                else:
                    failed.append(name)
                    console.print(f"{job.kind} {name}: exit {proc.returncode} after {seconds:.0f} s (log: {job.log})",
                                  markup=False, highlight=False)
                bar.advance(task)
                show()
            for job in list(pending):  # a job whose prerequisite failed will never run
                if job.after & set(failed):
                    pending.remove(job)
                    failed.append(job.name)
                    console.print(f"{job.kind} {job.name}: skipped, it needs {sorted(job.after & set(failed))}",
                                  markup=False, highlight=False)
                    bar.advance(task)
            for job in list(pending):
                if len(running) >= parallel:
                    break
                if job.after <= finished:
                    pending.remove(job)
                    job.log.parent.mkdir(parents=True, exist_ok=True)
                    with job.log.open("a") as log:
                        proc = subprocess.Popen(job.argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd)
                    running[job.name] = (job, proc, time.monotonic())
                    show()
            if pending and not running and not any(j.after <= finished for j in pending):
                stuck = [j.name for j in pending]
                raise ValueError(f"jobs {stuck} need jobs that are not in the list")
            time.sleep(poll_s)
    return failed


__all__ = ["FINDINGS", "Analysis", "Finding", "Job", "RunStep", "build_jobs", "describe", "grid_findings", "run_jobs",
           "seeds"]
