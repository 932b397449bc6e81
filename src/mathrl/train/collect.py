"""Collecting a step's training samples: rollouts -> rewards (+ shaping) -> group filter (refilled
by dynamic sampling) -> sample filters (loss mask) -> a TrainBatch.

    got = collect_rollouts(cfg, step, train_stream=stream, engine=engine, tokenizer=tok, verifier=verifier)
    loss_mask, metrics = filter_samples(cfg, got.rollout, got.texts, got.results)
    batch = new_train_batch(got.rollout, loss_mask, got.correct)
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from rich.console import Console

from mathrl.algo.filters import group_filter, overlong_mask
from mathrl.algo.sample_filter import sample_filter
from mathrl.config import Config
from mathrl.reward.collapse import is_garbled, is_repetitive
from mathrl.reward.extract import has_final_answer
from mathrl.reward.functions import Scores, component_metrics, failure_counts, score_rows
from mathrl.reward.shaping import kimi_length_penalty, length_bonus, length_schedule_reward, soft_overlong_punishment
from mathrl.reward.verify import RewardResult
from mathrl.rollout.engine import RolloutBatch, concat_rollouts, select_rollout_rows
from mathrl.rollout.episodes import episode_metrics, void_turns
from mathrl.seeds import PIECE_MODULUS, PIECE_STRIDE, REFILL_ROUND_STRIDE, SHARD_STRIDE, derive_seed
from mathrl.tasks.base import Problem
from mathrl.tasks.sources import ProblemStream
from mathrl.train import dist as tdist
from mathrl.train.batching import TrainBatch
from mathrl.train.dist import Ranks

SINGLE = Ranks()  # one process


@dataclass
class Collected:
    """The kept groups of one step: G problems, N = G x n samples."""

    problems: list[Problem]
    prompts_text: list[str]
    rollout: RolloutBatch | None
    texts: list[str]
    results: list[RewardResult]
    rewards: torch.Tensor  # [N] the components' weighted total plus shaping terms
    correct: torch.Tensor  # [N] 1.0 where the math checker accepted the answer (no math component: total > 0)
    metrics: dict[str, float]
    rollout_seconds: float
    reward_seconds: float
    scores: Scores | None = None  # every component's scores of the N samples
    versions: torch.Tensor | None = None  # [N] long: the policy version that sampled each row (set by a generator, train/generator.py)
    void: list[bool] | None = None  # [N] tool episodes whose last turn has neither a call nor an answer (`void_turns`)


class DynamicSamplingExhausted(RuntimeError):
    """data.dynamic_sampling.on_exhausted=error and max_rounds could not fill the batch."""


def shape_rewards(cfg: Config, step: int, rollout: RolloutBatch, correct: torch.Tensor, group_ids: torch.Tensor,
                  total: torch.Tensor | None = None):
    """[N] the components' weighted total (`total`; default: `correct`, the math checker alone), plus
    reward.incorrect where the answer is not correct, plus the configured length terms; and their
    per-term means for the log."""
    incorrect, base = cfg.reward.incorrect, correct if total is None else total
    r = base.clone() if incorrect == 0 else base + (1 - correct) * incorrect  # [N]
    lengths, metrics = rollout.response_lengths, {}
    shaping = cfg.reward
    if shaping.overlong.soft_punishment:
        term = soft_overlong_punishment(lengths, max_len=cfg.rollout.max_new_tokens, cache_len=shaping.overlong.cache_len)
        r, metrics["reward/overlong_penalty"] = r + term, float(term.mean())
    if shaping.kimi_length_coef:
        term = kimi_length_penalty(lengths, correct, group_ids, coef=shaping.kimi_length_coef)
        r, metrics["reward/length_penalty"] = r + term, float(term.mean())
    if shaping.length_bonus_coef:
        term = length_bonus(lengths, coef=shaping.length_bonus_coef, max_len=cfg.rollout.max_new_tokens)
        r, metrics["reward/length_bonus"] = r + term, float(term.mean())
    if shaping.length_schedule:
        schedule = [(int(a), int(b)) for a, b in shaping.length_schedule]
        term = length_schedule_reward(lengths, correct, step=step, schedule=schedule, coef=shaping.length_schedule_coef)
        r, metrics["reward/length_schedule"] = r + term, float(term.mean())
    return r, metrics


def shard_seed(seed: int, shard: int, offset: int = 0) -> int:
    """The sampling seed of rollout shard `shard` of a call seeded with `seed` (shard 0 keeps `seed`).

    offset: the first row of a rank's piece inside the shard, when a rank holds only part of it. 0 (the
    whole shard, or its first piece) keeps the one-process seed; any other offset gets a seed of its own,
    so two ranks that split one shard never replay the same random stream.
    """
    s = seed if shard == 0 else seed + shard * SHARD_STRIDE
    return s if offset == 0 else derive_seed(s, offset * PIECE_STRIDE + 1, modulus=PIECE_MODULUS)


def rank_pieces(rows: int, n: int, batch_size: int, ranks: Ranks) -> list[tuple[int, int, int, int]]:
    """The (start, end, shard, offset) pieces this rank samples: its rows (whole groups of n, a contiguous
    block in global order) cut at the shard boundaries of batch_size rows; offset is the piece's first
    row inside its shard (see `shard_seed`). One process: every shard whole, offset 0."""
    lo, hi = (g * n for g in tdist.split_range(rows // n, ranks.rank, ranks.world_size))
    pieces = []
    for start in range(0, rows, batch_size):
        a, b = max(start, lo), min(start + batch_size, hi)
        if a < b:
            pieces.append((a, b, start // batch_size, a - start))
    return pieces


def generate_and_score(cfg: Config, prompts: list[list[int]], problems: list[Problem], *, seed: int, engine, tokenizer,
                       verifier, ranks: Ranks = SINGLE,
                       prompts_text: list[str] | None = None) -> tuple[RolloutBatch, list[str], Scores, float, float]:
    """Sample one response per prompt and score it: (rollout, texts, scores, generation s, reward s),
    all rows in prompt order. `problems` and `prompts_text` are the rows' problems and prompt texts
    (one per prompt; the texts are what reward functions see as the prompt).

    The rows are cut into shards of rollout.batch_size, each sampled with `shard_seed(seed, shard)`;
    with several ranks each samples and scores the rows of its own groups (contiguous blocks of whole
    groups of rollout.n; `rank_pieces`) and the rows are gathered on every rank. So 1 and N processes
    draw the same samples whenever each rank's share is a multiple of rollout.batch_size, and the same
    step sees the same batch on every rank. A rank holding part of a shard samples it with a seed of
    its own (`shard_seed`'s offset): then the samples differ from one process's, drawn as independently.
    """
    pieces = rank_pieces(len(prompts), cfg.rollout.n, cfg.rollout.batch_size, ranks)
    lo, hi = (pieces[0][0], pieces[-1][1]) if pieces else (0, 0)  # this rank's rows
    t0 = time.time()
    shards = [
        engine.generate(
            prompts[a:b], max_new_tokens=cfg.rollout.max_new_tokens, temperature=cfg.rollout.temperature,
            top_p=cfg.rollout.top_p, seed=shard_seed(seed, shard, offset),
        )
        for a, b, shard, offset in pieces
    ]
    rollout = concat_rollouts(shards, tokenizer.pad_token_id) if shards else None
    t1 = time.time()
    texts = tokenizer.batch_decode(rollout.response_ids, skip_special_tokens=True) if rollout is not None else []
    scores = Scores.concat([])
    if texts:
        lengths = rollout.context_lengths.tolist()  # with tools, the observations are part of the transcript
        tokens = [rollout.response_ids[i, : lengths[i]].tolist() for i in range(len(texts))]
        prompt_texts = prompts_text[lo:hi] if prompts_text is not None else tokenizer.batch_decode(prompts[lo:hi])
        scores = score_rows(verifier, prompt_texts, texts, problems[lo:hi], tokens)
    t2 = time.time()
    if ranks.world_size > 1:
        gathered = [g for g in tdist.all_gather_objects((rollout, texts, scores)) if g[0] is not None]
        rollout = concat_rollouts([g[0] for g in gathered], tokenizer.pad_token_id)
        texts = [t for g in gathered for t in g[1]]
        scores = Scores.concat([g[2] for g in gathered])
    return rollout, texts, scores, t1 - t0, t2 - t1


def rank_rows(num_groups: int, n: int, ranks: Ranks) -> list[int] | None:
    """The rows (whole groups of n, a contiguous block) this rank trains on; None in one process (all)."""
    if not ranks.distributed:
        return None
    lo, hi = tdist.split_range(num_groups, ranks.rank, ranks.world_size)
    return list(range(lo * n, hi * n))


def kept_groups(ds, total: torch.Tensor, group_ids: torch.Tensor, correct: torch.Tensor, counts: dict[str, int]) -> list[int]:
    """The groups dynamic sampling keeps (data.dynamic_sampling `ds`; all with mode none), adding its drops
    to `counts`. It filters on the components' total, before length shaping, so that shaping cannot make
    an all-correct group look informative."""
    if ds.mode == "none":
        return list(range(int(group_ids.max()) + 1 if len(group_ids) else 0))
    gf = group_filter(total, group_ids, mode=ds.mode, band=(ds.band_low, ds.band_high), correct=correct)
    for k in ("dropped_all_correct", "dropped_all_wrong", "dropped_out_of_band"):
        counts[k] += getattr(gf, k)
    return gf.group_order[gf.keep].tolist()


def collect_rollouts(cfg: Config, step: int, *, train_stream: ProblemStream, engine, tokenizer, verifier,
                     ranks: Ranks = SINGLE) -> Collected:
    """Generate, score and (with dynamic sampling) filter groups until the batch is full or
    `max_rounds` generation rounds are spent (DAPO section 3.2).

    With several ranks each generates and verifies its share of every round, and every rank then holds
    the whole round, so the filter, the refill decision and the number of rounds are the same on all
    of them (and the same as in one process).
    """
    n, want, ds = cfg.rollout.n, cfg.rollout.prompts_per_step, cfg.data.dynamic_sampling
    parts, kept, counts = [], 0, {"kept_groups": 0, "dropped_all_correct": 0, "dropped_all_wrong": 0, "dropped_out_of_band": 0}
    t_gen = t_rew = 0.0
    rounds = generated_tokens = 0
    shaping_metrics: dict[str, list[float]] = {}
    failed: dict[str, float] = {}  # reward/<name>/errors and /timeouts, summed over the rounds
    episodes = []  # (rollout, void flags) of every round with tools: tool/* count every episode sampled
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
        generated_tokens += int(rollout.response_lengths.sum())  # kept or not: the compute spent
        void = void_turns(rollout, tokenizer, has_answer=has_final_answer)
        episodes += [(rollout, void)] if rollout.observation_mask is not None else []
        results = scores.results
        for k, v in failure_counts(scores).items():  # every scored sample, kept or not
            failed[k] = failed.get(k, 0.0) + v
        correct = torch.tensor(scores.correct, dtype=torch.float32)  # [N]
        total = torch.tensor(scores.total, dtype=torch.float32)  # [N] the components' weighted sum
        group_ids = torch.arange(len(problems)).repeat_interleave(n)  # [N]
        train_stream.observe([p for p in problems for _ in range(n)], correct.tolist())
        rewards, shaped = shape_rewards(cfg, step, rollout, correct, group_ids, total=total)
        for k, v in shaped.items():
            shaping_metrics.setdefault(k, []).append(v)
        keep = kept_groups(ds, total, group_ids, correct, counts)[: want - kept]
        kept += len(keep)
        rows = [g * n + j for g in keep for j in range(n)]
        parts.append(([problems[g] for g in keep], [prompts_text[g] for g in keep], select_rollout_rows(rollout, rows),
                      [texts[i] for i in rows], [results[i] for i in rows], rewards[rows], correct[rows],
                      scores.select(rows), [void[i] for i in rows]))
    counts["kept_groups"] = kept
    metrics = {f"filter/{k}": float(v) for k, v in counts.items()}
    metrics["filter/gen_rounds"] = float(rounds)
    metrics["rollout/generated_tokens"] = float(generated_tokens)
    metrics.update({k: sum(v) / len(v) for k, v in shaping_metrics.items()})
    metrics.update(episode_metrics(concat_rollouts([e[0] for e in episodes], tokenizer.pad_token_id),
                                   [v for e in episodes for v in e[1]]) if episodes else {})
    kept_scores = Scores.concat([p[7] for p in parts])
    if getattr(verifier, "logs_components", False):  # not the default math checker alone
        metrics.update(failed)
        if kept_scores.total:
            metrics.update(component_metrics(kept_scores))
    if kept < want and ds.mode != "none" and ds.on_exhausted == "error":
        raise DynamicSamplingExhausted(
            f"step {step}: dynamic sampling kept {kept} of {want} groups after data.dynamic_sampling.max_rounds="
            f"{ds.max_rounds} generation rounds; raise max_rounds, widen the band, or set on_exhausted=train_smaller"
        )
    parts = [p for p in parts if p[0]]
    if not parts:
        return Collected([], [], None, [], [], torch.zeros(0), torch.zeros(0), metrics, t_gen, t_rew, kept_scores)
    return Collected(
        problems=[x for p in parts for x in p[0]],
        prompts_text=[x for p in parts for x in p[1]],
        rollout=concat_rollouts([p[2] for p in parts], tokenizer.pad_token_id),
        texts=[x for p in parts for x in p[3]],
        results=[x for p in parts for x in p[4]],
        rewards=torch.cat([p[5] for p in parts]),
        correct=torch.cat([p[6] for p in parts]),
        metrics=metrics, rollout_seconds=t_gen, reward_seconds=t_rew, scores=kept_scores,
        void=[x for p in parts for x in p[8]],
    )


def filter_samples(cfg: Config, rollout: RolloutBatch, texts: list[str], results: list[RewardResult],
                   void: list[bool] | None = None):
    """Loss mask [N, T] after the sample filter and overlong filtering, and the collapse/filter metrics.

    The collapse detectors run on every step (collapse/*), whether or not their filter is on. `void`:
    per row, a tool episode with a void last turn (`void_turns`), for the void_turn filter.
    """
    lengths = rollout.response_lengths.tolist()
    garbled = [is_garbled(t, rollout.logprobs[i][rollout.response_mask[i] > 0].tolist()) for i, t in enumerate(texts)]
    repetitive = [is_repetitive(t) for t in texts]
    no_answer = [r.reason == "no_answer" for r in results]
    metrics = {
        "collapse/repetitive": sum(repetitive) / len(texts),
        "collapse/garbled": sum(garbled) / len(texts),
        "collapse/no_answer": sum(no_answer) / len(texts),
    }
    loss_mask = rollout.response_mask.clone()
    if cfg.data.sample_filter:
        sf = sample_filter(texts, no_answer=no_answer, is_repetitive=repetitive, is_garbled=garbled,
                           drop=set(cfg.data.sample_filter), void_turn=void)
        loss_mask = loss_mask * sf.keep_rows[:, None].float()
        metrics.update({f"filter/{k}": float(v) for k, v in sf.counts.items()})
    if cfg.reward.overlong.filter:
        metrics["filter/overlong"] = float(rollout.truncated.sum())
        loss_mask = overlong_mask(rollout.truncated, loss_mask)
    return loss_mask, metrics


class CollapseWatch:
    """Warns when a collapse rate jumps: above 0.1 and at least twice its running average."""

    def __init__(self, decay: float = 0.9):
        self.decay, self.avg = decay, {}

    def check(self, step: int, metrics: dict[str, float], console: Console) -> None:
        for key in ("collapse/repetitive", "collapse/garbled", "collapse/no_answer"):
            if key not in metrics:
                continue
            value, avg = metrics[key], self.avg.get(key)
            if avg is not None and value > 0.1 and value > 2 * avg:
                console.print(f"[yellow]warning:[/yellow] step {step}: {key} jumped to {value:.2f} (running average {avg:.2f})")
            self.avg[key] = value if avg is None else self.decay * avg + (1 - self.decay) * value


class NoSignalError(RuntimeError):
    """Too many consecutive steps in which no group of samples had a reward signal to learn from."""


@dataclass
class SignalWatch:
    """Consecutive steps without a learning signal, and what the run says about them.

    A group-normalised advantage is 0 for a group whose n samples are all right or all wrong, so a step
    in which every group is like that moves nothing. With dynamic sampling such a step keeps no group
    and trains nothing; after `data.dynamic_sampling.max_empty_steps` of them in a row the run stops
    with the reason (almost always: the model solves none of the problems) and what to try. With
    `data.dynamic_sampling.mode: none` every group trains by request (and KL, entropy or a critic may
    still move the weights), so the same streak is a warning, not a stop.
    """

    in_a_row: int = 0
    first: int = 0  # the streak's first step
    groups: int = 0  # groups sampled in the streak
    all_wrong: int = 0
    all_correct: int = 0
    n: int = 1  # samples per group
    warned: bool = False

    def record(self, step: int, metrics: dict[str, float], *, n: int) -> None:
        if metrics["filter/kept_groups"] == 0:  # dynamic sampling dropped every group it sampled
            wrong, right = int(metrics["filter/dropped_all_wrong"]), int(metrics["filter/dropped_all_correct"])
            groups = wrong + right + int(metrics["filter/dropped_out_of_band"])
        elif metrics.get("rollout/all_wrong_groups", 0.0) + metrics.get("rollout/all_correct_groups", 0.0) >= 1.0:
            groups = int(metrics["filter/kept_groups"])  # every kept group all right or all wrong (mode none)
            wrong = round(metrics["rollout/all_wrong_groups"] * groups)
            right = groups - wrong
        else:
            self.in_a_row, self.warned = 0, False
            return
        if self.in_a_row == 0:
            self.first, self.groups, self.all_wrong, self.all_correct = step, 0, 0, 0
        self.in_a_row += 1
        self.groups, self.all_wrong, self.all_correct = self.groups + groups, self.all_wrong + wrong, self.all_correct + right
        self.n = n

    def explain(self, step: int, cfg: Config) -> str:
        """What the streak was, why nothing could be learnt, and what to do."""
        steps = f"steps {self.first}-{step}" if step > self.first else f"step {step}"
        samples = self.groups * self.n
        fix_data = (f"check the prompt template and the answer fields first (`mathrl eval {cfg.model.path} --data "
                    f"{cfg.data.train}` with this run's data.* settings scores the model on these problems: pass@1 0 "
                    "there means the same); then use easier problems, or start from a model fine-tuned on worked "
                    "solutions (`mathrl sft`); see docs/your_data.md")
        if self.all_wrong == self.groups:
            why = (f"every one of the {samples} samples ({self.groups} groups of {self.n}) was wrong (reward 0): the model "
                   "solves none of these problems, so no group had a signal to learn from")
            todo = fix_data
        elif self.all_correct == self.groups:
            why = (f"every one of the {samples} samples ({self.groups} groups of {self.n}) was right: these problems are "
                   "too easy to learn from")
            todo = "use harder problems"
        else:
            rest = self.groups - self.all_wrong - self.all_correct
            why = (f"no group had a signal: of {self.groups} groups of {self.n} samples {self.all_wrong} had every sample wrong, "
                   f"{self.all_correct} every sample right" + (f", {rest} an accuracy outside the band" if rest else ""))
            todo = ("widen data.dynamic_sampling's band" if rest else
                    "use problems the model solves some of the time, or more samples per problem (rollout.n)")
        what = "had no reward signal" if cfg.data.dynamic_sampling.mode == "none" else "trained nothing"
        return f"{steps} {what}: {why}. To fix: {todo}"

    def check(self, step: int, cfg: Config, console: Console, *, main: bool = True) -> None:
        """Stop (dynamic sampling on) or warn once (mode none) after max_empty_steps steps in a row; 0: never.
        Every rank of a torchrun job stops at the same step (the metrics are the whole batch's); `main`
        False marks the error as rank 0's to report."""
        limit = cfg.data.dynamic_sampling.max_empty_steps
        if not limit or self.in_a_row < limit:
            return
        if cfg.data.dynamic_sampling.mode != "none":
            error = NoSignalError(self.explain(step, cfg) + f" (the run stops after data.dynamic_sampling.max_empty_steps={limit} "
                                "such steps in a row)")
            if not main:
                error.reported_by_rank_0 = True
            raise error
        if not self.warned:
            self.warned = True
            console.print(f"[yellow]warning:[/yellow] {self.explain(step, cfg)}; the policy gradient is 0 while this lasts")


def new_train_batch(rollout: RolloutBatch, loss_mask: torch.Tensor, correct: torch.Tensor) -> TrainBatch:
    """A TrainBatch of the rollout's rows; the scoring passes and advantages fill the zero fields."""
    zeros = torch.zeros_like(rollout.logprobs)
    return TrainBatch(
        prompt_ids=rollout.prompt_ids, prompt_mask=rollout.prompt_mask, response_ids=rollout.response_ids,
        response_mask=rollout.response_mask, loss_mask=loss_mask, old_logprobs=zeros, advantages=zeros.clone(),
        ref_logprobs=zeros.clone(), ref_entropy=zeros.clone(), correct=correct, rollout_logprobs=rollout.logprobs,
        observation_mask=rollout.observation_mask,
    )


def rollout_records(step, problems, prompts_text, texts, results, rollout: RolloutBatch, tokenizer, n: int, limit: int,
                    scores: Scores | None = None):
    """The first `limit` samples of a step, with per-token ids, strings and logprobs, for rollouts.jsonl;
    with `scores`, each sample's component scores too."""
    records = []
    for i in range(min(limit, len(texts))):
        length = int(rollout.context_mask[i].sum())
        ids = rollout.response_ids[i, :length].tolist()
        records.append({
            "step": step,
            "problem_id": problems[i // n].id,
            "prompt": prompts_text[i // n],
            "response": texts[i],
            "answer": problems[i // n].answer,
            "reward": results[i].score,
            "reason": results[i].reason,
            "extracted": results[i].extracted,
            "token_ids": ids,
            "tokens": tokenizer.convert_ids_to_tokens(ids),
            "logprobs": [round(x, 5) for x in rollout.logprobs[i, :length].tolist()],
            "truncated": bool(rollout.truncated[i]),
        })
        if rollout.observation_mask is not None:  # which tokens a tool wrote (mathrl inspect shows them apart)
            records[-1]["observation"] = [int(x) for x in rollout.observation_mask[i, :length].tolist()]
            records[-1]["tool_calls"] = int(rollout.tool_calls[i])
        if scores is not None:
            records[-1]["components"] = {name: values[i] for name, values in scores.values.items()}
    return records
