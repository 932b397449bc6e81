"""The progress lines' remaining-time estimate (mathrl.track.console): smooth under changing step times.

Run: python -m pytest tests/track/test_progress.py -q
"""

from __future__ import annotations

import io

import pytest
from rich.console import Console

import mathrl.track.console as console_mod
from mathrl.track.console import PlainProgress, remaining_seconds


def test_remaining_seconds_is_the_mean_after_the_first_unit() -> None:
    assert remaining_seconds(0, 10, 0.0, 0.0) is None  # nothing done: no estimate
    assert remaining_seconds(1, 9, 30.0, 0.0) == pytest.approx(270.0)  # one unit: its own time
    # 1 start-up unit of 30 s, then 4 units in 8 s: 2 s each, the start-up left out
    assert remaining_seconds(5, 5, 38.0, 8.0) == pytest.approx(10.0)


def test_plain_eta_moves_little_when_one_step_is_slow(monkeypatch) -> None:
    # the bug story: a run under load printed eta 0:02:50 and then 0:07:08 a few steps later. A step that
    # takes 4x the others (an evaluation step, a burst of load) must move the estimate by a fraction,
    # not multiply it.
    clock = [0.0]
    monkeypatch.setattr(console_mod.time, "monotonic", lambda: clock[0])
    out = io.StringIO()
    bar = PlainProgress(Console(file=out, width=200), "RL step", every_s=0.0)
    task = bar.add_task("rl", total=40)
    durations = [20.0] + [2.0] * 9 + [8.0] + [2.0] * 4  # start-up, steady steps, one slow step, steady again
    for d in durations:
        clock[0] += d
        bar.advance(task)
    etas = [line.rsplit("eta ", 1)[1] for line in out.getvalue().splitlines()]
    seconds = [int(m) * 60 + int(s) for _, m, s in (e.split(":") for e in etas)]
    assert len(seconds) == len(durations)
    assert seconds[1] == (40 - 2) * 2  # from the second unit on, the start-up unit is left out
    before, after = seconds[9], seconds[10]  # around the slow step
    assert after / (40 - 11) < 1.4 * before / (40 - 10)  # per-step estimate rose by under 40%


METRICS = {"reward/mean": 0.461, "actor/entropy": 0.118, "actor/pg_clipfrac": 0.031, "rollout/response_length": 30.5,
           "perf/step_seconds": 19.0}


@pytest.mark.parametrize("width, evaluated, shown, left_out, why", [
    (80, True, ["rew 0.461", "p@1 0.279", "ent 0.118", "clip 0.031"], ["len", "s/step"],
     "80 columns: reward, pass@1, entropy and clip stay; length and time go first"),
    (80, False, ["rew 0.461", "ent 0.118", "clip 0.031", "len 30.5"], ["p@1", "s/step"],
     "not evaluated yet: no pass@1, so the length fits"),
    (104, True, ["rew 0.461", "p@1 0.279", "ent 0.118", "clip 0.031", "len 30.5", "19.0s/step"], [],
     "104 columns: every field"),
    (160, True, ["reward 0.461", "eval pass@1 arith 0.279", "entropy 0.118", "clip 0.031", "len 30.5", "19.0s/step"], [],
     "a wide terminal keeps the bar and the long names"),
])
def test_the_step_bar_keeps_the_fields_that_matter_at_80_columns(width, evaluated, shown, left_out, why) -> None:
    # Bug story: at 80 columns the bar cut its text after the reward: entropy, clip fraction and length
    # were never seen on a laptop's terminal.
    from mathrl.track.console import StepProgress

    out = io.StringIO()
    console = Console(file=out, width=width, force_terminal=True, color_system=None)
    with StepProgress(console, total=50) as bar:
        bar.advance(METRICS, {"eval/arith/pass@1": 0.279} if evaluated else {})
    text = out.getvalue().replace("\x1b[2K", "").replace("\r", "\n")
    last = [line for line in text.splitlines() if "RL step" in line][-1]
    assert len(last.rstrip()) <= width
    assert "…" not in last, ("whole fields are left out; none is cut mid-way", last)
    for field in shown:
        assert field in last, (why, last)
    for field in left_out:
        assert field not in last, (why, last)


def test_fit_fields_leaves_out_the_lowest_priority_first() -> None:
    from mathrl.track.console import fit_fields

    assert fit_fields(["a 1", "b 2", "c 3"], 15) == "a 1 | b 2 | c 3"  # 15 columns: all
    assert fit_fields(["a 1", "b 2", "c 3"], 14) == "a 1 | b 2"  # one short: the last goes
    assert fit_fields(["a 1", "b 2", "c 3"], 2) == "a 1"  # the first always stays (the bar cuts it)


@pytest.mark.parametrize("count, noun, expected, why", [
    (1, "sample", "1 sample", "one: no s (`1 sample each`, not `1 samples each`)"),
    (2, "sample", "2 samples", "more than one: an s"),
    (0, "problem", "0 problems", "none: an s, as English has it"),
])
def test_plural_adds_an_s_unless_the_count_is_one(count, noun, expected, why) -> None:
    from mathrl.track.console import plural

    assert plural(count, noun) == expected, why
