"""Turning the `data` config into problem streams and eval sets."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mathrl.config import Config
from mathrl.registry import ARITH_SOURCES
from mathrl.seeds import derive_seed
from mathrl.tasks.arithmetic import ArithmeticTask, base_task
from mathrl.tasks.base import Problem
from mathrl.tasks.curriculum import Curriculum
from mathrl.tasks.loading import FieldMap, load_problems, preset_for, source_name
from mathrl.tasks.prompts import PromptEncoder, template_hint
from mathrl.tasks.transforms import integer_answer_transform, parse_integer_answer

if TYPE_CHECKING:  # torch loads only when a pretraining batch is drawn
    import torch


def arithmetic_task(cfg: Config) -> ArithmeticTask:
    """The training stream's task (data.arith: operand sizes, decimal and product shares, minimum carries)."""
    a = cfg.data.arith
    return ArithmeticTask(min_digits=a.min_digits, max_digits=a.max_digits, heldout_permille=a.heldout_permille,
                          decimal_share=a.decimal_share, min_carries=a.min_carries, mul_share=a.mul_share,
                          mul_digits=a.mul_digits)


@dataclass(frozen=True)
class ArithSource:
    """A built-in eval set (a `data.eval` name): held-out problems of the task `task(cfg)` returns, logged
    as eval/<set_name>/... ."""

    set_name: str
    task: Callable[[Config], ArithmeticTask]


# The held-out split is the same for all three (a keyed hash of each problem's text), so none of them
# holds a problem that the training stream or the base model's pretraining text can draw.
ARITH_SOURCES.register("arith", ArithSource(  # the task's own mix (data.arith.decimal_share), every difficulty
    "arith_heldout", lambda cfg: dataclasses.replace(arithmetic_task(cfg), min_carries=0)))
ARITH_SOURCES.register("arith_decimal", ArithSource(  # decimal problems only
    "arith_decimal_heldout", lambda cfg: dataclasses.replace(arithmetic_task(cfg), decimal_share=1.0, min_carries=0)))
ARITH_SOURCES.register("arith_hard", ArithSource(  # at least data.arith.hard_min_carries carries
    "arith_hard_heldout", lambda cfg: dataclasses.replace(arithmetic_task(cfg), min_carries=cfg.data.arith.hard_min_carries)))


def integer_answer_kept(problem: Problem) -> bool:
    """Whether the DAPO integer-answer transform keeps a problem (its answer is an integer, or becomes one)."""
    return parse_integer_answer(problem.answer)[0] is not None


def field_map(cfg: Config, path: str) -> FieldMap:
    """The preset of a known source (math500.jsonl, hf:HuggingFaceH4/MATH-500) or the default mapping,
    with every field the config sets to a non-default value applied on top."""
    import dataclasses

    from mathrl.config import DataConfig

    d, default = cfg.data, DataConfig()
    base = preset_for(path)
    changes = {}
    if d.question_field != default.question_field:
        changes["question"] = d.question_field
    if d.answer_from_solution is not None:
        changes.update(answer=None, answer_from_solution=d.answer_from_solution)
    elif d.answer_field != default.answer_field:
        changes.update(answer=d.answer_field, answer_from_solution=None)
    if d.answer_after is not None:
        changes["answer_after"] = d.answer_after
    return dataclasses.replace(base, **changes)


def prompt_encoder(cfg: Config, tokenizer, *, max_new_tokens: int) -> PromptEncoder:
    """The config's prompt template and limits (data.max_prompt_tokens, and the model's context minus
    `max_new_tokens`: model.max_position_embeddings, else read from the tokenizer's model directory)."""
    tools = None
    if cfg.rollout.tools and cfg.rollout.tool_format == "chat_tool_call":  # the template lists the tools' schemas
        from mathrl.tools import ToolSpec, tool_schemas

        tools = tool_schemas([ToolSpec(name=t.name, fn=t.fn, kwargs=dict(t.kwargs), timeout_s=t.timeout_s,
                                       description=t.description) for t in cfg.rollout.tools])
    return PromptEncoder(tokenizer, template=cfg.data.template, max_prompt_tokens=cfg.data.max_prompt_tokens,
                         max_new_tokens=max_new_tokens, context_length=cfg.model.max_position_embeddings,
                         suffix=cfg.data.question_suffix, tools=tools)


class ProblemStream:
    """Training problems, batch by batch: generated (arithmetic) or shuffled epochs over a file."""

    def __init__(self, cfg: Config, tokenizer):
        self.encoder = prompt_encoder(cfg, tokenizer, max_new_tokens=cfg.rollout.max_new_tokens)
        self.seed = cfg.seed
        self.draws = 0
        self.notes: list[str] = []  # what loading did, for the console
        self.curriculum: Curriculum | None = None
        self.keep: Callable[[Problem], bool] | None = None  # arithmetic problems the stream draws again
        if cfg.data.train == "arith":
            self.task: ArithmeticTask | None = arithmetic_task(cfg)
            self.pool: list[Problem] = []
            if cfg.data.transform == "integer_answer":  # config validation: only with decimal problems
                self.keep = integer_answer_kept
                self.notes.append("integer-answer transform: problems with a decimal answer are dropped and redrawn "
                                  "(whole-number sums such as 4.0 are kept, answer 4)")
        else:
            self.task = None
            loaded = load_problems(cfg.data.train, field_map(cfg, cfg.data.train), on_error=cfg.data.on_error)
            self.pool = loaded.problems
            self.notes.append(f"loaded {len(self.pool)} training problems from {cfg.data.train}"
                              + (f" ({loaded.skipped} malformed rows skipped: {loaded.skipped_reasons})" if loaded.skipped else ""))
            hint = template_hint(cfg.data.template, cfg.data.train, [p.question for p in self.pool])
            if hint:
                self.notes.append(f"[yellow]hint:[/yellow] {hint}")
            if cfg.data.transform == "integer_answer":
                report = integer_answer_transform(self.pool)
                self.pool = report.problems
                self.notes.append(f"integer-answer transform: {report.converted} converted, {report.unchanged} unchanged, "
                                  f"{report.dropped} dropped (could not be converted)")
            if not self.pool:
                raise ValueError(f"data.train {cfg.data.train!r} holds no problems")
            if cfg.data.curriculum.mode != "none":
                self.curriculum = Curriculum(self.pool, mode=cfg.data.curriculum.mode, field=cfg.data.curriculum.field)
        self._order: list[int] = []
        self._epoch = 0

    def _take(self, count: int) -> list[Problem]:
        if self.task is not None:
            problems = self.task.train_problems(count, seed=derive_seed(self.seed, self.draws), keep=self.keep)
            return integer_answer_transform(problems).problems if self.keep is not None else problems
        out = []
        while len(out) < count:
            if not self._order:
                if self.curriculum is not None:  # easiest first, re-ranked every epoch (online: latest pass rates)
                    self._order = list(reversed(self.curriculum.order()))
                else:
                    self._order = list(range(len(self.pool)))
                    random.Random(f"{self.seed}:{self._epoch}").shuffle(self._order)
                self._epoch += 1
            out.append(self.pool[self._order.pop()])
        return out

    def state_dict(self) -> dict:
        """Position in the stream (checkpointed so a resumed run sees the same problems)."""
        return {"draws": self.draws, "epoch": self._epoch, "order": list(self._order), "dropped": self.encoder.dropped,
                "unencodable": self.encoder.unencodable,
                "curriculum": self.curriculum.state_dict() if self.curriculum is not None else None}

    def load_state_dict(self, state: dict) -> None:
        self.draws, self._epoch, self._order = state["draws"], state["epoch"], list(state["order"])
        self.encoder.dropped = state["dropped"]
        self.encoder.unencodable = state.get("unencodable", 0)  # absent in checkpoints of older versions
        if self.curriculum is not None and state.get("curriculum"):
            self.curriculum.load_state_dict(state["curriculum"])

    def observe(self, problems: list[Problem], accuracy: list[float]) -> None:
        """Per-problem accuracy of this step's groups, for the online curriculum."""
        if self.curriculum is not None and self.curriculum.mode == "online":
            self.curriculum.update([p.id for p in problems], accuracy)

    def next_batch(self, count: int) -> tuple[list[Problem], list[list[int]], list[str]]:
        """`count` problems with their prompt ids and texts (over-long prompts replaced by further draws)."""
        problems, ids, texts = [], [], []
        for _attempt in range(100):
            self.draws += 1
            p, i, t = self.encoder.encode(self._take(count - len(problems)))
            problems += p
            ids += i
            texts += t
            if len(problems) == count:
                return problems, ids, texts
        raise ValueError(f"could not find {count} prompts within {self.encoder.limit}: data.train's prompts are too "
                         "long; raise data.max_prompt_tokens or lower rollout.max_new_tokens")


@dataclass
class EvalSet:
    name: str
    problems: list[Problem]
    prompt_ids: list[list[int]]
    dropped_too_long: int = 0  # problems left out because their prompt exceeds data.max_prompt_tokens


def build_train_stream(cfg: Config, tokenizer) -> ProblemStream:
    return ProblemStream(cfg, tokenizer)


def build_eval_sets(cfg: Config, tokenizer, *, limit: int | None) -> list[EvalSet]:
    """One EvalSet per source in cfg.data.eval: a built-in arithmetic held-out set (`ARITH_SOURCES`: arith,
    arith_decimal, arith_hard; `limit` problems, or data.eval_size when None) or a dataset's first `limit`
    rows (all of them when None). Prompts over
    data.max_prompt_tokens are dropped and counted in `dropped_too_long`; a set left empty is an error.
    Training passes limit=data.eval_size; `mathrl eval` passes --limit, so a benchmark is scored whole."""
    encoder = prompt_encoder(cfg, tokenizer, max_new_tokens=cfg.eval_max_new_tokens)
    sets = []
    for source in cfg.data.eval:
        if source in ARITH_SOURCES.names():
            builtin = ARITH_SOURCES.get(source)
            problems = builtin.task(cfg).heldout_problems(limit or cfg.data.eval_size)
            name = builtin.set_name
        else:
            problems = load_problems(source, field_map(cfg, source), limit=limit, default_split="test").problems
            name = source_name(source, default_split="test")
            hint = template_hint(cfg.data.template, source, [p.question for p in problems])
            if hint:
                encoder.warn(hint)
        if any(es.name == name for es in sets):  # a/test.jsonl and b/test.jsonl must not share metric keys
            name = f"{name}_{len(sets)}"
        before = encoder.dropped
        kept, ids, _ = encoder.encode(problems)
        if not kept:
            raise ValueError(f"eval set {name!r} has no problems left (loaded {len(problems)}; prompts over "
                             f"{encoder.limit} are dropped)")
        sets.append(EvalSet(name=name, problems=kept, prompt_ids=ids, dropped_too_long=encoder.dropped - before))
    return sets


class PretrainText:
    """Batches of pretraining text for the PTX loss (InstructGPT, Ouyang et al. 2022, eq. 2).

    `algo.ptx.data=arith` draws the tiny base model's own pretraining text (training-split problems
    with worked solutions, slips included, exactly as `model/tiny.py` generates them); a path reads a
    .txt file (one document per line) or a .jsonl file with a "text" field.
    """

    def __init__(self, cfg: Config, tokenizer):
        self.tokenizer = tokenizer
        self.max_tokens = cfg.algo.ptx.max_tokens
        self.rng = random.Random(f"ptx:{cfg.seed}")
        self.slip_prob, self.check_prob = cfg.base.slip_prob, cfg.base.check_prob
        self.docs: list[str] = []
        self.task: ArithmeticTask | None = None
        source = cfg.algo.ptx.data
        if source == "arith":
            self.task = base_task(cfg.base)
        else:
            self.docs = _read_texts(Path(source))

    def state_dict(self) -> dict:
        version, internal, gauss = self.rng.getstate()
        return {"rng": [version, list(internal), gauss]}

    def load_state_dict(self, state: dict) -> None:
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))

    def _doc(self) -> str:
        if self.task is not None:
            (problem,) = self.task.train_problems(1, seed=self.rng.randrange(2**62))
            return problem.question + "=" + self.task.solution(problem, rng=self.rng, slip_prob=self.slip_prob,
                                                               check_prob=self.check_prob)
        return self.docs[self.rng.randrange(len(self.docs))]

    def next_batch(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """input_ids [B, L] right-padded and attention mask [B, L]; EOS appended to each document."""
        import torch

        rows = [(self.tokenizer(self._doc())["input_ids"] + [self.tokenizer.eos_token_id])[: self.max_tokens] for _ in range(batch_size)]
        width = max(len(r) for r in rows)
        ids = torch.full((batch_size, width), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((batch_size, width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r)
            mask[i, : len(r)] = 1
        return ids, mask


def _read_texts(path: Path) -> list[str]:
    import json

    if not path.exists():
        raise ValueError(f"algo.ptx.data: {str(path)!r} does not exist")
    docs = []
    with path.open() as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            if path.suffix == ".jsonl":
                try:
                    row = json.loads(line)
                    docs.append(str(row["text"]))
                except (json.JSONDecodeError, KeyError, TypeError) as e:
                    raise ValueError(f"{path}:{line_no}: expected a JSON object with a 'text' field ({e})") from None
            else:
                docs.append(line.rstrip("\n"))
    if not docs:
        raise ValueError(f"algo.ptx.data: {str(path)!r} holds no text")
    return docs
