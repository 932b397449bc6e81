"""The front door: every class of bad input gets one line on stderr, a non-zero exit, no traceback, and
leaves the run directory as it was. Ctrl-C and piped output are checked on a real (tiny) run.

Most cases run the command in-process (`mathrl.cli.main([...])`) with pytest's capsys; a guard
replaces the training loop, so a case that wrongly got past the checks fails instead of training.
Two subprocess tests (SIGINT to a running training, its piped progress lines) take a few seconds each.

Run: python -m pytest tests/cli/test_cli_errors.py -q
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mathrl.cli import main


@pytest.fixture
def no_training(monkeypatch):
    """train() replaced: a case that gets past the checks is recorded instead of starting a run."""
    import mathrl.train.loop

    calls = []
    monkeypatch.setattr(mathrl.train.loop, "train", lambda cfg, console=None, resume=True: calls.append(cfg))
    return calls


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, make_tiny_qwen2, char_tokenizer) -> Path:
    """A tiny random Hugging Face model directory (no base-model build needed)."""
    from mathrl.model.io import save_model

    path = tmp_path_factory.mktemp("model") / "tiny"
    save_model(make_tiny_qwen2(seed=0, max_positions=128), char_tokenizer, path)
    return path


def _one_line_error(capsys, code: int, *, expect: str, status: int | None = None) -> str:
    captured = capsys.readouterr()
    lines = [ln for ln in captured.err.splitlines() if ln.strip()]
    assert code != 0 and (status is None or code == status), (code, captured.err)
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.err + captured.out
    assert lines[0].startswith("mathrl: ") and expect in lines[0], lines[0]
    return lines[0]


def _tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


# --------------------------------------------------------------------------------------------------
# the table: (why, argv, text the one line must hold, exit status)
# --------------------------------------------------------------------------------------------------
BAD_VALUES = [
    ("torch clips to a negative norm by flipping the gradient", ["train.max_grad_norm=-1"], "train.max_grad_norm=-1.0: must be > 0", 2),
    ("stopped the run with a false '0 consecutive steps' message", ["train.max_skipped_steps=0"], "train.max_skipped_steps=0: must be >= 1", 2),
    ("a raw range() error naming no field", ["rollout.batch_size=0"], "rollout.batch_size=0: must be >= 1", 2),
    ("a raw error naming no field", ["model.logprob_chunk_size=0"], "model.logprob_chunk_size=0: must be >= 1", 2),
    ("silently accepted", ["train.save_every=-1"], "train.save_every=-1: must be >= 0", 2),
    ("caught only after the model loaded", ["train.lr=-1"], "train.lr=-1.0: must be > 0", 2),
    ("caught only after the model loaded", ["train.betas=[0.9, 1.5]"], "train.betas=[0.9, 1.5]: each value must be in [0, 1)", 2),
    ("caught only after the model loaded", ["reward.num_workers=-1"], "reward.num_workers=-1: must be >= 0", 2),
    ("caught only after the model loaded", ["data.template=arihm"], "data.template='arihm': must be arith, zero", 2),
    ("'probability tensor contains inf/nan' after loading", ["eval.top_p=0"], "eval.top_p=0.0: must be in (0, 1]", 2),
    ("'probability tensor contains inf/nan' after loading", ["eval.max_new_tokens=-3"], "eval.max_new_tokens=-3: must be >= 1", 2),
    ("greedy needs one sample per problem", ["eval.temperature=0"], "eval.temperature=0 is greedy decoding", 2),
    ("training samples from the policy", ["rollout.temperature=0"], "rollout.temperature=0.0: must be > 0 (training", 2),
    ("a typo gets the closest key", ["rollout.temprature=0.5"], "did you mean 'rollout.temperature'", 2),
    ("a key at the wrong level", ["n=3"], "did you mean 'rollout.n'", 2),
    ("an override without a value", ["rollout.n"], "must look like key.path=value", 2),
    ("an unknown option", ["--bogus"], "unrecognized arguments: --bogus (see mathrl train --help)", 2),
    ("TRL's and argparse's underscore spelling", ["--run_dir", "x"], "unrecognized arguments: --run_dir; did you mean --run-dir?", 2),
    ("a typo in an option", ["--no-resme"], "unrecognized arguments: --no-resme; did you mean --no-resume?", 2),
    ("a bare name that is no directory was retried against the hub for 23 s", ["model.path=mymodel"], "model.path='mymodel' does not exist", 2),
    ("a missing data file", ["data.train=nope.jsonl"], "data.train: no such file 'nope.jsonl'", 2),
    ("a reward module that does not import would fail in every worker", ["reward.functions=[{name: mine, fn: 'nosuch_mod:f'}]"],
     "reward.functions[0] (mine): fn='nosuch_mod:f' module 'nosuch_mod' does not import", 2),
    ("a reward function that cannot take the batch", ["reward.functions=[{name: mine, fn: 'mathrl.reward:extract_boxed'}]"],
     "reward.functions[0] (mine): fn='mathrl.reward:extract_boxed' has the wrong signature", 2),
]


@pytest.mark.parametrize(("why", "args", "expect", "status"), BAD_VALUES, ids=[c[2].split(":")[0][:40] for c in BAD_VALUES])
def test_bad_values_are_one_line_before_anything_runs(tmp_path, monkeypatch, capsys, no_training, why, args, expect, status):
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    code = main(["train", *args, "--run-dir", str(run)])
    _one_line_error(capsys, code, expect=expect, status=status)
    assert no_training == [] and not run.exists()  # nothing started, nothing half-made


def test_an_offline_hub_id_is_named_as_such_and_leaves_no_run_directory(tmp_path, monkeypatch, capsys, no_training):
    # Bug story: with no network, model.path=Qwen/Qwen2.5-0.5B got past the checks, a run directory was
    # made, and the loader called the id a path that "does not exist" (its ".5-0" read as a file suffix).
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    code = main(["train", "model.path=Qwen/Qwen2.5-0.5B"])
    line = _one_line_error(capsys, code, status=2, expect="model.path='Qwen/Qwen2.5-0.5B' looks like a hub id but is not in "
                           "the local Hugging Face cache and the hub is unreachable (offline: HF_HUB_OFFLINE is set)")
    assert "`hf download Qwen/Qwen2.5-0.5B`" in line
    assert no_training == [] and not (tmp_path / "runs").exists()  # validated before the run directory is made


def test_overrides_after_options_are_accepted(tmp_path, capsys, no_training, model_dir):
    # argparse rejected `mathrl eval runs/x --n 2 rollout.n=3`; overrides may now stand anywhere after the verb
    code = main(["train", "--run-dir", str(tmp_path / "r"), "rollout.n=4", "--no-resume", "train.mini_batch_size=32"])
    assert code == 0 and no_training[0].rollout.n == 4 and no_training[0].train.mini_batch_size == 32
    # an eval option's own value is not taken for an override, and an override after --seeds is one
    code = main(["eval", str(model_dir), "--seeds", "0", "1", "rollout.n=0", "--template", "Q={question}"])
    _one_line_error(capsys, code, expect="rollout.n=0: must be >= 1", status=2)


def test_help_works_for_every_verb(capsys):
    # Bug story: `mathrl --help` crashed with "unsupported format character 'C'" ("95% CIs" in a help string).
    from mathrl.cli import VERBS

    for argv in (["--help"], ["-h"], *([verb, "--help"] for verb in VERBS)):
        assert main(argv) == 0, argv
        out = capsys.readouterr().out
        assert out.startswith("usage: mathrl"), argv
    assert main(["--help"]) == 0 and "95% CIs" in " ".join(capsys.readouterr().out.split())
    _one_line_error(capsys, main([]), expect="the following arguments are required", status=2)


@pytest.mark.parametrize(
    ("content", "expect"),
    [
        (b"\x89PNG\r\n\x1a\n\x00\xff\xfe", "is not a text file (byte 0 is not UTF-8)"),
        (b"rollout: [1, 2\n", "bad.yaml:2:1: not valid YAML"),
        (b"- 1\n- 2\n", "must be a mapping at the top level"),
    ],
)
def test_bad_recipe_files_name_the_file(tmp_path, capsys, no_training, content, expect):
    recipe = tmp_path / "bad.yaml"
    recipe.write_bytes(content)
    line = _one_line_error(capsys, main(["train", str(recipe)]), expect=expect, status=2)
    assert "bad.yaml" in line and no_training == []


def test_run_dir_that_cannot_be_written(tmp_path, monkeypatch, capsys, no_training):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("keep me")
    _one_line_error(capsys, main(["train", "--run-dir", str(a_file)]), expect="is a file, not a directory", status=2)
    _one_line_error(capsys, main(["train", "--run-dir", str(a_file / "run")]), expect="is a file, so no directory", status=2)
    assert a_file.read_text() == "keep me"
    # read-only mount or no permission: what os.access reports (root passes permission bits, so it is simulated)
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == locked else real_access(p, mode))
    _one_line_error(capsys, main(["train", "--run-dir", str(locked / "run")]), expect="cannot be written", status=2)
    assert no_training == [] and list(locked.iterdir()) == []


def test_model_directory_that_is_not_a_model(tmp_path, capsys, no_training):
    (tmp_path / "empty_dir").mkdir()
    _one_line_error(capsys, main(["train", f"model.path={tmp_path / 'empty_dir'}"]),
                    expect="is a directory but not a Hugging Face model (no config.json)", status=2)


@pytest.mark.parametrize(
    ("rows", "expect"),
    [
        ([b'{"problem": "1+1", "answer": "2"}', b'{"problem": "caf\xe9", "answer": "3"}'], "train.jsonl:2: not UTF-8 text"),
        ([b'{"question": "Tom has 3", "answer": "3 #### 3"}'], "data.question_field=question data.answer_after='####'"),
        ([b'{"problem": "1+1", "answer": null}'], "field 'answer' is null (use data.on_error=skip"),
    ],
)
def test_bad_data_rows_fail_before_the_model_loads(tmp_path, capsys, no_training, rows, expect):
    data = tmp_path / "train.jsonl"
    data.write_bytes(b"\n".join(rows) + b"\n")
    run = tmp_path / "run"
    code = main(["train", f"data.train={data}", "data.template=plain", "--run-dir", str(run)])
    _one_line_error(capsys, code, expect=expect, status=1)
    assert no_training == [] and not run.exists()
    if b"null" in rows[0] or b"\xe9" in rows[-1]:  # ... and data.on_error=skip skips them
        assert main(["train", f"data.train={data}", "data.template=plain", "data.on_error=skip", "--run-dir", str(run)]) == 0


@pytest.mark.parametrize(
    ("row", "override", "expect"),
    [
        ({"problem": "1+1=", "answer": "2"}, "data.question_field=nope", "sums.jsonl:1: missing field 'nope'"),
        ({"q": "1+1=", "a": "2"}, "data.template=plain", "sums.jsonl:1: missing fields 'problem' and 'answer' "
         "(the row has fields q, a; set data.question_field to the field that holds the problem and "
         "data.answer_field to the field that holds the gold answer)"),
    ],
)
def test_eval_reads_its_data_before_building_the_base_model(tmp_path, monkeypatch, capsys, row, override, expect):
    # Bug story: with a new cache, `mathrl eval tiny-arith --data file.jsonl data.question_field=wrong`
    # pretrained the tiny base model for minutes before it read the file and found the field missing.
    import mathrl.model.paths

    def no_build(*args, **kwargs):
        raise AssertionError("the base model was built before the data was checked")

    monkeypatch.setattr(mathrl.model.paths, "resolve_model_path", no_build)
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("MATHRL_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sums.jsonl").write_text(json.dumps(row) + "\n")
    _one_line_error(capsys, main(["eval", "tiny-arith", "--data", "sums.jsonl", override]), expect=expect, status=1)
    assert list(cache.iterdir()) == []  # no base model, not even its lock
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "sums.jsonl"]  # no eval_<timestamp>/


def test_a_finished_or_unresumable_run_is_left_as_it_was(tmp_path, capsys):
    # A run directory with metrics but no checkpoint: refused (one line), nothing touched, nothing built.
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    (run / "config.yaml").write_text("old: config\n")
    before = _tree(run)
    code = main(["train", "train.steps=1", "model.path=" + str(tmp_path / "no-model"), "--run-dir", str(run)])
    _one_line_error(capsys, code, expect="does not exist", status=2)  # the config error comes first
    assert _tree(run) == before


def test_a_finished_run_is_reported_and_left_as_it_was(tmp_path, capsys):
    # Rerunning the command of a finished run is not an error: exit 0, say what to do, touch nothing
    # (the run directory is opened before any model is built, so this needs no model).
    run = tmp_path / "run"
    (run / "final").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    (run / "summary.json").write_text("{}")
    before = _tree(run)
    assert main(["train", "train.steps=1", "--run-dir", str(run)]) == 0
    assert "holds a finished run" in capsys.readouterr().out
    assert _tree(run) == before


def test_a_finished_run_rerun_with_another_config_is_refused_naming_the_keys(tmp_path, capsys):
    # Bug story: `mathrl train train.steps=2` on a finished 20-step run exited 0, trained nothing and did
    # not say that the config differed. It is refused in one line that names the changed keys.
    from mathrl.config import dump_yaml, load_config

    run = tmp_path / "run"
    (run / "final").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 20}\n')
    (run / "summary.json").write_text('{"steps": 20}')
    old = load_config(None, ["train.steps=20"])
    old.run_dir = str(run)
    (run / "config.yaml").write_text(dump_yaml(old))
    before = _tree(run)
    code = main(["train", "train.steps=2", "--run-dir", str(run)])
    _one_line_error(capsys, code, status=1, expect=f"run directory {run} holds a finished run (20 steps) whose config "
                    "differs (train.steps: 20 -> 2); nothing was trained")
    assert _tree(run) == before
    assert main(["train", "train.steps=20", "--run-dir", str(run)]) == 0  # the same config: finished, not an error
    assert "holds a finished run" in capsys.readouterr().out


def test_a_rank_other_than_0_leaves_rank_0s_run_directory_error_to_rank_0(tmp_path, monkeypatch, capsys):
    # Rank 0 opens the run directory and sends what it found to the others; each rank raises the error,
    # but only rank 0 prints it (under --nproc 2 every message used to appear twice).
    import mathrl.train.loop
    import mathrl.train.trainer as trainer
    from mathrl.config import load_config
    from mathrl.train.dist import Ranks

    error = FileExistsError("run directory runs/x already holds a run, with no complete checkpoint to resume from")
    monkeypatch.setattr(trainer, "broadcast_object", lambda obj: (None, error))
    with pytest.raises(FileExistsError) as info:
        trainer._open_run(load_config(None, []), Ranks(rank=1, world_size=2, joined=True), console=None, resume=True)
    assert info.value.reported_by_rank_0

    def rank_1_train(cfg, console=None, resume=True):
        raise info.value

    monkeypatch.setattr(mathrl.train.loop, "train", rank_1_train)
    assert main(["train", "train.steps=1", "--run-dir", str(tmp_path / "run")]) == 1
    captured = capsys.readouterr()
    assert captured.out + captured.err == ""


@pytest.mark.parametrize("debug", [False, True])
def test_library_notices_are_silenced_unless_mathrl_debug(monkeypatch, capsys, debug):
    # Bug story: a --nproc / vLLM start printed vLLM's Triton notice and a FutureWarning raised from its
    # own code, torch's C++ "NUMA binding" warning and a safetensors progress bar. MATHRL_DEBUG=1 shows them.
    import warnings

    from mathrl.rollout.vllm_engine import quiet_vllm

    for name in ("VLLM_LOGGING_LEVEL", "TORCH_CPP_LOG_LEVEL", "MATHRL_DEBUG"):
        monkeypatch.setenv(name, "")  # recorded, so the test leaves the environment as it found it
        monkeypatch.delenv(name)
    if debug:
        monkeypatch.setenv("MATHRL_DEBUG", "1")
    assert main(["config", "--yaml"]) == 0
    capsys.readouterr()
    assert os.environ.get("TORCH_CPP_LOG_LEVEL") == (None if debug else "ERROR")  # read when torch loads
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_vllm()
        warnings.warn("`torch.distributed.reduce_op` is deprecated, please use `torch.distributed.ReduceOp` instead",
                      FutureWarning)
        warnings.warn("some other deprecation", FutureWarning)  # only the known one is filtered
    assert [str(w.message)[:20] for w in caught] == (["`torch.distributed.r", "some other deprecati"] if debug
                                                     else ["some other deprecati"])
    assert os.environ.get("VLLM_LOGGING_LEVEL") == (None if debug else "ERROR")
    import logging

    triton_notice = logging.getLogger("vllm.triton_utils.importing")  # "Triton is installed, but doesn't include CPU backend"
    assert triton_notice.isEnabledFor(logging.WARNING) == debug
    triton_notice.setLevel(logging.NOTSET)


def test_inspect_writes_into_the_run_directory_by_default(tmp_path):
    from mathrl.analysis.inspect_cli import InspectOptions, default_out

    assert default_out(InspectOptions(run=str(tmp_path / "r"))) == tmp_path / "r" / "inspect.html"
    assert default_out(InspectOptions(rollouts=str(tmp_path / "r" / "rollouts.jsonl"))) == tmp_path / "r" / "inspect.html"
    assert default_out(InspectOptions(prompt="1+1=", response="2")) == Path("inspect.html")
    assert default_out(InspectOptions(run=str(tmp_path / "r"), out="x.html")) == Path("x.html")


def test_base_prints_only_the_path_on_stdout(tmp_path, monkeypatch, capsys):
    # `$(mathrl base)` in the docs: stdout must be the path alone; status lines go to stderr.
    monkeypatch.setenv("MATHRL_CACHE", str(tmp_path / "cache"))
    small = ["base.steps=2", "base.hidden_size=16", "base.intermediate_size=32", "base.num_layers=1",
             "base.num_heads=2", "base.num_kv_heads=1"]
    for _ in range(2):  # built, then found in the cache
        assert main(["base", *small]) == 0
        captured = capsys.readouterr()
        (line,) = captured.out.splitlines()
        assert Path(line).is_dir() and (Path(line) / "config.json").exists()
        assert "tiny base model" in captured.err


# --------------------------------------------------------------------------------------------------
# a real run in a child process: Ctrl-C and piped progress
# --------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_ctrl_c_says_where_to_resume_and_piped_output_has_progress_lines(tmp_path, model_dir):
    # Bug stories: Ctrl-C printed a 30-frame KeyboardInterrupt traceback and exited -2; piped output
    # (nohup, tee) showed nothing until the run ended.
    run = tmp_path / "run"
    argv = [sys.executable, "-m", "mathrl.cli", "train", f"model.path={model_dir}", "train.steps=200",
            "rollout.prompts_per_step=2", "rollout.n=2", "train.mini_batch_size=4", "rollout.max_new_tokens=8",
            "data.eval_size=2", "eval.n=1", "eval.every=1000", "train.save_every=1", "train.keep_last=1",
            "reward.num_workers=1", "data.arith.max_digits=2",
            "data.dynamic_sampling.mode=none",  # every group trains: a random model is never right, all would be dropped
            "--run-dir", str(run)]
    env = {**os.environ, "PYTHONUNBUFFERED": "0"}  # block-buffered stdout, as under nohup: lines must be flushed
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                             start_new_session=True,  # its own process group, which Ctrl-C signals as a whole
                             # SIGINT at its default even when pytest runs with it ignored (a background job of a
                             # script): Python then leaves it ignored in the child, and Ctrl-C would do nothing
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 240
        while not any((run / "checkpoints").glob("step_*/trainer_state.json")) or _steps_logged(run) < 3:
            assert child.poll() is None, child.communicate()
            assert time.monotonic() < deadline, "no checkpoint after 240 s"
            time.sleep(0.2)
        os.killpg(child.pid, signal.SIGINT)
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
    assert child.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    from mathrl.run_dir import latest_checkpoint

    saved = json.loads((latest_checkpoint(run / "checkpoints") / "trainer_state.json").read_text())["step"]
    logged = _steps_logged(run)
    assert lines[-1].startswith(f"mathrl: interrupted at step {logged + 1}; rerun the same command to resume from "
                                f"step {saved} "), lines[-1]
    progress = [ln for ln in out.splitlines() if ln.startswith("RL step ")]
    assert len(progress) >= 2 and "/200 | reward " in progress[0] and "eta" in progress[0], out


def test_ctrl_c_before_the_first_step_and_the_rerun_agree(tmp_path, model_dir, monkeypatch, capsys):
    # Bug story: Ctrl-C during the start's evaluation said "nothing to resume: rerun to start over", and
    # the rerun failed with exit 1: "already holds a run, with no complete checkpoint to resume from".
    import mathrl.train.loop

    run = tmp_path / "run"
    argv = ["train", f"model.path={model_dir}", "train.steps=1", "rollout.prompts_per_step=2", "rollout.n=2",
            "train.mini_batch_size=4", "rollout.max_new_tokens=4", "data.eval_size=2", "eval.n=1",
            "reward.num_workers=0", "data.arith.max_digits=2", "data.dynamic_sampling.mode=none", "--run-dir", str(run)]

    def interrupted(trainer, step, collected=None):
        raise KeyboardInterrupt  # after the start's evaluation was logged at step 0, before step 1 ends

    with monkeypatch.context() as m:
        m.setattr(mathrl.train.loop, "rl_step", interrupted)
        assert main(argv) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "mathrl: interrupted at step 1; nothing was trained: rerun the same command to start over"
    assert [json.loads(ln)["step"] for ln in (run / "evals.jsonl").read_text().splitlines()] == [0]

    assert main(argv) == 0, capsys.readouterr().err
    assert "holds no trained step: starting over" in capsys.readouterr().out
    # the start was evaluated once more, not twice over: one step-0 evaluation, then step 1's
    assert [json.loads(ln)["step"] for ln in (run / "evals.jsonl").read_text().splitlines()] == [0, 1]


def _steps_logged(run: Path) -> int:
    path = run / "metrics.jsonl"
    steps = [0]
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                steps.append(int(json.loads(line)["step"]))
            except (ValueError, KeyError):
                pass
    return max(steps)


def test_piped_tables_and_bars_are_not_cut(capsys):
    # Bug story: piped, `mathrl eval`'s table came out as "chec…", "pass…" (rich's 80-column default
    # for non-terminals), and bars printed nothing until the end.
    from rich.table import Table

    from mathrl.evaluation.results import PASS1_HEADER
    from mathrl.track.console import PlainProgress, make_console, make_progress

    console = make_console()  # capsys: not a terminal
    table = Table()
    for name in ("checkpoint", PASS1_HEADER, "pass@2", "maj@8", "no-answer", "repetitive", "garbled"):
        table.add_column(name)
    table.add_row("run_with_a_long_name/step_000120", "0.512 [0.480, 0.544] · seeds 0.512 ± 0.013", *["0.500"] * 5)
    console.print(table)
    out = capsys.readouterr().out
    assert "run_with_a_long_name/step_000120" in out and PASS1_HEADER in out and "…" not in out

    bar = make_progress(console, "eval", every_s=3600)
    assert isinstance(bar, PlainProgress)
    with bar:
        task = bar.add_task("eval", total=3, info="")
        for i in range(3):
            bar.update(task, info=f"seed {i}")
            bar.advance(task)
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split(" | ")[0] for ln in lines] == ["eval 1/3", "eval 3/3"]  # first and last; the rest throttled
    assert "seed 0" in lines[0] and "eta" in lines[0]


def test_resuming_with_a_changed_config_names_the_changed_fields(tmp_path):
    # Bug story: the warning said only "the config differs", leaving the user to diff two YAML files.
    import io

    from rich.console import Console

    from mathrl.config import dump_yaml, load_config
    from mathrl.run_dir import open_run_dir

    run = tmp_path / "run"
    (run / "checkpoints" / "step_000002").mkdir(parents=True)
    for name in ("trainer_state.json", "trainer_state.pt"):
        (run / "checkpoints" / "step_000002" / name).write_text('{"step": 2}')
    (run / "metrics.jsonl").write_text('{"step": 2}\n')
    (run / "config.yaml").write_text(dump_yaml(load_config(None, ["rollout.n=8"])))
    console = Console(file=io.StringIO(), width=1000)
    _, checkpoint = open_run_dir(run, config_text=dump_yaml(load_config(None, ["rollout.n=4", "data.eval=[arith, arith]"])),
                                 resume=True, console=console)
    text = console.file.getvalue()
    assert checkpoint == run / "checkpoints" / "step_000002"
    assert "(data.eval: ['arith'] -> ['arith', 'arith']; rollout.n: 8 -> 4)" in text
    assert (run / "config.previous.yaml").exists()


@pytest.mark.parametrize("terminal", [True, False])
def test_the_base_model_bar_shows_a_loss_only_once_there_is_one(terminal):
    # Bug story: the base model's pretraining bar opened at "loss nan 0/800".
    import io

    from rich.console import Console

    from mathrl.track.console import BuildProgress

    console = Console(file=io.StringIO(), force_terminal=terminal, width=120, color_system=None)
    bar = BuildProgress(console, total=800)
    console.print(bar._progress.get_renderable() if terminal else "")
    assert "nan" not in console.file.getvalue() and "loss" not in console.file.getvalue()
    bar.update(1, 800, 2.5)
    if terminal:
        console.print(bar._progress.get_renderable())
    assert "loss 2.500" in console.file.getvalue() and "nan" not in console.file.getvalue()


@pytest.mark.parametrize("width", [80, 120])
def test_terminal_bar_keeps_its_times_and_cuts_the_info_text(width):
    # Bug story: at 120 columns the RL bar's remaining time was cut to "0:0…" by its long info text.
    import io
    import re

    from rich.console import Console

    from mathrl.track.console import make_progress

    console = Console(file=io.StringIO(), force_terminal=True, width=width, color_system=None)
    bar = make_progress(console, "RL step")
    bar.add_task("rl", total=50, completed=3, info="reward 0.500 | eval pass@1 arith_heldout 0.400 | entropy 0.200 | "
                 "clip 0.000 | len 12.0 | 1.0s/step")
    console.print(bar.get_renderable())
    (line,) = console.file.getvalue().splitlines()
    assert re.search(r" 3/50 \d:\d\d:\d\d -:--:-- reward 0.500 ", line), line
    assert line.endswith("…") and len(line) <= width


@pytest.mark.parametrize(
    ("args", "expect", "status"),
    [
        (["trian"], "invalid choice: 'trian'", 2),  # a misspelt verb
        (["eval", "{model}", "--temperature", "0"], "--temperature 0 is greedy decoding: all --n 8 samples", 2),
        (["eval", "{model}", "--top-p", "0"], "--top-p must be in (0, 1], got 0.0", 2),
        (["eval", "{model}", "--n", "2", "eval.n=4"], "has no effect in `mathrl eval`; use --n instead", 2),
        (["eval", "no_such_run"], "target 'no_such_run' does not exist", 1),
        (["eval", "{model}", "--out", "{file}"], "--out '{file}' is a file, not a directory", 2),
        (["inspect", "--prompt", "1+1="], "--prompt and --response go together", 1),
        # a model directory that is not there fails before the base model is built
        (["inspect", "--prompt", "1+1=", "--response", "2", "--base", "{model}", "--model", "./no_model"],
         "model ./no_model does not exist", 1),
        (["report", "no_such_run"], "no_such_run", 1),
    ],
)
def test_other_verbs_fail_in_one_line(tmp_path, monkeypatch, capsys, model_dir, args, expect, status):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a_file").write_text("x")
    fill = {"model": str(model_dir), "file": str(tmp_path / "a_file")}
    _one_line_error(capsys, main([a.format(**fill) for a in args]), expect=expect.format(**fill), status=status)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]  # nothing written


@pytest.mark.parametrize("args, expect", [
    (["--engine", "vllm", "--max-topk", "0"], "--gpu-memory-utilization must be in (0, 1] and --max-topk >= 1"),
    (["--engine", "vllm", "--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization must be in (0, 1]"),
    (["--port", "70000"], "--port must be in 0-65535"),
    (["--max-topk", "32"], "--max-topk count only with --engine vllm"),  # set where it has no effect: refused
])
def test_serve_teacher_refuses_bad_options_in_one_line_before_loading(capsys, args, expect):
    # why: a vLLM engine takes seconds to minutes to start; a wrong option must not wait for it
    code = main(["serve-teacher", "tiny-arith", *args])
    _one_line_error(capsys, code, expect=expect, status=1)  # the CLI's usage errors
