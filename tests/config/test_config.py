"""Tests for mathrl.config: defaults, YAML recipes, dotted overrides and the error messages.

Run: python -m pytest tests/config/test_config.py -q
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from mathrl.config import Config, ConfigError, dump_yaml, load_config, parse_override, to_dict

REPO = Path(__file__).resolve().parents[2]
DEFAULT_RECIPE = REPO / "recipes" / "arith_grpo.yaml"


# --------------------------------------------------------------------------------------------------
# defaults and recipes
# --------------------------------------------------------------------------------------------------
def test_defaults_equal_the_default_recipe():
    # recipes/arith_grpo.yaml claims to spell out the defaults; if someone changes one without the
    # other, `mathrl train` and `mathrl train recipes/arith_grpo.yaml` silently run different experiments.
    assert load_config(DEFAULT_RECIPE) == load_config(None) == Config()


def _flatten(tree: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def test_default_recipe_sets_only_defaults_and_names_the_main_knobs():
    # The recipe is read by newcomers: it lists the knobs of the default run, RL first, not all the
    # fields (`mathrl config` prints those). Each key it holds is a real field at its default value, so
    # it cannot drift from what `mathrl train` runs (the equality above), and the knobs a reader looks
    # for first are there.
    recipe = _flatten(yaml.safe_load(DEFAULT_RECIPE.read_text()))
    defaults = _flatten(to_dict(Config()))
    assert sorted(set(recipe) - set(defaults)) == [], "keys in recipes/arith_grpo.yaml that the config lacks"
    assert {k: v for k, v in recipe.items() if v != defaults[k]} == {}, "values differing from the defaults"
    for key in ("algo.adv.estimator", "algo.policy_loss", "algo.clip.eps_low", "algo.clip.eps_high", "algo.loss_agg",
                "algo.kl.use", "rollout.n", "rollout.prompts_per_step", "train.steps", "train.lr",
                "data.dynamic_sampling.mode", "model.path"):
        assert key in recipe, key
    # RL first: the algorithm's section opens the file, the tiny base's pretraining closes it
    sections = [k for k in yaml.safe_load(DEFAULT_RECIPE.read_text()) if k != "seed"]
    assert sections[0] == "algo" and sections[-1] == "base"


def test_dump_yaml_round_trips(tmp_path):
    # The run directory's config.yaml must reload to the same config (reproducing a run).
    (tmp_path / "x.jsonl").write_text("")
    cfg = load_config(None, ["rollout.n=4", "algo.clip.dual_clip_c=3", f"data.eval=[arith, {tmp_path / 'x.jsonl'}]",
                             "train.lr=1e-3"])
    path = tmp_path / "config.yaml"
    path.write_text(dump_yaml(cfg))
    assert load_config(path) == cfg


def test_every_recipe_in_the_repo_loads():
    # Shipped recipes must stay valid as the config tree evolves.
    recipes = sorted((REPO / "recipes").glob("*.yaml"))
    assert recipes
    for recipe in recipes:
        load_config(recipe)


# --------------------------------------------------------------------------------------------------
# overrides
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "override, path, expected",
    [
        ("rollout.n=16", "rollout.n", 16),  # int
        ("rollout.temperature=0.7", "rollout.temperature", 0.7),  # float
        ("rollout.temperature=1", "rollout.temperature", 1.0),  # an int is accepted for a float field
        ("train.lr=1e-3", "train.lr", 1e-3),  # YAML 1.1 reads "1e-3" as a string; it must become 0.001
        ("train.lr=3E-5", "train.lr", 3e-5),  # upper-case exponent, same story
        ("model.gradient_checkpointing=true", "model.gradient_checkpointing", True),  # bool
        ("algo.clip.dual_clip_c=3", "algo.clip.dual_clip_c", 3.0),  # optional float set
        ("eval.max_new_tokens=null", "eval.max_new_tokens", None),  # null clears an optional
        ("data.answer_field=null", "data.answer_field", None),
        ("data.eval=[arith, a.jsonl]", "data.eval", ["arith", "a.jsonl"]),  # list of str
        ("train.betas=[0.9, 0.95]", "train.betas", [0.9, 0.95]),  # list of float
        ("data.template=Q: {question} A:", "data.template", "Q: {question} A:"),  # YAML-invalid text stays a string
        ("model.path = Org/some-model", "model.path", "Org/some-model"),  # spaces around "=" are allowed (a hub id: no local check)
    ],
)
def test_override_values_are_typed(override, path, expected):
    # typing only; a.jsonl need not exist (a data file: the data.* fields of files count)
    cfg = load_config(None, ["data.train=a.jsonl", override], check_paths=False)
    value = cfg
    for part in path.split("."):
        value = getattr(value, part)
    assert value == expected
    assert type(value) is type(expected)


def test_overrides_apply_on_top_of_a_recipe_in_order(tmp_path):
    # Precedence is defaults <- recipe <- overrides, and a later override wins over an earlier one.
    recipe = tmp_path / "r.yaml"
    recipe.write_text("rollout:\n  n: 4\n  temperature: 0.5\ntrain:\n  mini_batch_size: 16\n")
    cfg = load_config(recipe, ["rollout.n=2", "rollout.n=6"])
    assert (cfg.rollout.n, cfg.rollout.temperature, cfg.rollout.top_p) == (6, 0.5, 1.0)
    assert cfg.train.mini_batch_size == 16


def test_parse_override_without_equals_is_an_error():
    # "rollout.n 8" or a forgotten "=" must not be read as a key with an empty value.
    with pytest.raises(ConfigError, match="key.path=value"):
        parse_override("rollout.n")
    with pytest.raises(ConfigError, match="key.path=value"):
        load_config(None, ["rollout.n"])
    with pytest.raises(ConfigError, match="empty key"):
        parse_override("=3")


# --------------------------------------------------------------------------------------------------
# errors that say how to fix them
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "override, suggestion",
    [
        ("rollout.temprature=0.5", "rollout.temperature"),  # typo in a nested key
        ("algo.clip.eps_hi=0.3", "algo.clip.eps_high"),  # typo two levels down
        ("train.lr_rate=1e-4", "train.lr"),  # extra suffix
        ("seeed=1", "seed"),  # top-level typo
        ("n=3", "rollout.n"),  # a nested key given at the top level: the first section holding it
        ("temperature=0.7", "rollout.temperature"),
        ("clip.eps_high=0.3", "algo.clip"),  # a section given at the wrong level
    ],
)
def test_unknown_key_names_the_closest_valid_key(override, suggestion):
    with pytest.raises(ConfigError, match="unknown config key") as info:
        load_config(None, [override])
    assert repr(suggestion) in str(info.value), str(info.value)


def test_unknown_key_without_close_match_lists_the_valid_keys():
    # Nothing close: the message should list the keys valid at that level. Bug story: the fallback
    # difflib match runs on full dotted paths ("rollout.zzzzzzzz" vs "rollout.n" share 8 of 9
    # characters), so any garbage key under a section got a confident but meaningless suggestion.
    with pytest.raises(ConfigError) as info:
        load_config(None, ["rollout.zzzzzzzz=1"])
    assert "temperature" in str(info.value) and "max_new_tokens" in str(info.value)


@pytest.mark.parametrize(
    "override, field_name, expected_type",
    [
        ("rollout.n=abc", "rollout.n", "int"),  # not a number at all
        ("rollout.n=2.5", "rollout.n", "int"),  # a float is not silently truncated
        ("rollout.n=true", "rollout.n", "int"),  # bool is an int subclass in Python, but not a count
        ("train.lr=fast", "train.lr", "float"),
        ("model.gradient_checkpointing=1", "model.gradient_checkpointing", "bool"),  # no int->bool
        ("train.betas=0.9", "train.betas", "list of float"),  # scalar for a list
        ("train.betas=[0.9, x]", "train.betas[1]", "float"),  # bad list item: names the index
        ("data.eval=arith", "data.eval", "list of str"),  # a bare string is not a one-item list
        ("eval.max_new_tokens=many", "eval.max_new_tokens", "int or null"),  # optional field
        ("algo=3", "algo", "mapping"),  # a value where a section belongs
    ],
)
def test_wrong_type_names_field_and_expected_type(override, field_name, expected_type):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    message = str(info.value)
    assert message.startswith(field_name + ":"), message
    assert expected_type in message, message


def test_override_through_a_value_is_an_error(tmp_path):
    # "rollout.n.x=1" treats the value rollout.n as a section.
    recipe = tmp_path / "r.yaml"
    recipe.write_text("rollout:\n  n: 4\n")
    with pytest.raises(ConfigError, match="rollout.n"):
        load_config(recipe, ["rollout.n.x=1"])


@pytest.mark.parametrize(
    "override, choice",
    [
        ("algo.loss_agg=token_men", "'token_mean'"),
        ("model.dtype=bf16", "'bfloat16'"),
        ("algo.adv.std_scope=batches", "'batch'"),
    ],
)
def test_literal_typo_suggests_the_closest_choice(override, choice):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    message = str(info.value)
    assert message.startswith(override.split("=")[0] + ":"), message
    assert f"did you mean {choice}" in message, message


@pytest.mark.parametrize(
    "override, message",
    [
        # Bug story: YAML 1.1 reads yes/no/on/off as booleans, so `algo.kl.use=yes` was reported as
        # "True is not one of ...", a value the user never typed.
        ("algo.kl.use=yes", "algo.kl.use: 'yes' is not one of 'none' | 'loss' | 'reward'"),
        ("algo.kl.use=on", "algo.kl.use: 'on' is not one of 'none' | 'loss' | 'reward'"),
        ("algo.kl.use=off", "algo.kl.use: 'off' is not one of 'none' | 'loss' | 'reward'; did you mean 'none'?"),
        ("algo.kl.use=true", "algo.kl.use: true is not one of 'none' | 'loss' | 'reward'"),  # as typed, not True
    ],
)
def test_a_choice_field_shows_the_value_as_typed(override, message):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    assert str(info.value) == message


@pytest.mark.parametrize(("word", "expected"), [("yes", True), ("on", True), ("no", False), ("Off", False), ("true", True)])
def test_a_bool_field_still_takes_yaml_1_1_words(tmp_path, word, expected):
    assert load_config(None, [f"log.wandb={word}"]).log.wandb is expected
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"log:\n  wandb: {word}\n")
    assert load_config(recipe).log.wandb is expected


@pytest.mark.parametrize(
    "override, choices",
    [
        ("algo.adv.estimator=grp", "grpo, rloo, reinforce_pp, gae"),  # the registered estimators
        ("rollout.engine=torhc", "torch, vllm"),  # the registered engines
    ],
)
def test_an_unregistered_name_is_an_error_naming_the_field_and_the_choices(override, choices):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    message = str(info.value)
    key, value = override.split("=")
    assert message.startswith(f"{key}={value!r}: must be a registered"), message
    assert choices in message, message
    assert "did you mean" in message, message


@pytest.mark.parametrize(
    "overrides, field_name",
    [
        # more sequences per optimizer step than one rollout batch holds (default 16 x 8 = 128)
        (["train.mini_batch_size=256"], "train.mini_batch_size"),
        # mini-batches must tile the rollout batch exactly, or the last one is silently smaller
        (["train.mini_batch_size=48"], "train.mini_batch_size"),
        # GRPO and RLOO compare samples within a group: a group of 1 gives every advantage 0
        (["rollout.n=1", "train.mini_batch_size=16"], "rollout.n"),
        (["rollout.n=1", "train.mini_batch_size=16", "algo.adv.estimator=rloo"], "rollout.n"),
        # dynamic sampling (on by default) judges groups: with one sample each, every group is all-equal
        # and dropped; the message names the way out even where the estimator needs no groups
        (["rollout.n=1", "train.mini_batch_size=16", "algo.adv.estimator=reinforce_pp"], "data.dynamic_sampling.mode=none"),
        # dual clip (Ye et al. 2020) needs c > 1 to bound the ratio above 1 + eps for negative advantages
        (["algo.clip.dual_clip_c=1"], "algo.clip.dual_clip_c"),
        (["algo.clip.dual_clip_c=0.5"], "algo.clip.dual_clip_c"),
        # eps_low = 1 is a lower bound of 0 (none: CISPO's truncation from above only); past 1 it is nonsense
        (["algo.clip.eps_low=1.5"], "algo.clip.eps_low"),
        (["rollout.temperature=0"], "rollout.temperature"),
        (["rollout.top_p=0"], "rollout.top_p"),
        (["rollout.top_p=1.5"], "rollout.top_p"),
        (["train.betas=[0.9]"], "train.betas"),
        (["train.steps=0"], "train.steps"),
        (["eval.every=0"], "eval.every"),
    ],
)
def test_impossible_combinations_name_the_field(overrides, field_name):
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    assert field_name in str(info.value), str(info.value)


def test_rollout_n_1_is_fine_with_reinforce_pp():
    # The rollout.n=1 rule is specific to group estimators; the message suggests reinforce_pp, so it must work
    # (with dynamic sampling off: it judges groups, which one sample per problem does not make).
    cfg = load_config(None, ["rollout.n=1", "train.mini_batch_size=16", "algo.adv.estimator=reinforce_pp",
                             "data.dynamic_sampling.mode=none"])
    assert cfg.rollout_batch_size == 16


def test_all_errors_are_reported_together():
    # Several problems at once: one message lists all of them, so a user fixes a recipe in one pass.
    with pytest.raises(ConfigError) as info:
        load_config(None, ["algo.clip.dual_clip_c=1", "rollout.top_p=0"])
    assert "algo.clip.dual_clip_c" in str(info.value) and "rollout.top_p" in str(info.value)


def test_recipe_with_unknown_key(tmp_path):
    # Same suggestion machinery for YAML recipes as for overrides.
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("rollout:\n  temprature: 0.5\n")
    with pytest.raises(ConfigError, match="'rollout.temperature'"):
        load_config(recipe)


@pytest.mark.parametrize(
    "text, match",
    [
        ("- 1\n- 2\n", "mapping"),  # a list at the top level
        ("rollout: [1, 2\n", "not valid YAML"),  # a syntax error is a ConfigError, not a traceback
        ("rollout: 3\n", "rollout: expected a mapping"),  # a value where a section belongs
    ],
)
def test_malformed_recipes(tmp_path, text, match):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_config(recipe)


def test_missing_recipe_and_empty_recipe(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_config(empty) == Config()  # an empty recipe means "the defaults"


def test_derived_sizes():
    # Derived sizes are computed in one place; eval.max_new_tokens=None falls back to the rollout's.
    cfg = load_config(None, ["rollout.prompts_per_step=4", "rollout.n=2", "train.mini_batch_size=8", "rollout.max_new_tokens=9"])
    assert cfg.rollout_batch_size == 8
    assert cfg.eval_max_new_tokens == 9
    assert dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, max_new_tokens=5)).eval_max_new_tokens == 5


def test_missing_model_path_is_a_config_error_naming_the_path(tmp_path):
    # A typo in a local model path must fail before anything is built or written, naming the path.
    missing = tmp_path / "no-such-model"
    with pytest.raises(ConfigError, match="no-such-model.*does not exist"):
        load_config(None, [f"model.path={missing}"])


def test_data_sources_are_checked_before_anything_runs(tmp_path):
    # A missing file or an unsupported format names the key and the source; hf: names and existing
    # .jsonl/.parquet files pass (an hf: name is only resolved when it is loaded).
    with pytest.raises(ConfigError, match=r"data.train: no such file .*missing.jsonl"):
        load_config(None, [f"data.train={tmp_path / 'missing.jsonl'}"])
    with pytest.raises(ConfigError, match=r"data.eval: 'problems.csv' is not a data source"):
        load_config(None, ["data.eval=[arith, problems.csv]"])
    present = tmp_path / "set.parquet"
    present.write_bytes(b"")
    cfg = load_config(None, [f"data.eval=[arith, {present}, hf:openai/gsm8k:main@test]"])
    assert cfg.data.eval[2] == "hf:openai/gsm8k:main@test"
    # Evaluating a finished run must not need its training data any more.
    cfg = load_config(None, [f"data.train={tmp_path / 'gone.jsonl'}"], check_paths=False)
    assert cfg.data.train.endswith("gone.jsonl")


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("algo.critic.lam_actor=1.5", "algo.critic.lam_actor=1.5: must be in [0, 1]"),
        ("algo.critic.gamma=0", "algo.critic.gamma=0.0: must be in (0, 1]"),
        ("algo.critic.length_adaptive_alpha=0", "algo.critic.length_adaptive_alpha=0.0: must be > 0"),
        ("algo.critic.value_clip=-0.1", "algo.critic.value_clip=-0.1: must be > 0"),
        ("algo.critic.pretrain_steps=-1", "algo.critic.pretrain_steps=-1: must be >= 0"),
    ],
)
def test_critic_settings_are_checked(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(None, ["algo.adv.estimator=gae", override])


def test_ppo_with_a_critic_needs_no_groups():
    # one sample per problem is plain PPO; GRPO would have nothing to compare against (nor would dynamic
    # sampling, on by default, so it is switched off)
    assert load_config(None, ["algo.adv.estimator=gae", "rollout.n=1", "train.mini_batch_size=16",
                              "data.dynamic_sampling.mode=none"]).rollout.n == 1


# --------------------------------------------------------------------------------------------------
# the domain of every field (declared in its type: `steps: Count = knob(50, ...)`, see config/schema.py)
# --------------------------------------------------------------------------------------------------
def _leaf_fields(cls=Config, prefix=""):
    """(key, annotation with its domain) of every field, sections descended; the fields of a list of
    sections (reward.functions) under `reward.functions[].<field>`."""
    import typing

    hints = typing.get_type_hints(cls, include_extras=True)
    for f in dataclasses.fields(cls):
        tp = typing.get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(tp):
            yield from _leaf_fields(tp, prefix + f.name + ".")
            continue
        yield prefix + f.name, hints[f.name]
        item = typing.get_args(tp)[0] if typing.get_origin(tp) is list else None
        if dataclasses.is_dataclass(item):
            yield from _leaf_fields(item, prefix + f.name + "[].")


def _is_numeric(tp) -> bool:
    import typing

    if tp in (int, float):
        return True
    return any(_is_numeric(a) for a in typing.get_args(tp))  # int | None, list[float], list[list[int]]


def test_every_numeric_field_has_a_domain():
    # A new int or float field without a declared range is how `train.max_grad_norm=-1` got through:
    # torch clips to a negative norm by flipping the gradient's sign. Declare its domain on the field.
    from mathrl.config.schema import domain_of

    # rollout.tools entries are checked by config.tool_entry_problems, which tools.ToolPool shares for
    # specs built in code (no config type checked those), with messages of its own
    by_hand = {"rollout.tools[].timeout_s"}
    missing = sorted(k for k, tp in _leaf_fields() if _is_numeric(tp) and tp is not bool and domain_of(tp) is None)
    assert missing == sorted(by_hand), f"numeric config fields without a domain (Annotated[T, domain]): {missing}"


def test_every_field_is_documented_and_every_default_is_in_its_domain():
    # `mathrl config` prints these docs (each field's help, config/tree.py); the defaults must pass their own checks.
    from mathrl.config.schema import check_domains, reference

    undocumented = [e.key for e in reference(Config) if not e.doc]
    assert undocumented == [], f"config fields without help (knob(default, \"help\")): {undocumented}"
    assert check_domains(Config()) == []


def _with(key: str, value):
    cfg = Config()
    node = cfg
    *parents, last = key.split(".")
    for part in parents:
        node = getattr(node, part)
    setattr(node, last, value)
    return cfg


def test_range_boundaries_are_exact():
    # For every numeric range: its closed end passes, its open end and the value one step beyond fail,
    # and NaN never passes (NaN compares false with everything, so a `v < low` check alone lets it in).
    from mathrl.config.schema import Range, check_domains, domains

    checked = 0
    for key, dom in domains(Config).items():
        if not isinstance(dom, Range) or dom.length is not None:
            continue
        for end, is_open, outward in ((dom.low, dom.open_low, -1), (dom.high, dom.open_high, +1)):
            if end in (float("inf"), float("-inf")):
                continue
            bad = [e for e in check_domains(_with(key, end)) if e.startswith(key + "=")]
            assert bool(bad) == is_open, (key, end, bad)
            assert [e for e in check_domains(_with(key, end + outward)) if e.startswith(key + "=")], (key, end + outward)
            checked += 1
        assert [e for e in check_domains(_with(key, float("nan"))) if e.startswith(key + "=")], key
    assert checked > 60


@pytest.mark.parametrize(
    ("override", "message"),
    [
        # each was accepted, or failed only after the model loaded, naming no field
        ("train.max_grad_norm=-1", "train.max_grad_norm=-1.0: must be > 0 (gradients are clipped"),
        ("train.max_skipped_steps=0", "train.max_skipped_steps=0: must be >= 1"),
        ("rollout.batch_size=0", "rollout.batch_size=0: must be >= 1"),
        ("model.logprob_chunk_size=0", "model.logprob_chunk_size=0: must be >= 1"),
        ("train.save_every=-1", "train.save_every=-1: must be >= 0"),
        ("train.lr=-1", "train.lr=-1.0: must be > 0"),
        ("train.lr=.nan", "train.lr=nan: must be > 0"),
        ("train.betas=[0.9]", "train.betas=[0.9]: must have 2 values, each in [0, 1)"),
        ("train.betas=[0.9, 1.5]", "train.betas=[0.9, 1.5]: each value must be in [0, 1)"),
        ("reward.num_workers=-1", "reward.num_workers=-1: must be >= 0"),
        ("data.template=arithh", "data.template='arithh': must be arith, zero, plain, chat, or a string containing {question}"),
        ("eval.top_p=0", "eval.top_p=0.0: must be in (0, 1]"),
        ("eval.max_new_tokens=-3", "eval.max_new_tokens=-3: must be >= 1"),
        ("eval.temperature=-1", "eval.temperature=-1.0: must be >= 0"),
        ("rollout.temperature=0", "rollout.temperature=0.0: must be > 0 (training samples from the policy"),
        ("eval.temperature=0", "eval.temperature=0 is greedy decoding: all eval.n=8 samples"),
        ("base.min_digits=4", "base.min_digits=4 is above base.max_digits=3"),
        ("rollout.max_new_tokens=200", "no room for a prompt in the tiny base model's 128 positions"),
        ("reward.length_schedule=[[10]]", "reward.length_schedule=[[10]]: must be a list of [step >= 0, target_length >= 1] pairs"),
    ],
)
def test_bad_values_name_key_value_and_range(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as info:
        load_config(None, [override])
    assert len(str(info.value).splitlines()) == 1  # one problem, one line


def test_greedy_evaluation_is_allowed_with_one_sample():
    cfg = load_config(None, ["eval.temperature=0", "eval.n=1"])
    assert cfg.eval.temperature == 0.0


def test_model_paths_that_cannot_load_fail_at_config_time(tmp_path, monkeypatch):
    # Bug story: a bare name that was no directory was tried as a hub id, retrying the network for ~23 s;
    # a directory without config.json failed later with a misleading "install sentencepiece".
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notamodel").mkdir()
    (tmp_path / "weights.bin").write_bytes(b"x")
    cases = {
        "notamodel": "is a directory but not a Hugging Face model (no config.json)",
        "mymodel": "does not exist",
        "weights.bin": "is a file",
        "notamodel/sub": "does not exist",  # org/name-shaped, but its first part is a local directory
    }
    for path, message in cases.items():
        with pytest.raises(ConfigError, match=re.escape(f"model.path={path!r} {message}")):
            load_config(None, [f"model.path={path}"])
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(ConfigError, match=re.escape("'SomeOrg/some-model' looks like a hub id but is not in the local "
                                                    "Hugging Face cache and the hub is unreachable (offline: HF_HUB_OFFLINE is set)")):
        load_config(None, ["model.path=SomeOrg/some-model"])
    monkeypatch.delenv("HF_HUB_OFFLINE")  # no offline switch, but no connection either: named the same way
    monkeypatch.setattr("mathrl.model.paths.hub_unreachable", lambda: "offline: no connection to huggingface.co:443")
    with pytest.raises(ConfigError, match=re.escape("the hub is unreachable (offline: no connection")):
        load_config(None, ["model.path=Qwen/Qwen2.5-0.5B"])  # its ".5-0" is no file suffix
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    assert load_config(None, ["model.path=model"]).model.path == "model"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x89PNG\r\n\x1a\n\x00\xff", "is not a text file (byte 0 is not UTF-8)"),
        (b"rollout:\n  n: 4\n   top_p: 1\n", ":3:9: not valid YAML: mapping values are not allowed here"),
    ],
)
def test_recipe_errors_name_the_file(tmp_path, content, message):
    # a binary file gave a UnicodeDecodeError traceback; a syntax error named "<unicode string>"
    recipe = tmp_path / "r.yaml"
    recipe.write_bytes(content)
    with pytest.raises(ConfigError, match=re.escape(message)) as info:
        load_config(recipe)
    assert "r.yaml" in str(info.value) and "<unicode string>" not in str(info.value)
    assert len(str(info.value).splitlines()) == 1


def test_mathrl_config_lists_every_key_with_type_default_domain_and_doc(capsys):
    from mathrl.cli import main
    from mathrl.config.schema import reference

    assert main(["config", "rollout.n=4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    keys = [k for e in reference(Config) if not e.section for k in [e.key, *(f"  {i.key}" for i in e.items)]]
    listed = [ln.split(":", 1)[0] for ln in lines if " = " in ln and "  # " in ln]  # sections have no " = "
    assert listed == keys  # every key once, in declaration order, each with a doc; a list entry's keys indented
    assert "rollout.n: int = 4 (default 8)  [>= 1]  # samples per problem (the GRPO group size)" in lines
    assert main(["config", "--yaml", "rollout.n=4"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["rollout"]["n"] == 4


def test_config_changes_name_every_changed_key():
    # Resuming with a changed config used to warn without saying which fields changed.
    from mathrl.run_dir import config_changes

    old = to_dict(load_config(None, ["rollout.n=8", "train.lr=2e-4"]))
    new = to_dict(load_config(None, ["rollout.n=4", "train.lr=1e-4", "data.eval=[arith, arith]"]))
    assert config_changes(old, new) == ["data.eval: ['arith'] -> ['arith', 'arith']", "rollout.n: 8 -> 4",
                                        "train.lr: 0.0002 -> 0.0001"]
    assert config_changes(old, old) == []
    assert config_changes({"a": {"b": 1}}, {"a": {"c": 1}}) == ["a.c: '<absent>' -> 1", "a.b: 1 -> '<absent>'"]


def test_init_from_a_weights_only_checkpoint_needs_restart(tmp_path):
    # A checkpoint kept by train.keep_every has its weights and trainer_state.json but no optimizer state:
    # init_from_mode=restart (weights only) starts from it; continue names the fix.
    kept = tmp_path / "step_000010"
    kept.mkdir()
    (kept / "config.json").write_text("{}")
    (kept / "trainer_state.json").write_text('{"step": 10}')
    with pytest.raises(ConfigError, match="holds weights only .* use train.init_from_mode=restart"):
        load_config(None, [f"train.init_from={kept}"])
    assert load_config(None, [f"train.init_from={kept}", "train.init_from_mode=restart"]).train.init_from == str(kept)
    with pytest.raises(ConfigError, match="is not a checkpoint directory"):
        load_config(None, [f"train.init_from={tmp_path}", "train.init_from_mode=restart"])


# --------------------------------------------------------------------------------------------------
# train.mini_batch_size follows a smaller rollout batch unless the user set it
# --------------------------------------------------------------------------------------------------
def test_a_short_run_changes_one_key_and_says_what_it_chose(tmp_path, capsys):
    # rollout.prompts_per_step=4 (a rollout batch of 4 x 8 = 32) used to fail until train.mini_batch_size,
    # which the user never set, was lowered from its default 64 too; now the default follows, in one line
    notes = []
    cfg = load_config(None, ["rollout.prompts_per_step=4"], note=notes.append)
    assert (cfg.rollout_batch_size, cfg.train.mini_batch_size) == (32, 32)
    assert notes == ["train.mini_batch_size lowered from its default 64 to 32, the rollout batch "
                     "(rollout.prompts_per_step x rollout.n = 4 x 8); set it to choose another"]
    recipe = tmp_path / "short.yaml"
    recipe.write_text("rollout:\n  prompts_per_step: 2\n  n: 4\ntrain:\n  steps: 3\n")
    assert load_config(recipe, note=notes.append).train.mini_batch_size == 8
    assert len(notes) == 2
    load_config(None, ["rollout.n=2"])  # by default the line goes to stderr, as the command line's other notes
    assert capsys.readouterr().err.splitlines() == [
        "mathrl: note: train.mini_batch_size lowered from its default 64 to 32, the rollout batch "
        "(rollout.prompts_per_step x rollout.n = 16 x 2); set it to choose another"]


@pytest.mark.parametrize("where", ["override", "recipe"])
def test_a_mini_batch_the_user_set_is_kept_and_named_when_too_large(tmp_path, where):
    # the user's own value is never changed behind their back: it fails as before, naming the fix
    notes = []
    if where == "override":
        args = (None, ["rollout.prompts_per_step=4", "train.mini_batch_size=64"])
    else:
        recipe = tmp_path / "r.yaml"
        recipe.write_text("rollout:\n  prompts_per_step: 4\ntrain:\n  mini_batch_size: 64\n")
        args = (recipe, [])
    with pytest.raises(ConfigError, match=re.escape("train.mini_batch_size=64 is larger than the rollout batch "
                                                    "(rollout.prompts_per_step x rollout.n = 32); lower it")):
        load_config(*args, note=notes.append)
    assert notes == []


def test_the_mini_batch_default_only_follows_a_smaller_batch():
    # the default recipe (which sets it) and the defaults (128 >= 64) keep 64 with no line: a default run
    # is unchanged; a larger batch that 64 does not divide is still an error, not a silent new size; a
    # count below 1 is named by its own domain alone
    notes = []
    assert load_config(DEFAULT_RECIPE, note=notes.append).train.mini_batch_size == 64
    assert load_config(None, note=notes.append).train.mini_batch_size == 64
    assert notes == []
    with pytest.raises(ConfigError, match=re.escape("the rollout batch (96) is not a multiple of train.mini_batch_size (64)")):
        load_config(None, ["rollout.prompts_per_step=12"], note=notes.append)
    with pytest.raises(ConfigError) as info:
        load_config(None, ["rollout.n=0"], note=notes.append)
    assert str(info.value) == "rollout.n=0: must be >= 1" and notes == []
