"""Watches over a run, step after step: they read what each step returned (`train/step.py:StepResult`)
and warn, or stop the run, when it goes wrong in a way one step cannot see.

    collapse, signal = CollapseWatch(), SignalWatch()              # held by the trainer
    result = rl_step(trainer, step)
    if result.trained:
        collapse.check(step, result.collapse, console)             # a collapse rate jumped: warn
    signal.record(step, result.groups, n=cfg.rollout.n)
    signal.check(step, cfg, console)                               # no reward signal for too long: stop or warn
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rich.console import Console

from mathrl.config import Config
from mathrl.train.collect import CollapseRates, GroupDrops


class CollapseWatch:
    """Warns when a collapse rate jumps: above 0.1 and at least twice its running average."""

    def __init__(self, decay: float = 0.9):
        self.decay, self.avg = decay, {}

    def check(self, step: int, rates: CollapseRates, console: Console) -> None:
        for key, value in rates.metrics().items():
            avg = self.avg.get(key)
            if avg is not None and value > 0.1 and value > 2 * avg:
                console.print(f"[yellow]warning:[/yellow] step {step}: {key} jumped to {value:.2f} (running average {avg:.2f})")
            self.avg[key] = value if avg is None else self.decay * avg + (1 - self.decay) * value


@dataclass(frozen=True)
class GroupOutcomes:
    """How one step's groups of samples turned out, as `SignalWatch` reads them."""

    kept: int  # groups the step trained on
    kept_all_wrong: int  # of them, groups whose every sample was wrong
    kept_all_correct: int  # ... whose every sample was right
    dropped: GroupDrops = field(default_factory=GroupDrops)  # the groups dynamic sampling dropped, per reason


class NoSignalError(RuntimeError):
    """Too many consecutive steps in which no group of samples had a reward signal to learn from."""


@dataclass
class SignalWatch:
    """Consecutive steps without a learning signal, and what the run says about them.

    A group-normalised advantage is 0 for a group whose n samples are all right or all wrong, so a step
    in which every group is like that moves nothing. With dynamic sampling such a step keeps no group
    and trains nothing; after `data.dynamic_sampling.max_empty_steps` of them in a row the run stops
    with the reason (almost always: the model solves none of the problems) and what to try. With
    `data.dynamic_sampling.mode: none` every group trains by request (and KL, entropy or a critic may
    still move the weights), so the same streak is a warning, not a stop.
    """

    in_a_row: int = 0
    first: int = 0  # the streak's first step
    groups: int = 0  # groups sampled in the streak
    all_wrong: int = 0
    all_correct: int = 0
    n: int = 1  # samples per group
    warned: bool = False

    def record(self, step: int, outcomes: GroupOutcomes, *, n: int) -> None:
        if outcomes.kept == 0:  # dynamic sampling dropped every group it sampled
            wrong, right = outcomes.dropped.all_wrong, outcomes.dropped.all_correct
            groups = wrong + right + outcomes.dropped.out_of_band
        elif outcomes.kept_all_wrong + outcomes.kept_all_correct == outcomes.kept:
            groups = outcomes.kept  # every kept group all right or all wrong (mode none)
            wrong, right = outcomes.kept_all_wrong, outcomes.kept_all_correct
        else:
            self.in_a_row, self.warned = 0, False
            return
        if self.in_a_row == 0:
            self.first, self.groups, self.all_wrong, self.all_correct = step, 0, 0, 0
        self.in_a_row += 1
        self.groups, self.all_wrong, self.all_correct = self.groups + groups, self.all_wrong + wrong, self.all_correct + right
        self.n = n

    def explain(self, step: int, cfg: Config) -> str:
        """What the streak was, why nothing could be learnt, and what to do."""
        steps = f"steps {self.first}-{step}" if step > self.first else f"step {step}"
        samples = self.groups * self.n
        fix_data = (f"check the prompt template and the answer fields first (`mathrl eval {cfg.model.path} --data "
                    f"{cfg.data.train}` with this run's data.* settings scores the model on these problems: pass@1 0 "
                    "there means the same); then use easier problems, or start from a model fine-tuned on worked "
                    "solutions (`mathrl sft`); see docs/your_data.md")
        if self.all_wrong == self.groups:
            why = (f"every one of the {samples} samples ({self.groups} groups of {self.n}) was wrong (reward 0): the model "
                   "solves none of these problems, so no group had a signal to learn from")
            todo = fix_data
        elif self.all_correct == self.groups:
            why = (f"every one of the {samples} samples ({self.groups} groups of {self.n}) was right: these problems are "
                   "too easy to learn from")
            todo = "use harder problems"
        else:
            rest = self.groups - self.all_wrong - self.all_correct
            why = (f"no group had a signal: of {self.groups} groups of {self.n} samples {self.all_wrong} had every sample wrong, "
                   f"{self.all_correct} every sample right" + (f", {rest} an accuracy outside the band" if rest else ""))
            todo = ("widen data.dynamic_sampling's band" if rest else
                    "use problems the model solves some of the time, or more samples per problem (rollout.n)")
        what = "had no reward signal" if cfg.data.dynamic_sampling.mode == "none" else "trained nothing"
        return f"{steps} {what}: {why}. To fix: {todo}"

    def check(self, step: int, cfg: Config, console: Console, *, main: bool = True) -> None:
        """Stop (dynamic sampling on) or warn once (mode none) after max_empty_steps steps in a row; 0: never.
        Every rank of a torchrun job stops at the same step (the outcomes are the whole batch's); `main`
        False marks the error as rank 0's to report."""
        limit = cfg.data.dynamic_sampling.max_empty_steps
        if not limit or self.in_a_row < limit:
            return
        if cfg.data.dynamic_sampling.mode != "none":
            error = NoSignalError(self.explain(step, cfg) + f" (the run stops after data.dynamic_sampling.max_empty_steps={limit} "
                                "such steps in a row)")
            if not main:
                error.reported_by_rank_0 = True
            raise error
        if not self.warned:
            self.warned = True
            console.print(f"[yellow]warning:[/yellow] {self.explain(step, cfg)}; the policy gradient is 0 while this lasts")
