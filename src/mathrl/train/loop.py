"""The RL loop, top to bottom: problems -> rollout -> reward -> advantages -> scoring -> updates -> log.

    mathrl train                                   # the embedded default (tiny model, arithmetic)
    mathrl train rollout.n=16 algo.clip.eps_high=0.2

One call of `train(cfg)` runs a whole experiment and writes its run directory:
    config.yaml       the resolved config
    metrics.jsonl     one JSON object per step (names in docs/metrics.md)
    rollouts.jsonl    a sample of each step's rollouts with per-token logprobs
    evals.jsonl       every evaluation, with pass@k tables
    checkpoints/      step_<N>/ Hugging Face directories (train.save_every), with critic/ for PPO
    final/            the trained model (Hugging Face format), with critic/ for PPO
    summary.json      base vs final held-out scores and wall time
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console

from mathrl.algo.advantages import expand_to_tokens, group_advantages, rloo_advantages, whiten_advantages
from mathrl.algo.critic import explained_variance, gae, length_adaptive_lambda, value_loss
from mathrl.algo.controllers import (
    AdaptiveEntropyController,
    AdaptiveKLController,
    CoefController,
    FixedCoef,
    SkyworkEntropyController,
)
from mathrl.algo.entropy import entropy_bonus_mask
from mathrl.algo.filters import group_filter, overlong_mask
from mathrl.algo.kl import apply_kl_reward_penalty, kl_penalty
from mathrl.algo.losses import aggregate, dp_scale, global_counts, policy_loss, positive_example_lm_loss
from mathrl.algo.sample_filter import sample_filter
from mathrl.analysis.collapse import is_garbled, is_repetitive
from mathrl.config import Config, dump_yaml, to_dict
from mathrl.evaluation.evaluate import EvalResult, evaluate
from mathrl.model.io import load_model_and_tokenizer, save_model
from mathrl.model.scoring import next_token_logprobs, response_logprobs
from mathrl.model.value import load_critic, response_values
from mathrl.reward.shaping import kimi_length_penalty, length_bonus, length_schedule_reward, soft_overlong_punishment
from mathrl.reward.verify import RewardResult, Verifier
from mathrl.rollout.engine import RolloutBatch, TorchEngine, concat_rollouts, select_rollout_rows
from mathrl.tasks.base import Problem
from mathrl.tasks.sources import (
    EvalSet,
    PretrainText,
    ProblemStream,
    build_eval_sets,
    build_train_stream,
    resolve_model_path,
)
from mathrl.track.console import StepProgress, summary_table
from mathrl.track.sinks import Tracker
from mathrl.train.batching import TrainBatch, micro_batch_slices, micro_batches, row_lengths
from mathrl.train.checkpoint import latest_checkpoint, save_checkpoint, set_rng_state, truncate_jsonl


@dataclass
class TrainResult:
    run_dir: Path
    base: dict[str, EvalResult]
    final: dict[str, EvalResult]
    wall_seconds: float


def prepare_run_dir(cfg: Config, *, resume: bool, console: Console) -> tuple[Path, Path | None]:
    """(run_dir, checkpoint to resume from or None). Never overwrites a run silently.

    An existing run is resumed from its last complete checkpoint; with resume=False (`--no-resume`)
    its files are moved aside to `<run_dir>.replaced-<timestamp>` and a new run starts.
    """
    run_dir = Path(cfg.run_dir or Path("runs") / time.strftime("%Y%m%d-%H%M%S"))
    has_run = (run_dir / "metrics.jsonl").exists()
    if has_run and not resume:
        aside = run_dir.with_name(f"{run_dir.name}.replaced-{time.strftime('%Y%m%d-%H%M%S')}")
        run_dir.rename(aside)
        console.print(f"--no-resume: the previous run was moved to {aside}")
        has_run = False
    checkpoint = None
    if has_run:
        if (run_dir / "summary.json").exists() and (run_dir / "final").exists():
            raise RunComplete(f"run directory {run_dir} holds a finished run; use --no-resume to start over "
                              "(the old run is kept aside) or choose another --run-dir")
        checkpoint = latest_checkpoint(run_dir / "checkpoints")
        if checkpoint is None:
            raise FileExistsError(
                f"run directory {run_dir} already holds a run, with no complete checkpoint to resume from; "
                "use --no-resume to start over (the old run is kept aside) or choose another --run-dir"
            )
        old = (run_dir / "config.yaml").read_text() if (run_dir / "config.yaml").exists() else ""
        if old and old != dump_yaml(cfg):
            console.print(f"[yellow]warning:[/yellow] the config differs from the one {run_dir} was started with; "
                          "resuming with the new one (the old one is kept as config.previous.yaml)")
            (run_dir / "config.previous.yaml").write_text(old)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(dump_yaml(cfg))
    return run_dir, checkpoint


class RunComplete(Exception):
    """The run directory already holds a finished run."""


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % 2**32)
    except ImportError:  # pragma: no cover
        pass


def compute_advantages(cfg: Config, rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """[N] sequence-level advantages for the configured estimator (algo.adv.*)."""
    adv = cfg.algo.adv
    if adv.estimator == "grpo":
        return group_advantages(rewards, group_ids, std_normalize=adv.std_normalize, std_scope=adv.std_scope)
    if adv.estimator == "rloo":
        return rloo_advantages(rewards, group_ids)
    return whiten_advantages(rewards)  # reinforce_pp: batch-whitened rewards (REINFORCE++)


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


class DynamicSamplingExhausted(RuntimeError):
    """data.dynamic_sampling.on_exhausted=error and max_rounds could not fill the batch."""


def shape_rewards(cfg: Config, step: int, rollout: RolloutBatch, correct: torch.Tensor, group_ids: torch.Tensor):
    """[N] verifier score + the configured length terms, and their per-term means for the log."""
    r, lengths, metrics = correct.clone(), rollout.response_lengths, {}
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


def collect_rollouts(cfg: Config, step: int, *, train_stream: ProblemStream, engine, tokenizer, verifier) -> Collected:
    """Generate, score and (with dynamic sampling) filter groups until the batch is full or
    `max_rounds` generation rounds are spent (DAPO section 3.2)."""
    n, want, ds = cfg.rollout.n, cfg.rollout.prompts_per_step, cfg.data.dynamic_sampling
    parts, kept, counts = [], 0, {"kept_groups": 0, "dropped_all_correct": 0, "dropped_all_wrong": 0, "dropped_out_of_band": 0}
    t_gen = t_rew = 0.0
    rounds = 0
    shaping_metrics: dict[str, list[float]] = {}
    while kept < want and rounds < (ds.max_rounds if ds.mode != "none" else 1):
        rounds += 1
        t0 = time.time()
        problems, prompt_ids, prompts_text = train_stream.next_batch(want)
        rollout = engine.generate(
            [p for p in prompt_ids for _ in range(n)], max_new_tokens=cfg.rollout.max_new_tokens,
            temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
            seed=cfg.seed * 1_000_003 + step + (rounds - 1) * 7_919_993,  # round 1 keeps the plain per-step seed
        )
        t1 = time.time()
        texts = tokenizer.batch_decode(rollout.response_ids, skip_special_tokens=True)
        results = verifier.score(texts, [p.answer for p in problems for _ in range(n)])
        t_gen, t_rew = t_gen + t1 - t0, t_rew + time.time() - t1
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


def build_controllers(cfg: Config) -> dict[str, CoefController]:
    """The entropy and KL coefficient controllers (their state goes into checkpoints)."""
    ent = cfg.algo.entropy
    if ent.mode == "adaptive":
        entropy = AdaptiveEntropyController(ent.coef, ent.target, kp=ent.kp, min_coef=ent.min_coef, max_coef=ent.max_coef)
    elif ent.mode == "skywork":
        entropy = SkyworkEntropyController(ent.coef, ent.target, step=ent.step, min_coef=ent.min_coef, max_coef=ent.max_coef)
    else:
        entropy = FixedCoef(ent.coef if ent.mode == "fixed" else 0.0)
    kl = cfg.algo.kl
    if kl.use != "none" and kl.target is not None:
        kl_ctl: CoefController = AdaptiveKLController(kl.coef, kl.target, kl.horizon)
    else:
        kl_ctl = FixedCoef(kl.coef if kl.use != "none" else 0.0)
    return {"entropy": entropy, "kl": kl_ctl}


@torch.no_grad()
def per_token_pass(model, batch: TrainBatch, cfg: Config, forward) -> list[torch.Tensor]:
    """Run `forward(model, micro_batch) -> [n, t] tensors` over no-grad micro-batches of `batch`, the
    model in eval mode; returns each output as [N, T] float32 on CPU, 0 at masked positions."""
    was_training = model.training
    model.eval()
    outputs: list[torch.Tensor] = []
    for rows in micro_batch_slices(row_lengths(batch), cfg.train.micro_batch_tokens * 4):  # no activations kept
        parts = forward(model, batch.select(rows).trimmed())
        if not outputs:
            outputs = [torch.zeros_like(batch.response_mask) for _ in parts]
        idx = (torch.as_tensor(rows)[:, None], torch.arange(parts[0].shape[1])[None, :])
        for out, part in zip(outputs, parts):
            out[idx] = part.float().cpu()
    model.train(was_training)
    return [out * batch.response_mask for out in outputs]


def scoring_pass(model, batch: TrainBatch, cfg: Config, *, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, T] logprobs (and entropy, zeros if not asked) of the sampled tokens under `model`, no grad."""

    def forward(model, mb: TrainBatch) -> list[torch.Tensor]:
        lp, ent = response_logprobs(
            model, mb.prompt_ids, mb.prompt_mask, mb.response_ids, mb.response_mask,
            temperature=cfg.rollout.temperature, chunk_size=cfg.model.logprob_chunk_size, with_entropy=with_entropy,
        )
        return [lp, ent if ent is not None else torch.zeros_like(lp)]

    logprobs, entropy = per_token_pass(model, batch, cfg, forward)
    return logprobs, entropy


def new_train_batch(rollout: RolloutBatch, loss_mask: torch.Tensor, correct: torch.Tensor) -> TrainBatch:
    """A TrainBatch of the rollout's rows; the scoring passes and advantages fill the zero fields."""
    zeros = torch.zeros_like(rollout.logprobs)
    return TrainBatch(
        prompt_ids=rollout.prompt_ids, prompt_mask=rollout.prompt_mask, response_ids=rollout.response_ids,
        response_mask=rollout.response_mask, loss_mask=loss_mask, old_logprobs=zeros, advantages=zeros.clone(),
        ref_logprobs=zeros.clone(), ref_entropy=zeros.clone(), correct=correct,
    )


def update_policy(
    model, optimizer, scheduler, batch: TrainBatch, cfg: Config, *, step: int, coefs: dict[str, float],
    ptx: PretrainText | None,
) -> dict[str, float]:
    """Mini-batches x epochs of updates on one rollout batch.

    loss = policy loss - entropy_coef * entropy + kl_coef * KL (as loss) + mu * positive-example NLL,
    each aggregated with algo.loss_agg over the whole mini-batch's counts, plus ptx_coef * the token-mean
    pretraining NLL of one PTX batch per optimizer step.
    """
    algo = cfg.algo
    agg = dict(mode=algo.loss_agg, max_len=cfg.rollout.max_new_tokens)
    sums = {k: 0.0 for k in ("entropy", "clipped", "dual_clipped", "ppo_kl", "tokens", "ent_masked", "kl")}
    per_step = {k: [] for k in ("pg_loss", "entropy_loss", "kl_loss", "pos_lm_loss", "ptx_loss", "grad_norm")}
    order_gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
    skipped = 0
    for _epoch in range(cfg.train.epochs):
        order = torch.randperm(len(batch), generator=order_gen)
        for start in range(0, len(batch), cfg.train.mini_batch_size):
            mini = batch.select(order[start : start + cfg.train.mini_batch_size])
            # the whole mini-batch's counts (all micro-batches, all ranks) normalise every micro-batch
            num_tokens, num_seqs = global_counts(mini.loss_mask)
            pos_tokens, pos_seqs = global_counts(mini.loss_mask * mini.correct[:, None])
            totals = {k: 0.0 for k in ("pg_loss", "entropy_loss", "kl_loss", "pos_lm_loss")}
            for micro in micro_batches(mini, cfg.train.micro_batch_tokens):
                logprobs, entropy = response_logprobs(
                    model, micro.prompt_ids, micro.prompt_mask, micro.response_ids, micro.response_mask,
                    temperature=cfg.rollout.temperature, chunk_size=cfg.model.logprob_chunk_size,
                )
                mask = micro.loss_mask
                token_loss, info = policy_loss(
                    logprobs, micro.old_logprobs, micro.advantages, mask,
                    eps_low=algo.clip.eps_low, eps_high=algo.clip.eps_high, dual_clip_c=algo.clip.dual_clip_c,
                )
                pg = aggregate(token_loss, mask, num_tokens=num_tokens, num_seqs=num_seqs, **agg)
                loss = pg
                totals["pg_loss"] += pg.item()
                if coefs["entropy"] != 0.0:
                    bonus_mask = mask
                    if algo.entropy.ref_gain_clip.max_gain is not None or algo.entropy.ref_gain_clip.max_ratio is not None:
                        bonus_mask = entropy_bonus_mask(
                            entropy.detach(), micro.ref_entropy, mask,
                            max_gain=algo.entropy.ref_gain_clip.max_gain, max_ratio=algo.entropy.ref_gain_clip.max_ratio,
                        )
                    # masked tokens contribute 0 but stay in the normaliser: the bonus per kept token is unchanged
                    ent_term = aggregate(entropy, bonus_mask, num_tokens=num_tokens, num_seqs=num_seqs, **agg)
                    loss = loss - coefs["entropy"] * ent_term
                    totals["entropy_loss"] += -ent_term.item()
                    sums["ent_masked"] += float((mask - bonus_mask).sum())
                if algo.kl.use == "loss":
                    kl_tok = kl_penalty(logprobs, micro.ref_logprobs, estimator=algo.kl.estimator)
                    kl_term = aggregate(kl_tok, mask, num_tokens=num_tokens, num_seqs=num_seqs, **agg)
                    loss = loss + coefs["kl"] * kl_term
                    totals["kl_loss"] += kl_term.item()
                if algo.pos_lm.coef > 0 and pos_tokens > 0:
                    nll, pos_mask = positive_example_lm_loss(logprobs, mask, micro.correct)
                    # VAPO: token-normalised over the correct samples' tokens of the whole mini-batch
                    pos = aggregate(nll, pos_mask, mode="token_mean", num_tokens=pos_tokens, num_seqs=pos_seqs)
                    loss = loss + algo.pos_lm.coef * pos
                    totals["pos_lm_loss"] += pos.item()
                (loss * dp_scale()).backward()
                sums["entropy"] += float((entropy.detach() * mask).sum())
                sums["clipped"] += float((info["clipped"] * mask).sum())
                sums["dual_clipped"] += float((info["dual_clipped"] * mask).sum())
                sums["ppo_kl"] += float((info["ppo_kl"] * mask).sum())
                sums["tokens"] += float(mask.sum())
            if ptx is not None:
                ids, attn = ptx.next_batch(algo.ptx.batch_size)
                nll = -next_token_logprobs(model, ids, attn, chunk_size=cfg.model.logprob_chunk_size)
                target_mask = attn[:, 1:].to(nll.device).float()
                ptx_loss = (nll * target_mask).sum() / target_mask.sum().clamp(min=1)
                (algo.ptx.coef * ptx_loss).backward()
                per_step["ptx_loss"].append(ptx_loss.item())
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.max_grad_norm)
            lr_used = optimizer.param_groups[0]["lr"]
            if torch.isfinite(grad_norm) and all(math.isfinite(v) for v in totals.values()):
                optimizer.step()
                scheduler.step()
            else:  # a non-finite loss or gradient: skip this optimizer step rather than corrupt the weights
                skipped += 1
            optimizer.zero_grad(set_to_none=True)
            for k, v in totals.items():
                per_step[k].append(v)
            per_step["grad_norm"].append(float(grad_norm))
    tokens = max(sums["tokens"], 1.0)
    mean = lambda xs: sum(xs) / len(xs) if xs else 0.0  # noqa: E731
    metrics = {
        "actor/pg_loss": mean(per_step["pg_loss"]),
        "actor/entropy": sums["entropy"] / tokens,
        "actor/pg_clipfrac": sums["clipped"] / tokens,
        "actor/pg_clipfrac_lower": sums["dual_clipped"] / tokens,
        "actor/ppo_kl": sums["ppo_kl"] / tokens,
        "actor/grad_norm": mean(per_step["grad_norm"]),
        "actor/lr": lr_used,  # of the step's last update
        "actor/updates": float(len(per_step["grad_norm"]) - skipped),
        "perf/skipped_updates": float(skipped),
    }
    if algo.entropy.mode != "none":
        metrics["actor/entropy_loss"] = mean(per_step["entropy_loss"])
        metrics["actor/entropy_clipfrac"] = sums["ent_masked"] / tokens
    if algo.kl.use == "loss":
        metrics["actor/kl_loss"] = mean(per_step["kl_loss"])
    if algo.pos_lm.coef > 0:
        metrics["actor/pos_lm_loss"] = mean(per_step["pos_lm_loss"])
    if ptx is not None:
        metrics["actor/ptx_loss"] = mean(per_step["ptx_loss"])
    return metrics


def value_pass(critic, batch: TrainBatch, cfg: Config) -> torch.Tensor:
    """[N, T] critic values V(s_t) of the sampled responses, no grad (0 at masked positions)."""

    def forward(critic, mb: TrainBatch) -> list[torch.Tensor]:
        return [response_values(critic, mb.prompt_ids, mb.prompt_mask, mb.response_ids, mb.response_mask)]

    (values,) = per_token_pass(critic, batch, cfg, forward)
    return values


def outcome_token_rewards(rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """[N, T]: each sequence's reward on its last response token, 0 elsewhere."""
    token_rewards = torch.zeros_like(response_mask)
    last = (response_mask.sum(-1).long() - 1).clamp(min=0)  # [N]
    token_rewards[torch.arange(len(rewards)), last] = rewards.float() * (response_mask.sum(-1) > 0)
    return token_rewards


def gae_targets(cfg: Config, batch: TrainBatch, token_rewards: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(policy advantages [N, T], value targets [N, T], mean policy lambda) from batch.old_values.

    Decoupled GAE (VC-PPO): lam_actor for the advantages, lam_critic for the targets; with
    algo.critic.length_adaptive_alpha the policy lambda is VAPO's 1 - 1/(alpha * length) per response.
    """
    crit = cfg.algo.critic
    mask = batch.response_mask
    if crit.length_adaptive_alpha is not None:
        lam_actor = length_adaptive_lambda(mask.sum(-1), crit.length_adaptive_alpha)  # [N]
    else:
        lam_actor = torch.full((len(batch),), crit.lam_actor)
    advantages, _ = gae(token_rewards, batch.old_values, mask, gamma=crit.gamma, lam=lam_actor)
    _, returns = gae(token_rewards, batch.old_values, mask, gamma=crit.gamma, lam=crit.lam_critic)
    if crit.whiten_advantages:
        advantages = whiten_advantages(advantages, batch.loss_mask)
    return advantages * batch.loss_mask, returns, float(lam_actor.mean())


def update_critic(critic, optimizer, scheduler, batch: TrainBatch, cfg: Config, *, step: int) -> dict[str, float]:
    """Mini-batches x epochs of clipped value-loss updates (token mean over the whole mini-batch)."""
    crit = cfg.algo.critic
    order_gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step + 500_009)
    losses, grad_norms, clipped, tokens, skipped = [], [], 0.0, 0.0, 0
    for _epoch in range(cfg.train.epochs):
        order = torch.randperm(len(batch), generator=order_gen)
        for start in range(0, len(batch), cfg.train.mini_batch_size):
            mini = batch.select(order[start : start + cfg.train.mini_batch_size])
            num_tokens, num_seqs = global_counts(mini.loss_mask)
            total = 0.0
            for micro in micro_batches(mini, cfg.train.micro_batch_tokens):
                values = response_values(critic, micro.prompt_ids, micro.prompt_mask, micro.response_ids, micro.response_mask)
                token_loss, is_clipped = value_loss(values, micro.old_values, micro.returns, micro.loss_mask,
                                                    clip_eps=crit.value_clip)
                loss = aggregate(token_loss, micro.loss_mask, mode="token_mean", num_tokens=num_tokens, num_seqs=num_seqs)
                (loss * dp_scale()).backward()
                total += loss.item()
                clipped += float(is_clipped.sum())
                tokens += float(micro.loss_mask.sum())
            grad_norm = torch.nn.utils.clip_grad_norm_(critic.parameters(), cfg.train.max_grad_norm)
            lr_used = optimizer.param_groups[0]["lr"]
            if torch.isfinite(grad_norm) and math.isfinite(total):
                optimizer.step()
                scheduler.step()
            else:
                skipped += 1
            optimizer.zero_grad(set_to_none=True)
            losses.append(total)
            grad_norms.append(float(grad_norm))
    m = batch.loss_mask
    count = m.sum().clamp(min=1)
    metrics = {
        "critic/value_loss": sum(losses) / len(losses),
        "critic/vf_clipfrac": clipped / max(tokens, 1.0),
        "critic/grad_norm": sum(grad_norms) / len(grad_norms),
        "critic/values_mean": float((batch.old_values * m).sum() / count),
        "critic/returns_mean": float((batch.returns * m).sum() / count),
        "critic/lr": lr_used,  # of the step's last update
        "critic/skipped_updates": float(skipped),
    }
    explained = explained_variance(batch.old_values, batch.returns, m)
    if math.isfinite(explained):  # undefined when every target is equal (e.g. every answer right)
        metrics["critic/explained_var"] = explained
    return metrics


def pretrain_critic(cfg: Config, critic, optimizer, scheduler, *, train_stream: ProblemStream, engine, tokenizer,
                    verifier, console: Console) -> dict[str, float]:
    """VC-PPO value pretraining (Yuan et al. 2025, §4.1): before the first policy update, fit the
    critic for algo.critic.pretrain_steps steps on rollouts of the starting policy, with Monte-Carlo
    targets (lambda = 1), so the first advantages do not come from an untrained value head.
    Returns the step-0 metrics critic/pretrain_*."""
    crit, first, last = cfg.algo.critic, None, {}
    for k in range(1, crit.pretrain_steps + 1):
        got = collect_rollouts(cfg, -k, train_stream=train_stream, engine=engine, tokenizer=tokenizer, verifier=verifier)
        if not got.problems:
            continue
        loss_mask, _ = filter_samples(cfg, got.rollout, got.texts, got.results)
        batch = new_train_batch(got.rollout, loss_mask, got.correct)
        batch.old_values = value_pass(critic, batch, cfg)
        token_rewards = outcome_token_rewards(got.rewards, batch.response_mask)
        _, batch.returns = gae(token_rewards, batch.old_values, batch.response_mask, gamma=crit.gamma, lam=1.0)
        last = update_critic(critic, optimizer, scheduler, batch, cfg, step=-k)
        first = last["critic/value_loss"] if first is None else first
        console.print(f"critic pretraining {k}/{crit.pretrain_steps}: value loss {last['critic/value_loss']:.4f}")
    out = {"critic/pretrain_steps": float(crit.pretrain_steps)}
    if first is not None:
        out["critic/pretrain_value_loss_first"] = first
        out["critic/pretrain_value_loss_last"] = last["critic/value_loss"]
    return out


class NonFiniteError(RuntimeError):
    """Too many consecutive steps with a non-finite loss or gradient."""


def _evals_from_log(run_dir: Path) -> tuple[dict[str, EvalResult], dict[str, EvalResult], dict[str, float]]:
    """Base and latest evaluations of a resumed run, read back from evals.jsonl."""
    rows = [json.loads(line) for line in (run_dir / "evals.jsonl").read_text().splitlines() if line.strip()]
    fields = set(EvalResult.__dataclass_fields__) - {"samples"}

    def result(row: dict) -> EvalResult:
        r = EvalResult(**{k: v for k, v in row.items() if k in fields})
        r.pass_at_k = {int(k): v for k, v in r.pass_at_k.items()}  # JSON object keys are strings
        return r

    base = {r["set"]: result(r) for r in rows if r["step"] == 0}
    last_step = max(r["step"] for r in rows)
    latest = {r["set"]: result(r) for r in rows if r["step"] == last_step}
    metrics = {}
    for name, r in latest.items():
        metrics.update(r.metrics(f"eval/{name}"))
    return base, latest, metrics


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


def run_evals(eval_sets: list[EvalSet], *, engine, tokenizer, verifier, cfg: Config) -> dict[str, EvalResult]:
    return {
        es.name: evaluate(
            es.name, es.problems, es.prompt_ids, engine=engine, tokenizer=tokenizer, verifier=verifier,
            n=cfg.eval.n, max_new_tokens=cfg.eval_max_new_tokens, temperature=cfg.eval.temperature,
            top_p=cfg.eval.top_p, seed=cfg.eval.seed,
        )
        for es in eval_sets
    }


def _log_evals(step: int, results: dict[str, EvalResult], tracker: Tracker, run_dir: Path) -> dict[str, float]:
    metrics = {}
    for name, r in results.items():
        metrics.update(r.metrics(f"eval/{name}"))
    tracker.log(step, metrics)
    with (run_dir / "evals.jsonl").open("a") as f:
        for name, r in results.items():
            f.write(json.dumps({"step": step, "set": name, **{k: v for k, v in r.__dict__.items() if k != "samples"},
                                "samples": r.samples[:5]}) + "\n")
    return metrics


def train(cfg: Config, *, console: Console | None = None, resume: bool = True) -> TrainResult:
    console = console or Console()
    t_start = time.time()
    run_dir, checkpoint = prepare_run_dir(cfg, resume=resume, console=console)
    console.print(f"[bold]run directory[/bold] {run_dir}")
    seed_everything(cfg.seed)

    # ---- model, data, engine, verifier -----------------------------------------------------------
    model_path = resolve_model_path(cfg, console)
    console.print(f"loading model from {model_path}")
    parent = Path(cfg.train.init_from) if cfg.train.init_from and checkpoint is None else None
    model, tokenizer = load_model_and_tokenizer(checkpoint or parent or model_path, dtype=cfg.model.dtype)
    if cfg.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    train_stream: ProblemStream = build_train_stream(cfg, tokenizer)
    eval_sets = build_eval_sets(cfg, tokenizer, limit=cfg.data.eval_size)
    engine = TorchEngine(model, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         batch_size=cfg.rollout.batch_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr, betas=tuple(cfg.train.betas),
                                  weight_decay=cfg.train.weight_decay)
    warmup = max(1, cfg.train.warmup_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup))
    controllers = build_controllers(cfg)
    ptx = PretrainText(cfg, tokenizer) if cfg.algo.ptx.coef > 0 else None
    ref_model = None
    if cfg.needs_reference:  # loaded only when a KL term or ref_gain_clip needs it
        console.print("loading the reference model (a frozen copy of the starting model)")
        ref_model, _ = load_model_and_tokenizer(model_path, dtype=cfg.model.dtype)
        ref_model.eval().requires_grad_(False)
    critic = critic_optimizer = critic_scheduler = None
    if cfg.algo.adv.estimator == "gae":  # PPO with a learned critic; it resumes from checkpoints like the policy
        origin = checkpoint or parent
        saved = origin / "critic" if origin is not None and (origin / "critic").is_dir() else None
        if checkpoint is not None and saved is None:
            raise ValueError(f"checkpoint {checkpoint} has no critic/: its run did not use algo.adv.estimator=gae; "
                             "start a new run (--no-resume, or train.init_from to continue its policy with PPO)")
        # a parent run without a critic (GRPO continued with PPO): a fresh critic from its policy
        critic_source = saved or cfg.algo.critic.path or parent or model_path
        console.print(f"loading the critic from {critic_source}")
        critic = load_critic(critic_source, dtype=cfg.model.dtype)
        critic.train()
        critic_optimizer = torch.optim.AdamW(critic.parameters(), lr=cfg.algo.critic.lr or cfg.train.lr,
                                             betas=tuple(cfg.train.betas), weight_decay=cfg.train.weight_decay)
        critic_scheduler = torch.optim.lr_scheduler.LambdaLR(critic_optimizer, lambda s: min(1.0, (s + 1) / warmup))
    def restore_optimizers(tensors: dict) -> None:
        optimizer.load_state_dict(tensors["optimizer"])
        scheduler.load_state_dict(tensors["scheduler"])
        if critic is not None and "critic_optimizer" in tensors:  # absent when a GRPO parent is continued with PPO
            critic_optimizer.load_state_dict(tensors["critic_optimizer"])
            critic_scheduler.load_state_dict(tensors["critic_scheduler"])

    n = cfg.rollout.n
    start_step, skipped_in_a_row, skipped_total = 1, 0, 0
    if checkpoint is not None:
        # ---- resume: everything the next step depends on comes back from the checkpoint ---------
        done = int(json.loads((checkpoint / "trainer_state.json").read_text())["step"])
        tensors = torch.load(checkpoint / "trainer_state.pt", weights_only=True)
        state = json.loads((checkpoint / "trainer_state.json").read_text())
        restore_optimizers(tensors)
        set_rng_state(tensors["rng"])
        for name, ctl in controllers.items():
            ctl.load_state_dict(state["controllers"][name])
        train_stream.load_state_dict(state["data"])
        if ptx is not None:
            ptx.load_state_dict(state["ptx"])
        skipped_total = int(state.get("skipped_steps", 0))
        for name in ("metrics.jsonl", "rollouts.jsonl", "evals.jsonl"):
            truncate_jsonl(run_dir / name, done)  # rows a killed run wrote after this checkpoint
        start_step = done + 1
        console.print(f"[bold]resuming[/bold] from {checkpoint} (step {done} of {cfg.train.steps})")
    elif parent is not None:
        # ---- staged growth: a new run continuing another run's checkpoint (e.g. with a longer
        # rollout.max_new_tokens), keeping its optimizer, schedule and controller state -----------
        tensors = torch.load(parent / "trainer_state.pt", weights_only=True)
        state = json.loads((parent / "trainer_state.json").read_text())
        restore_optimizers(tensors)
        for name, ctl in controllers.items():
            ctl.load_state_dict(state["controllers"][name])
        parent_cfg = (parent.parent.parent / "config.yaml")
        (run_dir / "parent.json").write_text(json.dumps({
            "checkpoint": str(parent.resolve()), "step": state["step"],
            "run_dir": str(parent.parent.parent.resolve()),
            "config": parent_cfg.read_text() if parent_cfg.exists() else None,
        }, indent=2))
        console.print(f"[bold]continuing[/bold] from {parent} (step {state['step']} of its run); recorded in parent.json")
    tracker = Tracker(run_dir, tensorboard=cfg.log.tensorboard, wandb=cfg.log.wandb, mlflow=cfg.log.mlflow,
                      wandb_project=cfg.log.wandb_project, mlflow_experiment=cfg.log.mlflow_experiment,
                      config=to_dict(cfg))

    def trainer_state() -> dict:
        return {
            "controllers": {k: c.state_dict() for k, c in controllers.items()},
            "data": train_stream.state_dict(),
            "ptx": ptx.state_dict() if ptx is not None else None,
            "skipped_steps": skipped_total,
        }

    for note in train_stream.notes:
        console.print(note)
    for es in eval_sets:
        if es.dropped_too_long:
            console.print(f"eval set {es.name}: {es.dropped_too_long} problems dropped, their prompts exceed "
                          f"data.max_prompt_tokens={cfg.data.max_prompt_tokens}")
    collapse = CollapseWatch()
    with Verifier(num_workers=cfg.reward.num_workers, timeout_s=cfg.reward.timeout_s) as verifier:
        # ---- evaluate the starting point ---------------------------------------------------------
        if checkpoint is None:
            console.print(f"evaluating the base model on {', '.join(f'{e.name} ({len(e.problems)} problems)' for e in eval_sets)}, "
                          f"{cfg.eval.n} samples each")
            base_results = run_evals(eval_sets, engine=engine, tokenizer=tokenizer, verifier=verifier, cfg=cfg)
            last_eval = _log_evals(0, base_results, tracker, run_dir)
            latest = base_results
        else:
            base_results, latest, last_eval = _evals_from_log(run_dir)
        if critic is not None and cfg.algo.critic.pretrain_steps > 0 and checkpoint is None and parent is None:
            tracker.log(0, pretrain_critic(cfg, critic, critic_optimizer, critic_scheduler, train_stream=train_stream,
                                           engine=engine, tokenizer=tokenizer, verifier=verifier, console=console))

        with StepProgress(console, total=cfg.train.steps, completed=start_step - 1) as progress:
            for step in range(start_step, cfg.train.steps + 1):
                t0 = time.time()
                # ---- 1-3. problems -> rollout -> reward (+ shaping) -> group filter, refilled ----------
                got = collect_rollouts(cfg, step, train_stream=train_stream, engine=engine, tokenizer=tokenizer,
                                       verifier=verifier)
                problems, prompts_text, rollout, texts, results = got.problems, got.prompts_text, got.rollout, got.texts, got.results
                rewards, correct = got.rewards, got.correct
                t_rollout, t_reward = t0 + got.rollout_seconds, t0 + got.rollout_seconds + got.reward_seconds
                if not problems:  # every group was filtered out and on_exhausted=train_smaller: nothing to learn from
                    console.print(f"[yellow]warning:[/yellow] step {step}: dynamic sampling kept no group; update skipped")
                    tracker.log(step, got.metrics)
                    progress.advance_empty()
                    continue
                # ---- sample filters: masked out of the loss, counted per reason ------------------------
                loss_mask, filter_metrics = filter_samples(cfg, rollout, texts, results)
                got.metrics.update(filter_metrics)
                batch = new_train_batch(rollout, loss_mask, correct)
                # ---- 4. scoring passes: old logprobs (training model), reference logprobs/entropy ----
                batch.old_logprobs, rollout_entropy = scoring_pass(model, batch, cfg, with_entropy=True)
                metrics = dict(got.metrics)
                if ref_model is not None:
                    batch.ref_logprobs, batch.ref_entropy = scoring_pass(ref_model, batch, cfg, with_entropy=True)
                    kl_k1 = ((batch.old_logprobs - batch.ref_logprobs) * batch.loss_mask).sum() / batch.loss_mask.sum().clamp(min=1)
                    metrics["actor/ref_kl"] = float(kl_k1)
                    metrics["actor/ref_entropy"] = float((batch.ref_entropy * batch.loss_mask).sum() / batch.loss_mask.sum().clamp(min=1))
                # ---- 5. coefficients, KL reward penalty, advantages ---------------------------------
                mean_entropy = float((rollout_entropy * batch.loss_mask).sum() / batch.loss_mask.sum().clamp(min=1))
                coefs = {"entropy": controllers["entropy"].update(mean_entropy)}
                coefs["kl"] = (controllers["kl"].update(metrics["actor/ref_kl"], n_steps=len(batch))
                               if cfg.algo.kl.use != "none" else 0.0)
                shaped, kl_rewards = rewards, torch.zeros_like(batch.response_mask)  # [N], [N, T]
                if cfg.algo.kl.use == "reward":
                    kl_tok = kl_penalty(batch.old_logprobs, batch.ref_logprobs, estimator=cfg.algo.kl.estimator)
                    kl_rewards = apply_kl_reward_penalty(torch.zeros_like(kl_tok), kl_tok, batch.loss_mask, coef=coefs["kl"])
                    shaped = rewards + kl_rewards.sum(-1)  # the sequence reward minus coef x its summed KL
                    metrics["reward/kl_penalty"] = float(-kl_rewards.sum(-1).mean())
                group_ids = torch.arange(len(problems)).repeat_interleave(n)  # [N]
                if critic is not None:  # PPO: token-level GAE from the critic's values, KL penalty per token
                    token_rewards = outcome_token_rewards(rewards, batch.response_mask) + kl_rewards
                    batch.old_values = value_pass(critic, batch, cfg)
                    batch.advantages, batch.returns, metrics["actor/gae_lambda"] = gae_targets(cfg, batch, token_rewards)
                else:
                    batch.advantages = expand_to_tokens(compute_advantages(cfg, shaped, group_ids), batch.loss_mask)
                # ---- 6. updates: mini-batches x epochs ---------------------------------------------
                metrics.update(update_policy(model, optimizer, scheduler, batch, cfg, step=step, coefs=coefs, ptx=ptx))
                if critic is not None:
                    metrics.update(update_critic(critic, critic_optimizer, critic_scheduler, batch, cfg, step=step))
                if metrics["perf/skipped_updates"] > 0:
                    skipped_total += int(metrics["perf/skipped_updates"])
                    skipped_in_a_row += 1
                    console.print(f"[yellow]warning:[/yellow] step {step}: {int(metrics['perf/skipped_updates'])} optimizer "
                                  "step(s) skipped: non-finite loss or gradient")
                else:
                    skipped_in_a_row = 0
                metrics["perf/skipped_steps"] = float(skipped_total)
                metrics["actor/entropy_coef"] = coefs["entropy"]
                metrics["actor/rollout_entropy"] = mean_entropy
                if cfg.algo.kl.use != "none":
                    metrics["actor/kl_coef"] = coefs["kl"]
                t_train = time.time()

                # ---- 7. metrics and logs -----------------------------------------------------------
                lengths = rollout.response_lengths.float()
                per_group = correct.view(len(problems), n)
                metrics.update({
                    "reward/mean": float(rewards.mean()),
                    "reward/accuracy": float(correct.mean()),
                    "reward/no_answer_rate": sum(r.reason == "no_answer" for r in results) / len(results),
                    "reward/timeout_rate": sum(r.reason == "timeout" for r in results) / len(results),
                    "reward/error_rate": sum(r.reason == "error" for r in results) / len(results),
                    "rollout/response_length": float(lengths.mean()),
                    "rollout/response_length_max": float(lengths.max()),
                    "rollout/truncated_frac": float(rollout.truncated.float().mean()),
                    "data/prompts_too_long": float(train_stream.encoder.dropped),
                    "rollout/all_correct_groups": float((per_group.min(1).values == per_group.max(1).values).logical_and(per_group.max(1).values > 0).float().mean()),
                    "rollout/all_wrong_groups": float((per_group.max(1).values <= 0).float().mean()),
                    "rollout/logprob_mismatch": float(((rollout.logprobs - batch.old_logprobs).abs() * rollout.response_mask).sum() / rollout.response_mask.sum().clamp(min=1)),
                    "perf/rollout_seconds": t_rollout - t0,
                    "perf/reward_seconds": t_reward - t_rollout,
                    "perf/train_seconds": t_train - t_reward,
                    "perf/step_seconds": time.time() - t0,
                    "perf/rollout_tokens_per_second": float(lengths.sum()) / max(t_rollout - t0, 1e-9),
                })
                tracker.log(step, metrics)
                with (run_dir / "rollouts.jsonl").open("a") as f:
                    for rec in rollout_records(step, problems, prompts_text, texts, results, rollout, tokenizer, n,
                                               cfg.log.rollouts_per_step):
                        f.write(json.dumps(rec) + "\n")

                if step % cfg.eval.every == 0 or step == cfg.train.steps:
                    progress.note(f"step {step}: evaluating")
                    latest = run_evals(eval_sets, engine=engine, tokenizer=tokenizer, verifier=verifier, cfg=cfg)
                    last_eval = _log_evals(step, latest, tracker, run_dir)
                collapse.check(step, metrics, console)
                # no checkpoint while updates are being skipped: the last one stays the last good one
                if cfg.train.save_every and (step % cfg.train.save_every == 0 or step == cfg.train.steps) and not skipped_in_a_row:
                    save_checkpoint(run_dir / "checkpoints", step, model=model, tokenizer=tokenizer, optimizer=optimizer,
                                    scheduler=scheduler, state=trainer_state(), keep_last=cfg.train.keep_last,
                                    keep_every=cfg.train.keep_every, critic=critic, critic_optimizer=critic_optimizer,
                                    critic_scheduler=critic_scheduler)
                if skipped_in_a_row >= cfg.train.max_skipped_steps:
                    last = latest_checkpoint(run_dir / "checkpoints")
                    where = f"the last good checkpoint is {last}" if last else "no checkpoint had been written yet"
                    raise NonFiniteError(f"{skipped_in_a_row} consecutive steps had a non-finite loss or gradient; "
                                         f"stopping ({where})")
                progress.advance(metrics, last_eval)

    console.print("saving the final model")
    save_model(model, tokenizer, run_dir / "final")
    if critic is not None:
        critic.save_pretrained(run_dir / "final" / "critic", safe_serialization=True)
    (run_dir / "final" / "trainer_state.json").write_text(json.dumps({"step": cfg.train.steps, **trainer_state()}, indent=2))
    tracker.close()
    wall = time.time() - t_start
    summary = {
        "wall_seconds": wall,
        "steps": cfg.train.steps,
        "base": {k: {"pass@1": v.pass_at_1, "pass@k": v.pass_at_k, "maj@n": v.maj_at_n} for k, v in base_results.items()},
        "final": {k: {"pass@1": v.pass_at_1, "pass@k": v.pass_at_k, "maj@n": v.maj_at_n} for k, v in latest.items()},
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    console.print(summary_table(base_results, latest, wall_seconds=wall, n=cfg.eval.n))
    console.print(f"[bold]run directory[/bold] {run_dir}")
    return TrainResult(run_dir=run_dir, base=base_results, final=latest, wall_seconds=wall)
