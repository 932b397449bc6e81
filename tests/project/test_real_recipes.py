"""The real-size recipes (recipes/real/*.yaml): valid configs, their published settings, data that
exists, and a memory plan for each."""

from __future__ import annotations

from pathlib import Path

import pytest

from mathrl.config import ConfigError, load_config
from mathrl.plan.format import format_plan
from mathrl.plan.memory import estimate_memory

REPO = Path(__file__).resolve().parents[2]
RECIPES = sorted((REPO / "recipes" / "real").glob("*.yaml"))
STAGES = [REPO / "recipes" / "real" / f"deepscaler_1.5b_{k}k.yaml" for k in (8, 16, 24)]


def test_the_real_recipes_are_there():
    names = {p.name for p in RECIPES}
    assert {"deepscaler_1.5b_8k.yaml", "deepscaler_1.5b_16k.yaml", "deepscaler_1.5b_24k.yaml",
            "dapo_qwen2.5_math_7b.yaml", "torl_qwen2.5_math_1.5b.yaml"} <= names


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_recipe_loads_and_plans(recipe):
    # Paths are not checked: the data and earlier stages' checkpoints live on the training machine.
    cfg = load_config(recipe, check_paths=False)
    plan = estimate_memory(cfg, gpus=8, gpu_mem_gib=80)
    assert plan.arch.params > 1e9 and plan.total > 0


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_local_data_files_exist_in_the_shared_folder(recipe, shared_math, monkeypatch):
    # Relative data paths are written from the repository root, like every command in the README.
    if not shared_math.is_dir():
        pytest.skip(f"shared math data not found at {shared_math}")
    cfg = load_config(recipe, check_paths=False)
    monkeypatch.chdir(REPO)
    for where, source in cfg._data_files():
        path = Path(source)
        if not path.is_file():  # the folder may sit elsewhere (MATHRL_SHARED_DATA): same file name there
            path = shared_math / path.name
        assert path.is_file(), f"{recipe.name}: {where} {source!r} does not exist"


def test_deepscaler_stages_grow_the_context_and_chain_their_checkpoints():
    cfgs = [load_config(p, check_paths=False) for p in STAGES]
    assert [c.rollout.max_new_tokens for c in cfgs] == [8192, 16384, 24576]
    assert [c.rollout.n for c in cfgs] == [8, 16, 16]
    assert cfgs[0].train.init_from is None
    for previous, stage in zip(cfgs, cfgs[1:]):
        # the stage continues the previous run's last checkpoint, which that run's save_every writes
        assert stage.train.init_from == f"{previous.run_dir}/checkpoints/step_{previous.train.steps:06d}"
        assert previous.train.steps % previous.train.save_every == 0
    for c in cfgs:  # DeepScaleR's published settings
        assert (c.train.lr, c.rollout.prompts_per_step, c.rollout.temperature) == (1e-6, 128, 0.6)
        assert (c.algo.kl.use, c.algo.kl.estimator, c.algo.kl.coef) == ("loss", "k3", 0.001)
        assert c.train.mini_batch_size == 64 * c.rollout.n  # 64 prompts per mini-batch
        assert c.model.path == "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"


def test_dapo_recipe_has_the_settings_of_verls_dapo_7b_script():
    c = load_config(REPO / "recipes" / "real" / "dapo_qwen2.5_math_7b.yaml", check_paths=False)
    assert (c.rollout.prompts_per_step, c.rollout.n, c.train.mini_batch_size) == (512, 16, 512)
    assert c.rollout_batch_size // c.train.mini_batch_size == 16  # 16 gradient updates per rollout step
    assert (c.algo.clip.eps_low, c.algo.clip.eps_high, c.algo.loss_agg, c.algo.kl.use) == (0.2, 0.28, "token_mean", "none")
    assert c.algo.clip.dual_clip_c == 10.0  # clip_ratio_c=10.0
    assert c.data.dynamic_sampling.mode == "nonconstant" and c.data.transform == "integer_answer"
    # 2048 + 8192 tokens, the last 4096 of the response the overlong buffer, on a +1/-1 reward
    assert (c.data.max_prompt_tokens, c.rollout.max_new_tokens) == (2048, 8192)
    assert (c.reward.overlong.soft_punishment, c.reward.overlong.cache_len, c.reward.incorrect) == (True, 4096, -1.0)
    # the 4096-position model is lifted to 32768 positions, so the context check at config time passes
    assert c.model.max_position_embeddings == 32768 and c.rollout.vllm.max_model_len == 2048 + 8192
    assert (c.train.lr, c.train.warmup_steps, c.train.weight_decay) == (1e-6, 10, 0.1)
    assert (c.eval.n, c.eval.top_p) == (32, 0.7)


def test_a_context_longer_than_the_model_is_refused_at_config_time():
    # Qwen2.5-Math-7B has 4096 positions: without the override, 2048 + 8192 tokens cannot start, and the
    # error comes from validate, before any model or engine loads
    with pytest.raises(ConfigError, match="8192 tokens leave no room for a prompt in the model's 4096 positions"):
        load_config(REPO / "recipes" / "real" / "dapo_qwen2.5_math_7b.yaml", ["model.max_position_embeddings=null"],
                    check_paths=False)
    with pytest.raises(ConfigError, match="rollout.vllm.max_model_len=10240 exceeds the model's 4096"):
        load_config(REPO / "recipes" / "real" / "dapo_qwen2.5_math_7b.yaml", ["model.max_position_embeddings=null"],
                    check_paths=False)


def test_the_guides_recipe_table_names_every_real_recipe():
    # the GSPO and CISPO recipes existed, but no doc named them: the guide's table and the folder stay in step
    guide = (REPO / "docs" / "guide.md").read_text()
    table = guide[guide.index("<!-- real-recipes -->"):].split("\n\n")[0]
    named = {line.split("`")[1] for line in table.splitlines() if line.strip().startswith("| `")}
    assert named == {p.name for p in RECIPES}


@pytest.mark.parametrize("recipe", [p for p in RECIPES if p.name.startswith(("gspo", "cispo"))], ids=lambda p: p.name)
def test_the_gspo_and_cispo_recipes_pin_no_run_dir_and_fit_their_model(recipe):
    # adapting the GSPO recipe to a 1.5B model took three length overrides and a run_dir of one's own
    assert "\nrun_dir:" not in recipe.read_text()
    cfg = load_config(recipe, check_paths=False)  # lengths beyond the model's positions are refused here
    assert cfg.run_dir is None
    trainer_gpus = list(range(7)) if cfg.rollout.max_staleness else None
    assert estimate_memory(cfg, gpus=8, gpu_mem_gib=80, trainer_gpus=trainer_gpus).fits


def test_every_recipe_header_gives_its_launch_line():
    # the multi-GPU launch had to be inferred from a pointer to docs/guide.md; each header now spells it out
    for recipe in RECIPES:
        header = recipe.read_text().split("\n\n")[0]
        assert "mathrl train --nproc " in header or "torchrun --nnodes " in header, recipe.name


def test_torl_parquet_converts_to_the_jsonl_the_recipe_reads(tmp_path):
    # ToRL ships its problems in verl's layout (nested prompt messages, reward_model.ground_truth), which the
    # loader does not read; scripts/torl_to_jsonl.py flattens it. A tiny parquet in that layout, written here.
    import json
    import subprocess
    import sys

    import pyarrow as pa
    import pyarrow.parquet as pq

    from mathrl.tasks.loading import load_problems
    from mathrl.tasks.sources import field_map

    system = {"role": "system", "content": "Please reason step by step."}
    rows = [
        {"data_source": "numina", "prompt": [system, {"role": "user", "content": "What is $1+1$?"}], "ability": "math",
         "reward_model": {"style": "rule", "ground_truth": "2"}, "extra_info": {"split": "train", "index": 7}},
        {"data_source": "math", "prompt": [system, {"role": "user", "content": "Solve $x^2=4$."}], "ability": "math",
         "reward_model": {"style": "rule", "ground_truth": "\\pm 2"}, "extra_info": {"split": "train", "index": 8}},
        {"data_source": "math", "prompt": [system], "ability": "math",  # no user message: a bad row
         "reward_model": {"style": "rule", "ground_truth": "3"}, "extra_info": {"split": "train", "index": 9}},
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    script = [sys.executable, str(REPO / "scripts" / "torl_to_jsonl.py"), str(tmp_path / "train.parquet")]
    bad = subprocess.run([*script, str(tmp_path / "out.jsonl")], capture_output=True, text=True)
    assert bad.returncode == 1 and "row 2: prompt has no user message" in bad.stderr
    done = subprocess.run([*script, str(tmp_path / "out.jsonl"), "--skip-bad"], capture_output=True, text=True, check=True)
    assert "wrote 2 problems" in done.stdout and "1 rows without a question or answer left out" in done.stdout
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert out == [{"problem": "What is $1+1$?", "answer": "2", "source": "numina", "id": "torl-7"},
                   {"problem": "Solve $x^2=4$.", "answer": "\\pm 2", "source": "math", "id": "torl-8"}]
    cfg = load_config(REPO / "recipes" / "real" / "torl_qwen2.5_math_1.5b.yaml", [f"data.train={tmp_path / 'out.jsonl'}"],
                      check_paths=False)
    problems = load_problems(cfg.data.train, field_map(cfg, cfg.data.train)).problems  # the recipe's own field mapping reads it
    assert [(p.question, p.answer) for p in problems] == [("What is $1+1$?", "2"), ("Solve $x^2=4$.", "\\pm 2")]


@pytest.mark.parametrize("name, reward_weight", [("opd_qwen3_1.7b_from_8b.yaml", 0.0),
                                                 ("opd_reward_qwen3_1.7b_from_8b.yaml", 1.0)])
def test_distillation_recipes_fit_8_gpus_teacher_included(name, reward_weight):
    # Thinking Machines' setting: a Qwen3 base student and a larger post-trained Qwen3 teacher, reverse KL;
    # the teacher is frozen in the trainer, so the plan must hold it on the same 8 GPUs
    cfg = load_config(REPO / "recipes" / "real" / name, check_paths=False)
    assert (cfg.algo.distill.mode, cfg.algo.distill.reward_weight) == ("reverse_kl", reward_weight)
    assert (cfg.model.path, cfg.teacher.path) == ("Qwen/Qwen3-1.7B-Base", "Qwen/Qwen3-8B")
    plan = estimate_memory(cfg, gpus=8, gpu_mem_gib=80)
    teacher = 8_190_735_360  # Qwen3-8B's parameters (tests/model/test_model_init.py), float32 shards / 8
    assert plan.components["teacher model"] > -(-teacher * 4 // 8)  # plus its gathered layers
    assert plan.components["teacher logits"] == cfg.train.micro_batch_tokens * 151_936 * 4
    assert plan.fits, format_plan(plan, name)
