"""End-to-end tests of `mathrl.train.loop.train` and the `mathrl` command on tiny CPU models.

STYLE.md point 9: a few steps with tiny models, then check the run directory, that every metric is
finite and that the parameters changed. The base model here is a 20-step, hidden-32 version of the
tiny base model, built into a temporary MATHRL_CACHE (never the user's cache).

Run: python -m pytest tests/train/test_train_e2e.py -q
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from mathrl.config import load_config
from mathrl.model.io import load_model_and_tokenizer
from mathrl.track.sinks import read_metrics

TINY_BASE = [
    "base.steps=20",
    "base.hidden_size=32",
    "base.intermediate_size=64",
    "base.num_layers=2",
    "base.num_heads=2",
    "base.num_kv_heads=1",
]


def quiet_console() -> Console:
    return Console(file=io.StringIO(), width=120)


def assert_all_metrics_finite(rows: list[dict]) -> None:
    # The JSONL sink writes NaN/inf as strings (JSON has neither), so a non-number value is a NaN too.
    for row in rows:
        for key, value in row.items():
            assert isinstance(value, (int, float)) and not isinstance(value, bool), (row["step"], key, value)
            assert math.isfinite(value), (row["step"], key, value)


# --------------------------------------------------------------------------------------------------
# (a) the embedded default experiment, shrunk
# --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def arith_run(tmp_path_factory):
    """One 2-step run on the arithmetic task; returns (config, result, base model dir).

    The base model must be good enough that some groups hold both right and wrong answers: with
    every reward 0, all GRPO advantages are 0, the gradient is exactly 0 and (no weight decay) the
    parameters rightly do not move. A 20-step base model only emits noise ("no_answer" everywhere),
    so this one trains 200 steps on single-digit sums (~5 s), which gives ~10-25% reward.
    Single digits leave only 5 held-out problems, hence data.eval_size=4: asking for more than
    exist makes ArithmeticTask.heldout_problems loop forever (see the report).
    """
    from mathrl.model.tiny import base_model_dir
    from mathrl.train.loop import train

    root = tmp_path_factory.mktemp("arith_run")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MATHRL_CACHE", str(root / "cache"))
        cfg = load_config(None, [
            *TINY_BASE,
            "base.steps=200",
            "base.max_digits=1",
            "data.arith.max_digits=1",
            "train.steps=2",
            "rollout.prompts_per_step=4",
            # 8 samples per problem: with a ~10%-reward model a group is all wrong with odds ~0.9^8 = 0.43,
            # so all 8 groups of the 2 steps are, and nothing trains, with odds ~0.43^8 ~ 1e-3 whatever
            # the seed (with 4 samples per problem that happened for about half the seeds)
            "rollout.n=8",
            "train.mini_batch_size=16",  # 32 sequences per step -> 2 optimizer steps per RL step
            "data.eval_size=4",
            "eval.n=2",
            "eval.every=1",
            "data.dynamic_sampling.mode=none",  # every group trains: the assertions count the full batch
            "reward.num_workers=1",
            "reward.timeout_s=60",  # a slow worker start on a busy machine must not read as a timeout
            f"run_dir={root / 'run'}",
        ])
        result = train(cfg, console=quiet_console())
        base_dir = base_model_dir(cfg.base)
    return cfg, result, base_dir


@pytest.mark.slow
def test_run_directory_layout(arith_run):
    cfg, result, _ = arith_run
    run = result.run_dir
    for name in ("config.yaml", "metrics.jsonl", "rollouts.jsonl", "evals.jsonl", "summary.json"):
        assert (run / name).is_file(), name
    assert (run / "final").is_dir()
    # config.yaml is the resolved config: loading it back reproduces the run's config exactly
    assert load_config(run / "config.yaml") == cfg
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["steps"] == 2


def test_metrics_are_finite_and_named(arith_run):
    cfg, result, _ = arith_run
    rows = read_metrics(result.run_dir / "metrics.jsonl")
    assert_all_metrics_finite(rows)
    keys = set().union(*rows)
    for key in ("actor/entropy", "actor/pg_clipfrac", "actor/pg_loss", "actor/grad_norm", "actor/ppo_kl",
                "rollout/response_length", "reward/mean", "eval/arith_heldout/pass@1", "perf/step_seconds"):
        assert key in keys, key
    # the base model is evaluated at step 0, then every step trains and (eval.every=1) evaluates
    train_steps = [r["step"] for r in rows if "actor/entropy" in r]
    eval_steps = [r["step"] for r in rows if "eval/arith_heldout/pass@1" in r]
    assert train_steps == [1, 2] and eval_steps == [0, 1, 2]
    for r in rows:
        if "actor/entropy" in r:
            assert r["actor/updates"] == 2  # 32 sequences / mini-batch 16, one epoch
            assert 0 <= r["actor/pg_clipfrac"] <= 1
            assert 0 <= r["reward/mean"] <= 1
            assert 1 <= r["rollout/response_length"] <= cfg.rollout.max_new_tokens
            assert r["actor/entropy"] > 0  # a briefly pretrained model is far from deterministic


def test_every_logged_metric_is_defined_in_the_glossary(arith_run):
    # docs/metrics.md is the contract for metric names: a key logged but not defined there is a bug.
    # eval keys are documented once as eval/<set>/..., pass@<k> / maj@<n> once for every k.
    import re

    _, result, _ = arith_run
    glossary = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    keys = set().union(*read_metrics(result.run_dir / "metrics.jsonl")) - {"step"}
    generic = {re.sub(r"^eval/[^/]+/(pass|maj)@\d+$", r"eval/<set>/\1@<k>", re.sub(r"^eval/[^/]+/", "eval/<set>/", k))
               for k in keys}
    undefined = sorted(k for k in generic
                       if f"`{k}`" not in glossary and f"`{k.replace('@<k>', '@<n>')}`" not in glossary)
    assert undefined == []


def test_ppo_with_a_critic_end_to_end(arith_run, tmp_path):
    # PPO with a critic: VC-PPO value pretraining, VAPO length-adaptive lambda, KL as a per-token
    # reward penalty, on the cached tiny base model of arith_run.
    from mathrl.train.loop import train

    cfg, _, base_dir = arith_run
    ppo = load_config(None, [
        f"model.path={base_dir}", "data.arith.max_digits=1", "train.steps=2", "rollout.prompts_per_step=4",
        "rollout.n=4", "train.mini_batch_size=8", "data.eval_size=4", "eval.n=2", "eval.every=2",
        "reward.num_workers=0", "algo.adv.estimator=gae", "algo.critic.pretrain_steps=1", "algo.critic.lr=1e-3",
        "algo.critic.length_adaptive_alpha=0.05", "algo.kl.use=reward", "algo.kl.coef=0.01", f"run_dir={tmp_path / 'ppo'}",
    ])
    result = train(ppo, console=quiet_console())
    rows = read_metrics(result.run_dir / "metrics.jsonl")
    assert_all_metrics_finite(rows)
    pretrain = next(r for r in rows if "critic/pretrain_steps" in r)
    assert pretrain["step"] == 0 and pretrain["critic/pretrain_value_loss_first"] > 0
    steps = [r for r in rows if "critic/value_loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        # responses of single-digit sums are ~10-30 tokens: lambda = 1 - 1/(0.05 l) is well below 1
        assert 0 <= r["actor/gae_lambda"] < 0.95
        assert r["critic/value_loss"] > 0 and "reward/kl_penalty" in r
    assert (result.run_dir / "final" / "critic" / "model.safetensors").is_file()
    glossary = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    assert [k for k in set().union(*rows) if k.startswith("critic/") and f"`{k}`" not in glossary] == []


def test_rollouts_jsonl_has_tokens_and_logprobs(arith_run):
    cfg, result, _ = arith_run
    records = [json.loads(line) for line in (result.run_dir / "rollouts.jsonl").read_text().splitlines()]
    assert len(records) == cfg.train.steps * cfg.log.rollouts_per_step
    for rec in records:
        assert len(rec["token_ids"]) == len(rec["tokens"]) == len(rec["logprobs"]) >= 1
        assert all(lp <= 0 for lp in rec["logprobs"])
        assert rec["prompt"].endswith("=")  # the arith template
        assert 0 <= rec["reward"] <= 1


def test_evals_and_summary(arith_run):
    _, result, _ = arith_run
    evals = [json.loads(line) for line in (result.run_dir / "evals.jsonl").read_text().splitlines()]
    assert [(e["step"], e["set"]) for e in evals] == [(0, "arith_heldout"), (1, "arith_heldout"), (2, "arith_heldout")]
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert summary["steps"] == 2
    for when in ("base", "final"):
        assert 0 <= summary[when]["arith_heldout"]["pass@1"] <= 1
    assert summary["final"]["arith_heldout"]["pass@1"] == pytest.approx(result.final["arith_heldout"].pass_at_1)


def test_final_model_loads_and_differs_from_the_base(arith_run):
    # The run must have trained: at least one parameter tensor moved away from the base model.
    _, result, base_dir = arith_run
    rows = [r for r in read_metrics(result.run_dir / "metrics.jsonl") if "rollout/all_wrong_groups" in r]
    mixed = [1 - r["rollout/all_wrong_groups"] - r["rollout/all_correct_groups"] for r in rows]
    assert max(mixed) > 0, "no group with both right and wrong answers: zero advantages, nothing to learn"
    assert max(r["actor/grad_norm"] for r in rows) > 0
    final, tokenizer = load_model_and_tokenizer(result.run_dir / "final")
    base, _ = load_model_and_tokenizer(base_dir)
    assert tokenizer.eos_token_id == 1
    final_params = dict(final.named_parameters())
    diffs = {name: (p - final_params[name]).abs().max().item() for name, p in base.named_parameters()}
    assert max(diffs.values()) > 0, "no parameter changed"
    assert all(math.isfinite(d) for d in diffs.values())


# --------------------------------------------------------------------------------------------------
# (b) a user model directory and a jsonl data file
# --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gsm8k_file(tmp_path_factory, shared_math) -> Path:
    source = shared_math / "gsm8k_test.jsonl"
    if not source.is_file():
        pytest.skip(f"shared math data not found at {source} (set MATHRL_SHARED_DATA)")
    # named like the preset so the GSM8K field mapping ("question", answer after "####") applies
    path = tmp_path_factory.mktemp("data") / "gsm8k_test.jsonl"
    path.write_text("".join(source.read_text().splitlines(keepends=True)[:6]))
    return path


@pytest.fixture(scope="module")
def random_model_dir(tmp_path_factory, make_tiny_qwen2, char_tokenizer) -> Path:
    from mathrl.model.io import save_model

    model = make_tiny_qwen2(seed=11, max_positions=1024)  # GSM8K prompts are ~300-600 characters
    return save_model(model, char_tokenizer, tmp_path_factory.mktemp("model") / "random-qwen2")


def test_train_on_a_jsonl_file_with_a_user_model(tmp_path, gsm8k_file, random_model_dir):
    # Note: data.question_field is left at its default on purpose. Setting it to "question" (the
    # GSM8K field) turns the preset off and the gold answer becomes the whole solution text; see
    # test_explicit_question_field_keeps_the_gsm8k_preset below.
    from mathrl.train.loop import train

    cfg = load_config(None, [
        f"model.path={random_model_dir}",
        f"data.train={gsm8k_file}",
        f"data.eval=[{gsm8k_file}]",
        "data.template=plain",
        "data.max_prompt_tokens=1000",
        "rollout.max_new_tokens=8",
        "rollout.prompts_per_step=2",
        "rollout.n=2",
        "train.mini_batch_size=4",
        "train.steps=2",
        "eval.n=2",
        "eval.every=1",
        "reward.num_workers=0",  # in-process: this test is about data and model plumbing
        "data.dynamic_sampling.mode=none",  # every group trains: a random model is never right, all would be dropped
        f"run_dir={tmp_path / 'run'}",
    ])
    result = train(cfg, console=quiet_console())
    rows = read_metrics(result.run_dir / "metrics.jsonl")
    assert_all_metrics_finite(rows)
    assert [r["step"] for r in rows if "reward/mean" in r] == [1, 2]
    final = result.final["gsm8k_test"]
    assert final.num_problems == 6  # every row of the file was read and evaluated
    logged = [r["eval/gsm8k_test/pass@1"] for r in rows if "eval/gsm8k_test/pass@1" in r]
    assert len(logged) == 3 and logged[-1] == final.pass_at_1  # steps 0, 1, 2; the result is the last one logged
    records = [json.loads(line) for line in (result.run_dir / "rollouts.jsonl").read_text().splitlines()]
    # the preset gave numeric gold answers (the text after "####"), not the worked solutions
    assert all(rec["answer"].lstrip("-").replace(".", "").isdigit() for rec in records)
    assert all(len(rec["tokens"]) <= 8 for rec in records)
    assert (result.run_dir / "final" / "model.safetensors").is_file()


def test_train_on_parquet_with_an_hf_folder_eval_set(tmp_path, gsm8k_file, random_model_dir):
    # The same rows as Parquet (training) and as a local Hugging Face dataset folder (evaluation):
    # both formats reach the loop through the same field map and prompt encoder as jsonl.
    import pyarrow as pa
    import pyarrow.parquet as pq

    from mathrl.train.loop import train

    rows = [json.loads(line) for line in gsm8k_file.read_text().splitlines()]
    parquet = tmp_path / "gsm8k_test.parquet"  # the stem picks the GSM8K preset ("####" answers)
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    folder = tmp_path / "hf_gsm8k" / "data"
    folder.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), folder / "test-00000-of-00001.parquet")

    cfg = load_config(None, [
        f"model.path={random_model_dir}", f"data.train={parquet}", f"data.eval=[hf:{folder.parent}]",
        "data.question_field=question", "data.answer_after=####",  # a folder has no preset of its own
        "data.template=plain", "data.max_prompt_tokens=1000", "rollout.max_new_tokens=8",
        "rollout.prompts_per_step=2", "rollout.n=2", "train.mini_batch_size=4", "train.steps=1",
        "eval.n=2", "eval.every=1", "reward.num_workers=0", f"run_dir={tmp_path / 'run'}",
        "data.dynamic_sampling.mode=none",  # every group trains: a random model is never right, all would be dropped
    ])
    result = train(cfg, console=quiet_console())
    assert set(result.final) == {"hf_gsm8k_test"}  # folder name + the default eval split
    records = [json.loads(line) for line in (result.run_dir / "rollouts.jsonl").read_text().splitlines()]
    assert all(rec["answer"].lstrip("-").replace(".", "").isdigit() for rec in records)


def test_explicit_question_field_keeps_the_gsm8k_preset(gsm8k_file):
    # Bug story: field_map() uses the preset only when the configured FieldMap equals FieldMap().
    # data.question_field=question is exactly what GSM8K needs, yet it switches the preset off, and
    # there is no config field for answer_after="####": the gold answer becomes the whole worked
    # solution ("Janet sells ... #### 18"), which no completion can ever match, so every reward is 0.
    from mathrl.tasks.loading import load_problems
    from mathrl.tasks.sources import field_map

    cfg = load_config(None, ["data.question_field=question", f"data.train={gsm8k_file}"])
    problems = load_problems(gsm8k_file, field_map(cfg, str(gsm8k_file))).problems
    assert problems[0].answer == "18"


# --------------------------------------------------------------------------------------------------
# (c) the command line
# --------------------------------------------------------------------------------------------------
@pytest.fixture
def no_training(monkeypatch):
    """Replace train() so a CLI test that wrongly gets past config parsing cannot start a real run."""
    import mathrl.train.loop

    calls = []
    monkeypatch.setattr(mathrl.train.loop, "train", lambda cfg, console=None, resume=True: calls.append(cfg))
    return calls


def test_cli_unknown_key_exits_2_with_suggestion(capsys, no_training):
    from mathrl.cli import main

    assert main(["train", "n=3"]) == 2
    out = capsys.readouterr().err  # errors: one line each on stderr
    assert "unknown config key 'n'" in out and "'rollout.n'" in out
    assert no_training == []


def test_cli_override_without_equals_exits_2(capsys, no_training):
    from mathrl.cli import main

    assert main(["train", "rollout.n"]) == 2
    assert "key.path=value" in capsys.readouterr().err
    assert no_training == []


def test_cli_passes_recipe_overrides_and_run_dir(tmp_path, no_training):
    # The CLI only parses: recipe file first, overrides on top, --run-dir into run_dir.
    from mathrl.cli import main

    recipe = Path(__file__).resolve().parents[2] / "recipes" / "arith_grpo.yaml"
    assert main(["train", str(recipe), "rollout.n=4", "--run-dir", str(tmp_path / "r")]) == 0
    (cfg,) = no_training
    assert cfg.rollout.n == 4 and cfg.run_dir == str(tmp_path / "r")


def test_cli_run_dir_is_taken_literally(tmp_path, monkeypatch, no_training):
    # Bug story: main() appends f"run_dir={ns.run_dir}" to the overrides, and override values are
    # read as YAML: "--run-dir 2024-05-01" becomes a datetime.date and "--run-dir 42" an int, and
    # both fail with "run_dir: expected str or null", although they are perfectly good directory names.
    from mathrl.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["train", "--run-dir", "2024-05-01"]) == 0
    assert no_training[0].run_dir == "2024-05-01"


def test_cli_refuses_to_reuse_a_run_dir(tmp_path, monkeypatch, capsys):
    # A run directory that already holds metrics.jsonl is refused before anything is written or
    # built, so a finished experiment is never appended to or overwritten. (Tiny overrides and a
    # temporary cache make sure a regression here cannot start an expensive default run.)
    from mathrl.cli import main

    monkeypatch.setenv("MATHRL_CACHE", str(tmp_path / "cache"))
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    (run / "config.yaml").write_text("old: config\n")
    code = main(["train", *TINY_BASE, "train.steps=1", "rollout.prompts_per_step=2", "rollout.n=2",
                 "train.mini_batch_size=4", "data.eval_size=2", "--run-dir", str(run)])
    assert code == 1
    out = capsys.readouterr().err
    assert "already holds a run" in out
    assert (run / "metrics.jsonl").read_text() == '{"step": 1}\n'
    assert (run / "config.yaml").read_text() == "old: config\n"
    assert not (tmp_path / "cache").exists()  # nothing was built
