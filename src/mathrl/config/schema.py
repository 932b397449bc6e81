"""The vocabulary of field domains and help, the check of every field against its domain, and the
reference that `mathrl config` prints.

A field's domain (the values it allows: a range, a length, a rule for strings) is part of its type
annotation in the config tree (mathrl/config/tree.py); its default and help are given by `knob` (a
section's by `section`): `lr: Positive[float] = knob(1e-4, "AdamW learning rate")`.

`check_domains` reads the domains from the annotations (`typing.Annotated` metadata) and `Config.validate`
runs it before anything is built or loaded; each message names the key, the value and what is allowed
(`train.max_grad_norm=-1.0: must be > 0 (gradients are clipped to this norm; ...)`). The help is the
field's metadata (`dataclasses.field(metadata={"help": ...})`, as Hugging Face's argument dataclasses
write it); nothing is read from the source, so the docs are there wherever the package is installed.

    from mathrl.config import Config; from mathrl.config.schema import reference
    for entry in reference(Config): print(entry.key, entry.type, entry.default, entry.domain, entry.doc)
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import inspect
import math
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from mathrl.config.peers import close_name
from mathrl.registry import Registry

__all__ = [
    "COUNT", "FINITE", "NONNEG", "NON_EMPTY", "SEED", "Count", "Domain", "FieldInfo", "Finite", "NonNeg", "Positions", "Positive",
    "Range", "Registered", "Rule", "Seed", "Text", "ZeroToOne", "at_least", "check_domains",
    "When", "dead_settings", "domain_of", "domains", "field_docs", "knob", "plain", "positive", "reference", "section",
    "unit", "value_at",
]

INF = math.inf
SEED_MAX = 2**32 - 1  # numpy's seeds are 32-bit


class Domain:
    """The allowed values of one field; `problem(value)` is None when the value is allowed."""

    text: str  # "> 0", "in [0, 1)", ...

    def problem(self, value: Any) -> str | None:  # pragma: no cover - interface
        raise NotImplementedError


@dataclass(frozen=True)
class Range(Domain):
    """A number in [low, high] (`open_low` / `open_high` make an end exclusive); NaN and inf never pass.
    Applied to each item of a list, with `length` the list's required length."""

    low: float = -INF
    high: float = INF
    open_low: bool = False
    open_high: bool = False
    why: str = ""
    length: int | None = None

    @property
    def text(self) -> str:
        if self.low == -INF and self.high == INF:
            return "a finite number"
        if self.high == INF:
            return f"{'>' if self.open_low else '>='} {_num(self.low)}"
        if self.low == -INF:
            return f"{'<' if self.open_high else '<='} {_num(self.high)}"
        return f"in {'(' if self.open_low else '['}{_num(self.low)}, {_num(self.high)}{')' if self.open_high else ']'}"

    def _bad(self, x: Any) -> bool:
        if not isinstance(x, (int, float)) or isinstance(x, bool) or not math.isfinite(x):
            return True
        return x < self.low or x > self.high or (self.open_low and x == self.low) or (self.open_high and x == self.high)

    def problem(self, value: Any) -> str | None:
        if value is None:
            return None  # None is "off" / "default" where the type allows it (the type check has run)
        if isinstance(value, list):
            if self.length is not None and len(value) != self.length:
                return f"must have {self.length} values, each {self.text}" + self._why()
            if any(self._bad(x) for x in value):
                return f"each value must be {self.text}" + self._why()
            return None
        return f"must be {self.text}" + self._why() if self._bad(value) else None

    def _why(self) -> str:
        return f" ({self.why})" if self.why else ""


@dataclass(frozen=True)
class Rule(Domain):
    """Any other rule: `ok(value)` says whether the value is allowed; `text` says what is."""

    ok: Callable[[Any], bool]
    text: str

    def problem(self, value: Any) -> str | None:
        return None if self.ok(value) else f"must be {self.text}"


class Registered(Domain):
    """A name registered in `registry` (mathrl.registry): the choices are whatever is registered when
    the config is checked, built-in or added by the user's code."""

    def __init__(self, registry: Registry):
        self.registry = registry

    @property
    def text(self) -> str:
        return f"a registered {self.registry.kind}: {', '.join(self.registry.names())}"

    def problem(self, value: Any) -> str | None:
        names = self.registry.names()
        if value in names:
            return None
        peer = close_name(value, names, self.registry.field)  # GSPO -> gspo, verl's vanilla -> ppo_clip
        if peer is not None:
            return f"must be {self.text}; did you mean {peer[0]!r}?{peer[1]}"
        close = difflib.get_close_matches(str(value), names, n=1)
        return f"must be {self.text}" + (f"; did you mean {close[0]!r}?" if close else "")


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else repr(x)


def positive(why: str = "") -> Range:
    return Range(0, open_low=True, why=why)


def at_least(low: float, why: str = "") -> Range:
    return Range(low, why=why)


def unit(*, open_low: bool = False, open_high: bool = False, why: str = "") -> Range:
    return Range(0, 1, open_low=open_low, open_high=open_high, why=why)


COUNT = at_least(1)  # a size, a number of steps or samples
NONNEG = at_least(0)
FINITE = Range()
SEED = Range(0, SEED_MAX)
NON_EMPTY = Rule(lambda v: isinstance(v, str) and bool(v.strip()), "a non-empty string")


# The domains most fields take, as annotations: `steps: Count`, `lr: Positive[float]`, `slip_prob: ZeroToOne`,
# `keep_every: NonNeg[int] | None`. Any other domain is written out:
# `Annotated[float, Range(1, open_low=True, why="...")]`.
_T = TypeVar("_T")
Count = Annotated[int, COUNT]  # a size, a number of steps or samples: >= 1
NonNeg = Annotated[_T, NONNEG]  # >= 0
Positive = Annotated[_T, positive()]  # > 0
Finite = Annotated[float, FINITE]  # any finite number
ZeroToOne = Annotated[float, unit()]  # in [0, 1]: a probability, a share, a lambda
Seed = Annotated[int, SEED]
Text = Annotated[str, NON_EMPTY]
Positions = Annotated[int, at_least(2)]  # a context length in tokens


def domain_of(tp: Any) -> Domain | None:
    """The domain an annotation declares: the `Domain` in `Annotated[T, domain]`, also where that is the
    non-null side of an optional (`Count | None`); None when only the type constrains the field."""
    if typing.get_origin(tp) is Annotated:
        return next((m for m in tp.__metadata__ if isinstance(m, Domain)), None)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return next((d for d in map(domain_of, typing.get_args(tp)) if d is not None), None)
    return None


@functools.cache
def _annotations(cls: type) -> dict[str, Any]:
    """{field: its annotation, `Annotated` metadata kept} of a config dataclass, in declaration order."""
    hints = typing.get_type_hints(cls, include_extras=True)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def domains(cls: type, prefix: str = "") -> dict[str, Domain]:
    """{dotted key: domain} of every field of the config dataclass `cls` that declares one, sections
    descended, in declaration order."""
    out: dict[str, Domain] = {}
    hints = typing.get_type_hints(cls)
    for name, tp in _annotations(cls).items():
        if dataclasses.is_dataclass(hints[name]):
            out.update(domains(hints[name], f"{prefix}{name}."))
        elif (domain := domain_of(tp)) is not None:
            out[prefix + name] = domain
    return out


@functools.cache
def _field_domains(cls: type) -> tuple[tuple[str, Domain | None], ...]:
    """(field, its domain or None) of a config dataclass, in declaration order, worked out once."""
    return tuple((name, domain_of(tp)) for name, tp in _annotations(cls).items())


def _problems(obj: Any, prefix: str = "") -> Iterator[tuple[str, Any, str]]:
    """(dotted key, value, problem) of every field of the dataclass `obj` outside its domain, sections
    descended; the items of a list of sections are checked by `check_domains`."""
    for name, domain in _field_domains(type(obj)):
        value = getattr(obj, name)
        if dataclasses.is_dataclass(value):
            yield from _problems(value, f"{prefix}{name}.")
        elif domain is not None and (problem := domain.problem(value)):
            yield prefix + name, value, problem


def _items(obj: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(where, item) of every item of a list of sections in `obj` (reward.functions), named as the
    entry's other rules name it: `reward.functions[0] (math)`."""
    for name in _annotations(type(obj)):
        value = getattr(obj, name)
        if dataclasses.is_dataclass(value):
            yield from _items(value, f"{prefix}{name}.")
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if dataclasses.is_dataclass(item):
                    label = getattr(item, "name", None)
                    yield f"{prefix}{name}[{i}]" + (f" ({label})" if isinstance(label, str) else ""), item


def check_domains(cfg: Any) -> list[str]:
    """One message per field of the config `cfg` whose value is outside its domain, "key=value: must be
    ...", and per field of a list item, "reward.functions[0] (math): weight=inf must be ..."."""
    errors = [f"{key}={value!r}: {problem}" for key, value, problem in _problems(cfg)]
    for where, item in _items(cfg):
        errors += [f"{where}: {key}={value!r} {problem}" for key, value, problem in _problems(item)]
    return errors


# --------------------------------------------------------------------------------------------------
# settings that count only when another one is on
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class When:
    """A field has an effect only when `ok(cfg)` holds for the whole config; `switch` says which setting makes
    it count (`algo.kl.use=loss or reward`), `keys` the keys `ok` looks at (their values go in the message).
    Declared on the field, `knob(0.001, "...", when=When(...))`; `dead_settings` names every field that
    differs from its default while its `When` does not hold."""

    keys: tuple[str, ...]
    ok: Callable[[Any], bool]
    switch: str


WHEN = "when"  # the metadata key of a field's When


def value_at(cfg: Any, key: str) -> Any:
    """The value of the dotted `key` in the config `cfg`."""
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


@functools.cache
def _conditions(cls: type, prefix: str = "") -> tuple[tuple[str, Any, When], ...]:
    """(dotted key, default, When) of every field of `cls` that declares one, sections descended."""
    hints, out = typing.get_type_hints(cls), []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            out += _conditions(hints[f.name], f"{prefix}{f.name}.")
        elif WHEN in f.metadata:
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            out.append((prefix + f.name, default, f.metadata[WHEN]))
    return tuple(out)


def dead_settings(cfg: Any) -> list[str]:
    """One message per field set away from its default while the setting that makes it count is off:
    "algo.kl.coef=0.04 has no effect with algo.kl.use='none': it counts only with algo.kl.use=loss or
    reward; set that, or leave algo.kl.coef at its default 0.001"."""
    errors = []
    for key, default, when in _conditions(type(cfg)):
        value = value_at(cfg, key)
        if value != default and not when.ok(cfg):
            now = ", ".join(f"{k}={value_at(cfg, k)!r}" for k in when.keys)
            errors.append(f"{key}={value!r} has no effect with {now}: it counts only with {when.switch}; set that, "
                          f"or leave {key} at its default {default!r}")
    return errors


# --------------------------------------------------------------------------------------------------
# docs and the reference listing
# --------------------------------------------------------------------------------------------------
HELP = "help"  # the metadata key of a field's help text


def knob(default: Any = dataclasses.MISSING, help: str = "", *, default_factory: Any = dataclasses.MISSING,
         when: When | None = None) -> Any:
    """A config field with its default and its help text (the field's metadata, which `mathrl config` prints):

        steps: Count = knob(50, "RL steps (one rollout batch each)")
        mode: Literal["none", "tis", "mis"] = knob("none",
            "tis: weight min(ratio, cap) (Yao et al. 2025); "
            "mis: drop ratio > cap (Liu, Li et al. 2025)")

    A list, dict or dataclass default is copied for each config (dataclasses' default_factory), so a
    config's `data.eval` is its own; `default_factory=` gives any other factory. `when` declares the
    setting without which the field has no effect (`When`): set away from its default without it, the
    config is refused."""
    if default_factory is dataclasses.MISSING and (isinstance(default, (list, dict, set)) or _is_instance(default)):
        default, default_factory = dataclasses.MISSING, functools.partial(copy.deepcopy, default)
    metadata = {HELP: help, **({WHEN: when} if when is not None else {})}
    return dataclasses.field(default=default, default_factory=default_factory, metadata=metadata)


def section(cls: type, help: str = "") -> Any:
    """A section of the tree, built fresh for each config: `model: ModelConfig = section(ModelConfig, "the
    policy model")`. Without help of its own, the section's docstring is its doc."""
    return dataclasses.field(default_factory=cls, metadata={HELP: help})


def _is_instance(value: Any) -> bool:
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def field_docs(cls: type) -> dict[str, str]:
    """{field name: its help} of the fields of the dataclass `cls` that have one (`knob`, `section`)."""
    return {f.name: f.metadata[HELP] for f in dataclasses.fields(cls) if f.metadata.get(HELP)}


@dataclass(frozen=True)
class FieldInfo:
    key: str  # dotted, e.g. rollout.temperature
    type: str
    default: Any
    domain: str  # "" when only the type constrains it
    doc: str
    section: bool = False  # a section (its doc is the dataclass docstring)
    items: tuple[FieldInfo, ...] = ()  # a list of sections (rollout.tools, reward.functions): each entry's keys, `key[].name`


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return " | ".join(str(a) for a in typing.get_args(tp))
    args = typing.get_args(tp)
    if origin is not None and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return " | ".join(_type_name(a) for a in rest) + " | null"
    if origin is list:
        return f"list[{_type_name(args[0])}]"
    return getattr(tp, "__name__", str(tp))


def _class_doc(cls: type) -> str:
    doc = cls.__doc__ or ""
    if doc.startswith(cls.__name__ + "("):  # the signature dataclasses writes when there is no docstring
        return ""
    return " ".join(inspect.cleandoc(doc).split())


def plain(value: Any) -> Any:
    """A list of sections (reward.functions) as the mappings a recipe writes, unset (null or empty) keys left out."""
    if isinstance(value, list) and value and dataclasses.is_dataclass(value[0]):
        return [{k: v for k, v in dataclasses.asdict(d).items() if v is not None and v != {}} for d in value]
    return value


def reference(cls: type, prefix: str = "") -> list[FieldInfo]:
    """Every key of the config dataclass `cls` (sections too), in declaration order."""
    out = []
    hints, annotated = typing.get_type_hints(cls), _annotations(cls)
    docs = field_docs(cls)
    for f in dataclasses.fields(cls):
        key, tp = prefix + f.name, hints[f.name]
        if dataclasses.is_dataclass(tp):
            out.append(FieldInfo(key, "section", None, "", docs.get(f.name) or _class_doc(tp), section=True))
            out += reference(tp, key + ".")
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        default = plain(default)
        domain = domain_of(annotated[f.name])
        item = typing.get_args(tp)[0] if typing.get_origin(tp) is list else None
        items = tuple(reference(item, key + "[].")) if dataclasses.is_dataclass(item) else ()
        out.append(FieldInfo(key, _type_name(tp), default, domain.text if domain else "", docs.get(f.name, ""), items=items))
    return out
