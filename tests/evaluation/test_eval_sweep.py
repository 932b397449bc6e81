"""Tests of `mathrl eval` (mathrl.evaluation.sweep, targets, results) on a fake run directory of tiny random Qwen2 models.

The run directory holds three checkpoints (steps 5, 10 and 30, the step_5 directory sorting AFTER
step_000010 by name, so ordering must come from trainer_state.json) and a config.yaml with small
arithmetic settings. A random model never writes a correct \\boxed{} answer, so the library-level sweep
uses a deterministic stub verifier that marks a hash-chosen third of the responses correct: the
pass@1 values then differ between seeds and checkpoints, and the aggregate checks below compare
non-trivial numbers. The CLI-level tests use the real Verifier in-process (reward.num_workers=0).

Run: python -m pytest tests/evaluation/test_eval_sweep.py -q
"""

from __future__ import annotations

import contextlib
import io
import json
import zlib
from pathlib import Path

import pytest
from rich.console import Console

from mathrl.config import dump_yaml, load_config
from mathrl.evaluation.metrics import bootstrap_ci95, default_ks, mean_std_ci95
from mathrl.evaluation.results import PASS1_HEADER
from mathrl.evaluation.sweep import neighbourhood_average, sweep
from mathrl.evaluation.targets import SweepSettings, resolve_targets
from mathrl.model.io import save_model
from mathrl.reward.verify import RewardResult

RUN_CONFIG = ["data.arith.max_digits=2", "data.eval_size=4", "rollout.max_new_tokens=10", "reward.num_workers=0"]
CHECKPOINTS = {"checkpoints/step_000010": 10, "checkpoints/step_5": 5, "final": 30}


def quiet_console() -> Console:
    return Console(file=io.StringIO(), width=200)


class HashVerifier:
    """Deterministic stand-in for reward.verify.Verifier: the verdict is a function of the text."""

    def score(self, completions, references):
        out = []
        for text, ref in zip(completions, references):
            h = zlib.crc32(text.encode()) % 3
            if h == 0:
                out.append(RewardResult(1.0, ref, "correct"))
            elif h == 1:
                out.append(RewardResult(0.0, "wrong", "wrong"))
            else:
                out.append(RewardResult(0.0, None, "no_answer"))
        return out

    def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, make_tiny_qwen2, char_tokenizer) -> Path:
    root = tmp_path_factory.mktemp("sweep") / "myrun"
    root.mkdir()
    start = save_model(make_tiny_qwen2(seed=9, num_layers=1), char_tokenizer, root.parent / "start_model")
    (root / "config.yaml").write_text(dump_yaml(load_config(None, [*RUN_CONFIG, f"model.path={start}"])))
    for i, (sub, step) in enumerate(CHECKPOINTS.items()):
        out = save_model(make_tiny_qwen2(seed=i, num_layers=1), char_tokenizer, root / sub)
        (out / "trainer_state.json").write_text(json.dumps({"step": step}))
    # a checkpoint still being written (train/checkpoint.py renames it to step_<N> once complete): never evaluated
    partial = root / "checkpoints" / "step_000040.tmp-abc123"
    partial.mkdir()
    (partial / "config.json").write_text((root / "final" / "config.json").read_text())
    return root


@pytest.fixture(scope="module")
def report(run_dir: Path) -> dict:
    settings = SweepSettings(n=2, seeds=[0, 1], limit=4, step=10, neighbours=1, device="cpu")
    return sweep([str(run_dir)], settings, console=quiet_console(), verifier=HashVerifier())


def parse(argv: list[str]) -> list[str]:
    return ["eval", *argv]


def run(argv: list[str], console: Console) -> int:
    """`mathrl eval` through the command line's one entry point, its stdout and stderr into console.file."""
    from mathrl.cli import main

    with contextlib.redirect_stdout(console.file), contextlib.redirect_stderr(console.file):
        return main(argv)


# ----------------------------------------------------------------------------------------------------
# a run directory
# ----------------------------------------------------------------------------------------------------
def test_sweep_writes_results_ordered_by_step(report: dict, run_dir: Path) -> None:
    out = run_dir / "eval"  # the default output directory of a single run target
    on_disk = json.loads((out / "results.json").read_text())
    assert on_disk["complete"] is True
    # the run's starting model (model.path) is step 0 of its curve
    assert [c["step"] for c in on_disk["checkpoints"]] == [0, 5, 10, 30]
    assert [c["label"] for c in on_disk["checkpoints"]] == ["myrun/start", "myrun/step_5", "myrun/step_000010", "myrun/final"]
    assert [r["step"] for r in on_disk["results"]] == [0, 5, 10, 30]
    assert on_disk["settings"]["ks"] == default_ks(2) == [1, 2]
    for row in on_disk["results"]:
        assert row["dataset"] == "arith_heldout" and row["num_problems"] == 4 and row["dropped_prompts"] == 0
        # the run's config.yaml supplied the template and the length limit
        assert row["template"] == "arith" and row["max_new_tokens"] == 10
        assert [r["seed"] for r in row["per_seed"]] == [0, 1]
        expected = {"pass@1", "pass@2", "maj@2", "no_answer_rate", "truncated_rate", "response_length",
                    "reflection_rate", "repetitive_rate", "garbled_rate"}
        assert set(row["metrics"]) == expected
        for rec in row["per_seed"]:
            assert expected <= set(rec)
            assert all(0.0 <= rec[k] <= 1.0 for k in expected - {"response_length"})
            assert 0 < rec["response_length"] <= 10
    md = (out / "results.md").read_text()
    assert PASS1_HEADER in md and "| myrun/final | 30 | arith_heldout |" in md
    assert "Neighbourhood averages" in md


def test_results_show_right_and_wrong_samples_beside_their_gold_answers(report: dict, run_dir: Path) -> None:
    # a user checking their data reads a few responses first: right ones and wrong ones, each under its gold
    md = (run_dir / "eval" / "results.md").read_text()
    kinds = set()
    for row in report["results"]:
        ex = row["examples"]
        assert len(ex["right"]) <= 3 and len(ex["wrong"]) <= 3
        for kind in ("right", "wrong"):
            for e in ex[kind]:
                # the stub marks a response correct from its text alone: the verdict shown is the one scored
                assert (e["reason"] == "correct") == (kind == "right")
                assert e["gold"] and e["response"] in md and f"gold `{e['gold']}`" in md
                kinds.add(kind)
        assert f"## Sampled responses: {row['checkpoint']}, {row['dataset']}" in md
    assert kinds == {"right", "wrong"}  # the stub's verdicts vary, so both kinds were shown


def test_seed_statistics_match_mean_std_ci95(report: dict) -> None:
    values_seen = set()
    for row in report["results"]:
        for key, summary in row["metrics"].items():
            per_seed = [r[key] for r in row["per_seed"]]
            mean, std, half = mean_std_ci95(per_seed)
            assert summary["mean"] == pytest.approx(mean)
            assert summary["std"] == pytest.approx(std)
            assert summary["ci95"] == pytest.approx(half)
        values_seen.update(r["pass@1"] for r in row["per_seed"])
    # the stub verifier makes pass@1 vary, so the checks above compared non-trivial numbers
    assert len(values_seen) > 1


def test_pass_at_1_interval_is_the_bootstrap_over_problem_scores(report: dict) -> None:
    # each problem's score is its fraction correct over both seeds x 2 samples; the interval resamples them
    for row in report["results"]:
        scores = row["problem_pass@1"]
        assert len(scores) == row["num_problems"] and all(s * 4 == round(s * 4) for s in scores)
        pass1 = row["metrics"]["pass@1"]
        assert sum(scores) / len(scores) == pytest.approx(pass1["mean"])
        _, low, high = bootstrap_ci95(scores, seed=0)
        assert (pass1["ci95_low"], pass1["ci95_high"]) == (low, high)
        assert 0.0 <= low <= high <= 1.0


def test_pass_at_1_and_no_answer_follow_the_verdicts(report: dict) -> None:
    # the per-seed pass@1 is avg@n of the stub's verdicts on the recorded texts: between 0 and 1, a multiple of 1/8
    for row in report["results"]:
        for rec in row["per_seed"]:
            assert rec["pass@1"] * 8 == pytest.approx(round(rec["pass@1"] * 8))
            assert rec["pass@1"] <= rec["pass@2"]


def test_neighbourhood_average_is_the_mean_of_per_step_pass_at_1(report: dict) -> None:
    (avg,) = report["neighbourhood"]
    assert avg["step"] == 10 and avg["steps"] == [5, 10, 30]
    by_step = {r["step"]: r["metrics"]["pass@1"]["mean"] for r in report["results"]}
    hand = (by_step[5] + by_step[10] + by_step[30]) / 3
    assert avg["pass@1"] == pytest.approx(hand)
    assert avg["pass@1_per_step"] == pytest.approx([by_step[5], by_step[10], by_step[30]])


def test_neighbourhood_window_is_clipped_at_the_ends() -> None:
    def row(step, value, run="r", dataset="d"):
        return {"run": run, "step": step, "dataset": dataset, "metrics": {"pass@1": {"mean": value}}}

    rows = [row(10, 0.1), row(20, 0.2), row(30, 0.6), row(40, 0.4), row(20, 0.9, dataset="other"),
            {"run": None, "step": None, "dataset": "d", "metrics": {"pass@1": {"mean": 1.0}}}]
    (first,) = [a for a in neighbourhood_average(rows, step=10, neighbours=1) if a["dataset"] == "d"]
    assert first["steps"] == [10, 20] and first["pass@1"] == pytest.approx(0.15)
    (wide,) = neighbourhood_average(rows, step=30, neighbours=2)
    assert wide["steps"] == [10, 20, 30, 40] and wide["pass@1"] == pytest.approx(1.3 / 4)
    (alone,) = [a for a in neighbourhood_average(rows, step=20, neighbours=1) if a["dataset"] == "other"]
    assert alone["steps"] == [20] and alone["pass@1"] == pytest.approx(0.9)
    (zero,) = neighbourhood_average(rows, step=40, neighbours=0)
    assert zero["steps"] == [40] and zero["pass@1"] == pytest.approx(0.4)


def test_a_step_that_is_not_a_checkpoint_is_a_clear_error(run_dir: Path, tmp_path: Path) -> None:
    console = quiet_console()
    code = run(parse([str(run_dir), "--step", "7", "--out", str(tmp_path / "o")]), console)
    text = console.file.getvalue()
    assert code == 2 and "--step 7" in text and "[0, 5, 10, 30]" in text


# ----------------------------------------------------------------------------------------------------
# other targets, through the command-line entry point
# ----------------------------------------------------------------------------------------------------
def test_cli_on_a_plain_model_directory(run_dir: Path, tmp_path: Path) -> None:
    console = quiet_console()
    model_dir = run_dir / "checkpoints" / "step_000010"
    out = tmp_path / "out"
    argv = [str(model_dir), "reward.num_workers=0", "data.arith.max_digits=2",
            "--n", "2", "--seeds", "3", "--limit", "2", "--max-new-tokens", "6", "--out", str(out)]
    assert run(parse(argv), console) == 0, console.file.getvalue()
    result = json.loads((out / "results.json").read_text())
    (row,) = result["results"]
    assert row["step"] is None and row["run"] is None and row["checkpoint"] == str(model_dir)
    assert row["num_problems"] == 2 and row["max_new_tokens"] == 6
    # one seed: the seed spread is unknown, not zero, so its t half-width is null and the table says "1 seed";
    # the interval over problems needs no second seed
    pass1 = row["metrics"]["pass@1"]
    assert pass1["ci95"] is None
    assert 0.0 <= pass1["ci95_low"] <= pass1["mean"] <= pass1["ci95_high"] <= 1.0
    assert f"{pass1['mean']:.3f} [{pass1['ci95_low']:.3f}, {pass1['ci95_high']:.3f}] · 1 seed" in (out / "results.md").read_text()


def test_nonexistent_target_is_a_clear_error(tmp_path: Path) -> None:
    console = quiet_console()
    missing = tmp_path / "no_such_run"
    assert run(parse([str(missing)]), console) == 1
    text = console.file.getvalue()
    assert "does not exist" in text and "no_such_run" in text


def test_directory_that_is_neither_run_nor_model_is_a_clear_error(tmp_path: Path) -> None:
    console = quiet_console()
    assert run(parse([str(tmp_path)]), console) == 1
    assert "neither a run directory" in console.file.getvalue()


def test_overrides_that_the_flags_own_are_rejected(run_dir: Path) -> None:
    console = quiet_console()
    assert run(parse([str(run_dir), "eval.n=4"]), console) == 2
    assert "--n" in console.file.getvalue()


def test_neighbours_without_step_is_rejected(run_dir: Path) -> None:
    console = quiet_console()
    assert run(parse([str(run_dir), "--neighbours", "2"]), console) == 2
    assert "--step" in console.file.getvalue()


def test_tiny_arith_target_resolves_to_the_cached_base_model(monkeypatch, run_dir: Path) -> None:
    import mathrl.model.paths as paths

    seen = {}

    def fake_resolve(cfg, console, *, pretraining_text):
        seen["path"], seen["steps"] = cfg.model.path, cfg.base.steps
        return str(run_dir / "final")

    monkeypatch.setattr(paths, "resolve_model_path", fake_resolve)
    (ckpt,) = resolve_targets(["tiny-arith"], overrides=["base.steps=7"], settings=SweepSettings(), console=quiet_console())
    assert ckpt.label == "tiny-arith" and ckpt.path == str(run_dir / "final") and ckpt.step is None
    assert seen == {"path": "tiny-arith", "steps": 7}  # base.* overrides choose which cached model


def test_run_config_provides_defaults_and_flags_win(run_dir: Path) -> None:
    settings = SweepSettings(template="Q: {question}\nA:", data=["arith", "arith"])
    ckpts = resolve_targets([str(run_dir)], overrides=["rollout.max_new_tokens=7"], settings=settings,
                            console=quiet_console())
    cfg = ckpts[0].cfg
    assert cfg.data.arith.max_digits == 2 and cfg.data.eval_size == 4  # from config.yaml
    assert cfg.eval_max_new_tokens == 7  # override
    assert cfg.data.template == "Q: {question}\nA:" and cfg.data.eval == ["arith", "arith"]  # flags


def test_cli_on_jsonl_parquet_and_hf_folder_datasets(run_dir: Path, tmp_path: Path) -> None:
    # The three data-source kinds go through the data layer's loader and field presets in one sweep.
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"problem": f"{a}+{a}", "answer": str(2 * a), "unique_id": f"p{a}"} for a in range(1, 6)]
    jsonl = tmp_path / "math500.jsonl"  # named like a preset: ids from unique_id
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "small.parquet")
    (tmp_path / "hfset" / "data").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows[:3]), tmp_path / "hfset" / "data" / "test-00000-of-00001.parquet")

    console = quiet_console()
    out = tmp_path / "out"
    argv = [str(run_dir / "final"), "reward.num_workers=0", "data.template=plain",
            "--data", str(jsonl), str(tmp_path / "small.parquet"), f"hf:{tmp_path / 'hfset'}",
            "--n", "2", "--seeds", "0", "--limit", "4", "--max-new-tokens", "4", "--out", str(out)]
    assert run(parse(argv), console) == 0, console.file.getvalue()
    result = json.loads((out / "results.json").read_text())
    sizes = {row["dataset"]: row["num_problems"] for row in result["results"]}
    assert sizes == {"math500": 4, "small": 4, "hfset_test": 3}  # --limit 4; the hf split holds 3 rows


def test_a_failed_eval_leaves_no_empty_output_directory(run_dir: Path, tmp_path: Path, monkeypatch) -> None:
    # Bug story: a sweep over two models that stopped at a bad data row (exit 1) left an empty
    # eval_<timestamp>/ behind in the working directory, one more per attempt.
    monkeypatch.chdir(tmp_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"problem": "1+1"}) + "\n")  # no answer
    models = [str(run_dir / "checkpoints" / "step_000010"), str(run_dir / "final")]
    console = quiet_console()
    assert run(parse([*models, "reward.num_workers=0", "--n", "1", "--seeds", "0", "--data", str(bad)]), console) == 1
    assert "missing field 'answer'" in console.file.getvalue()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl"]
    # the same with --out naming a new nested directory: neither it nor its new parent is left
    assert run(parse([*models, "reward.num_workers=0", "--n", "1", "--data", str(bad), "--out", "a/b"]), quiet_console()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl"]


def test_a_run_keeps_the_weights_of_every_evaluated_step_for_its_eval_curve(tmp_path, make_tiny_qwen2,
                                                                           char_tokenizer) -> None:
    # Bug story: with train.keep_last=2, `mathrl eval runs/<run>` of the default run evaluated steps 40
    # and 50 only, no curve. Now the weights of every eval.every-th step (train.keep_every: null) stay,
    # without their optimizer state, and the run's starting model is step 0: every point of the
    # training's evaluation curve (steps 0, 2, 4, 6 here) is evaluated again.
    from mathrl.run_dir import latest_checkpoint
    from mathrl.train.loop import train

    start = save_model(make_tiny_qwen2(seed=4, num_layers=1), char_tokenizer, tmp_path / "start")
    cfg = load_config(None, [*RUN_CONFIG, f"model.path={start}", "train.steps=6", "train.save_every=1", "eval.every=2",
                             "rollout.prompts_per_step=2", "rollout.n=2", "train.mini_batch_size=4", "eval.n=1",
                             "rollout.max_new_tokens=4", "data.dynamic_sampling.mode=none", f"run_dir={tmp_path / 'run'}"])
    train(cfg, console=quiet_console())
    ckpts = tmp_path / "run" / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == [f"step_00000{s}" for s in (2, 4, 5, 6)]
    assert not (ckpts / "step_000002" / "trainer_state.pt").exists() and (ckpts / "step_000002" / "model.safetensors").exists()
    assert latest_checkpoint(ckpts) == ckpts / "step_000006"  # a resume never picks a weights-only one
    found = resolve_targets([str(tmp_path / "run")], overrides=[], settings=SweepSettings(), console=quiet_console())
    assert [c.step for c in found] == [0, 2, 4, 5, 6]
    assert found[0].path == str(start) and found[0].label == "run/start"
    evaluated = {json.loads(line)["step"] for line in (tmp_path / "run" / "evals.jsonl").read_text().splitlines()}
    assert evaluated == {0, 2, 4, 6} and evaluated <= {c.step for c in found}


def test_tool_columns_appear_only_when_a_row_has_tool_metrics():
    # mathrl eval of a run with rollout.tools reports its tool calls per set; other runs keep their table
    from mathrl.evaluation.results import _columns

    def row(**extra):
        m = {k: {"mean": 0.5} for k in ("pass@2", "maj@2", "no_answer_rate", "repetitive_rate", "garbled_rate",
                                         "response_length", *extra)}
        m["pass@1"] = {"mean": 0.5, "std": 0.0, "ci95": 0.0, "ci95_low": 0.4, "ci95_high": 0.6}
        return {"checkpoint": "c", "step": 1, "dataset": "d", "metrics": m}

    settings = {"n": 2, "ks": [1, 2], "seeds": [0]}
    headers, cells = _columns({"settings": settings, "results": [row()]})
    assert "call rate" not in headers and len(cells(row())) == len(headers)
    with_tools = row(**{"tool/calls_mean": 1, "tool/call_rate": 1})
    headers, cells = _columns({"settings": settings, "results": [with_tools, row()]})
    assert headers[-2:] == ["tool calls", "call rate"]
    assert cells(with_tools)[-2:] == ["0.50", "0.50"] and cells(row())[-2:] == ["", ""]
