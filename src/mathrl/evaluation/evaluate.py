"""Evaluate a policy on a problem set: n samples per problem, avg@n, unbiased pass@k, maj@k.

Uses the same rollout engine and verifier as training, so a training-time eval and `mathrl eval`
measure the same thing. With reward components beyond the math checker (`reward.functions`; a
`reward.functions.Rewarder` as the verifier) every component scores every sample too, reported as
`eval/<set>/reward/<name>/mean`; pass@1 stays the math checker's verdict. On a set whose gold answers
are not all integers, `eval/<set>/integer_answer_rate` is the share of samples that box an integer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mathrl.evaluation.metrics import answer_forms, avg_at_n, default_ks, maj_at_k, pass_at_k_table
from mathrl.reward.extract import has_final_answer
from mathrl.reward.functions import Rewarder, Scores, component_metrics, failure_counts, score_rows
from mathrl.reward.numeric import answer_form
from mathrl.reward.reflection import reflection_stats
from mathrl.reward.verify import RewardResult, Verifier
from mathrl.rollout.base import RolloutBatch, concat_rollouts
from mathrl.rollout.episodes import episode_metrics, void_turns
from mathrl.shards import block_rows
from mathrl.tasks.base import Problem


@dataclass
class EvalResult:
    name: str
    n: int  # samples per problem
    num_problems: int
    pass_at_1: float  # avg@n: pass@1 averaged over the n samples of each problem
    pass_at_k: dict[int, float]  # unbiased estimator, k = 1, 2, 4, ... <= n
    maj_at_n: float
    no_answer_rate: float  # share of samples with no extractable \boxed{} answer
    truncated_rate: float  # share of samples that hit the length limit
    mean_response_length: float  # tokens
    reflection_rate: float = 0.0  # share of samples with a reflection marker (log.reflection_words)
    integer_answer_rate: float | None = None  # share of samples whose boxed answer is written as an integer (None: every gold answer is one)
    rewards: dict[str, float] | None = None  # each reward component's <name>/mean, /errors, /timeouts (None: the math checker alone)
    samples: list[dict] = field(default_factory=list, repr=False)
    tools: dict[str, float] | None = None  # with rollout.tools: tool/* and rollout/turns_* of the set's episodes (docs/metrics.md)
    problem_pass_at_1: list[float] = field(default_factory=list, repr=False)  # each problem's fraction of its n samples correct, in problem order

    def metrics(self, prefix: str) -> dict[str, float]:
        out = {f"{prefix}/pass@1": self.pass_at_1, f"{prefix}/maj@{self.n}": self.maj_at_n}
        out.update({f"{prefix}/pass@{k}": v for k, v in self.pass_at_k.items() if k > 1})
        out[f"{prefix}/no_answer_rate"] = self.no_answer_rate
        out[f"{prefix}/truncated_rate"] = self.truncated_rate
        out[f"{prefix}/response_length"] = self.mean_response_length
        out[f"{prefix}/reflection_rate"] = self.reflection_rate
        if self.integer_answer_rate is not None:
            out[f"{prefix}/integer_answer_rate"] = self.integer_answer_rate
        out.update({f"{prefix}/reward/{k}": v for k, v in (self.rewards or {}).items()})
        out.update({f"{prefix}/{k}": v for k, v in (self.tools or {}).items()})  # eval/<set>/tool/call_rate, ...
        return out


def _single(obj):
    return [obj]


@dataclass
class Sampled:
    """Sampled and scored rows of an evaluation, in row order (problem-major: n per problem)."""

    texts: list[str] = field(default_factory=list)
    results: list[RewardResult] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)  # response tokens
    truncated: list[bool] = field(default_factory=list)
    scores: Scores | None = None  # every reward component's (reward.functions beyond the math checker)
    episodes: tuple[RolloutBatch, list[bool]] | None = None  # with tools: the rollout and its void-turn flags


def evaluate(
    name: str,
    problems: Sequence[Problem],
    prompts: Sequence[list[int]],
    *,
    engine,
    tokenizer,
    verifier: Verifier | Rewarder,
    n: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    seed: int,
    reflection_words: Sequence[str] = (),
    rank: int = 0,
    world_size: int = 1,
    gather: Callable[[Any], list[Any]] = _single,
) -> EvalResult:
    """Sample n responses for each (problem, prompt token ids) and score them.

    Several ranks (`rank` of `world_size`, every rank calling): each samples and verifies its own
    block of the rows (`shards.py:block_rows`: whole seed blocks of the engine) and `gather` (an
    all-gather of Python objects, rank order) brings every row to every rank, so each returns the
    whole result, equal to one process's.
    """
    flat_prompts = [p for p in prompts for _ in range(n)]
    flat_problems = [p for p in problems for _ in range(n)]
    # an engine that does not say how its rows share random streams is sampled whole, on rank 0
    block = getattr(engine, "seed_block", len(flat_prompts)) if world_size > 1 else len(flat_prompts)
    lo, hi = block_rows(len(flat_prompts), max(block, 1), rank, world_size)
    sampled = sample_rows(flat_prompts[lo:hi], flat_problems[lo:hi], first_row=lo, engine=engine, tokenizer=tokenizer,
                          verifier=verifier, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed)
    if world_size > 1:
        sampled = gathered(gather(sampled), components=getattr(verifier, "logs_components", False),
                           pad_token_id=tokenizer.pad_token_id)
    return eval_result(name, problems, sampled, n=n, reflection_words=reflection_words)


def sample_rows(prompts: list[list[int]], problems: list[Problem], *, first_row: int, engine, tokenizer,
                verifier: Verifier | Rewarder, max_new_tokens: int, temperature: float, top_p: float, seed: int) -> Sampled:
    """Sample one response per prompt and score it; the prompts are rows first_row, ... of the whole
    call (their place sets their seeds) and `problems` their problems, one per row."""
    if not prompts:
        return Sampled()
    offset = {"first_row": first_row} if first_row else {}  # the rows' place in the whole call, for their seeds
    out = engine.generate(prompts, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed,
                          **offset)
    texts = tokenizer.batch_decode(out.response_ids, skip_special_tokens=True)
    sampled = Sampled(texts=texts, lengths=out.response_lengths.tolist(), truncated=out.truncated.tolist())
    if out.observation_mask is not None:
        sampled.episodes = (out, void_turns(out, tokenizer, has_answer=has_final_answer))
    if getattr(verifier, "logs_components", False):  # reward.functions beyond the math checker: every component scores every sample
        context = out.context_lengths.tolist()
        tokens = [out.response_ids[i, : context[i]].tolist() for i in range(len(texts))]
        prompt_texts = tokenizer.batch_decode(prompts, skip_special_tokens=True)
        calls = out.tool_calls.tolist() if out.tool_calls is not None else None  # the engine's record
        sampled.scores = score_rows(verifier, prompt_texts, texts, problems, tokens, calls)
        sampled.results = sampled.scores.results
    else:
        sampled.results = verifier.score(texts, [p.answer for p in problems])
    return sampled


def gathered(parts: list[Sampled], *, components: bool, pad_token_id: int) -> Sampled:
    """Every rank's `Sampled`, in rank order, as one."""
    episodes = [p.episodes for p in parts if p.episodes is not None]
    return Sampled(
        texts=[x for p in parts for x in p.texts],
        results=[x for p in parts for x in p.results],
        lengths=[x for p in parts for x in p.lengths],
        truncated=[x for p in parts for x in p.truncated],
        scores=Scores.concat([p.scores for p in parts if p.scores is not None]) if components else None,
        episodes=(concat_rollouts([e[0] for e in episodes], pad_token_id), [v for e in episodes for v in e[1]]) if episodes else None,
    )


def eval_result(name: str, problems: Sequence[Problem], sampled: Sampled, *, n: int,
                reflection_words: Sequence[str] = ()) -> EvalResult:
    """The set's numbers from its samples (n per problem, in problem order)."""
    texts, results, scores = sampled.texts, sampled.results, sampled.scores
    correct = [[results[i * n + j].score > 0 for j in range(n)] for i in range(len(problems))]
    answers = [[_vote_key(results[i * n + j].extracted) for j in range(n)] for i in range(len(problems))]
    first = [  # the first sample of each problem
        {"problem_id": problems[i // n].id, "response": texts[i], "reason": results[i].reason, "extracted": results[i].extracted}
        for i in range(0, len(texts), n)
    ]
    return EvalResult(
        name=name,
        n=n,
        num_problems=len(problems),
        pass_at_1=avg_at_n(correct),
        pass_at_k=pass_at_k_table(correct, default_ks(n)),
        maj_at_n=maj_at_k(answers, correct, n),
        no_answer_rate=sum(r.reason == "no_answer" for r in results) / len(results),
        truncated_rate=sum(sampled.truncated) / len(sampled.truncated),
        mean_response_length=sum(sampled.lengths) / len(sampled.lengths),
        reflection_rate=reflection_stats(texts, reflection_words)["reflection_rate"],
        integer_answer_rate=integer_answer_rate(texts, [p.answer for p in problems]),
        rewards={**{k.removeprefix("reward/"): v for k, v in component_metrics(scores).items()},
                 **{k.removeprefix("reward/"): v for k, v in failure_counts(scores).items()}} if scores else None,
        samples=first,
        tools=episode_metrics(*sampled.episodes) if sampled.episodes else None,
        problem_pass_at_1=[sum(row) / n for row in correct],
    )


def integer_answer_rate(completions: Sequence[str], golds: Sequence[str]) -> float | None:
    """Share of `completions` whose final boxed answer is written as an integer (`answer_forms`), or None
    when every gold answer is written as one (then the share says nothing: integer answers are right).
    On decimal golds (data.eval arith_decimal) it shows the integer-answer transform's hack: the model
    boxing `16` where its columns give 16.2."""
    if all(answer_form(g) == "integer" for g in golds):
        return None
    return answer_forms(completions)["integer"]


def _vote_key(answer: str | None) -> str | None:
    """Answers that differ only in spacing, `$` signs or a trailing `.0` vote together in maj@k."""
    if answer is None:
        return None
    key = answer.replace(" ", "").replace("$", "").strip()
    if key.endswith(".0") and key[:-2].lstrip("-").isdigit():
        key = key[:-2]
    return key
