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
from mathrl.reward.shaping import kimi_length_penalty, length_bonus, length_schedule_reward, soft_overlong_punishment
from mathrl.reward.verify import RewardResult
from mathrl.rollout.engine import RolloutBatch, concat_rollouts, select_rollout_rows
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
    rewards: torch.Tensor  # [N] verifier score plus shaping terms
    correct: torch.Tensor  # [N] 1.0 where the verifier accepted the answer
    metrics: dict[str, float]
    rollout_seconds: float
    reward_seconds: float
    versions: torch.Tensor | None = None  # [N] long: the policy version that sampled each row (set by a generator, train/generator.py)


class DynamicSamplingExhausted(RuntimeError):
    """data.dynamic_sampling.on_exhausted=error and max_rounds could not fill the batch."""


def shape_rewards(cfg: Config, step: int, rollout: RolloutBatch, correct: torch.Tensor, group_ids: torch.Tensor):
    """[N] verifier score (1 right, reward.incorrect otherwise) + the configured length terms, and their
    per-term means for the log."""
    incorrect = cfg.reward.incorrect
    r = correct.clone() if incorrect == 0 else correct + (1 - correct) * incorrect  # [N]
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


def generate_and_score(cfg: Config, prompts: list[list[int]], answers: list[str], *, seed: int, engine, tokenizer,
                       verifier, ranks: Ranks = SINGLE) -> tuple[RolloutBatch, list[str], list[RewardResult], float, float]:
    """Sample one response per prompt and verify it: (rollout, texts, results, generation s, reward s),
    all rows in prompt order.

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
    results = verifier.score(texts, answers[lo:hi]) if texts else []
    t2 = time.time()
    if ranks.world_size > 1:
        gathered = [g for g in tdist.all_gather_objects((rollout, texts, results)) if g[0] is not None]
        rollout = concat_rollouts([g[0] for g in gathered], tokenizer.pad_token_id)
        texts = [t for g in gathered for t in g[1]]
        results = [r for g in gathered for r in g[2]]
    return rollout, texts, results, t1 - t0, t2 - t1


def rank_rows(num_groups: int, n: int, ranks: Ranks) -> list[int] | None:
    """The rows (whole groups of n, a contiguous block) this rank trains on; None in one process (all)."""
    if not ranks.distributed:
        return None
    lo, hi = tdist.split_range(num_groups, ranks.rank, ranks.world_size)
    return list(range(lo * n, hi * n))


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
    rounds, generated_tokens = 0, 0
    shaping_metrics: dict[str, list[float]] = {}
    while kept < want and rounds < (ds.max_rounds if ds.mode != "none" else 1):
        rounds += 1
        problems, prompt_ids, prompts_text = train_stream.next_batch(want)
        rollout, texts, results, gen_s, rew_s = generate_and_score(
            cfg, [p for p in prompt_ids for _ in range(n)], [p.answer for p in problems for _ in range(n)],
            seed=derive_seed(cfg.seed, step + (rounds - 1) * REFILL_ROUND_STRIDE),  # round 1 keeps the plain per-step seed
            engine=engine, tokenizer=tokenizer, verifier=verifier, ranks=ranks,
        )
        t_gen, t_rew = t_gen + gen_s, t_rew + rew_s
        generated_tokens += int(rollout.response_lengths.sum())  # kept or not: the compute spent
        correct = torch.tensor([r.reason == "correct" for r in results], dtype=torch.float32)  # [N]
        group_ids = torch.arange(len(problems)).repeat_interleave(n)  # [N]
        train_stream.observe([p for p in problems for _ in range(n)], correct.tolist())
        rewards, shaped = shape_rewards(cfg, step, rollout, correct, group_ids)
        for k, v in shaped.items():
            shaping_metrics.setdefault(k, []).append(v)
        if ds.mode == "none":
            keep = list(range(len(problems)))
        else:  # filter on correctness, so length shaping cannot make an all-correct group look informative
            gf = group_filter(correct, group_ids, mode=ds.mode, band=(ds.band_low, ds.band_high), correct=correct)
            for k in ("dropped_all_correct", "dropped_all_wrong", "dropped_out_of_band"):
                counts[k] += getattr(gf, k)
            keep = gf.group_order[gf.keep].tolist()
        keep = keep[: want - kept]
        kept += len(keep)
        rows = [g * n + j for g in keep for j in range(n)]
        parts.append(([problems[g] for g in keep], [prompts_text[g] for g in keep], select_rollout_rows(rollout, rows),
                      [texts[i] for i in rows], [results[i] for i in rows], rewards[rows], correct[rows]))
    counts["kept_groups"] = kept
    metrics = {f"filter/{k}": float(v) for k, v in counts.items()}
    metrics["filter/gen_rounds"] = float(rounds)
    metrics["rollout/generated_tokens"] = float(generated_tokens)
    metrics.update({k: sum(v) / len(v) for k, v in shaping_metrics.items()})
    if kept < want and ds.mode != "none" and ds.on_exhausted == "error":
        raise DynamicSamplingExhausted(
            f"step {step}: dynamic sampling kept {kept} of {want} groups after data.dynamic_sampling.max_rounds="
            f"{ds.max_rounds} generation rounds; raise max_rounds, widen the band, or set on_exhausted=train_smaller"
        )
    parts = [p for p in parts if p[0]]
    if not parts:
        return Collected([], [], None, [], [], torch.zeros(0), torch.zeros(0), metrics, t_gen, t_rew)
    return Collected(
        problems=[x for p in parts for x in p[0]],
        prompts_text=[x for p in parts for x in p[1]],
        rollout=concat_rollouts([p[2] for p in parts], tokenizer.pad_token_id),
        texts=[x for p in parts for x in p[3]],
        results=[x for p in parts for x in p[4]],
        rewards=torch.cat([p[5] for p in parts]),
        correct=torch.cat([p[6] for p in parts]),
        metrics=metrics, rollout_seconds=t_gen, reward_seconds=t_rew,
    )


def filter_samples(cfg: Config, rollout: RolloutBatch, texts: list[str], results: list[RewardResult]):
    """Loss mask [N, T] after the sample filter and overlong filtering, and the collapse/filter metrics.

    The collapse detectors run on every step (collapse/*), whether or not their filter is on.
    """
    lengths = rollout.response_lengths.tolist()
    garbled = [is_garbled(t, rollout.logprobs[i, : lengths[i]].tolist()) for i, t in enumerate(texts)]
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
                           drop=set(cfg.data.sample_filter))
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


def new_train_batch(rollout: RolloutBatch, loss_mask: torch.Tensor, correct: torch.Tensor) -> TrainBatch:
    """A TrainBatch of the rollout's rows; the scoring passes and advantages fill the zero fields."""
    zeros = torch.zeros_like(rollout.logprobs)
    return TrainBatch(
        prompt_ids=rollout.prompt_ids, prompt_mask=rollout.prompt_mask, response_ids=rollout.response_ids,
        response_mask=rollout.response_mask, loss_mask=loss_mask, old_logprobs=zeros, advantages=zeros.clone(),
        ref_logprobs=zeros.clone(), ref_entropy=zeros.clone(), correct=correct, rollout_logprobs=rollout.logprobs,
    )


def rollout_records(step, problems, prompts_text, texts, results, rollout: RolloutBatch, tokenizer, n: int, limit: int):
    """The first `limit` samples of a step, with per-token ids, strings and logprobs, for rollouts.jsonl."""
    records = []
    for i in range(min(limit, len(texts))):
        length = int(rollout.response_mask[i].sum())
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
    return records
