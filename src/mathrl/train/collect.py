"""Collecting a step's training samples: rollouts -> rewards (+ shaping) -> group filter (refilled
by dynamic sampling) -> sample filters (loss mask) -> the rows the step's passes read.

    got = collect_rollouts(cfg, step, train_stream=stream, engine=engine, tokenizer=tok, verifier=verifier)
    prep = prepare(cfg, got, ranks)   # prep.checks.loss_mask, prep.batch (ids and masks), prep.rows (this rank's)

Which rows a rank samples and with which seeds: shards.py. The shaping terms added to the
reward: reward/shaping.py (`SHAPING_TERMS`). What the run watches of each step: train/monitors.py.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, fields

import torch

import mathrl.train.dist as tdist
from mathrl.algo.filters import group_filter, overlong_mask
from mathrl.algo.sample_filter import sample_filter
from mathrl.config import Config
from mathrl.registry import ADVANTAGE_ESTIMATORS
from mathrl.reward.collapse import is_garbled, is_repetitive
from mathrl.reward.extract import has_final_answer
from mathrl.reward.functions import Scores, component_metrics, failure_counts, score_rows
from mathrl.reward.shaping import shape_rewards
from mathrl.reward.verify import RewardResult
from mathrl.rollout.engine import RolloutBatch, concat_rollouts
from mathrl.rollout.episodes import episode_metrics, void_turns
from mathrl.seeds import REFILL_ROUND_STRIDE, derive_seed
from mathrl.shards import group_rows, rank_pieces, shard_seed
from mathrl.tasks.base import Problem
from mathrl.tasks.sources import ProblemStream
from mathrl.train.batching import Rows
from mathrl.train.dist import Ranks

SINGLE = Ranks()  # one process


@dataclass(frozen=True)
class GroupDrops:
    """Groups dynamic sampling dropped in one step, per reason, summed over its generation rounds."""

    all_correct: int = 0
    all_wrong: int = 0
    out_of_band: int = 0

    def __add__(self, other: GroupDrops) -> GroupDrops:
        return GroupDrops(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def metrics(self) -> dict[str, float]:
        """filter/dropped_<reason>, for the log."""
        return {f"filter/dropped_{k}": float(v) for k, v in asdict(self).items()}


@dataclass(kw_only=True)
class Samples:
    """Scored samples in whole groups of rollout.n: G problems, N = G x n rows, in group order. One
    generation round's kept groups are a `Samples`; the step's, the rounds joined, a `Collected`."""

    problems: list[Problem]
    prompts_text: list[str]
    rollout: RolloutBatch | None  # None: no rows
    texts: list[str]
    results: list[RewardResult]
    rewards: torch.Tensor  # [N] the components' weighted total plus shaping terms
    correct: torch.Tensor  # [N] 1.0 where the math checker accepted the answer (no math component: total > 0)
    scores: Scores | None = None  # every component's scores of the N samples
    void: list[bool] | None = None  # [N] tool episodes whose last turn has neither a call nor an answer (`void_turns`)
    greedy_rewards: torch.Tensor | None = None  # [N] the score of the greedy response to each row's prompt (remax)

    def groups(self, keep: list[int], n: int) -> Samples:
        """The groups `keep` (indices of problems), their n rows each, in that order."""
        rows = [g * n + j for g in keep for j in range(n)]
        return Samples(problems=[self.problems[g] for g in keep], prompts_text=[self.prompts_text[g] for g in keep],
                       rollout=self.rollout.select(rows), texts=[self.texts[i] for i in rows],
                       results=[self.results[i] for i in rows], rewards=self.rewards[rows], correct=self.correct[rows],
                       scores=None if self.scores is None else self.scores.select(rows),
                       void=None if self.void is None else [self.void[i] for i in rows],
                       greedy_rewards=None if self.greedy_rewards is None else self.greedy_rewards[rows])


@dataclass(kw_only=True)
class Collected(Samples):
    """The kept groups of one step (the rounds' `Samples` joined: `joined`) and what the step logs of
    their collection."""

    metrics: dict[str, float]  # filter/*, rollout/*, reward/* of the collection, for the log
    rollout_seconds: float
    reward_seconds: float
    versions: torch.Tensor | None = None  # [N] long: the policy version that sampled each row (set by a generator, train/generators/host.py)
    drops: GroupDrops = field(default_factory=GroupDrops)  # the groups dynamic sampling dropped (the kept ones: `problems`)
    dropped: Samples | None = None  # no group kept: the first round's first groups as sampled, for rollouts.jsonl


class DynamicSamplingExhausted(RuntimeError):
    """data.dynamic_sampling.on_exhausted=error and max_rounds could not fill the batch."""


def generate_and_score(cfg: Config, prompts: list[list[int]], problems: list[Problem], *, seed: int, engine, tokenizer,
                       verifier, ranks: Ranks = SINGLE, prompts_text: list[str] | None = None,
                       greedy: bool = False) -> tuple[RolloutBatch, list[str], Scores, float, float]:
    """Sample one response per prompt and score it: (rollout, texts, scores, generation s, reward s),
    all rows in prompt order. `problems` and `prompts_text` are the rows' problems and prompt texts
    (one per prompt; the texts are what reward functions see as the prompt).

    The rows are cut into shards of rollout.batch_size, each sampled with `shard_seed(seed, shard)`;
    with several ranks each samples and scores the rows of its own groups (contiguous blocks of whole
    groups of rollout.n; `rank_pieces`) and the rows are gathered on every rank. So 1 and N processes
    draw the same samples whenever each rank's share is a multiple of rollout.batch_size, and the same
    step sees the same batch on every rank. A rank holding part of a shard samples it with a seed of
    its own (`shard_seed`'s offset): then the samples differ from one process's, drawn as independently.
    (The rule: shards.py.) With rollout.draws=row every row is seeded by (seed, its place in the
    call), so the samples depend neither on rollout.batch_size nor on the number of ranks. greedy: one
    argmax decoding per prompt (temperature 0, groups of one), ReMax's baseline.
    """
    n, temperature = (1, 0.0) if greedy else (cfg.rollout.n, cfg.rollout.temperature)
    pieces = rank_pieces(len(prompts), n, cfg.rollout.batch_size, ranks.rank, ranks.world_size)
    lo, hi = (pieces[0].start, pieces[-1].end) if pieces else (0, 0)  # this rank's rows

    def seeds(p):
        if cfg.rollout.draws == "row":
            return {"seed": seed, "first_row": p.start}
        return {"seed": shard_seed(seed, p.shard, p.offset)}

    t0 = time.time()
    shards = [
        engine.generate(
            prompts[p.start : p.end], max_new_tokens=cfg.rollout.max_new_tokens, temperature=temperature,
            top_p=cfg.rollout.top_p, **seeds(p),
        )
        for p in pieces
    ]
    rollout = concat_rollouts(shards, tokenizer.pad_token_id) if shards else None
    t1 = time.time()
    texts = tokenizer.batch_decode(rollout.response_ids, skip_special_tokens=True) if rollout is not None else []
    scores = Scores.concat([])
    if texts:
        lengths = rollout.context_lengths.tolist()  # with tools, the observations are part of the transcript
        tokens = [rollout.response_ids[i, : lengths[i]].tolist() for i in range(len(texts))]
        prompt_texts = prompts_text[lo:hi] if prompts_text is not None else tokenizer.batch_decode(prompts[lo:hi])
        calls = rollout.tool_calls.tolist() if rollout.tool_calls is not None else None  # the engine's record
        scores = score_rows(verifier, prompt_texts, texts, problems[lo:hi], tokens, calls)
    t2 = time.time()
    if ranks.world_size > 1:
        gathered = [g for g in tdist.all_gather_objects((rollout, texts, scores)) if g[0] is not None]
        rollout = concat_rollouts([g[0] for g in gathered], tokenizer.pad_token_id)
        texts = [t for g in gathered for t in g[1]]
        scores = Scores.concat([g[2] for g in gathered])
    return rollout, texts, scores, t1 - t0, t2 - t1


def kept_groups(ds, total: torch.Tensor, group_ids: torch.Tensor, correct: torch.Tensor) -> tuple[list[int], GroupDrops]:
    """The groups dynamic sampling keeps (data.dynamic_sampling `ds`; all with mode none) and the ones it
    drops, per reason. It filters on the components' total, before length shaping, so that shaping
    cannot make an all-correct group look informative."""
    if ds.mode == "none":
        return list(range(int(group_ids.max()) + 1 if len(group_ids) else 0)), GroupDrops()
    gf = group_filter(total, group_ids, mode=ds.mode, band=(ds.band_low, ds.band_high), correct=correct)
    drops = GroupDrops(all_correct=gf.dropped_all_correct, all_wrong=gf.dropped_all_wrong, out_of_band=gf.dropped_out_of_band)
    return gf.group_order[gf.keep].tolist(), drops


def collect_rollouts(cfg: Config, step: int, *, train_stream: ProblemStream, engine, tokenizer, verifier,
                     ranks: Ranks = SINGLE) -> Collected:
    """Generate, score and (with dynamic sampling) filter groups until the batch is full or
    `max_rounds` generation rounds are spent (DAPO section 3.2).

    With several ranks each generates and verifies its share of every round, and every rank then holds
    the whole round, so the filter, the refill decision and the number of rounds are the same on all
    of them (and the same as in one process).
    """
    n, want, ds = cfg.rollout.n, cfg.rollout.prompts_per_step, cfg.data.dynamic_sampling
    parts: list[Samples] = []
    kept, drops = 0, GroupDrops()
    t_gen = t_rew = 0.0
    rounds = generated_tokens = 0
    shaping: dict[str, list[float]] = {}  # each shaping term's mean, per round
    failed: dict[str, float] = {}  # reward/<name>/errors and /timeouts, summed over the rounds
    episodes = []  # (rollout, void flags) of every round with tools: tool/* count every episode sampled
    first_round: Samples | None = None  # what a step that keeps no group logs instead (log.rollouts_per_step rows)
    while kept < want and rounds < (ds.max_rounds if ds.mode != "none" else 1):
        rounds += 1
        problems, prompt_ids, prompts_text = train_stream.next_batch(want)
        rollout, texts, scores, gen_s, rew_s = generate_and_score(
            cfg, [p for p in prompt_ids for _ in range(n)], [p for p in problems for _ in range(n)],
            seed=derive_seed(cfg.seed, step + (rounds - 1) * REFILL_ROUND_STRIDE),  # round 1 keeps the plain per-step seed
            engine=engine, tokenizer=tokenizer, verifier=verifier, ranks=ranks,
            prompts_text=[t for t in prompts_text for _ in range(n)],
        )
        t_gen, t_rew = t_gen + gen_s, t_rew + rew_s
        greedy = None
        if ADVANTAGE_ESTIMATORS.get(cfg.algo.adv.estimator).needs_greedy:  # ReMax: each prompt's greedy score
            _, _, greedy_scores, gen_s, rew_s = generate_and_score(
                cfg, prompt_ids, problems, seed=derive_seed(cfg.seed, step), engine=engine, tokenizer=tokenizer,
                verifier=verifier, ranks=ranks, prompts_text=prompts_text, greedy=True)
            t_gen, t_rew = t_gen + gen_s, t_rew + rew_s
            greedy = torch.tensor(greedy_scores.total, dtype=torch.float32).repeat_interleave(n)  # [N]
            shaping.setdefault("greedy", []).append(float(greedy.mean()))  # logged as reward/greedy
        generated_tokens += int(rollout.response_lengths.sum())  # kept or not: the compute spent
        void = void_turns(rollout, tokenizer, has_answer=has_final_answer)
        episodes += [(rollout, void)] if rollout.observation_mask is not None else []
        for k, v in failure_counts(scores).items():  # every scored sample, kept or not
            failed[k] = failed.get(k, 0.0) + v
        correct = torch.tensor(scores.correct, dtype=torch.float32)  # [N]
        total = torch.tensor(scores.total, dtype=torch.float32)  # [N] the components' weighted sum
        group_ids = torch.arange(len(problems)).repeat_interleave(n)  # [N]
        train_stream.observe([p for p in problems for _ in range(n)], correct.tolist())
        rewards, term_means = shape_rewards(cfg, step, rollout.response_lengths, correct, group_ids, total=total)
        for name, mean in term_means.items():
            shaping.setdefault(name, []).append(mean)
        keep, dropped = kept_groups(ds, total, group_ids, correct)
        sampled = Samples(problems=problems, prompts_text=prompts_text, rollout=rollout, texts=texts, results=scores.results,
                          rewards=rewards, correct=correct, scores=scores, void=void, greedy_rewards=greedy)
        if first_round is None:  # enough whole groups for the log
            first_round = sampled.groups(list(range(min(len(problems), -(-cfg.log.rollouts_per_step // n)))), n)
        keep, drops = keep[: want - kept], drops + dropped
        kept += len(keep)
        parts.append(sampled.groups(keep, n))
    metrics = {"filter/kept_groups": float(kept), **drops.metrics(), "filter/gen_rounds": float(rounds),
               "rollout/generated_tokens": float(generated_tokens)}
    metrics.update({f"reward/{name}": sum(v) / len(v) for name, v in shaping.items()})
    metrics.update(episode_metrics(concat_rollouts([e[0] for e in episodes], tokenizer.pad_token_id),
                                   [v for e in episodes for v in e[1]]) if episodes else {})
    fast = getattr(verifier, "latex_fast_parse", None)  # None: the checker does not parse LaTeX this way
    if fast is not None:  # 0: the LaTeX parser patch did not fit the installed libraries (same scores, slower)
        metrics["perf/latex_fast_parse"] = float(fast)
    kept_scores = Scores.concat([p.scores for p in parts])
    if getattr(verifier, "logs_components", False):  # not the default math checker alone
        metrics.update(failed)
        if kept_scores.total:
            metrics.update(component_metrics(kept_scores))
    if kept < want and ds.mode != "none" and ds.on_exhausted == "error":
        raise DynamicSamplingExhausted(
            f"step {step}: dynamic sampling kept {kept} of {want} groups after data.dynamic_sampling.max_rounds="
            f"{ds.max_rounds} generation rounds; raise max_rounds, widen the band, or set on_exhausted=train_smaller"
        )
    return joined(parts, tokenizer.pad_token_id, metrics=metrics, rollout_seconds=t_gen, reward_seconds=t_rew,
                  scores=kept_scores, drops=drops, dropped=first_round if kept == 0 else None)


def joined(parts: list[Samples], pad_token_id: int, **rest) -> Collected:
    """The rounds' kept groups as one step's `Collected` (no group kept: empty, without a rollout)."""
    parts = [p for p in parts if p.problems]
    if not parts:
        return Collected(problems=[], prompts_text=[], rollout=None, texts=[], results=[], rewards=torch.zeros(0),
                         correct=torch.zeros(0), **rest)
    return Collected(
        problems=[x for p in parts for x in p.problems],
        prompts_text=[x for p in parts for x in p.prompts_text],
        rollout=concat_rollouts([p.rollout for p in parts], pad_token_id),
        texts=[x for p in parts for x in p.texts],
        results=[x for p in parts for x in p.results],
        rewards=torch.cat([p.rewards for p in parts]),
        correct=torch.cat([p.correct for p in parts]),
        void=[x for p in parts for x in p.void],
        greedy_rewards=None if parts[0].greedy_rewards is None else torch.cat([p.greedy_rewards for p in parts]),
        **rest,
    )


# ---- sample filters and the step's rows --------------------------------------------------------------
@dataclass(frozen=True)
class CollapseRates:
    """Shares of a step's samples that the collapse detectors flag (reward/collapse.py)."""

    repetitive: float
    garbled: float
    no_answer: float  # no extractable final answer

    def metrics(self) -> dict[str, float]:
        """collapse/<detector>, for the log."""
        return {f"collapse/{k}": v for k, v in asdict(self).items()}


@dataclass
class SampleChecks:
    """The sample filters' verdict on a step's N samples."""

    loss_mask: torch.Tensor  # [N, T] the response mask less the filtered samples' rows and overlong tokens
    collapse: CollapseRates  # measured on every step, whether or not a filter acts on it
    metrics: dict[str, float]  # collapse/* and filter/<reason> counts, for the log


def filter_samples(cfg: Config, rollout: RolloutBatch, texts: list[str], results: list[RewardResult],
                   void: list[bool] | None = None) -> SampleChecks:
    """The loss mask after the sample filter and overlong filtering, the collapse rates and the
    collapse/filter metrics.

    The collapse detectors run on every step (collapse/*), whether or not their filter is on. `void`:
    per row, a tool episode with a void last turn (`void_turns`), for the void_turn filter.
    """
    garbled = [is_garbled(t, rollout.rollout_logprobs[i][rollout.response_mask[i] > 0].tolist()) for i, t in enumerate(texts)]
    repetitive = [is_repetitive(t) for t in texts]
    no_answer = [r.reason == "no_answer" for r in results]
    collapse = CollapseRates(repetitive=sum(repetitive) / len(texts), garbled=sum(garbled) / len(texts),
                             no_answer=sum(no_answer) / len(texts))
    metrics = collapse.metrics()
    loss_mask = rollout.response_mask.clone()
    if cfg.data.sample_filter:
        sf = sample_filter(texts, no_answer=no_answer, is_repetitive=repetitive, is_garbled=garbled,
                           drop=set(cfg.data.sample_filter), void_turn=void)
        loss_mask = loss_mask * sf.keep_rows[:, None].float()
        metrics.update({f"filter/{k}": float(v) for k, v in sf.counts.items()})
    if cfg.reward.overlong.filter:
        metrics["filter/overlong"] = float(rollout.truncated.sum())
        loss_mask = overlong_mask(rollout.truncated, loss_mask)
    return SampleChecks(loss_mask=loss_mask, collapse=collapse, metrics=metrics)


@dataclass
class Prepared:
    """A step's kept samples made ready for its passes (policy scoring, critic values, updates).

    `batch` holds what is known before any pass: the N rows' token ids and masks, the loss mask,
    correctness and the sampling logprobs. The passes read it; the policy step extends it with their
    results (old and reference logprobs, advantages) into its `TrainBatch` (`train/step.py:train_batch`).
    """

    checks: SampleChecks
    batch: Rows
    rows: list[int] | None  # the rows this rank scores and trains on (whole groups); None: all, one process


def prepare(cfg: Config, got: Collected, ranks: Ranks = SINGLE) -> Prepared:
    """The sample filters over `got`'s samples, its rows as the passes read them, and this
    rank's rows (`shards.group_rows`). The policy step (train/step.py) and critic pretraining
    (train/critic.py) both start here."""
    rollout = got.rollout
    checks = filter_samples(cfg, rollout, got.texts, got.results, got.void)
    batch = Rows(**rollout.tensors(), loss_mask=checks.loss_mask, correct=got.correct)
    rows = group_rows(len(got.problems), cfg.rollout.n, ranks.rank, ranks.world_size) if ranks.distributed else None
    return Prepared(checks=checks, batch=batch, rows=rows)
