"""scripts/findings: curves over seeds on hand-written run directories; passk and overconfidence on tiny
random models.

The run directories are written by hand in the format of run_dir.py (metrics.jsonl: training rows
and `eval/<set>/*` rows per step; evals.jsonl: one row per evaluation), so every number in a table can
be computed here from the values written.

Run: python -m pytest tests/project/test_findings.py -q
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

from findings.common import ci_cell, fmt, group_runs, variant_name  # noqa: E402
from findings.curves import (  # noqa: E402
    RunSeries,
    collapsed,
    load_variants,
    mean_curve,
    permutation_p,
    read_run,
    run_curves,
    smooth,
    steps_to,
    summary_table,
)

from mathrl.evaluation.metrics import mean_std_ci95  # noqa: E402
from mathrl.reward.verify import RewardResult  # noqa: E402

PASS1 = "eval/arith_heldout/pass@1"


def write_run(path: Path, train: dict[int, dict], evals: dict[int, dict], *, evals_jsonl: bool = False) -> Path:
    """metrics.jsonl as the loop writes it: the step-0 eval row, then per step a training row and, at
    eval steps, an eval row. With evals_jsonl the evaluations go to evals.jsonl only."""
    path.mkdir(parents=True)
    rows = []
    for step in sorted(set(train) | set(evals)):
        if step in train:
            rows.append({"step": step, **train[step]})
        if step in evals and not evals_jsonl:
            rows.append({"step": step, **{f"eval/arith_heldout/{k}": v for k, v in evals[step].items()}})
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "summary.json").write_text("{}")  # a finished run
    if evals_jsonl:
        (path / "evals.jsonl").write_text("".join(
            json.dumps({"step": s, "set": "arith_heldout", "name": "arith_heldout", "n": 2, "num_problems": 4,
                        "pass_at_1": e["pass@1"], "pass_at_k": {"1": e["pass@1"]}, "maj_at_n": 0.0,
                        "no_answer_rate": 0.0, "truncated_rate": 0.0, "mean_response_length": 9.0, "samples": []}) + "\n"
            for s, e in sorted(evals.items())))
    return path


# Final eval pass@1 of the three seeds of variant `a` (step 0: 0.2 each) and their last-two-steps accuracy.
A_FINAL = [0.5, 0.6, 0.8]
A_ACC = {0: [0.1, 0.3, 0.5], 1: [0.2, 0.4, 0.4], 2: [0.3, 0.5, 0.9]}  # seed -> accuracy at steps 1..3


@pytest.fixture()
def grid(tmp_path: Path) -> tuple[Path, Path]:
    """A grid of variants a (seeds 0, 1, 2) and b (seeds 0 and 1 finished, seed 2 missing)."""
    grid = tmp_path / "g.yaml"
    grid.write_text("seeds: [0, 1, 2]\ncolumns: [reward/accuracy, actor/ref_kl]\nruns:\n  a: []\n  b: [algo.clip.eps_high=0.2]\n")
    out = tmp_path / "runs"
    for seed, name in enumerate(["a", "a_seed1", "a_seed2"]):
        train = {s: {"reward/accuracy": A_ACC[seed][s - 1], "rollout/generated_tokens": 10.0 * s} for s in (1, 2, 3)}
        write_run(out / name, train, {0: {"pass@1": 0.2}, 2: {"pass@1": 0.9}, 3: {"pass@1": A_FINAL[seed]}})
    for name in ["b", "b_seed1"]:
        write_run(out / name, {s: {"reward/accuracy": 0.5} for s in (1, 2, 3)}, {0: {"pass@1": 0.3}, 3: {"pass@1": 0.4}},
                  evals_jsonl=True)
    return grid, out


# ---- pieces -----------------------------------------------------------------------------------------


def test_variant_names_drop_only_the_seed_suffix() -> None:
    assert [variant_name(n) for n in ["a", "a_seed1", "a_seed12", "clip_higher_seed2", "seed3", "c15-s0"]] == [
        "a", "a", "a", "clip_higher", "seed3", "c15-s0"]
    groups = group_runs([Path("x/a"), Path("x/b_seed1"), Path("x/a_seed2"), Path("x/b")])
    assert {k: [p.name for p in v] for k, v in groups.items()} == {"a": ["a", "a_seed2"], "b": ["b_seed1", "b"]}
    # explicit labels win over names; a wrong count is an error, not a silent misgrouping
    assert list(group_runs([Path("r1"), Path("r2")], ["x", "x"])) == ["x"]
    with pytest.raises(ValueError, match="one label per run"):
        group_runs([Path("r1"), Path("r2")], ["x"])


def test_smooth_is_a_trailing_mean_that_skips_nan() -> None:
    assert smooth([1.0, 3.0, math.nan, 5.0], 2) == [1.0, 2.0, 3.0, 5.0]  # [1] [1,3] [3,nan] [nan,5]
    assert math.isnan(smooth([math.nan], 3)[0])  # nothing to average: stays nan rather than 0
    assert smooth([1.0, 2.0, 3.0], 1) == [1.0, 2.0, 3.0]


def test_ci_cell_is_mean_std_ci95() -> None:
    # hand: mean 0.6333, sample std 0.15275, t_{0.975,2} = 4.3027 -> half-width 0.3795
    assert ci_cell(A_FINAL) == "0.633 ± 0.379 (n=3)"
    mean, _, half = mean_std_ci95(A_FINAL)
    assert ci_cell(A_FINAL) == f"{fmt(mean)} ± {fmt(half)} (n=3)"
    assert ci_cell([0.5]) == "0.500 ± nan (n=1)"  # one seed: the spread is unknown, not zero
    assert ci_cell([]) == "—"
    assert ci_cell([4500.0, 4520.0]) == "4510.0 ± 127.1 (n=2)"  # a count: the half-width takes its mean's decimals


def test_mean_curve_bands_only_where_two_seeds_have_a_value() -> None:
    xs, mean, low, high = mean_curve([{1: 1.0, 2: 2.0}, {1: 3.0}])
    assert xs == [1, 2] and mean == [2.0, 2.0]
    m, _, half = mean_std_ci95([1.0, 3.0])
    assert (low[0], high[0]) == (m - half, m + half)
    assert math.isnan(low[1]) and math.isnan(high[1])


# ---- curves -----------------------------------------------------------------------------------------


def test_steps_to_a_threshold_and_collapse_by_hand() -> None:
    m = "eval/x/pass@1"
    rising = RunSeries("a", evals={m: {0: 0.4, 10: 0.85, 20: 0.91, 30: 0.95}})
    falling = RunSeries("b", evals={m: {0: 0.4, 10: 0.9, 20: 0.75, 30: 0.69}})  # 0.69 < 0.9 - 0.2: collapsed
    assert steps_to(rising, m, 0.9) == 20 and steps_to(falling, m, 0.9) == 10 and steps_to(rising, m, 0.99) is None
    assert not collapsed(rising, m) and collapsed(falling, m)
    assert not collapsed(RunSeries("c", evals={m: {0: 0.9, 10: 0.71}}), m)  # exactly 0.19 below: not more than 0.2
    table = summary_table({"a": [rising], "b": [falling]}, [m], last=10, threshold=0.9)
    assert "steps to 0.9" in table and "20.000 ± nan (n=1), 1/1 reached | 0/1" in table and "| 1/1 |" in table


def test_permutation_p_by_hand() -> None:
    # 4 values into 2 and 2: 6 splits; only {3, 4} against {1, 2} has a mean difference >= the observed 2
    assert permutation_p([3.0, 4.0], [1.0, 2.0]) == pytest.approx(1 / 6)
    assert permutation_p([1.0, 2.0], [3.0, 4.0]) == 1.0  # every split is at least -2
    assert permutation_p([0.5] * 5, [0.5] * 5) == 1.0  # ties count as "at least": no evidence
    assert permutation_p([0.95, 0.94, 0.96, 0.93, 0.97], [0.90, 0.91, 0.89, 0.92, 0.88]) == pytest.approx(1 / 252)
    m = "eval/x/pass@1"
    fast = [RunSeries(f"f{i}", evals={m: {0: 0.4, 10: 0.9 + i / 100}}) for i in range(3)]
    slow = [RunSeries(f"s{i}", evals={m: {0: 0.4, 10: 0.5, 20: 0.8 + i / 100}}) for i in range(3)]
    table = summary_table({"fast": fast, "slow": slow}, [m], last=10, threshold=0.85, versus="slow")
    # fast: higher (p = 1/20, the smallest of 3 against 3) and sooner (slow never reaches 0.85: step 30)
    assert "| fast |" in table and "| 0.050 | 0.050 |" in table
    with pytest.raises(ValueError, match="no such variant"):
        summary_table({"fast": fast}, [m], last=10, versus="nope")


def test_seeds_group_into_variants_and_a_missing_seed_is_left_out(grid, capsys) -> None:
    variants, columns = load_variants([grid[0]], out=grid[1], labels=None)
    assert {k: [r.name for r in v] for k, v in variants.items()} == {"a": ["a", "a_seed1", "a_seed2"],
                                                                      "b": ["b", "b_seed1"]}
    assert columns == ["reward/accuracy", "actor/ref_kl"]
    assert "b_seed2 holds no run" in capsys.readouterr().err


def test_an_unfinished_run_is_left_out_unless_asked(grid, capsys) -> None:
    (grid[1] / "a_seed2" / "summary.json").unlink()  # still training: its last eval is from an earlier step
    variants, _ = load_variants([grid[0]], out=grid[1], labels=None)
    assert [r.name for r in variants["a"]] == ["a", "a_seed1"]
    assert "a_seed2 is not finished" in capsys.readouterr().err
    variants, _ = load_variants([grid[0]], out=grid[1], labels=None, unfinished=True)
    assert [r.name for r in variants["a"]] == ["a", "a_seed1", "a_seed2"]


def test_table_numbers_are_mean_std_ci95_over_seeds(grid) -> None:
    variants, _ = load_variants([grid[0]], out=grid[1], labels=None)
    table = summary_table(variants, [PASS1, "reward/accuracy", "actor/ref_kl"], last=2)
    header, _, row_a, row_b = table.splitlines()
    assert header.split(" | ")[1:4] == [PASS1, f"{PASS1} best", f"{PASS1} Δ from step 0"]
    cells = row_a.strip("| ").split(" | ")
    assert cells[0] == "a"
    assert cells[1] == ci_cell(A_FINAL)  # the last evaluation of each seed
    assert cells[2] == ci_cell([0.9, 0.9, 0.9])  # best evaluation: step 2 for every seed
    assert cells[3] == ci_cell([v - 0.2 for v in A_FINAL])  # change from step 0
    # training metric: mean over the last 2 steps (2 and 3) of each seed, then over seeds
    assert cells[4] == ci_cell([(A_ACC[s][1] + A_ACC[s][2]) / 2 for s in range(3)])
    assert cells[5] == "—"  # no run logged actor/ref_kl
    # b: two seeds, eval metrics read from evals.jsonl
    assert row_b.strip("| ").split(" | ")[1] == ci_cell([0.4, 0.4])


def test_x_tokens_is_the_cumulative_sum_of_generated_tokens(grid) -> None:
    run = read_run(grid[1] / "a")
    assert run.tokens_at() == {0: 0.0, 1: 10.0, 2: 30.0, 3: 60.0}  # 10, 20, 30 tokens at steps 1, 2, 3
    assert read_run(grid[1] / "b").tokens_at() == {}  # not logged: no token axis for this run


def test_curves_writes_figure_and_table(grid, tmp_path: Path) -> None:
    fig = tmp_path / "figs" / "g.png"
    table = run_curves([grid[0]], fig_path=fig, out=grid[1], x="tokens", window=2, last=2)
    assert fig.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert fig.with_suffix(".md").read_text() == table
    # default metrics: the eval pass@1, then the grid's columns
    assert table.splitlines()[0].split(" | ")[1:] == [PASS1, f"{PASS1} best", f"{PASS1} Δ from step 0",
                                                      "reward/accuracy", "actor/ref_kl |"]


def machine_summary(*types: str) -> str:
    """summary.json of a run whose processes ran on these CPU types, as train/loop.py writes it."""
    processes = [{"first_step": 1, "last_step": 3, "wall_seconds": 1.0,
                  "machine": {"cpu_model": t, "cpu_type": t, "cpu_flags": [], "threads": 1, "torch": "2"}} for t in types]
    return json.dumps({"steps": 3, "machine": processes[-1]["machine"], "processes": processes})


def test_runs_of_two_cpu_types_give_one_table_per_type(grid, tmp_path: Path) -> None:
    from findings.curves import UNRECORDED, machine_of

    out = grid[1]
    for name in ("a", "a_seed1", "b"):
        (out / name / "summary.json").write_text(machine_summary("Intel Xeon (AMX)"))
    (out / "a_seed2" / "summary.json").write_text(machine_summary("AMD EPYC"))
    (out / "b_seed1" / "summary.json").write_text(machine_summary("AMD EPYC", "Intel Xeon (AMX)"))  # resumed elsewhere
    assert machine_of({}) == UNRECORDED and machine_of(json.loads(machine_summary("AMD EPYC"))) == "AMD EPYC"
    fig = tmp_path / "g.png"
    table = run_curves([grid[0]], fig_path=fig, out=out, metrics=[PASS1], window=1, last=1)
    sections = table.split("### ")[1:]
    assert [s.splitlines()[0] for s in sections] == ["Intel Xeon (AMX)", "AMD EPYC", "mixed: AMD EPYC + Intel Xeon (AMX)"]
    intel, amd, mixed = sections
    assert f"| a | {ci_cell(A_FINAL[:2])} |" in intel and f"| b | {ci_cell([0.4])} |" in intel
    assert f"| a | {ci_cell(A_FINAL[2:])} |" in amd and "| b | — |" in amd  # b has no AMD run
    for machine in ("intel_xeon_amx", "amd_epyc", "mixed_amd_epyc_intel_xeon_amx"):
        assert (tmp_path / f"g_{machine}.png").is_file()
    assert fig.with_suffix(".md").read_text() == table
    # one type: one table, no headings (every run of the fixture before this test: not recorded)
    (out / "a_seed2" / "summary.json").write_text(machine_summary("Intel Xeon (AMX)"))
    (out / "b_seed1" / "summary.json").write_text(machine_summary("Intel Xeon (AMX)"))
    assert "###" not in run_curves([grid[0]], fig_path=fig, out=out, metrics=[PASS1], window=1, last=1)


@pytest.mark.slow
def test_command_line_on_run_directories(grid, tmp_path: Path) -> None:
    fig = tmp_path / "cli.png"
    runs = [str(grid[1] / n) for n in ("a", "a_seed1", "b")]
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "findings"), "curves", *runs, "--fig", str(fig),
                           "--metrics", PASS1, "no/such_metric"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"| a | {ci_cell(A_FINAL[:2])} |" in done.stdout and "| — |" in done.stdout
    assert fig.is_file()


# ---- passk and overconfidence on tiny random models ---------------------------------------------------


def test_token_shift_stats_by_hand() -> None:
    from findings.sampling import token_shift_stats

    # float64: in float32 0.99 is 0.99000001, above the 0.99 threshold
    p_base = torch.tensor([0.05, 0.1, 0.95, 0.99, 1.0], dtype=torch.float64)
    p_rl = torch.tensor([0.05, 0.5, 0.999, 0.9, 1.0], dtype=torch.float64)
    s = token_shift_stats(p_base, p_rl)
    assert s["tokens"] == 5
    assert s["moved"] == pytest.approx(1 / 5)  # only 0.1 -> 0.5; 0.99 -> 0.9 moved by 0.09
    assert s["rl_saturated"] == pytest.approx(2 / 5)  # 0.999 and 1.0
    assert s["base_saturated"] == pytest.approx(1 / 5)  # 1.0; 0.99 is not above 0.99
    counts = [b["tokens"] for b in s["bins"]]
    assert counts == [1, 1, 0, 1, 2]  # 0.1 opens [0.1, 0.5); 0.99 opens [0.99, 1]
    assert [b["p_rl"] for b in s["bins"][:2]] == pytest.approx([0.05, 0.5])
    assert math.isnan(s["bins"][2]["p_rl"])  # an empty bin has no mean
    assert s["bins"][4]["p_rl"] == pytest.approx(0.95) and s["bins"][4]["p_base"] == pytest.approx(0.995)


class HashVerifier:
    """A random model never writes a correct answer: mark a hash-chosen third of the responses correct,
    so pass@k is not zero everywhere."""

    def score(self, completions, references):
        return [RewardResult(1.0, ref, "correct") if zlib.crc32(t.encode()) % 3 == 0 else RewardResult(0.0, "x", "wrong")
                for t, ref in zip(completions, references)]

    def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory, make_tiny_qwen2, char_tokenizer) -> tuple[Path, list[Path]]:
    from mathrl.config import dump_yaml, load_config
    from mathrl.model.io import save_model

    root = tmp_path_factory.mktemp("findings")
    base = save_model(make_tiny_qwen2(seed=0, num_layers=1), char_tokenizer, root / "base")
    runs = []
    for seed, name in ((1, "v"), (2, "v_seed1")):
        run = root / name
        run.mkdir()
        (run / "config.yaml").write_text(dump_yaml(load_config(None, [
            "data.arith.max_digits=2", "data.eval_size=4", "rollout.max_new_tokens=10", "reward.num_workers=0",
            f"seed={seed - 1}"])))
        save_model(make_tiny_qwen2(seed=seed, num_layers=1), char_tokenizer, run / "final")
        runs.append(run)
    return base, runs


def test_passk_shapes_and_monotone_in_k(tiny_runs, tmp_path: Path) -> None:
    from findings.sampling import run_passk

    base, runs = tiny_runs
    fig = tmp_path / "passk.png"
    table, results = run_passk(str(base), runs, n=4, limit=4, fig_path=fig, device="cpu", verifier=HashVerifier())
    assert results["ks"] == [1, 2, 4]
    tables = list(results["base"].values()) + [r["pass@k"] for r in results["runs"].values()]
    assert len(tables) == 3
    for t in tables:
        values = [t[k] for k in (1, 2, 4)]
        assert all(0.0 <= v <= 1.0 for v in values)
        assert values == sorted(values)  # pass@k never decreases in k
    assert {r["group"] for r in results["runs"].values()} == {"v"}  # v and v_seed1 are one variant
    lines = table.splitlines()
    assert lines[0] == "| model | runs | pass@1 | pass@4 |"  # k = 8 and 64 exceed n = 4: pass@n instead
    assert lines[2].startswith("| base | 1 |") and lines[3].startswith("| v | 2 |") and "(n=2)" in lines[3]
    assert fig.is_file() and json.loads(fig.with_suffix(".json").read_text())["ks"] == [1, 2, 4]


def test_overconfidence_shapes(tiny_runs, tmp_path: Path) -> None:
    from findings.sampling import BIN_NAMES, run_overconfidence

    base, runs = tiny_runs
    fig = tmp_path / "oc.png"
    table, results = run_overconfidence(str(base), runs, limit=4, fig_path=fig, device="cpu")
    assert len(results["runs"]) == 2
    for record in results["runs"].values():
        for source in ("rl_samples", "base_samples"):
            s = record[source]
            assert s["tokens"] >= 4  # one response per problem, at least its first token
            assert sum(b["tokens"] for b in s["bins"]) == s["tokens"] and len(s["bins"]) == len(BIN_NAMES)
            assert all(0.0 <= s[k] <= 1.0 for k in ("moved", "rl_saturated", "base_saturated"))
    rows = table.splitlines()[2:]
    assert [r.split(" | ")[1] for r in rows] == ["RL model", "base model"]  # one variant, two response sources
    assert fig.is_file()


# ---- positions ----------------------------------------------------------------------------------------


def test_positions_buckets_by_hand(tmp_path: Path, capsys) -> None:
    from findings.positions import run_positions

    rows = {  # seed -> positions.jsonl row of step 1 (step 2 is there too, to be ignored)
        "ppo": {"value": [0.1, 0.3, 0.5, 0.7], "advantage": [2.0, 1.0, 0.0, -1.0], "count": [4, 4, 2, 1]},
        "ppo_seed1": {"value": [0.3, 0.3, 0.3], "advantage": [1.0, 1.0, 1.0], "count": [4, 4, 4]},
    }
    for name, row in rows.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "positions.jsonl").write_text(
            json.dumps({"step": 1, **row}) + "\n" + json.dumps({"step": 2, **row, "value": [9.0] * len(row["value"])}) + "\n")
    (tmp_path / "grpo").mkdir()  # no critic: no positions.jsonl
    fig = tmp_path / "pos.png"
    table = run_positions([tmp_path / "grpo", tmp_path / "ppo", tmp_path / "ppo_seed1"], fig_path=fig, steps=[1],
                          edges=[0, 2, 4])
    assert "grpo has no positions.jsonl" in capsys.readouterr().err
    header, _, row = table.splitlines()
    assert header == "| variant | step | value [0,2) | value [2,4) | advantage [0,2) | advantage [2,4) |"
    # count-weighted per seed: value [0,2): (0.1*4 + 0.3*4) / 8 = 0.2 and 0.3; [2,4): (0.5*2 + 0.7*1) / 3 and 0.3
    # advantage [0,2): (2*4 + 1*4) / 8 = 1.5 and 1.0; [2,4): (0*2 - 1*1) / 3 and 1.0
    assert row.strip("| ").split(" | ") == ["ppo", "1", ci_cell([0.2, 0.3]), ci_cell([1.7 / 3, 0.3]),
                                            ci_cell([1.5, 1.0]), ci_cell([-1 / 3, 1.0])]
    assert fig.is_file() and fig.with_suffix(".md").read_text() == table
    with pytest.raises(ValueError, match="no row for step 7"):
        run_positions([tmp_path / "ppo"], fig_path=fig, steps=[7])
    with pytest.raises(ValueError, match="no run has positions.jsonl"):
        run_positions([tmp_path / "grpo"], fig_path=fig)
