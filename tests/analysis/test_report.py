"""Tests of `mathrl report` (src/mathrl/analysis/report/) on two fake run directories.

The runs are written by hand in the layout of src/mathrl/train/loop.py: metrics.jsonl with training
and evaluation rows, evals.jsonl, summary.json and config.yaml, the two configs differing in
algo.clip.eps_high (and run_dir, which the report must not list). The HTML is checked as text: one
<svg class="chart"> per logged metric with a line per run, the config-difference table, the eval
table, no external reference; and the PNGs beside it. tests/analysis/test_report_browser.py renders it.

Run: python -m pytest tests/analysis/test_report.py -q
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
from pathlib import Path

import pytest
import yaml

from mathrl.analysis.charts import format_tick, nice_ticks
from mathrl.analysis.report import build_report
from mathrl.analysis.report.runs import run_labels
from mathrl.track.sinks import flatten

STEPS = 6
EVAL_EVERY = 3
SET = "arith_heldout"

# Charted keys both fake runs log; run "clip_higher" also logs actor/ref_kl and a collapse rate,
# collapse/repetitive. Keys not listed in
# report.SECTIONS (actor/grad_norm, perf/*) are logged too and must not be charted.
SHARED_CHARTS = [
    "reward/mean",
    f"eval/{SET}/pass@1", f"eval/{SET}/pass@2", f"eval/{SET}/pass@4", f"eval/{SET}/maj@4",
    "actor/entropy", "actor/rollout_entropy", "actor/entropy_coef",
    "actor/pg_clipfrac", "actor/pg_clipfrac_lower",
    "rollout/response_length", "rollout/truncated_frac",
    "reward/no_answer_rate",
]


def _eval(step: int, p1: float) -> dict:
    return {"pass_at_1": p1, "pass_at_k": {"1": p1, "2": min(1.0, p1 + 0.1), "4": min(1.0, p1 + 0.15)},
            "maj_at_n": min(1.0, p1 + 0.05)}


def write_run(run_dir: Path, *, eps_high: float, lift: float, extra_metrics: bool = False,
              entropy_nan_at: int | None = None, num_problems: int = 20, world_size: int | None = None,
              engine: str | None = None) -> Path:
    """A finished run of STEPS steps with evaluations at steps 0, 3 and 6; pass@1 rises 0.3 -> 0.3 + lift.

    extra_metrics: also log actor/ref_kl and collapse/repetitive. entropy_nan_at: log actor/entropy as
    "nan" at that step, as JsonlSink writes a non-finite value.
    """
    run_dir.mkdir(parents=True)
    rows, evals = [], []
    for step in range(STEPS + 1):
        if step > 0:
            row = {
                "step": step,
                "reward/mean": 0.3 + lift * step / STEPS,
                "reward/no_answer_rate": 0.2 / step,
                "actor/entropy": "nan" if step == entropy_nan_at else 0.9 - 0.05 * step,
                "actor/rollout_entropy": 0.92 - 0.05 * step,
                "actor/entropy_coef": 0.0,
                "actor/pg_clipfrac": 0.01 * step,
                "actor/pg_clipfrac_lower": 0.0,
                "actor/grad_norm": 1.0,
                "rollout/response_length": 30.0 + step,
                "rollout/truncated_frac": 0.05,
                "perf/step_seconds": 1.5,
            }
            if world_size is not None:
                row["perf/world_size"] = float(world_size)
            if extra_metrics:  # logged by one run only
                row["actor/ref_kl"] = 0.002 * step
                row["collapse/repetitive"] = 0.01 * step
            rows.append(row)
        if step % EVAL_EVERY == 0:
            e = _eval(step, 0.3 + lift * step / STEPS)
            rows.append({"step": step, f"eval/{SET}/pass@1": e["pass_at_1"], f"eval/{SET}/maj@4": e["maj_at_n"],
                         **{f"eval/{SET}/pass@{k}": v for k, v in e["pass_at_k"].items() if k != "1"},
                         f"eval/{SET}/no_answer_rate": 0.1})
            evals.append({"step": step, "set": SET, "name": SET, "n": 4, "num_problems": num_problems, **e,
                          "no_answer_rate": 0.1, "truncated_rate": 0.0, "mean_response_length": 30.0,
                          "samples": [{"problem_id": "p0", "response": "\\boxed{3}", "reason": "correct"}]})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run_dir / "evals.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evals))
    base, final = evals[0], evals[-1]
    (run_dir / "summary.json").write_text(json.dumps({
        "wall_seconds": 90.0, "steps": STEPS,
        "base": {SET: {"pass@1": base["pass_at_1"], "pass@k": base["pass_at_k"], "maj@n": base["maj_at_n"]}},
        "final": {SET: {"pass@1": final["pass_at_1"], "pass@k": final["pass_at_k"], "maj@n": final["maj_at_n"]}},
    }))
    config = {"seed": 0, "run_dir": str(run_dir), "rollout": {"n": 8, "temperature": 1.0},
              "algo": {"clip": {"eps_low": 0.2, "eps_high": eps_high, "dual_clip_c": None}},
              "data": {"eval": ["arith"]}}
    if engine is not None:
        config["rollout"]["engine"] = engine
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return run_dir


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """Two runs and their report, built once for the module (the PNGs take most of the time)."""
    root = tmp_path_factory.mktemp("report")
    a = write_run(root / "runs" / "clip_sym", eps_high=0.2, lift=0.2, entropy_nan_at=4)
    b = write_run(root / "runs" / "clip_higher", eps_high=0.28, lift=0.3, extra_metrics=True)
    (b / "inspect_step6.html").write_text("<!DOCTYPE html><p class='tok'>token map of step 6</p>")
    out = build_report([a, b], root / "out" / "report.html", title="clip ablation")
    return out, out.read_text()


def charts(page: str) -> dict[str, str]:
    """data-metric -> the whole <svg class="chart"> element."""
    return {m[1]: m[0] for m in re.finditer(r'<svg class="chart" data-metric="([^"]+)".*?</svg>', page, re.S)}


def runs_drawn(svg: str) -> set[str]:
    return set(re.findall(r'<polyline class="series" data-run="([^"]+)"', svg))


def test_one_chart_per_logged_metric_with_a_line_per_run(report):
    _, page = report
    found = charts(page)
    only_b = {"actor/ref_kl", "collapse/repetitive"}
    assert set(found) == set(SHARED_CHARTS) | only_b  # nothing unlogged, nothing outside SECTIONS
    for metric in SHARED_CHARTS:
        assert runs_drawn(found[metric]) == {"clip_sym", "clip_higher"}, metric
        assert "clip_sym" in found[metric] and "clip_higher" in found[metric]  # the legend
    for metric in only_b:
        assert runs_drawn(found[metric]) == {"clip_higher"}  # only that run logged it


def test_chart_lines_carry_the_logged_values(report):
    _, page = report
    svg = charts(page)["reward/mean"]
    line = re.search(r'data-run="clip_higher"[^>]*data-steps="([^"]+)" data-values="([^"]+)"', svg)
    assert [int(s) for s in line[1].split(",")] == list(range(1, STEPS + 1))
    assert [float(v) for v in line[2].split(",")] == pytest.approx([0.3 + 0.3 * s / STEPS for s in range(1, STEPS + 1)],
                                                                   rel=1e-5)
    # eval curves start at step 0, the starting model
    svg = charts(page)[f"eval/{SET}/pass@1"]
    assert re.search(r'data-run="clip_sym"[^>]*data-steps="0,3,6"', svg)


def test_nan_breaks_the_line_and_is_marked(report):
    # JsonlSink writes a non-finite value as the string "nan"; the chart must show it, not drop it
    _, page = report
    svg = charts(page)["actor/entropy"]
    segments = re.findall(r'<polyline class="series" data-run="clip_sym"[^>]*data-steps="([^"]+)"', svg)
    assert segments == ["1,2,3", "5,6"]
    assert 'class="nonfinite"' in svg and "nan at step 4" in svg


def test_config_diff_lists_only_the_differing_field(report):
    _, page = report
    table = re.search(r"<table class='config-diff'>.*?</table>", page, re.S)[0]
    assert "algo.clip.eps_high" in table and ">0.2<" in table and ">0.28<" in table
    assert "run_dir" not in table  # differs between any two runs by construction
    for same in ("rollout.n", "algo.clip.eps_low", "seed", "data.eval"):
        assert same not in table


def test_eval_table_shows_base_and_final(report):
    _, page = report
    # clip_higher: pass@1 0.3 -> 0.6, pass@4 0.45 -> 0.75, maj@4 0.35 -> 0.65
    assert "0.300 → 0.600" in page and "+0.300" in page
    assert "0.450 → 0.750" in page and "0.350 → 0.650" in page
    assert "0.300 → 0.500" in page  # clip_sym


def test_best_pass_at_1_is_marked_only_among_runs_evaluated_alike(tmp_path):
    # Bug story: the report bolded the best final pass@1 across runs evaluated on different numbers of
    # problems, and did not say that a run had used 2 processes.
    a = write_run(tmp_path / "a", eps_high=0.2, lift=0.2, world_size=1, engine="torch")
    b = write_run(tmp_path / "b", eps_high=0.2, lift=0.3, world_size=1, engine="torch")
    c = write_run(tmp_path / "c", eps_high=0.2, lift=0.5, num_problems=200, world_size=2, engine="vllm")
    page = build_report([a, b, c], tmp_path / "r.html", pngs=False).read_text()
    bold = re.findall(r'<td class="num best">([^<]*)', page)
    assert bold == ["0.300 → 0.600"]  # b beats a on the same 20 problems; c (200 problems, 0.8) has no peer
    assert "evaluated on different numbers of problems or samples" in page
    runs = page.split("<table>", 1)[1].split("</table>", 1)[0]
    assert "<th>processes</th><th>rollout engine</th>" in runs
    row_c = runs.split("<tr>")[-1]
    assert "<td class='num'>2</td><td>vllm</td>" in row_c, row_c
    # alone, on the same problems, the best run is still marked and no note is added
    page = build_report([a, b], tmp_path / "r2.html", pngs=False).read_text()
    assert re.findall(r'<td class="num best">([^<]*)', page) == ["0.300 → 0.600"]
    assert "evaluated on different numbers" not in page


def test_eval_sections_say_which_evaluations_they_show(tmp_path):
    # Bug story: the report's table showed the training-time evaluations while `mathrl eval` had written
    # other numbers (other problems, samples and seeds) into the run, with nothing saying which was which.
    a = write_run(tmp_path / "a", eps_high=0.2, lift=0.2)
    page = build_report([a], tmp_path / "r.html", pngs=False).read_text()
    assert "During training" in page and "From <code>mathrl eval</code>" not in page
    (a / "eval").mkdir()
    (a / "eval" / "results.json").write_text(json.dumps({"results": [
        {"checkpoint": "a/final", "step": 6, "dataset": "math500", "num_problems": 500, "n": 4, "seeds": [0, 1, 2],
         "metrics": {"pass@1": {"mean": 0.4567, "std": 0.01, "ci95": 0.02, "ci95_low": 0.41, "ci95_high": 0.5}}}]}))
    page = build_report([a], tmp_path / "r.html", pngs=False).read_text()
    sweep = page.split("From <code>mathrl eval</code>", 1)[1].split("</table>", 1)[0]
    assert "<td>math500</td><td class='num'>500</td><td class='num'>4</td><td class='num'>3</td>" in sweep
    assert "0.457 [0.410, 0.500]" in sweep
    (a / "eval" / "results.json").write_text('{"results": [')  # being rewritten by a running sweep
    assert "During training" in build_report([a], tmp_path / "r.html", pngs=False).read_text()


def test_page_is_self_contained(report):
    _, page = report
    assert "http" not in page.lower()
    assert not re.search(r"""\b(src|href)\s*=\s*["'](?!data:)""", page)  # no file or URL to fetch
    assert "<iframe" in page and "token map of step 6" in page  # inspect*.html embedded via srcdoc


def test_pngs_beside_the_html(report):
    out, page = report
    plots = out.parent / "report_plots"
    for metric in charts(page):
        png = plots / (metric.replace("/", "__") + ".png")
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", metric


def test_command_line(tmp_path):
    a = write_run(tmp_path / "a", eps_high=0.2, lift=0.1)
    from mathrl.cli import main

    buf = io.StringIO()

    def run(argv: list[str]) -> int:
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            return main(["report", *argv])

    # --no-png keeps this fast; the module fixture checks the PNGs
    assert run([str(a), "--out", str(tmp_path / "r.html"), "--no-png"]) == 0
    assert (tmp_path / "r.html").exists() and not (tmp_path / "r_plots").exists()
    assert run([str(tmp_path / "missing")]) == 1
    (tmp_path / "empty").mkdir()
    assert run([str(tmp_path / "empty")]) == 1
    assert "not a run directory" in buf.getvalue()


def test_run_still_writing(tmp_path):
    # a report of a live run: no summary.json, and the last metrics line is half written
    a = write_run(tmp_path / "live", eps_high=0.2, lift=0.1)
    (a / "summary.json").unlink()
    with (a / "metrics.jsonl").open("a") as f:
        f.write('{"step": 7, "reward/me')
    page = build_report([a], tmp_path / "live.html", pngs=False).read_text()
    assert "reward/mean" in charts(page) and "no summary.json" in page


@pytest.mark.parametrize("lo, hi, integer, expected", [
    (0.13, 0.87, False, [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]),  # widened to round numbers
    (0, 50, True, [0, 10, 20, 30, 40, 50]),
    (1, 6, True, [1, 2, 3, 4, 5, 6]),  # integer steps never go below 1
    (0.0, 0.0, False, [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]),  # a constant 0 (pg_clipfrac_lower) still gets an axis
    (0.5, 0.5, False, [0.47, 0.48, 0.49, 0.5, 0.51, 0.52, 0.53]),  # another constant: +-5% around it
])
def test_nice_ticks(lo, hi, integer, expected):
    t0, t1, ticks = nice_ticks(lo, hi, integer=integer)
    assert ticks == pytest.approx(expected) and (t0, t1) == pytest.approx((expected[0], expected[-1]))
    assert t0 <= lo and t1 >= hi and all(math.isfinite(t) for t in ticks)


@pytest.mark.parametrize("lo, hi, labels", [
    (0.13, 0.87, ["0", "0.2", "0.4", "0.6", "0.8", "1.0"]),
    (0.0, 1.1, ["0", "0.25", "0.50", "0.75", "1.00", "1.25"]),  # steps of 2.5 x 10^e need one more digit
    (1e-6, 1.08e-6, ["1e-06", "1.02e-06", "1.04e-06", "1.06e-06", "1.08e-06"]),
    (1_000_000, 1_000_004, ["1000000", "1000001", "1000002", "1000003", "1000004"]),  # never "1e+06" five times
])
def test_tick_labels_are_distinct_and_short(lo, hi, labels):
    _, _, ticks = nice_ticks(lo, hi)
    assert [format_tick(t, ticks[1] - ticks[0]) for t in ticks] == labels


def test_flatten_and_labels():
    assert flatten({"algo": {"clip": {"eps_high": 0.28}}, "data": {"eval": ["a", "b"]}, "run_dir": None}) == {
        "algo.clip.eps_high": 0.28, "data.eval": ["a", "b"], "run_dir": None}
    # same directory name under two parents: the parent makes the labels unique
    assert run_labels([Path("/r/x/seed0"), Path("/r/y/seed0"), Path("/r/z")]) == ["x/seed0", "y/seed0", "z"]


TOOL_CHARTS = ["tool/call_rate", "tool/calls_mean", "tool/void_turn_rate", "tool/error_rate",
               f"eval/{SET}/tool/call_rate"]


def add_tool_metrics(run_dir: Path) -> None:
    """Log what a run with rollout.tools logs (docs/metrics.md, tool/*): tool/* on training steps,
    eval/<set>/tool/* on evaluation rows; tool/timeout_rate and rollout/turns_mean are not charted."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        if "reward/mean" in row:
            s = row["step"]
            row |= {"tool/call_rate": 0.5 + 0.05 * s, "tool/calls_mean": 0.6 + 0.1 * s, "tool/void_turn_rate": 0.1,
                    "tool/error_rate": 0.2 - 0.02 * s, "tool/timeout_rate": 0.0, "rollout/turns_mean": 1.6 + 0.1 * s}
        else:
            row |= {f"eval/{SET}/tool/call_rate": 0.4 + 0.05 * row["step"], f"eval/{SET}/rollout/turns_mean": 1.5}
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_tools_section_charts_the_tool_metrics(tmp_path):
    # A run with tools gets a Tools section after Collapse: the four training rates and the eval
    # call rate, in SECTIONS order; a run without tools draws no line there, and a report of runs
    # without tools has no Tools section at all.
    tools = write_run(tmp_path / "tools", eps_high=0.2, lift=0.2)
    add_tool_metrics(tools)
    plain = write_run(tmp_path / "plain", eps_high=0.2, lift=0.1)
    page = build_report([tools, plain], tmp_path / "r.html", pngs=False).read_text()
    assert "<h3>Tools</h3>" in page
    section = page.split("<h3>Tools</h3>", 1)[1].split("<h3>", 1)[0]
    assert list(charts(section)) == TOOL_CHARTS
    for metric in TOOL_CHARTS:
        assert runs_drawn(charts(page)[metric]) == {"tools"}, metric
    for unlisted in ("tool/timeout_rate", "rollout/turns_mean", f"eval/{SET}/rollout/turns_mean"):
        assert unlisted not in charts(page)
    svg = charts(page)[f"eval/{SET}/tool/call_rate"]
    assert re.search(r'data-steps="0,3,6" data-values="0.4,0.55,0.7"', svg)
    assert page.index("<h3>Collapse</h3>") < page.index("<h3>Tools</h3>")
    page = build_report([plain], tmp_path / "p.html", pngs=False).read_text()
    assert "<h3>Tools</h3>" not in page and "tool/" not in page


def test_token_map_of_a_tool_episode_keeps_its_tool_marks(tmp_path):
    # The report shows rollouts through the run's inspect*.html pages; a tool episode's page keeps its
    # tool output marked (class "t obs", its title) inside the embedded srcdoc.
    import torch

    from mathrl.analysis.tokens import TokenScores
    from mathrl.analysis.tokens.comparison import compare, exploration_table
    from mathrl.analysis.tokens.html import InspectReport, render_html

    def scores(p: list[float]) -> TokenScores:
        return TokenScores(prompt="1+1=", prompt_ids=[1], token_ids=[5, 6, 7, 8], tokens=["x", "<o>", "2", "!"],
                           logprobs=torch.tensor(p).log(), entropy=torch.ones(4),
                           observation=torch.tensor([False, True, False, False]))

    c = compare(scores([0.5, 0.9, 0.5, 0.5]), scores([0.7, 0.1, 0.9, 0.4]))
    run = write_run(tmp_path / "tools", eps_high=0.2, lift=0.2)
    (run / "inspect.html").write_text(render_html(InspectReport(
        source="hand-made", prompt="1+1=", base_path="b", model_path="r", comparison=c,
        exploration=exploration_table(comparison=c))))
    page = build_report([run], tmp_path / "r.html", pngs=False).read_text()
    srcdoc = re.search(r'srcdoc="([^"]*)"', page)[1]
    # the token itself in the base map, the RL map and the change view (the two legends are not titled)
    assert len(re.findall(r"class=&quot;t obs&quot; style=&quot;[^&]*&quot; title=&quot;tool output "
                          r"\(not sampled, in no loss\)", srcdoc)) == 3
