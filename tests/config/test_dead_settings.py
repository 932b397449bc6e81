"""No setting that does nothing: every field of the config, set alone away from its default, either counts
or is refused before anything loads, naming the setting that would make it count (each field's declared
`when`, schema.When; the rule is schema.dead_settings).

The fast half here enumerates every field of the schema; the slow half (test_dead_settings_run.py) runs
tiny trainings and checks the declarations against the fields the run actually reads.

Run: python -m pytest tests/config/test_dead_settings.py -q
"""

from __future__ import annotations

import dataclasses
import json
import typing
from typing import Any, Literal

import pytest

from mathrl.config import Config, ConfigError, load_config
from mathrl.config.load import from_dict
from mathrl.config.schema import Registered, When, check_domains, domain_of, reference

# one way to turn each declared switch on, by its text (a field that counts only with it then loads)
ENABLE = {
    "algo.policy_loss=sapo": ["algo.policy_loss=sapo"],
    "algo.policy_loss=dppo_tv or dppo_kl": ["algo.policy_loss=dppo_tv"],
    "algo.policy_loss=clip_cov or kl_cov": ["algo.policy_loss=kl_cov"],
    "algo.policy_loss=clip_cov": ["algo.policy_loss=clip_cov"],
    "algo.policy_loss=kl_cov": ["algo.policy_loss=kl_cov"],
    "algo.policy_loss=dro": ["algo.policy_loss=dro"],
    "algo.adv.estimator=gpg": ["algo.adv.estimator=gpg"],
    "algo.adv.estimator=gdpo": ["algo.adv.estimator=gdpo"],
    "algo.adv.estimator=gae (an estimator with a learned critic)": ["algo.adv.estimator=gae"],
    "algo.entropy.mode=fixed, adaptive or skywork": ["algo.entropy.mode=fixed"],
    "algo.entropy.mode=adaptive or skywork": ["algo.entropy.mode=adaptive"],
    "algo.entropy.mode=adaptive": ["algo.entropy.mode=adaptive"],
    "algo.entropy.mode=skywork": ["algo.entropy.mode=skywork"],
    "algo.kl.use=loss or reward": ["algo.kl.use=loss"],
    "algo.kl.target set (the adaptive controller)": ["algo.kl.use=loss", "algo.kl.target=0.1"],
    "algo.ptx.coef > 0": ["algo.ptx.coef=0.1"],
    "algo.rollout_correction.mode=tis or mis": ["algo.rollout_correction.mode=tis"],
    "algo.rollout_correction.mode=tis or mis, or algo.off_policy=tis or decoupled": ["algo.rollout_correction.mode=mis"],
    "algo.rollout_correction.mode, algo.off_policy or algo.rollout_correction.masks": ["algo.rollout_correction.mode=mis"],
    "geo_rs in algo.rollout_correction.masks": ["algo.rollout_correction.masks=[geo_rs]"],
    "icepop in algo.rollout_correction.masks": ["algo.rollout_correction.masks=[icepop]"],
    "k3_rs in algo.rollout_correction.masks": ["algo.rollout_correction.masks=[k3_rs]"],
    "k2_mean_rs or k2_max_rs in algo.rollout_correction.masks": ["algo.rollout_correction.masks=[k2_max_rs]"],
    "opsm in algo.rollout_correction.masks": ["algo.rollout_correction.masks=[opsm]"],
    "model.lora.r > 0": ["model.lora.r=8"],
    "a data file or hf: dataset in data.train or data.eval": ["data.train=a.jsonl"],
    "arith_hard in data.eval": ["data.eval=[arith, arith_hard]"],
    "data.arith.mul_share > 0": ["data.arith.mul_share=0.5"],
    "data.dynamic_sampling.mode=band": ["data.dynamic_sampling.mode=band"],
    "data.curriculum.mode=field": ["data.train=a.jsonl", "data.curriculum.mode=field"],
    "rollout.engine=vllm": ["rollout.engine=vllm"],
    "rollout.vllm.enable_sleep_mode=true": ["rollout.engine=vllm", "rollout.vllm.enable_sleep_mode=true"],
    "generator processes (rollout.max_staleness >= 1, or rollout.generator.workers >= 1)": ["rollout.max_staleness=1"],
    "rollout.tools (at least one tool)": ["rollout.tools=[{name: python, fn: python}]"],
    "train.init_from (a checkpoint)": ["train.init_from=runs/x/checkpoints/step_000001"],
    "reward.overlong.soft_punishment=true": ["reward.overlong.soft_punishment=true"],
    "reward.length_schedule_coef > 0": ["reward.length_schedule_coef=0.1"],
    "reward.length_schedule (a schedule)": ["reward.length_schedule=[[0, 10]]"],
    "log.wandb=true": ["log.wandb=true"],
    "log.mlflow=true": ["log.mlflow=true"],
    "algo.distill.mode=reverse_kl, forward_kl_topk or jsd": ["algo.distill.mode=reverse_kl"],
    "algo.distill.mode=reverse_kl": ["algo.distill.mode=reverse_kl"],
    "algo.distill.mode=forward_kl_topk or jsd": ["algo.distill.mode=jsd"],
    "algo.distill.mode=jsd": ["algo.distill.mode=jsd"],
    "teacher.self=true with algo.distill.mode set": ["algo.distill.mode=reverse_kl", "teacher.self=true"],
    "teacher.url set with algo.distill.mode set": ["algo.distill.mode=reverse_kl", "teacher.url=http://127.0.0.1:1"],
    "teacher.engine=vllm with algo.distill.mode set": ["algo.distill.mode=reverse_kl", "teacher.self=true", "teacher.engine=vllm"],
}
# ... and one way off for the switches that are on under the defaults
OFF = {
    "a policy loss with a ratio clip (ppo_clip, gspo, gspo_token, cispo, geo_mean, clip_cov)": ["algo.policy_loss=sapo"],
    "algo.adv.estimator=grpo or grpo_passk or gdpo": ["algo.adv.estimator=rloo"],
    "algo.adv.std_normalize=true and algo.adv.estimator=grpo or grpo_passk or gdpo": ["algo.adv.std_normalize=false"],
    "data.train=arith or an arith source in data.eval": ["data.train=a.jsonl", "data.eval=[b.jsonl]"],
    "data.train=arith": ["data.train=a.jsonl"],
    "data.dynamic_sampling.mode=nonconstant or band": ["data.dynamic_sampling.mode=none"],
}
# values that pass a field's domain where the generic candidates below do not
SAMPLES: dict[str, Any] = {
    "data.eval": ["arith_hard"], "data.sample_filter": ["garbled"], "model.lora.target_modules": ["q_proj"],
    "rollout.generator.devices": [0], "reward.length_schedule": [[0, 10]], "data.template": "zero",
    "reward.functions": [{"name": "fmt", "fn": "format"}], "rollout.tools": [{"name": "python", "fn": "python"}],
    "model.path": "config:qwen2-tiny", "algo.rollout_correction.masks": ["icepop"], "train.betas": [0.9, 0.95],
    "log.reflection_words": ["wait"],
}


def leaves(cls: type = Config, prefix: str = "") -> list[tuple[str, Any, Any, When | None]]:
    """(dotted key, annotation, default, When or None) of every field of the tree, sections descended."""
    out = []
    hints = typing.get_type_hints(cls, include_extras=True)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(typing.get_type_hints(cls)[f.name]):
            out += leaves(typing.get_type_hints(cls)[f.name], f"{prefix}{f.name}.")
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        out.append((prefix + f.name, tp, default, f.metadata.get("when")))
    return out


FIELDS = leaves()


def _candidates(key: str, tp: Any, default: Any) -> list[Any]:
    if key in SAMPLES:
        return [SAMPLES[key]]
    while typing.get_origin(tp) is typing.Annotated:
        domain = domain_of(tp)
        tp = typing.get_args(tp)[0]
        if isinstance(domain, Registered):
            return [n for n in domain.registry.names() if n != default]
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) in (typing.Union, getattr(__import__("types"), "UnionType")):
        return [v for a in args for v in _candidates(key, a, default)]
    if typing.get_origin(tp) is Literal:
        return [a for a in typing.get_args(tp) if a != default]
    if tp is bool:
        return [not default]
    if tp is int:
        return [v for v in ((default or 0) + 1, (default or 0) * 2, 2, 1) if v != default]
    if tp is float:
        d = default if isinstance(default, float) else 0.0
        return [v for v in (d * 2, d / 2, d + 0.5, 0.5, 0.1, 1.5, 2.0) if v != default]
    if tp is str:
        return ["other"]
    if typing.get_origin(tp) is list:
        return [[0.9, 1.1], [0.5, 1.5]]
    if typing.get_origin(tp) is dict:
        return [{"a": 1}]
    return []


def non_default(key: str, tp: Any, default: Any) -> Any:
    """A value other than the default that passes the field's own domain."""
    for value in _candidates(key, tp, default):
        tree: dict[str, Any] = {}
        node = tree
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
        try:
            cfg = from_dict(Config, tree)
        except ConfigError:
            continue
        if not [e for e in check_domains(cfg) if e.startswith(key + "=")]:
            return value
    raise AssertionError(f"no non-default value found for {key}; add one to SAMPLES")


def _load(*overrides: str) -> Config:
    return load_config(None, list(overrides), check_paths=False, note=lambda line: None)


def _override(key: str, value: Any) -> str:
    return f"{key}={json.dumps(value)}"


def _dead_message(error: str, key: str) -> bool:
    return any(line.startswith(key + "=") and "has no effect" in line for line in error.splitlines())


@pytest.mark.parametrize("key, tp, default, when", FIELDS, ids=[f[0] for f in FIELDS])
def test_every_field_set_alone_counts_or_is_refused_naming_its_switch(key, tp, default, when):
    value = non_default(key, tp, default)
    if when is None:
        # counts under the defaults (a tiny run reads it: test_dead_settings_run.py), or another rule
        # refuses the value naming the field
        try:
            _load(_override(key, value))
        except ConfigError as e:
            assert key in str(e) or key.rsplit(".", 1)[0] in str(e), str(e)
        return
    on_by_default = when.ok(Config())
    # with the switch off: refused, the message naming the field and the switch's keys
    with pytest.raises(ConfigError) as e:
        _load(*(OFF[when.switch] if on_by_default else []), _override(key, value))
    assert _dead_message(str(e.value), key), str(e.value)
    line = next(x for x in str(e.value).splitlines() if x.startswith(key + "="))
    assert when.switch in line and all(k in line for k in when.keys), line
    # ... and with it on, not refused as dead (it may meet that switch's other rules)
    try:
        _load(*([] if on_by_default else ENABLE[when.switch]), _override(key, value))
    except ConfigError as e2:
        assert not _dead_message(str(e2), key), str(e2)


def test_every_declared_switch_has_a_way_on():
    # the tables above cover every switch text the tree declares (a new `when` needs its line): ENABLE
    # those off under the defaults, OFF those on
    switches = {when.switch for *_, when in FIELDS if when is not None}
    assert switches == set(ENABLE) | set(OFF)
    assert all(not w.ok(Config()) for *_, w in FIELDS if w is not None and w.switch in ENABLE)
    assert all(w.ok(Config()) for *_, w in FIELDS if w is not None and w.switch in OFF)


@pytest.mark.parametrize("overrides, key, switch", [
    (["algo.kl.coef=0.04"], "algo.kl.coef", "algo.kl.use"),  # TRL's beta habit: a KL weight without the KL term
    (["algo.sapo.tau_neg=2"], "algo.sapo.tau_neg", "algo.policy_loss=sapo"),  # SAPO's temperature, another loss
    (["algo.policy_loss=sapo", "algo.clip.eps_high=0.3"], "algo.clip.eps_high", "a policy loss with a ratio clip"),
    (["algo.rollout_correction.icepop_bounds=[0.4, 3]"], "algo.rollout_correction.icepop_bounds", "icepop in"),
    (["algo.rollout_correction.cap=3"], "algo.rollout_correction.cap", "algo.off_policy"),  # cap without a weight
    (["algo.critic.gamma=0.9"], "algo.critic.gamma", "algo.adv.estimator=gae"),  # GRPO has no critic
    (["algo.adv.std_normalize=false", "algo.adv.std_scope=batch"], "algo.adv.std_scope", "std_normalize=true"),
    (["rollout.vllm.gpu_memory_utilization=0.9"], "rollout.vllm.gpu_memory_utilization", "rollout.engine=vllm"),
    (["model.lora.alpha=16"], "model.lora.alpha", "model.lora.r > 0"),
])
def test_the_cases_users_meet(overrides, key, switch):
    with pytest.raises(ConfigError) as e:
        _load(*overrides)
    line = next(x for x in str(e.value).splitlines() if x.startswith(key + "="))
    assert "has no effect" in line and switch in line, line


def test_a_value_equal_to_the_default_is_never_dead_and_the_default_config_loads():
    # a recipe that spells out every default (recipes/arith_grpo.yaml) sets dead fields at their defaults
    assert _load("algo.kl.coef=0.001", "algo.sapo.tau_pos=1.0") == Config()
    assert [key for key, *_ in FIELDS if key.startswith("algo.kl.")] == [
        "algo.kl.use", "algo.kl.estimator", "algo.kl.coef", "algo.kl.target", "algo.kl.horizon"]
    assert len(reference(Config)) > len(FIELDS) > 200  # every leaf is enumerated (sections aside)
