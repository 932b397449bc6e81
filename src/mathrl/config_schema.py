"""The domain of every config field, the fields' docs, and the reference that `mathrl config` prints.

`DOMAINS` maps each dotted key to the values it allows (a range, a length, a rule for strings);
`Config.validate` checks every one of them before anything is built or loaded, and each message
names the key, the value and what is allowed:

    train.max_grad_norm=-1.0: must be > 0 (gradients are clipped to this norm; a negative limit flips their sign)

The docs are the `#` comments beside the fields in config.py (and each section's docstring); they are
read from the source once, so the file stays the one place where a field is documented.

    from mathrl.config import Config
    from mathrl.config_schema import reference
    for entry in reference(Config): print(entry.key, entry.type, entry.default, entry.domain, entry.doc)
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import inspect
import io
import math
import os
import re
import textwrap
import tokenize
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mathrl.registry import ADVANTAGE_ESTIMATORS, ENGINES, PROMPT_TEMPLATES, TOOL_FORMATS, Registry

__all__ = ["DOMAINS", "Domain", "FieldInfo", "Range", "Registered", "Rule", "check_domains", "config_changes", "field_docs", "model_path_problem", "plain", "reference"]

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


def _template_ok(value: Any) -> bool:
    return value == "chat" or value in PROMPT_TEMPLATES.names() or "{question}" in str(value)


def _schedule_ok(value: Any) -> bool:
    return all(isinstance(p, list) and len(p) == 2 and p[0] >= 0 and p[1] >= 1 for p in value)


# Every int and float field has an entry (tests/test_config.py checks it); strings and lists where a
# value can be wrong beyond its type. Cross-field rules (min <= max, batch divisibility, ...) live in
# Config.validate.
DOMAINS: dict[str, Domain] = {
    "seed": SEED,
    "model.path": NON_EMPTY,
    "model.logprob_chunk_size": COUNT,
    "model.max_position_embeddings": at_least(2),
    "model.lora.r": NONNEG,
    "model.lora.alpha": positive(),
    "model.lora.dropout": unit(open_high=True),
    "model.lora.target_modules": Rule(lambda v: bool(v) and all(isinstance(s, str) and s.strip() for s in v),
                                      "a non-empty list of module names"),
    "base.seed": SEED,
    "base.min_digits": Range(1, 18),
    "base.max_digits": Range(1, 18),
    "base.hidden_size": COUNT,
    "base.intermediate_size": COUNT,
    "base.num_layers": COUNT,
    "base.num_heads": COUNT,
    "base.num_kv_heads": COUNT,
    "base.max_positions": at_least(2),
    "base.steps": NONNEG,
    "base.batch_size": COUNT,
    "base.lr": positive(),
    "base.warmup_steps": NONNEG,
    "base.slip_prob": unit(),
    "base.check_prob": unit(),
    "base.decimal_share": unit(),
    "base.tool_share": unit(),
    "data.train": NON_EMPTY,
    "data.eval": Rule(lambda v: bool(v) and all(isinstance(s, str) and s.strip() for s in v),
                      "a non-empty list of sources (arith, arith_decimal, arith_hard, files, hf: datasets)"),
    "data.question_field": NON_EMPTY,
    "data.template": Rule(_template_ok, "arith, zero, plain, chat, or a string containing {question}"),
    "data.max_prompt_tokens": COUNT,
    "data.eval_size": COUNT,
    "data.dynamic_sampling.band_low": unit(),
    "data.dynamic_sampling.band_high": unit(),
    "data.dynamic_sampling.max_rounds": COUNT,
    "data.dynamic_sampling.max_empty_steps": NONNEG,
    "data.arith.min_digits": Range(1, 18),
    "data.arith.max_digits": Range(1, 18),
    "data.arith.heldout_permille": Range(1, 999),
    "data.arith.decimal_share": unit(),
    "data.arith.min_carries": Range(0, 18, why="at most data.arith.max_digits"),
    "data.arith.hard_min_carries": Range(0, 18, why="at most data.arith.max_digits"),
    "rollout.engine": Registered(ENGINES),
    "rollout.prompts_per_step": COUNT,
    "rollout.n": COUNT,
    "rollout.temperature": positive(
        "training samples from the policy: at 0 (greedy) every sample of a group is the same, its advantages are 0, "
        "and the sampling logprobs the loss needs are undefined; eval.temperature=0 is allowed"),
    "rollout.top_p": unit(open_low=True),
    "rollout.max_new_tokens": COUNT,
    "rollout.batch_size": COUNT,
    "rollout.max_staleness": at_least(0, "policy versions between the sampling weights and the trainer's"),
    "rollout.generator.workers": NONNEG,
    "rollout.generator.threads": NONNEG,
    "rollout.generator.devices": at_least(0, "CUDA device indices"),
    "rollout.generator.bucket_mb": positive(),
    "rollout.tool_format": Registered(TOOL_FORMATS),
    "rollout.max_turns": COUNT,
    "rollout.max_tool_calls": NONNEG,
    "rollout.observation_max_tokens": COUNT,
    "rollout.tool_workers": COUNT,
    "rollout.vllm.gpu_memory_utilization": unit(open_low=True, why="a share of the GPU's memory"),
    "rollout.vllm.kv_cache_gb": positive("null lets vLLM size it"),
    "rollout.vllm.max_model_len": at_least(2),
    "rollout.vllm.tensor_parallel_size": COUNT,
    "rollout.vllm.max_num_seqs": COUNT,
    "rollout.vllm.max_num_batched_tokens": COUNT,
    "algo.adv.estimator": Registered(ADVANTAGE_ESTIMATORS),
    "algo.clip.eps_low": unit(open_high=True),
    "algo.clip.eps_high": NONNEG,
    "algo.clip.dual_clip_c": Range(1, open_low=True, why="the dual-clip bound sits above the ratio clip"),
    "algo.critic.lr": positive(),
    "algo.critic.gamma": unit(open_low=True),
    "algo.critic.lam_actor": unit(),
    "algo.critic.lam_critic": unit(),
    "algo.critic.length_adaptive_alpha": positive("VAPO uses 0.05; null is off"),
    "algo.critic.value_clip": positive("null is off"),
    "algo.critic.pretrain_steps": NONNEG,
    "algo.entropy.coef": NONNEG,
    "algo.entropy.target": NONNEG,
    "algo.entropy.kp": NONNEG,
    "algo.entropy.step": NONNEG,
    "algo.entropy.min_coef": NONNEG,
    "algo.entropy.max_coef": NONNEG,
    "algo.entropy.ref_gain_clip.max_gain": FINITE,
    "algo.entropy.ref_gain_clip.max_ratio": positive(),
    "algo.kl.coef": NONNEG,
    "algo.kl.target": positive("null is a fixed coefficient"),
    "algo.kl.horizon": COUNT,
    "algo.ptx.coef": NONNEG,
    "algo.ptx.data": NON_EMPTY,
    "algo.ptx.batch_size": COUNT,
    "algo.ptx.max_tokens": at_least(2),
    "algo.pos_lm.coef": NONNEG,
    "algo.rollout_correction.cap": Range(1, open_low=True, why="a ratio of 1 is on-policy; 2.0 is common"),
    "algo.rollout_correction.lower": unit(open_low=True, open_high=True, why="a ratio of 1 is on-policy; 0.5 is IcePop's"),
    "train.steps": COUNT,
    "train.mini_batch_size": COUNT,
    "train.epochs": COUNT,
    "train.micro_batch_tokens": COUNT,
    "train.lr": positive(),
    "train.warmup_steps": NONNEG,
    "train.weight_decay": NONNEG,
    "train.betas": Range(0, 1, open_high=True, length=2, why="Adam's beta1 and beta2"),
    "train.max_grad_norm": positive("gradients are clipped to this norm; a negative limit flips their sign"),
    "train.save_every": NONNEG,
    "train.save_every_minutes": NONNEG,
    "train.keep_last": COUNT,
    "train.keep_every": NONNEG,
    "train.max_skipped_steps": COUNT,
    "train.dist.timeout_s": positive("seconds a collective may wait for the other ranks"),
    "reward.num_workers": NONNEG,
    "reward.timeout_s": positive(),
    "reward.incorrect": Range(-INF, 1, open_high=True, why="a wrong answer must score below a right one (1)"),
    "reward.overlong.cache_len": COUNT,
    "reward.kimi_length_coef": NONNEG,
    "reward.length_bonus_coef": FINITE,
    "reward.length_schedule": Rule(_schedule_ok, "a list of [step >= 0, target_length >= 1] pairs"),
    "reward.length_schedule_coef": NONNEG,
    "eval.every": COUNT,
    "eval.n": COUNT,
    "eval.temperature": Range(0, why="0 is greedy decoding"),
    "eval.top_p": unit(open_low=True),
    "eval.max_new_tokens": COUNT,
    "eval.seed": SEED,
    "log.rollouts_per_step": NONNEG,
    "sft.steps": COUNT,
    "sft.batch_size": COUNT,
    "sft.lr": positive(),
    "sft.warmup_steps": NONNEG,
    "sft.response_field": NON_EMPTY,
    "sft.max_response_tokens": COUNT,
    "sft.eval_rows": NONNEG,
}


def check_domains(cfg: Any, domains: dict[str, Domain] = DOMAINS) -> list[str]:
    """One message per field of `cfg` whose value is outside its domain: "key=value: must be ..."."""
    errors = []
    for key, domain in domains.items():
        value = cfg
        for part in key.split("."):
            value = getattr(value, part)
        problem = domain.problem(value)
        if problem:
            errors.append(f"{key}={value!r}: {problem}")
    return errors


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # org/name
_OFFLINE_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


def model_path_problem(path: str) -> str | None:
    """Why `path` cannot be a model to load, or None: a local Hugging Face directory (with config.json),
    or a hub id `org/name` (which must be in the local cache when HF_HUB_OFFLINE is set). Checked before
    anything loads: a bare name that is neither would otherwise be tried against the hub, with retries."""
    local = Path(path).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            return ("is a directory but not a Hugging Face model (no config.json); give the directory that holds "
                    "config.json, the weights and the tokenizer files")
        return None
    if local.exists():
        return "is a file; give a Hugging Face model directory (with config.json) or a hub id such as Qwen/Qwen2.5-Math-1.5B"
    hint = "give a Hugging Face model directory, a hub id such as Qwen/Qwen2.5-Math-1.5B, or tiny-arith"
    if path.startswith(("/", ".", "~")) or not _HUB_ID.match(path) or Path(path.split("/")[0]).is_dir():
        return f"does not exist ({hint})"
    if any(os.environ.get(v, "").lower() in ("1", "true", "yes", "on") for v in _OFFLINE_VARS):
        try:
            from huggingface_hub import try_to_load_from_cache
        except ImportError:  # pragma: no cover - transformers depends on it
            return None
        if not isinstance(try_to_load_from_cache(path, "config.json"), str):
            return "is a hub id that is not in the local cache, and HF_HUB_OFFLINE is set (download it first, or unset it)"
    return None


def config_changes(old: dict, new: dict, prefix: str = "") -> list[str]:
    """`key: old -> new` for every leaf that differs between two config trees (e.g. two config.yaml files
    loaded with yaml.safe_load), keys in the new tree's order; keys only one side has count as changes."""
    changes = []
    for key in list(new) + [k for k in old if k not in new]:
        a, b = old.get(key, "<absent>"), new.get(key, "<absent>")
        if isinstance(a, dict) and isinstance(b, dict):
            changes += config_changes(a, b, f"{prefix}{key}.")
        elif a != b:
            changes.append(f"{prefix}{key}: {a!r} -> {b!r}")
    return changes


# --------------------------------------------------------------------------------------------------
# docs and the reference listing
# --------------------------------------------------------------------------------------------------
@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """{field name: the `#` comment on its line} for a dataclass defined in a source file ({} if the
    source cannot be read, e.g. from a zip)."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    (node,) = ast.parse(source).body
    docs = {}
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            lines = range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1)
            text = " ".join(comments[i] for i in lines if i in comments)
            if text:
                docs[stmt.target.id] = text
    return docs


@dataclass(frozen=True)
class FieldInfo:
    key: str  # dotted, e.g. rollout.temperature
    type: str
    default: Any
    domain: str  # "" when only the type constrains it
    doc: str
    section: bool = False  # a section (its doc is the dataclass docstring)


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
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    for f in dataclasses.fields(cls):
        key, tp = prefix + f.name, hints[f.name]
        if dataclasses.is_dataclass(tp):
            out.append(FieldInfo(key, "section", None, "", docs.get(f.name) or _class_doc(tp), section=True))
            out += reference(tp, key + ".")
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        default = plain(default)
        domain = DOMAINS.get(key)
        out.append(FieldInfo(key, _type_name(tp), default, domain.text if domain else "", docs.get(f.name, "")))
    return out
