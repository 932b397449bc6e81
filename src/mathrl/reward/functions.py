"""Reward functions as config (`reward.functions`): the sequence reward's components, the built-ins (`math`, `format`, `choice`)
and the `Rewarder` that scores a batch with them all. The contract (docs/rewards.md), one batched signature for all:

    def my_reward(prompts: list[str], responses: list[str], fields: list[dict], tokens: list[list[int]],
                  **kwargs) -> list[float | dict[str, float]]:
        ...  # one value per sample: a float, or named floats with a "score" (the others are logged)

Functions run in the verifier's worker processes (`verify.Verifier.call`) with a timeout per call of
`batch_size` samples, so a hang, a crash or an exception scores those samples 0 and is counted
(``reward/<name>/timeouts``, ``reward/<name>/errors``); a `url` entry POSTs them to a server instead
(`remote.RemoteReward`). The sequence reward is the weighted sum of the components.

    with build_rewarder(cfg.reward) as rewarder:
        scores = rewarder.score_rows(prompts, responses, fields, tokens)   # Scores: total, per component
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mathrl.config import DEFAULT_REWARD_FN, ConfigError, RewardFunctionConfig, resolve_reward_function
from mathrl.registry import REWARD_FUNCTIONS
from mathrl.reward.extract import extract_boxed
from mathrl.reward.remote import RemoteReward, check_reachable
from mathrl.reward.verify import DEFAULT_BOX_POLICY, FunctionCall, RewardResult, Verifier, verify_one

__all__ = ["Component", "Rewarder", "Scores", "build_rewarder", "choice_reward", "component_metrics", "failure_counts",
           "format_reward", "function_ref", "math_reward", "tool_call_reward", "math_scores", "problem_fields", "score_rows"]

DEFAULT_URL_TIMEOUT_S = 30.0  # seconds per request attempt of a `url` entry without timeout_s
DEFAULT_URL_BATCH_SIZE = 64  # samples per request of a `url` entry without batch_size


# ---------------------------------------------------------------------------------------------------
# Built-in components
# ---------------------------------------------------------------------------------------------------


def math_reward(prompts: list[str], responses: list[str], fields: list[dict], tokens: list[list[int]], *,
                boxed: str = DEFAULT_BOX_POLICY, checker: str = "mathrl") -> list[float]:
    """1.0 where the response's final boxed answer equals the gold ``answer`` (`verify.verify_one`),
    else 0.0. As a `reward.functions` entry it runs item by item in the worker pool with
    `reward.boxed` and `reward.checker`, keeping the checker's reasons (no_answer, timeout, ...)."""
    return [verify_one(r, f["answer"], boxed=boxed, checker=checker).score for r, f in zip(responses, fields)]


def format_reward(prompts: list[str], responses: list[str], fields: list[dict], tokens: list[list[int]], *,
                  pattern: str | None = None) -> list[float]:
    """1.0 where the response is well formed, else 0.0: without `pattern`, its answer is in a closed,
    non-empty ``\\boxed{...}``; with `pattern`, the regular expression is found in it (``re.search``
    with DOTALL: anchor it with ``^`` and ``$`` to match the whole response)."""
    if pattern is not None:
        regex = re.compile(pattern, re.DOTALL)
        return [1.0 if regex.search(r) else 0.0 for r in responses]
    return [1.0 if extract_boxed(r) else 0.0 for r in responses]


_CHOICE_PATTERNS = (  # the chosen option, most explicit first; the last occurrence of the first that matches
    re.compile(r"\\boxed\s*\{\s*(?:\\text(?:bf)?\s*\{\s*)?\(?([A-Za-z])\)?\s*\}"),
    re.compile(r"answer\s*(?:is|:)\s*\**\s*\(?([A-Za-z])\)?(?![A-Za-z])", re.IGNORECASE),
)


def choice_letter(text: str, letters: str) -> str | None:
    """The option letter a response chose (upper case), or None: the last ``\\boxed{B}`` (also
    ``\\boxed{(B)}``, ``\\boxed{\\text{B}}``), else the last "answer is B" / "Answer: (B)"; a letter
    outside `letters` is no choice."""
    for pattern in _CHOICE_PATTERNS:
        found = [m.group(1).upper() for m in pattern.finditer(text[-10_000:])]
        if found:
            return found[-1] if found[-1] in letters else None
    return None


def choice_reward(prompts: list[str], responses: list[str], fields: list[dict], tokens: list[list[int]], *,
                  letters: str = "ABCDE") -> list[float]:
    """Multiple choice: 1.0 where the chosen letter (`choice_letter`) is the gold ``answer``'s letter
    ("B", "(B)", "b" all name B), else 0.0. A gold answer that is not one of `letters` raises, so the
    sample is counted as an error instead of silently scoring 0."""
    letters = letters.upper()
    scores = []
    for response, row in zip(responses, fields):
        gold = str(row["answer"]).strip().strip("()").upper()
        if len(gold) != 1 or gold not in letters:
            raise ValueError(f"gold answer {row['answer']!r} is not one of the letters {letters}")
        scores.append(1.0 if choice_letter(response, letters) == gold else 0.0)
    return scores


def tool_call_reward(prompts: list[str], responses: list[str], fields: list[dict], tokens: list[list[int]], *,
                     min_calls: int = 1) -> list[float]:
    """1.0 where the episode called a tool at least `min_calls` times, else 0.0: a call bonus, as a
    component with a small weight (0.1 in verl's tool-agent example, where a model that had learnt to
    skip its tool went from 0.608 to 0.717 validation accuracy with it). The count is the episode
    record's (the row's ``tool_calls`` field: the calls the engine ran, `RolloutBatch.tool_calls`),
    never a pattern in the text: a tool's output that prints call blocks and observation tags adds
    no call. A row without the field (a single-turn response) made none."""
    return [1.0 if int(f.get("tool_calls", 0)) >= min_calls else 0.0 for f in fields]


REWARD_FUNCTIONS.register("math", math_reward)
REWARD_FUNCTIONS.register("format", format_reward)
REWARD_FUNCTIONS.register("choice", choice_reward)
REWARD_FUNCTIONS.register("tool_call", tool_call_reward)


# ---------------------------------------------------------------------------------------------------
# Components of a config
# ---------------------------------------------------------------------------------------------------


def resolve_function(fn: str) -> Any:
    """The function a `reward.functions` entry's `fn` names: a built-in name or an import path; ValueError
    saying why not. The config's check of the entries resolves with the same function
    (`config.resolve_reward_function`), so what passes it is what runs here."""
    return resolve_reward_function(fn)


def function_ref(fn: str) -> str:
    """The import path workers load `fn` by: a built-in's module:name, a file path made absolute."""
    if ":" not in fn:
        f = REWARD_FUNCTIONS.get(fn)
        return f"{f.__module__}:{f.__name__}"
    module, _, attr = fn.rpartition(":")
    return f"{Path(module).expanduser().resolve()}:{attr}" if module.endswith(".py") else fn


@dataclass(frozen=True)
class Component:
    """One resolved `reward.functions` entry."""

    name: str
    weight: float
    ref: str | None = None  # a function's import path (None for a url)
    url: str | None = None
    kwargs: dict = field(default_factory=dict)
    timeout_s: float = 5.0
    batch_size: int = 1
    retries: int = 2
    is_math: bool = False  # the built-in math checker: scored item by item, with its reasons


def components(reward_cfg) -> list[Component]:
    """The components of a validated `reward` config section."""
    out = []
    for e in reward_cfg.functions:
        if e.url is not None:
            out.append(Component(e.name, e.weight, url=e.url, kwargs=dict(e.kwargs),
                                 timeout_s=e.timeout_s or DEFAULT_URL_TIMEOUT_S,
                                 batch_size=e.batch_size or DEFAULT_URL_BATCH_SIZE, retries=e.retries))
        else:
            out.append(Component(e.name, e.weight, ref=function_ref(e.fn), kwargs=dict(e.kwargs),
                                 timeout_s=e.timeout_s or reward_cfg.timeout_s, batch_size=e.batch_size or 1,
                                 retries=e.retries, is_math=resolve_function(e.fn) is math_reward))
    return out


# ---------------------------------------------------------------------------------------------------
# Scoring a batch
# ---------------------------------------------------------------------------------------------------


@dataclass
class Scores:
    """Every component's verdict on N samples, in sample order."""

    results: list[RewardResult]  # the math checker's (or, without a math component, the total's: see Rewarder)
    values: dict[str, list[float]]  # component name -> [N] its score, 0 where it failed
    failures: dict[str, list[str]]  # component name -> [N] "", "error" or "timeout"
    logs: dict[str, list[float | None]]  # "<name>/<key>" -> [N] the named floats besides "score" (None: absent)
    total: list[float]  # [N] the weighted sum of the components
    correct: list[bool]  # [N] the math checker accepted (without a math component: total > 0)

    def select(self, rows: list[int]) -> Scores:
        pick = lambda xs: [xs[i] for i in rows]  # noqa: E731
        return Scores(pick(self.results), {k: pick(v) for k, v in self.values.items()},
                      {k: pick(v) for k, v in self.failures.items()}, {k: pick(v) for k, v in self.logs.items()},
                      pick(self.total), pick(self.correct))

    @staticmethod
    def concat(parts: list[Scores]) -> Scores:
        def join(attr: str) -> dict:
            keys = dict.fromkeys(k for p in parts for k in getattr(p, attr))
            return {k: [x for p in parts for x in getattr(p, attr).get(k, [None] * len(p.total))] for k in keys}

        return Scores([r for p in parts for r in p.results], join("values"), join("failures"), join("logs"),
                      [t for p in parts for t in p.total], [c for p in parts for c in p.correct])


def math_scores(results: list[RewardResult]) -> Scores:
    """The Scores of the math checker alone, weight 1 (the default), from its results."""
    return Scores(list(results), {"math": [r.score for r in results]},
                  {"math": [r.reason if r.reason in ("error", "timeout") else "" for r in results]}, {},
                  [r.score for r in results], [r.reason == "correct" for r in results])


def problem_fields(problem, tool_calls: int | None = None) -> dict:
    """A row's fields as reward functions get them: its other fields (`Problem.meta`), then ``id``,
    ``question`` and ``answer`` (the gold answer), and for an episode with tools ``tool_calls``, the
    calls the engine ran (its record, not the text)."""
    fields = {**problem.meta, "id": problem.id, "question": problem.question, "answer": problem.answer}
    if tool_calls is not None:
        fields["tool_calls"] = int(tool_calls)
    return fields


def score_rows(verifier, prompts: list[str], responses: list[str], problems: list, tokens: list[list[int]],
               tool_calls: list[int] | None = None) -> Scores:
    """`Rewarder.score_rows`, or for a plain verifier (anything with ``score(completions, references)``)
    the math checker alone. `tool_calls`: per row, the calls its episode ran (`RolloutBatch.tool_calls`)."""
    if isinstance(verifier, Rewarder):
        calls = tool_calls if tool_calls is not None else [None] * len(problems)
        return verifier.score_rows(prompts, responses, [problem_fields(p, c) for p, c in zip(problems, calls)], tokens)
    return math_scores(verifier.score(responses, [p.answer for p in problems]))


def component_metrics(scores: Scores, prefix: str = "reward") -> dict[str, float]:
    """``<prefix>/<name>/mean`` of every component and ``<prefix>/<name>/<key>`` of every named float
    it returned (the mean over the samples that have it)."""
    metrics = {}
    for name, values in scores.values.items():
        metrics[f"{prefix}/{name}/mean"] = math.fsum(values) / len(values) if values else 0.0
    for key, values in scores.logs.items():
        present = [v for v in values if v is not None]
        if present:
            metrics[f"{prefix}/{key}"] = math.fsum(present) / len(present)
    return metrics


def failure_counts(scores: Scores, prefix: str = "reward") -> dict[str, float]:
    """``<prefix>/<name>/errors`` and ``<prefix>/<name>/timeouts``: samples each component failed on."""
    metrics = {}
    for name, failures in scores.failures.items():
        metrics[f"{prefix}/{name}/errors"] = float(sum(f == "error" for f in failures))
        metrics[f"{prefix}/{name}/timeouts"] = float(sum(f == "timeout" for f in failures))
    return metrics


class Rewarder:
    """The configured components and the worker pool they run in.

    `score(completions, references)` is the math checker alone (the `Verifier` interface);
    `score_rows` scores with every component. `logs_components` is False for the default (the math
    checker alone, weight 1), whose metrics are the math checker's own (reward/accuracy, ...).
    """

    def __init__(self, parts: list[Component], verifier: Verifier, *, logs_components: bool = True):
        self.components, self.verifier, self.logs_components = parts, verifier, logs_components
        self.servers = {c.name: RemoteReward(c.url, timeout_s=c.timeout_s, batch_size=c.batch_size,
                                             retries=c.retries, kwargs=c.kwargs) for c in parts if c.url}

    # -- the Verifier interface ----------------------------------------------------------------------
    def score(self, completions, references) -> list[RewardResult]:
        return self.verifier.score(completions, references)

    @property
    def latex_fast_parse(self) -> bool | None:
        """`Verifier.latex_fast_parse` of the pool the components run in."""
        return self.verifier.latex_fast_parse

    def close(self) -> None:
        self.verifier.close()

    def __enter__(self) -> Rewarder:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- start-up --------------------------------------------------------------------------------------
    def check_servers(self) -> list[str]:
        """One line per reward server that nothing answers at (a TCP connection is tried)."""
        problems = []
        for c in self.components:
            if c.url:
                why = check_reachable(c.url, timeout_s=min(c.timeout_s, 5.0))
                if why:
                    problems.append(f"reward.functions ({c.name}): {c.url}: {why}; start the server or fix the url")
        return problems

    # -- scoring ---------------------------------------------------------------------------------------
    def score_rows(self, prompts: list[str], responses: list[str], fields: list[dict],
                   tokens: list[list[int]]) -> Scores:
        """Every component's scores of N samples and their weighted total. Never raises for what a
        component does (see the module docstring)."""
        n = len(responses)
        values: dict[str, list[float]] = {}
        failures: dict[str, list[str]] = {}
        logs: dict[str, list[float | None]] = {}
        results = None

        def record(name: str, i: int, value, failure: str) -> None:
            if isinstance(value, dict):
                for key, x in value.items():
                    if key != "score":
                        logs.setdefault(f"{name}/{key}", [None] * n)[i] = x
                value = value["score"]
            values[name][i] = 0.0 if value is None else float(value)
            failures[name][i] = failure if failure else ("error" if value is None else "")

        calls, owners = [], []  # the functions' calls, all components at once, so they share the workers
        for c in self.components:
            values[c.name], failures[c.name] = [0.0] * n, [""] * n
            if c.is_math:
                results = self.verifier.score(responses, [f["answer"] for f in fields])
                for i, r in enumerate(results):
                    values[c.name][i] = r.score
                    failures[c.name][i] = r.reason if r.reason in ("error", "timeout") else ""
            elif c.url:
                out = self.servers[c.name].score(prompts, responses, fields, tokens)
                for i, (value, failure) in enumerate(zip(out.values, out.failures)):
                    record(c.name, i, value, failure)
            else:
                for lo in range(0, n, c.batch_size):
                    hi = min(lo + c.batch_size, n)
                    batch = {"prompts": prompts[lo:hi], "responses": responses[lo:hi], "fields": fields[lo:hi],
                             "tokens": tokens[lo:hi]}
                    calls.append(FunctionCall(c.ref, c.kwargs, batch, c.timeout_s))
                    owners.append((c.name, lo, hi))
        for (name, lo, hi), got in zip(owners, self.verifier.call(calls) if calls else []):
            for i in range(lo, hi):
                if got.status == "ok":
                    record(name, i, got.values[i - lo], "")
                else:
                    record(name, i, None, got.status)

        weights = {c.name: c.weight for c in self.components}
        total = [math.fsum(weights[k] * values[k][i] for k in values) for i in range(n)]
        if results is None:  # no math checker: the total decides, and the answer is the final box
            results = [_total_result(t, r) for t, r in zip(total, responses)]
            correct = [t > 0 for t in total]
        else:
            correct = [r.reason == "correct" for r in results]
        return Scores(results, values, failures, logs, total, correct)


def _total_result(total: float, response: str) -> RewardResult:
    answer = extract_boxed(response) if isinstance(response, str) else None
    reason = "correct" if total > 0 else ("no_answer" if not answer else "wrong")
    return RewardResult(total, answer, reason, "weighted total of reward.functions")


def build_rewarder(reward_cfg, *, check_servers: bool = True) -> Rewarder:
    """The Rewarder of a validated `reward` config section; raises ConfigError when a reward server
    does not answer (`check_servers`), before anything else starts."""
    parts = components(reward_cfg)
    verifier = Verifier(num_workers=reward_cfg.num_workers, timeout_s=reward_cfg.timeout_s, boxed=reward_cfg.boxed,
                        checker=reward_cfg.checker)
    default = list(reward_cfg.functions) == [RewardFunctionConfig(fn=DEFAULT_REWARD_FN)]
    rewarder = Rewarder(parts, verifier, logs_components=not default)
    problems = rewarder.check_servers() if check_servers else []
    if problems:
        rewarder.close()
        raise ConfigError("\n".join(problems))
    return rewarder
