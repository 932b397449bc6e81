"""Building a config: defaults <- a YAML recipe <- dotted command-line overrides, each value checked
against its field's type; then the one default that depends on what the user wrote (`fit_mini_batch`),
then `Config.validate`.

    cfg = load_config("recipes/arith_grpo.yaml", ["rollout.n=8", "algo.clip.eps_high=0.28"])

Unknown keys are errors that name the closest valid key; a wrong type names the field and the type
(`Literal` choices with the closest one, int/float/bool/str, optional, lists, lists of sections).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
import sys
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import yaml

from mathrl.config.peers import close_name, peer_key_hint
from mathrl.config.shared import ConfigError
from mathrl.config.tree import Config
from mathrl.config.tree_algo import ClipConfig
from mathrl.registry import POLICY_LOSSES

_FLOAT_RE = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def note_to_stderr(line: str) -> None:
    """How `load_config` says what it chose for the user: one `mathrl: note:` line on stderr."""
    print(f"mathrl: note: {line}", file=sys.stderr, flush=True)


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is list:
        return f"list of {_type_name(typing.get_args(tp)[0])}"
    if origin is dict:
        return "mapping"
    return "null" if tp is type(None) else getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check `value` against the annotation `tp`; ints are accepted for floats. Raises ConfigError."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        if value in typing.get_args(tp):
            return value
        choices, why = [str(a) for a in typing.get_args(tp)], ""
        word, peer = str(value).lower(), close_name(value, choices, where)  # another case, or a TRL / verl name
        if peer is not None:
            close, why = [peer[0]], peer[1]
        elif word in ("off", "no", "false"):  # switching a choice field off
            close = ["none"] if "none" in choices else []
        elif word in ("on", "yes", "true"):  # "on" is not a typo of "none": which choice is meant is the user's call
            close = []
        else:
            close = difflib.get_close_matches(str(value), choices, n=1)
        hint = f"; did you mean {close[0]!r}?{why}" if close else ""
        shown = str(value).lower() if isinstance(value, bool) else repr(value)  # as typed: true, not True
        raise ConfigError(f"{where}: {shown} is not one of {_type_name(tp)}{hint}")
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, where)
            except ConfigError:
                pass
        raise ConfigError(f"{where}: expected {_type_name(tp)}, got {type(value).__name__} {value!r}")
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected {_type_name(tp)}, got {type(value).__name__} {value!r}")
        return [_coerce(v, item_tp, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:  # dict[str, Any]: free-form keyword arguments, any YAML value
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise ConfigError(f"{where}: expected a mapping of names to values, got {type(value).__name__} {value!r}")
        return dict(value)
    if dataclasses.is_dataclass(tp):  # an item of a list of sections, e.g. reward.functions[0]
        if isinstance(value, tp):
            return value
        return from_dict(tp, value, where + ".")
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _YAML11_BOOLS:
            return _YAML11_BOOLS[value.strip().lower()]  # YAML 1.1's yes/no/on/off, kept as strings by the loader
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str) and _FLOAT_RE.fullmatch(value.strip()):
            return float(value)  # PyYAML (YAML 1.1) reads "1e-3" as a string: accept it as the number it is
    elif tp is str:
        if isinstance(value, str):
            return value
    else:
        raise TypeError(f"unsupported config annotation {tp!r} at {where}")
    raise ConfigError(f"{where}: expected {_type_name(tp)}, got {type(value).__name__} {value!r}")


def _all_keys(cls: type, prefix: str = "") -> list[str]:
    keys = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path = prefix + f.name
        keys.append(path)
        if dataclasses.is_dataclass(hints[f.name]):
            keys += _all_keys(hints[f.name], path + ".")
    return keys


def _dotted_leaves(value: Any, key: str) -> list[str]:
    """`key` and, when `value` is a mapping, the dotted keys of its leaves (actor_rollout_ref.actor.clip_ratio)."""
    if not isinstance(value, dict):
        return [key]
    return [key] + [leaf for k, v in value.items() for leaf in _dotted_leaves(v, f"{key}.{k}")]


def _unknown_key_error(cls: type, key: str, prefix: str, value: Any = None) -> ConfigError:
    for dotted in _dotted_leaves(value, prefix + key):  # a TRL or verl key: mathrl's, with the conversion
        peer = peer_key_hint(dotted)
        if peer is not None:
            return ConfigError(f"unknown config key {dotted!r}; {peer}")
    local = [f.name for f in dataclasses.fields(cls)]
    close = difflib.get_close_matches(key, local, n=1, cutoff=0.5)
    close = close or [k for k in local if len(k) > 1 and (key.startswith(k) or k.startswith(key))][:1]  # lr_rate -> lr
    if close:
        hint = f"did you mean {prefix + close[0]!r}?"
    else:  # maybe it lives under another section, e.g. `n` given at top level instead of rollout.n
        elsewhere = [k for k in _all_keys(Config) if k.rsplit(".", 1)[-1] == key]
        hint = f"did you mean {elsewhere[0]!r}?" if elsewhere else f"valid keys under {prefix.rstrip('.') or 'the top level'}: {', '.join(local)}"
    return ConfigError(f"unknown config key {prefix + key!r}; {hint}")


@functools.cache
def _hints(cls: type) -> tuple[dict[str, Any], frozenset[str]]:
    """(the resolved annotations, the field names) of a config dataclass, worked out once."""
    return typing.get_type_hints(cls), frozenset(f.name for f in dataclasses.fields(cls))


# Values an earlier mathrl wrote for a field whose type has changed since, read as what they meant, so that
# an earlier run's config.yaml (a resumed run, an analysis of old runs) still loads.
OLDER_VALUES: dict[str, dict[Any, Any]] = {
    "algo.adv.gdpo_whiten": {True: "token", False: "none"},  # a bool before the token | sequence | none choice
    "algo.rollout_correction.masks": {"k2_rs": "k2_mean_rs"},  # the mean form's name before k2_max_rs joined it
}


def _older_value(value: Any, older: dict[Any, Any]) -> Any:
    """`value` (or each item of a list) as what an earlier mathrl meant by it; bools and strings only (1 == True)."""
    if isinstance(value, list):
        return [_older_value(v, older) for v in value]
    return older[value] if isinstance(value, (bool, str)) and value in older else value


def from_dict(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    """Build the dataclass `cls` from a nested dict, starting from its defaults."""
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a mapping, got {type(data).__name__}")
    hints, names = _hints(cls)
    kwargs = {}
    for key, value in data.items():
        if key not in names:
            raise _unknown_key_error(cls, str(key), prefix, value)
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            kwargs[key] = from_dict(tp, value if value is not None else {}, prefix + key + ".")
        else:
            kwargs[key] = _coerce(_older_value(value, OLDER_VALUES.get(prefix + key, {})), tp, prefix + key)
    return cls(**kwargs)


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    node = tree
    *parents, last = dotted.split(".")
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {dotted!r}: {part!r} is a value, not a section")
        node = child
    node[last] = value


class _ConfigLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's booleans: only true/false are bools.

    YAML 1.1 also reads yes/no/on/off as bools, so `algo.kl.use=yes` reached the check as True and
    the message showed a value the user never typed. Here those words stay strings: a choice field
    reports 'yes' as typed, and a bool field accepts them (`_coerce`), as it did before."""


_ConfigLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
_YAML11_BOOLS = {"yes": True, "on": True, "no": False, "off": False}


def _load_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_ConfigLoader)  # noqa: S506 - a SafeLoader subclass


def parse_override(text: str) -> tuple[str, Any]:
    """`a.b=value` with the value read as YAML (so 0.2 is a float, true a bool, [1,2] a list, null None)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like key.path=value (e.g. rollout.n=8)")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override {text!r} has an empty key")
    try:
        value = _load_yaml(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key, value


def fit_mini_batch(cfg: Config, *, set_by_user: bool) -> str | None:
    """Lower train.mini_batch_size to the rollout batch when the user did not set it and its default is
    larger, so a short run changes one key (rollout.prompts_per_step=4), not two; returns the line that
    says so, or None. A value the user set is kept, and `Config.validate` names it when it does not fit."""
    r, t = cfg.rollout, cfg.train
    if set_by_user or r.prompts_per_step < 1 or r.n < 1 or t.mini_batch_size <= cfg.rollout_batch_size:
        return None  # (a count below 1 is named by its domain check)
    line = (f"train.mini_batch_size lowered from its default {t.mini_batch_size} to {cfg.rollout_batch_size}, the rollout "
            f"batch (rollout.prompts_per_step x rollout.n = {r.prompts_per_step} x {r.n}); set it to choose another")
    t.mini_batch_size = cfg.rollout_batch_size
    return line


def apply_loss_defaults(cfg: Config, *, set_by_user: set[str]) -> tuple[dict[str, str], list[str]]:
    """Give algo.clip.* the chosen policy loss's published values (its registered `defaults`: GSPO's
    3e-4 / 4e-4, CISPO's one-sided bound, GMPO's log-space 0.4) where the user set no value of that key.
    Returns ({dotted key: where its value came from} for each value changed, note lines): a key the user
    set is kept, and when it holds PPO's value under another loss, a note names the loss's own."""
    name = cfg.algo.policy_loss
    if name not in POLICY_LOSSES.names():
        return {}, []  # named by the domain check
    chosen, notes = {}, []
    tree_default = ClipConfig()
    for key, value in POLICY_LOSSES.get(name).defaults.items():
        dotted, current = f"algo.clip.{key}", getattr(cfg.algo.clip, key)
        if value == getattr(tree_default, key):
            continue  # the tree's default is the loss's own (ppo_clip, clip_cov): nothing to choose
        if key in set_by_user:
            if current == getattr(tree_default, key):
                notes.append(f"{dotted}={current} as set, which is PPO's value; {name}'s own default is {value}")
            continue
        setattr(cfg.algo.clip, key, value)
        chosen[dotted] = f"{name}'s default"
    if chosen:
        notes.insert(0, ", ".join(f"{k}={getattr(cfg.algo.clip, k.rsplit('.', 1)[1])}" for k in chosen)
                     + f": {name}'s default{'s' if len(chosen) > 1 else ''} (set algo.clip.* to choose others)")
    return chosen, notes


def _read_recipe(recipe: str | Path) -> dict[str, Any]:
    """The mapping a YAML recipe file holds; ConfigError naming the file (and line) when it cannot be one."""
    path = Path(recipe)
    if not path.exists():
        raise ConfigError(f"recipe {str(path)!r} does not exist")
    if not path.is_file():
        raise ConfigError(f"recipe {str(path)!r} is not a file; give a .yaml recipe")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"recipe {str(path)!r} is not a text file (byte {e.start} is not UTF-8); "
                          "a recipe is a YAML file") from None
    except OSError as e:
        raise ConfigError(f"recipe {str(path)!r} cannot be read: {e.strerror}") from None
    try:
        loaded = _load_yaml(text) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        what = " ".join(str(x) for x in (getattr(e, "context", None), getattr(e, "problem", None)) if x) or str(e)
        raise ConfigError(f"recipe {where}: not valid YAML: {' '.join(what.split())}") from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"recipe {str(path)!r} must be a mapping at the top level")
    return loaded


def load_config(
    recipe: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (), *, check_paths: bool = True,
    note: Callable[[str], None] = note_to_stderr,
) -> Config:
    """Defaults <- recipe YAML (if given) <- dotted overrides, then validated (see Config.validate).
    A train.mini_batch_size that neither the recipe nor the overrides set, and whose default is larger
    than the rollout batch, becomes the rollout batch (`fit_mini_batch`), said in one line to `note`."""
    tree: dict[str, Any] = _read_recipe(recipe) if recipe is not None else {}
    for text in overrides:
        key, value = parse_override(text)
        _set_dotted(tree, key, value)
    cfg = from_dict(Config, tree)
    clip = (tree.get("algo") or {}).get("clip") or {}
    cfg.chosen, notes = apply_loss_defaults(cfg, set_by_user=set(clip) if isinstance(clip, dict) else set())
    fitted = fit_mini_batch(cfg, set_by_user="mini_batch_size" in (tree.get("train") or {}))
    for line in [*notes, *([fitted] if fitted else [])]:
        note(line)
    cfg.validate(check_paths=check_paths)
    return cfg


def dump_yaml(cfg: Config) -> str:
    """The config as YAML; a value `load_config` chose (`cfg.chosen`) carries a comment saying where from:
    `    eps_low: 0.0003  # gspo's default`."""
    return _annotate(yaml.safe_dump(to_dict(cfg), sort_keys=False), getattr(cfg, "chosen", {}))


def _annotate(text: str, comments: dict[str, str]) -> str:
    """`text` (safe_dump's block YAML, two spaces per level) with `# comment` after the line of each dotted key."""
    if not comments:
        return text
    lines, path = text.splitlines(keepends=True), []
    for i, line in enumerate(lines):
        indent, key = len(line) - len(line.lstrip(" ")), line.strip().split(":", 1)[0]
        if not line.strip() or line.lstrip().startswith("-"):
            continue
        path = path[: indent // 2] + [key]
        comment = comments.get(".".join(path))
        if comment is not None:
            lines[i] = line.rstrip("\n") + f"  # {comment}\n"
    return "".join(lines)
