"""The rules that tie config fields together, checked by `Config.validate` after every field has
passed its own domain (declared on the field, mathrl/config/tree.py): batch sizes that tile, groups
for the estimators that compare within one, settings that only make sense together, files that must
exist, and the entries of rollout.tools and reward.functions. Each rule returns one message per problem,
naming the key, the value and the fix; `validate` raises them together, one line each.

The questions that need the model's files (can model.path be loaded, how long is its context) are
answered by model/paths.py, a higher layer, through the `MODEL_FILES` registry, as each engine judges
its own settings through `registry.ENGINES`.
"""

from __future__ import annotations

import inspect
import math
import re
import urllib.parse
from pathlib import Path
from typing import Any

from mathrl.config.schema import check_domains, dead_settings
from mathrl.config.shared import (
    CUT_NOTE,
    DATA_FILE_SUFFIXES,
    DEFAULT_REWARD_FN,
    MIN_OBSERVATION_TOKENS,
    TINY_BASE,
    ConfigError,
    parse_config_path,
)
from mathrl.registry import (
    ADVANTAGE_ESTIMATORS,
    ARCHITECTURES,
    ARITH_SOURCES,
    ENGINES,
    POLICY_LOSSES,
    REWARD_FUNCTIONS,
    TOOLS,
    Registry,
    load_callable,
)

# model/paths.py registers "path_problem" (str -> why it cannot be loaded, or None) and "context_length"
# (str -> max_position_embeddings read from its config.json, or None), neither loading nor downloading
MODEL_FILES = Registry("model file probe", field="model.path", home="mathrl.model.paths")
SAMPLE_FILTERS = ("repetitive", "garbled", "no_answer", "void_turn")  # data.sample_filter's reasons
TOOL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")  # a chat template's function name rule, starting with a letter or _


class ConfigRules:
    """`validate` and the rules it runs, one method per concern; `Config` (tree.py) inherits them, so
    they read the tree as `self.rollout`, `self.train`, ... and its derived sizes (`self.rollout_batch_size`)."""

    def validate(self, check_paths: bool = True) -> None:
        """Raise ConfigError listing every problem. `check_paths=False` skips the checks that local
        files exist (model, init_from checkpoint, data files): evaluating or inspecting a finished
        run must not need its training data.

        First every field against its domain (declared on the field, tree.py), then the rules that tie
        fields together; every message names the key, the value and the fix."""
        errors = check_domains(self)
        if errors:  # cross-field rules assume each field is in its own domain
            raise ConfigError("\n".join(errors))
        errors = [*self._batch_errors(), *self._algo_errors(), *self._tiny_base_errors(), *self._data_errors()]
        errors += dead_settings(self)  # a field set while the setting that makes it count is off (its `when`)
        if check_paths:
            errors += self._missing_paths()
        errors += self._model_init_errors(check_paths)
        errors += ENGINES.get(self.rollout.engine).check(self)  # the engine's own settings
        errors += self._context_errors() + self._reward_errors() + self._async_errors() + self._tool_errors()
        errors += self._teacher_errors(check_paths)
        if errors:
            raise ConfigError("\n".join(errors))  # one line per problem

    def _batch_errors(self) -> list[str]:
        """Mini-batches that tile the rollout batch; groups of several samples where a rule compares within one."""
        errors, batch, mini = [], self.rollout_batch_size, self.train.mini_batch_size
        if mini > batch:
            errors.append(f"train.mini_batch_size={mini} is larger than the rollout batch "
                          f"(rollout.prompts_per_step x rollout.n = {batch}); lower it or sample more")
        elif batch % mini:
            errors.append(f"the rollout batch ({batch}) is not a multiple of train.mini_batch_size ({mini})")
        if self.rollout.n == 1 and ADVANTAGE_ESTIMATORS.get(self.algo.adv.estimator).needs_groups:
            errors.append(
                f"algo.adv.estimator={self.algo.adv.estimator} needs groups of several samples; rollout.n is 1 "
                "(every advantage would be 0). Raise rollout.n or use an estimator without groups (reinforce_pp, gae)"
            )
        ds = self.data.dynamic_sampling
        if ds.mode != "none" and self.rollout.n == 1:
            errors.append(f"data.dynamic_sampling.mode={ds.mode} needs groups: rollout.n is 1, so every group would be "
                          "dropped. Raise rollout.n or set data.dynamic_sampling.mode=none")
        if self.eval.temperature == 0 and self.eval.n > 1:
            errors.append(f"eval.temperature=0 is greedy decoding: all eval.n={self.eval.n} samples of a problem "
                          "would be the same; set eval.n=1 with it")
        return errors

    def _algo_errors(self) -> list[str]:
        """Loss terms, reward shaping and importance weights that only work together."""
        errors, ent, algo = [], self.algo.entropy, self.algo
        if ent.mode == "none" and (ent.ref_gain_clip.max_gain is not None or ent.ref_gain_clip.max_ratio is not None):
            errors.append("algo.entropy.ref_gain_clip is set but algo.entropy.mode is none: there is no bonus to clip")
        if not ent.min_coef <= ent.max_coef:
            errors.append("algo.entropy.min_coef must be <= algo.entropy.max_coef")
        if algo.kl.target is not None and algo.kl.use == "none":
            errors.append("algo.kl.target is set but algo.kl.use is none")
        if self.reward.overlong.soft_punishment and not 0 < self.reward.overlong.cache_len <= self.rollout.max_new_tokens:
            errors.append("reward.overlong.cache_len must be in (0, rollout.max_new_tokens]")
        why = self.engine_logprobs_not_old()
        if self.train.old_logprobs == "reuse_engine" and why and not algo.rollout_correction.bypass:
            errors.append(f"train.old_logprobs=reuse_engine with {why[0]}: {why[1]}; use train.old_logprobs=recompute or auto")
        errors += self._policy_loss_errors()
        if algo.off_policy != "none" and algo.rollout_correction.mode != "none":
            errors.append(f"algo.off_policy={algo.off_policy} with algo.rollout_correction.mode="
                          f"{algo.rollout_correction.mode}: the policy-gradient term takes one importance weight; "
                          "set one of them (off_policy reads cap, lower and rejected from algo.rollout_correction)")
        errors += self._bypass_errors()
        return errors

    def _bypass_errors(self) -> list[str]:
        """algo.rollout_correction.bypass makes the old logprobs the engine's and skips the scoring pass: nothing
        that needs the trainer's own old logprobs (or that pass's entropy) can be on with it."""
        algo, rc = self.algo, self.algo.rollout_correction
        if not rc.bypass:
            return []
        off = "set it to none or algo.rollout_correction.bypass=false"
        conflicts = [  # (on, setting, why, fix); mode and masks weigh pi_theta against the engine in the loss (verl)
            (rc.mode != "none" and algo.policy_loss != "gpg", f"algo.rollout_correction.mode={rc.mode} with "
             f"algo.policy_loss={algo.policy_loss}", "the loss's ratio is already pi_theta / pi_rollout, a weight would "
             "count the gap twice (verl applies none with ppo_clip)", "use algo.policy_loss=gpg (verl's loss_type="
             "reinforce) or algo.rollout_correction.mode=none"),
            ("opsm" in rc.masks, "algo.rollout_correction.masks with opsm", "it compares the old logprobs with the "
             "engine's, which bypass makes equal", "remove opsm or set algo.rollout_correction.bypass=false"),
            ((rc.mode != "none" or bool(rc.masks)) and rc.rejected == "drop", "algo.rollout_correction.rejected=drop",
             "bypass rejects in the loss, after the normaliser is counted (verl's engine path: rejected tokens are zero "
             "terms)", "set algo.rollout_correction.rejected=zero"),
            (algo.off_policy != "none", f"algo.off_policy={algo.off_policy}", "it needs the trainer's logprobs before the update", off),
            (algo.entropy.mode not in ("none", "fixed"), f"algo.entropy.mode={algo.entropy.mode}",
             "its controller needs the scoring pass's entropy", "use none or fixed, or algo.rollout_correction.bypass=false"),
            (algo.top_entropy_quantile is not None, f"algo.top_entropy_quantile={algo.top_entropy_quantile}",
             "it picks tokens by the scoring pass's entropy", "set it to null or algo.rollout_correction.bypass=false"),
            (self.train.old_logprobs != "auto", f"train.old_logprobs={self.train.old_logprobs}", "bypass sets the old logprobs itself",
             "leave train.old_logprobs=auto"),
        ]
        return [f"algo.rollout_correction.bypass=true (old logprobs := the engine's, no scoring pass) with {setting}: {why}; {fix}"
                for on, setting, why, fix in conflicts if on]

    def _policy_loss_errors(self) -> list[str]:
        """algo.policy_loss with the switches it reads, and without those it has no use for."""
        algo, name = self.algo, self.algo.policy_loss
        loss, errors = POLICY_LOSSES.get(name), []
        if algo.clip.dual_clip_c is not None and not loss.dual_clip:
            errors.append(f"algo.clip.dual_clip_c={algo.clip.dual_clip_c} with algo.policy_loss={name}: dual clip "
                          "bounds PPO's clipped surrogate (ppo_clip) only; set algo.clip.dual_clip_c=null")
        if loss.agg is not None and algo.loss_agg not in ("token_mean", loss.agg):
            errors.append(f"algo.loss_agg={algo.loss_agg} with algo.policy_loss={name}: {name} aggregates its loss "
                          f"per sequence ({loss.agg}), so the setting would be ignored; leave algo.loss_agg at "
                          f"token_mean (the entropy and KL terms use it) or set {loss.agg}")
        if algo.top_entropy_quantile is not None and loss.sequence_ratio:
            errors.append(f"algo.top_entropy_quantile with algo.policy_loss={name}: its importance ratio is one per "
                          "sequence, so no token's gradient can be kept apart; use gspo_token or a token-level loss")
        if name == "dro" and algo.dro.beta is None:
            errors.append("algo.policy_loss=dro needs algo.dro.beta, the weight of its quadratic log-ratio penalty "
                          "(e.g. algo.dro.beta=0.05)")
        return errors

    def _tiny_base_errors(self) -> list[str]:
        """The tiny base model's recipe (base.*) and what a run on it can ask of it."""
        errors, b = [], self.base
        for name, section in (("base", b), ("data.arith", self.data.arith)):
            if section.min_digits > section.max_digits:
                errors.append(f"{name}.min_digits={section.min_digits} is above {name}.max_digits={section.max_digits}")
            if section.mul_share > 0 and section.decimal_share > 0:
                errors.append(f"{name}.mul_share={section.mul_share}: products are integer problems; "
                              f"set {name}.decimal_share=0 (it is {section.decimal_share})")
        if b.hidden_size % b.num_heads or b.num_heads % b.num_kv_heads:
            errors.append(f"base: hidden_size={b.hidden_size} must be a multiple of num_heads={b.num_heads}, "
                          f"and num_heads a multiple of num_kv_heads={b.num_kv_heads}")
        if self.model.path != TINY_BASE:
            return errors
        if max(self.rollout.max_new_tokens, self.eval_max_new_tokens) >= b.max_positions:
            errors.append(f"rollout.max_new_tokens={self.rollout.max_new_tokens} / eval.max_new_tokens="
                          f"{self.eval.max_new_tokens} leave no room for a prompt in the tiny base model's "
                          f"{b.max_positions} positions (base.max_positions); lower them")
        if self.data.arith.heldout_permille > 50:
            errors.append(
                "data.arith.heldout_permille > 50 would hold out problems the tiny base model was pretrained on "
                "(its pretraining excludes only the first 50 permille); use a value <= 50"
            )
        return errors

    def _data_errors(self) -> list[str]:
        """Dynamic sampling's band, sample filters, the problem order and rewrites, the arithmetic task's
        carries, and the form of every data source."""
        errors, d = [], self.data
        if d.dynamic_sampling.band_low > d.dynamic_sampling.band_high:
            errors.append(f"data.dynamic_sampling.band_low={d.dynamic_sampling.band_low} is above "
                          f"band_high={d.dynamic_sampling.band_high}; need band_low <= band_high")
        unknown = set(d.sample_filter) - set(SAMPLE_FILTERS)
        if unknown:
            errors.append(f"data.sample_filter: unknown reasons {sorted(unknown)}; choose from {', '.join(SAMPLE_FILTERS)}")
        if d.curriculum.mode != "none" and d.train == "arith":
            errors.append("data.curriculum orders a fixed problem set: use it with a dataset as data.train")
        if d.transform != "none" and d.train == "arith" and d.arith.decimal_share == 0:
            errors.append("data.transform rewrites dataset answers; the arithmetic task's answers are integers already "
                          "(set data.arith.decimal_share > 0 for decimal problems, which the transform drops)")
        carry_keys = ["min_carries"] + (["hard_min_carries"] if "arith_hard" in d.eval else [])
        for key in carry_keys:  # hard_min_carries only matters (and is only checked) when arith_hard is evaluated
            value, digits = getattr(d.arith, key), d.arith.max_digits
            if value > digits:
                errors.append(f"data.arith.{key}={value}: operands of at most {digits} digits (data.arith.max_digits) "
                              f"give at most {digits} carries; lower it or raise max_digits")
        for where, source in self._data_files():
            if Path(source).suffix not in DATA_FILE_SUFFIXES:
                builtin = "arith" if where == "data.train" else ", ".join(ARITH_SOURCES.names())
                errors.append(f"{where}: {source!r} is not a data source (give {builtin}, a .jsonl or .parquet file, "
                              "or hf:<name>[:<config>][@<split>])")
        return errors

    def _missing_paths(self) -> list[str]:
        """The local model, init_from checkpoint and data files the run will read, each checked to exist."""
        errors = []
        if self.model.path != TINY_BASE and parse_config_path(self.model.path) is None:
            problem = MODEL_FILES.get("path_problem")(self.model.path)
            if problem:
                errors.append(f"model.path={self.model.path!r} {problem}")
        if self.train.init_from is not None:
            errors += _init_from_errors(self.train.init_from, self.train.init_from_mode)
        for where, source in self._data_files():
            if Path(source).suffix in DATA_FILE_SUFFIXES and not Path(source).expanduser().is_file():
                errors.append(f"{where}: no such file {source!r}")
        return errors

    def _model_init_errors(self, check_paths: bool) -> list[str]:
        """model.init=random goes with model.path=config:<name> (a shipped architecture or a config.json), and only with it."""
        arch, names = parse_config_path(self.model.path), ", ".join(ARCHITECTURES.names())
        if self.model.init == "pretrained":
            if arch is None:
                return []
            return [f"model.path={self.model.path!r} names an architecture without weights: add model.init=random "
                    "(or give a model directory or hub id)"]
        if arch is None:
            return [f"model.init=random needs model.path=config:<name> (one of {names}) or config:<file>.json, "
                    f"got model.path={self.model.path!r}"]
        if arch in ARCHITECTURES.names():
            return []
        if not arch.endswith(".json"):
            return [f"model.path={self.model.path!r}: unknown architecture {arch!r}; choose one of {names} or give config:<file>.json"]
        if check_paths and not Path(arch).expanduser().is_file():
            return [f"model.path={self.model.path!r}: no such config file {arch!r}"]
        return []

    def _context_errors(self) -> list[str]:
        """Prompt plus response must fit the model's positions (model.max_position_embeddings, else its
        config.json where it can be read without loading the model); checked here, before any model loads."""
        if self.model.path == TINY_BASE:
            return []  # base.max_positions, checked with the tiny base model's rules
        context = self.model.max_position_embeddings or MODEL_FILES.get("context_length")(self.model.path)
        if context is None:
            return []
        errors = []
        longest = max(self.rollout.max_new_tokens, self.eval_max_new_tokens)
        if longest >= context:  # data.max_prompt_tokens is a filter, not every prompt's length: not added here
            errors.append(f"rollout.max_new_tokens / eval.max_new_tokens = {longest} tokens leave no room for a prompt "
                          f"in the model's {context} positions ({self.model.path}); lower them, or raise the context "
                          "with model.max_position_embeddings")
        v = self.rollout.vllm
        own_copy = not ENGINES.get(self.rollout.engine).samples_from_module  # vLLM: its own weights, its own context
        if own_copy and v.max_model_len is not None and v.max_model_len > context:
            errors.append(f"rollout.vllm.max_model_len={v.max_model_len} exceeds the model's {context} positions "
                          f"({self.model.path}); lower it, or raise the context with model.max_position_embeddings")
        return errors

    def _async_errors(self) -> list[str]:
        """rollout.max_staleness and rollout.generator: the settings generation in other processes cannot work with."""
        r, g, workers, errors = self.rollout, self.rollout.generator, self.generator_workers, []
        if r.max_staleness > 0 and workers == 0:
            errors.append(f"rollout.max_staleness={r.max_staleness} samples in generator processes but "
                          "rollout.generator.workers=0; set workers >= 1 (or leave it null)")
        if r.async_mode == "free" and r.max_staleness == 0:
            errors.append("rollout.async_mode=free needs rollout.max_staleness >= 1 (with 0 every step samples the current weights)")
        if workers > 1 and self.data.dynamic_sampling.mode != "none":
            errors.append(f"rollout.generator.workers={workers} with data.dynamic_sampling.mode="
                          f"{self.data.dynamic_sampling.mode}: the problems of a step depend on the refill rounds of "
                          "the step before, which another worker generates; use workers=1 or dynamic_sampling.mode=none")
        if workers > 1 and self.data.curriculum.mode == "online":
            errors.append(f"rollout.generator.workers={workers} with data.curriculum.mode=online: the order "
                          "of a step's problems depends on the pass rates of the step before; use workers=1")
        if workers and self.model.lora.r > 0:
            errors.append(f"rollout.generator.workers={workers} with model.lora.r={self.model.lora.r}: "
                          "generator processes take whole weights and LoRA sends adapters; train without "
                          "generator processes (rollout.max_staleness=0, workers=0) or without LoRA")
        if g.devices and self.train.device == "cpu":
            errors.append(f"rollout.generator.devices={g.devices} names GPUs but train.device=cpu; clear it or train on cuda")
        return errors

    def _reward_errors(self) -> list[str]:
        """Each reward.functions entry: a unique metric name, exactly one of fn and url, a function that
        imports and takes the batched contract (prompts, responses, fields, tokens, **kwargs), or an
        http(s) url; checked here, so a typo stops the run before any model loads."""
        errors, names, maths = [], set(), 0
        if not self.reward.functions:
            return ["reward.functions is empty; give at least one component (the default is "
                    f"[{{name: math, fn: {DEFAULT_REWARD_FN!r}}}])"]
        for i, e in enumerate(self.reward.functions):
            where = f"reward.functions[{i}] ({e.name})"
            if e.name in names:
                errors.append(f"{where}: the name {e.name!r} is used twice; give each component its own name")
            names.add(e.name)
            if (e.fn is None) == (e.url is None):
                errors.append(f"{where}: give exactly one of fn (a function) and url (a reward server)")
            elif e.url is not None:
                parts = urllib.parse.urlsplit(e.url)
                if parts.scheme not in ("http", "https") or not parts.hostname:
                    errors.append(f"{where}: url={e.url!r} must look like http://host:port/path")
            else:
                problem, is_math = _reward_function_problem(e.fn, e.kwargs)
                maths += is_math
                if problem:
                    errors.append(f"{where}: fn={e.fn!r} {problem}")
                elif is_math and e.kwargs:
                    errors.append(f"{where}: the math checker takes no kwargs; it is set by reward.boxed and reward.checker")
        if maths > 1:
            errors.append("reward.functions: the math checker is listed more than once; keep one math component")
        return errors

    def _tool_errors(self) -> list[str]:
        """rollout.tools and the limits of an episode: unique names, a built-in or importable fn, limits
        that leave room for a call and an answer after it."""
        r = self.rollout
        errors = tool_entry_problems([(t.name, t.fn, t.kwargs, t.timeout_s) for t in r.tools])
        if not r.tools:
            return errors
        if r.max_turns < 2:
            errors.append(f"rollout.max_turns={r.max_turns} leaves no turn after a tool call; use >= 2 (or rollout.tools: [])")
        if r.max_tool_calls < 1:
            errors.append("rollout.max_tool_calls=0 runs no call; use >= 1 (or rollout.tools: [] for single-turn responses)")
        if r.observation_max_tokens < MIN_OBSERVATION_TOKENS:
            errors.append(f"rollout.observation_max_tokens={r.observation_max_tokens} leaves no room for the note a cut "
                          f"observation carries ({CUT_NOTE.format(cut='N')!r}: up to {MIN_OBSERVATION_TOKENS - 2} tokens "
                          f"at one per character, and a token of output either side); use >= {MIN_OBSERVATION_TOKENS}")
        if r.observation_max_tokens >= r.max_new_tokens:
            errors.append(f"rollout.observation_max_tokens={r.observation_max_tokens} must be below rollout.max_new_tokens="
                          f"{r.max_new_tokens}: an episode holds its observations and the model's tokens")
        if r.tool_format == "python_blocks" and "python" not in {t.name for t in r.tools}:
            errors.append("rollout.tool_format=python_blocks sends code blocks to the tool named `python`; name one "
                          "rollout.tools entry python (its fn may be any tool, e.g. calculator)")
        return errors


# --------------------------------------------------------------------------------------------------
# entries of reward.functions and rollout.tools, and a train.init_from checkpoint
# --------------------------------------------------------------------------------------------------
    def _teacher_errors(self, check_paths: bool) -> list[str]:
        """A distillation mode has exactly one teacher (teacher.path, teacher.url or teacher.self), a teacher has a mode, and a
        teacher model directory has the student's vocabulary (same tokenizer only)."""
        mode, t = self.algo.distill.mode, self.teacher
        sources = [name for name, on in (("teacher.path", t.path is not None), ("teacher.url", t.url is not None),
                                          ("teacher.self", t.self)) if on]
        if mode == "none":
            if sources:
                return [f"a teacher is set ({', '.join(sources)}) but algo.distill.mode is none: "
                        "choose reverse_kl, forward_kl_topk or jsd, or remove the teacher"]
            return []
        if t.self_update and not t.self:
            return ["teacher.self_update=true needs teacher.self=true (the current policy is the model itself)"]
        if len(sources) != 1:
            return [f"algo.distill.mode={mode} needs exactly one teacher: teacher.path=<model dir or run's final/>, "
                    "teacher.url=<a mathrl serve-teacher address> or teacher.self=true"
                    + (f" (not {' and '.join(sources)})" if sources else "")]
        if t.engine == "vllm":
            if t.url is not None or t.self_update:
                what = "teacher.url (its server scores)" if t.url is not None else "teacher.self_update (the policy scores)"
                return [f"teacher.engine=vllm scores teacher.path's or teacher.self's frozen model, not {what}; "
                        "remove teacher.engine"]
            if self.rollout.temperature != 1.0:
                return [f"teacher.engine=vllm needs rollout.temperature=1 (not {self.rollout.temperature:g}): vLLM's "
                        "prompt logprobs are of the untempered distribution; use teacher.engine=torch"]
        if t.url is not None:
            parts = urllib.parse.urlsplit(t.url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                return [f"teacher.url={t.url!r} must look like http://host:port (mathrl serve-teacher's address)"]
            return []
        if t.self:
            if not any(key in t.context for key in ("{answer}", "{solution}")):
                return [f"teacher.context={t.context!r} gives the teacher nothing the student lacks: put {{answer}} or "
                        "{solution} in it"]
            return []
        if check_paths and t.path is not None:
            problem = MODEL_FILES.get("path_problem")(t.path)
            if problem:
                return [f"teacher.path={t.path!r} {problem}"]
            return vocab_errors(t.path, self.model.path)
        return []


def vocab_errors(teacher: str, student: str) -> list[str]:
    """One line when both config.json files are readable here and their vocabularies differ: distillation compares
    the two models token by token, so they must share the tokenizer."""
    sizes = {name: MODEL_FILES.get("vocab_size")(path) for name, path in (("teacher", teacher), ("student", student))}
    if None in sizes.values() or sizes["teacher"] == sizes["student"]:
        return []
    return [f"teacher.path={teacher!r} has a vocabulary of {sizes['teacher']} tokens, the student model.path={student!r} "
            f"{sizes['student']}: distillation needs the same tokenizer; choose a teacher of the student's family"]


def _init_from_errors(init_from: str, mode: str) -> list[str]:
    """train.init_from: a complete checkpoint to continue, or at least its weights to restart from."""
    source = Path(init_from)
    if mode == "continue" and not (source / "trainer_state.pt").exists():
        weights_only = (source / "trainer_state.json").exists() and (source / "config.json").exists()
        return [f"train.init_from={init_from!r} " + (
            "holds weights only (a checkpoint kept by train.keep_every, without its optimizer state): use "
            "train.init_from_mode=restart, or a complete checkpoint" if weights_only else
            "is not a complete checkpoint directory (expected e.g. runs/X/checkpoints/step_000050 with "
            "trainer_state.pt)")]
    if not ((source / "trainer_state.json").exists() and (source / "config.json").exists()):
        return [f"train.init_from={init_from!r} is not a checkpoint directory (expected "
                "e.g. runs/X/checkpoints/step_000050 with trainer_state.json and the model files)"]
    return []


def resolve_reward_function(fn: str) -> Any:
    """The function a reward.functions entry's `fn` names: a built-in (`registry.REWARD_FUNCTIONS`) or
    "package.module:function" / "path/file.py:function" (`registry.load_callable`). ValueError saying why
    not, worded to follow the fn: "is neither a built-in reward ...". The config's check and the reward
    room (reward/functions.py) both resolve with it."""
    if ":" not in fn:
        if fn not in REWARD_FUNCTIONS.names():
            raise ValueError(f"is neither a built-in reward ({', '.join(REWARD_FUNCTIONS.names())}) nor of the form "
                             "package.module:function")
        return REWARD_FUNCTIONS.get(fn)
    return load_callable(fn)


def _reward_function_problem(fn: str, kwargs: dict[str, Any]) -> tuple[str | None, bool]:
    """(why `fn` cannot be a reward function called with `kwargs`, or None; whether it is the math checker)."""
    try:
        function = resolve_reward_function(fn)
    except ValueError as e:
        return str(e), False
    is_math = function is REWARD_FUNCTIONS.get("math")
    if not callable(function):
        return f"names a {type(function).__name__}, not a function", is_math
    try:
        inspect.signature(function).bind(prompts=[], responses=[], fields=[], tokens=[], **kwargs)
    except TypeError as e:
        return (f"has the wrong signature ({e}); a reward function takes "
                "(prompts, responses, fields, tokens, **kwargs)"), is_math
    except ValueError:  # a builtin without a signature: it is called and may fail, counted per sample
        pass
    return None, is_math


def tool_entry_problems(entries: list[tuple[Any, Any, Any, Any]]) -> list[str]:
    """One-line problems of tool entries (name, fn, kwargs, timeout_s), each naming its
    ``rollout.tools[i]`` field: names unique and of the chat templates' form, a timeout > 0, a built-in
    `fn` (`registry.TOOLS`) with options it takes, or a "package.module:function" that imports and is
    callable. The config (`Config.validate`) and `tools.ToolPool` both check with it; the pool's specs
    are built in code and reach it unchecked, which is why these checks are written out here rather
    than declared as domains on ToolConfig's fields."""
    problems: list[str] = []
    first: dict[str, int] = {}
    for i, (name, fn, kwargs, timeout_s) in enumerate(entries):
        where = f"rollout.tools[{i}]"
        if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
            problems.append(f"{where}.name={name!r} must be 1 to 64 letters, digits, _ or -, the first a letter or _")
        elif name in first:
            problems.append(f"{where}.name={name!r} is also rollout.tools[{first[name]}]'s; give each tool its own name")
        else:
            first[name] = i
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not (math.isfinite(timeout_s) and timeout_s > 0):
            problems.append(f"{where}.timeout_s must be a number of seconds > 0, got {timeout_s!r}")
        if not isinstance(kwargs, dict):
            problems.append(f"{where}.kwargs must be a mapping, got {type(kwargs).__name__}")
            continue
        problems += [f"{where}.{p}" for p in _tool_fn_problems(fn, kwargs)]
    return problems


def _tool_fn_problems(fn: Any, kwargs: dict) -> list[str]:
    if not isinstance(fn, str):
        return [f"fn must be a string, got {type(fn).__name__}"]
    if fn in TOOLS.names():
        return [f"kwargs: {p}" for p in TOOLS.get(fn).check_kwargs(kwargs)]  # a built-in checks its own options
    if ":" not in fn:
        return [f"fn={fn!r} is not a built-in tool ({', '.join(TOOLS.names())}) nor of the form "
                "package.module:function or path/file.py:function"]
    try:
        function = load_callable(fn)
    except ValueError as e:
        return [f"fn: {e}"]
    return [] if callable(function) else [f"fn={fn!r} is not callable"]
