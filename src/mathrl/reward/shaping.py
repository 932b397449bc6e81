"""Length-dependent reward terms, added to the correctness reward before advantages.

Every function is a pure tensor function over [N] response lengths (in tokens) and returns an [N] float
term; `shape_rewards` sums the enabled terms of `SHAPING_TERMS`, in registration order, into the sequence
reward, and logs each one's batch mean as reward/<name>:

    r = correctness (the reward components' total), plus reward.incorrect on wrong answers
    r = r + soft_overlong_punishment(lengths, max_len=L, cache_len=C)    # reward.overlong.soft_punishment
    r = r + kimi_length_penalty(lengths, correct, group_ids, coef=c)     # reward.kimi_length_coef
    r = r + length_bonus(lengths, coef=c, max_len=L)                     # reward.length_bonus_coef
    r = r + length_schedule_reward(lengths, correct, step=s, schedule=sched, coef=c)   # reward.length_schedule

Only the first two come from papers; ``length_bonus`` and ``length_schedule_reward`` are ablation switches,
off by default, that reproduce a negative result (docs/tricks.md). A new term: docs/architecture.md, "Where
to add". Run the tests with ``python -m pytest tests/reward/test_shaping.py -q``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from mathrl.algo.groups import group_stats
from mathrl.config import Config, RewardConfig
from mathrl.registry import SHAPING_TERMS

__all__ = [
    "soft_overlong_punishment",
    "kimi_length_penalty",
    "length_bonus",
    "scheduled_target",
    "length_schedule_reward",
    "ShapingInputs",
    "ShapingTerm",
    "SHAPING_TERMS",
    "shape_rewards",
]


def _lengths(lengths: Tensor) -> Tensor:
    if lengths.dim() != 1:
        raise ValueError(f"lengths must be 1-D [N], got shape {tuple(lengths.shape)}")
    return lengths.to(torch.get_default_dtype()) if not lengths.is_floating_point() else lengths


def soft_overlong_punishment(lengths: Tensor, *, max_len: int, cache_len: int) -> Tensor:
    """DAPO soft overlong punishment (Yu et al. 2025, §3.4, eq. 13). With L = max_len, C = cache_len:

        R(len) = 0                      if len <= L - C
               = ((L - C) - len) / C    if L - C < len <= L      (falls linearly from 0 to -1)
               = -1                     if len > L

    A length-aware penalty that grows over the last C tokens before the limit, so long responses
    are discouraged smoothly instead of by one cliff. DAPO uses L = 20480, C = 4096 with a response
    limit of L tokens, so len > L does not occur there; it is defined for completeness.

    lengths: [N] response lengths in tokens; max_len: L, the length at which the penalty reaches -1 (usually
    rollout.max_new_tokens); cache_len: C, the width of the soft ramp, 0 < C <= L (config
    ``reward.overlong.cache_len``). -> [N] penalties in [-1, 0].
    """
    if not 0 < cache_len <= max_len:
        raise ValueError(f"need 0 < cache_len <= max_len, got cache_len={cache_len}, max_len={max_len}")
    length = _lengths(lengths)  # [N]
    expected = max_len - cache_len
    ramp = (expected - length) / cache_len  # [N] 0 at len = L - C, -1 at len = L
    # clamp(-1, 0) is exactly eq. 13: the ramp is > 0 below L - C and < -1 above L.
    return ramp.clamp(min=-1.0, max=0.0)


def kimi_length_penalty(lengths: Tensor, correct: Tensor, group_ids: Tensor, *, coef: float = 1.0) -> Tensor:
    """Kimi k1.5 length penalty (Kimi Team 2025, "Kimi k1.5: Scaling Reinforcement Learning with
    LLMs", §2.3.3). Within each group (the k responses to one problem):

        lambda_i = 0.5 - (len_i - min_len) / (max_len - min_len)
        reward_i = lambda_i            if response i is correct
                 = min(0, lambda_i)    if it is wrong

    so the shortest response gets +0.5 and the longest -0.5; wrong answers are never rewarded for
    being short, only penalised for being long. min_len / max_len are over all responses of the
    group, correct or not. A group whose lengths are all equal (a single-sample group included)
    gets 0. The result is multiplied by ``coef``; Kimi warms the penalty up because it slows early
    training, which the caller does by ramping ``coef``.

    lengths: [N] response lengths in tokens; correct: [N] correctness (bool or 0/1), entries > 0 count as
    correct; group_ids: [N] integer prompt id per response; coef: the scale of the term (config
    ``reward.kimi_length_coef``). -> [N] float, in [-0.5 coef, 0.5 coef].
    """
    length = _lengths(lengths)  # [N]
    if group_ids.shape != length.shape or correct.shape != length.shape:
        raise ValueError(
            f"lengths, correct and group_ids must have the same shape, got {tuple(length.shape)}, "
            f"{tuple(correct.shape)} and {tuple(group_ids.shape)}"
        )
    if group_ids.is_floating_point():
        raise ValueError("group_ids must be an integer tensor (one id per prompt)")
    if length.numel() == 0:
        return length.clone()
    groups = group_stats(length, group_ids)
    gmin, gmax = groups.min[groups.index], groups.max[groups.index]  # [N] each
    span = gmax - gmin  # [N]
    lam = 0.5 - (length - gmin) / span.clamp_min(1e-12)  # [N]; span 0 handled below
    reward = torch.where(correct > 0, lam, lam.clamp(max=0.0))
    reward = torch.where(span > 0, reward, torch.zeros_like(reward))
    return coef * reward


def length_bonus(lengths: Tensor, *, coef: float, max_len: int) -> Tensor:
    """coef * len / max_len: a reward for length itself, for ablations only (see the module
    docstring: the field report found it useless).

    lengths: [N] response lengths in tokens; coef: the scale (config ``reward.length_bonus_coef``); max_len: the
    normaliser, usually rollout.max_new_tokens (so the bonus is in [0, coef]). -> [N] float.
    """
    if max_len <= 0:
        raise ValueError(f"max_len must be > 0, got {max_len}")
    return coef * _lengths(lengths) / max_len


def scheduled_target(schedule: Sequence[tuple[int, int]], step: int) -> int:
    """The target length at ``step`` of a piecewise-constant schedule [(start_step, target), ...]:
    the target of the last entry whose start_step <= step. Steps before the first entry use the
    first target. Start steps must be strictly increasing and targets > 0 (config validation can
    call this function with step 0 to check a schedule up front).
    """
    if not schedule:
        raise ValueError("the length schedule is empty; give at least one (start_step, target) pair")
    starts = [s for s, _ in schedule]
    if any(b <= a for a, b in zip(starts, starts[1:])):
        raise ValueError(f"length schedule start steps must be strictly increasing, got {starts}")
    if any(t <= 0 for _, t in schedule):
        raise ValueError(f"length schedule targets must be > 0, got {[t for _, t in schedule]}")
    target = schedule[0][1]
    for start, t in schedule:
        if start <= step:
            target = t
    return target


def length_schedule_reward(
    lengths: Tensor,
    correct: Tensor,
    *,
    step: int,
    schedule: Sequence[tuple[int, int]],
    coef: float,
) -> Tensor:
    """Reward for being near a scheduled target length, for ablations only (see the module
    docstring: the field report found length schedules useless). With target = the schedule's
    length at ``step`` (``scheduled_target``):

        reward_i = -coef * |len_i - target| / target    if response i is correct
                 = 0                                     if it is wrong

    Only correct responses are steered, as in Kimi's length penalty, so a wrong answer can never
    gain from its length.

    lengths: [N] response lengths in tokens; correct: [N] correctness, entries > 0 count as correct; step: the
    current RL step; schedule: [(start_step, target_length), ...] (config ``reward.length_schedule``); coef: the
    scale. -> [N] float, <= 0.
    """
    length = _lengths(lengths)  # [N]
    if correct.shape != length.shape:
        raise ValueError(f"correct must have shape {tuple(length.shape)}, got {tuple(correct.shape)}")
    target = scheduled_target(schedule, step)
    penalty = -coef * (length - target).abs() / target  # [N]
    return torch.where(correct > 0, penalty, torch.zeros_like(penalty))


# ----------------------------------------------------------------------------- the terms by name
@dataclass(frozen=True)
class ShapingInputs:
    """What a shaping term sees of one generation round's N samples, and the config section it reads."""

    reward: RewardConfig  # cfg.reward
    max_len: int  # rollout.max_new_tokens
    step: int  # the RL step
    lengths: Tensor  # [N] response lengths in model tokens
    correct: Tensor  # [N] 1.0 where the answer is right
    group_ids: Tensor  # [N] long, the prompt each sample answers (groups of rollout.n)


@dataclass(frozen=True)
class ShapingTerm:
    """One term added to the sequence reward: `fn` returns it, [N]; its mean is logged as reward/<name>
    (the name it is registered under)."""

    enabled: Callable[[RewardConfig], bool]  # from cfg.reward
    fn: Callable[[ShapingInputs], Tensor]


def overlong_term(x: ShapingInputs) -> Tensor:
    """DAPO's soft overlong punishment over the last reward.overlong.cache_len tokens before the limit."""
    return soft_overlong_punishment(x.lengths, max_len=x.max_len, cache_len=x.reward.overlong.cache_len)


def kimi_term(x: ShapingInputs) -> Tensor:
    """Kimi k1.5's length penalty within each group, times reward.kimi_length_coef."""
    return kimi_length_penalty(x.lengths, x.correct, x.group_ids, coef=x.reward.kimi_length_coef)


def bonus_term(x: ShapingInputs) -> Tensor:
    """reward.length_bonus_coef x length / rollout.max_new_tokens (ablation only)."""
    return length_bonus(x.lengths, coef=x.reward.length_bonus_coef, max_len=x.max_len)


def schedule_term(x: ShapingInputs) -> Tensor:
    """The distance of a correct answer's length from reward.length_schedule's target (ablation only)."""
    schedule = [(int(a), int(b)) for a, b in x.reward.length_schedule]
    return length_schedule_reward(x.lengths, x.correct, step=x.step, schedule=schedule, coef=x.reward.length_schedule_coef)


# summed in this order
SHAPING_TERMS.register("overlong_penalty", ShapingTerm(lambda reward: reward.overlong.soft_punishment, overlong_term))
SHAPING_TERMS.register("length_penalty", ShapingTerm(lambda reward: bool(reward.kimi_length_coef), kimi_term))
SHAPING_TERMS.register("length_bonus", ShapingTerm(lambda reward: bool(reward.length_bonus_coef), bonus_term))
SHAPING_TERMS.register("length_schedule", ShapingTerm(lambda reward: bool(reward.length_schedule), schedule_term))


def shape_rewards(cfg: Config, step: int, lengths: Tensor, correct: Tensor, group_ids: Tensor,
                  total: Tensor | None = None) -> tuple[Tensor, dict[str, float]]:
    """[N] sequence rewards: the components' weighted total (`total`; default: `correct`, the math
    checker alone), plus reward.incorrect where the answer is not correct, plus every enabled term of
    `SHAPING_TERMS`; and each enabled term's mean over the N samples, by name.

    lengths, correct, group_ids: [N] (see `ShapingInputs`)."""
    incorrect, base = cfg.reward.incorrect, correct if total is None else total
    r = base.clone() if incorrect == 0 else base + (1 - correct) * incorrect  # [N]
    x, means = ShapingInputs(cfg.reward, cfg.rollout.max_new_tokens, step, lengths, correct, group_ids), {}
    for name, term in SHAPING_TERMS.items():
        if term.enabled(cfg.reward):
            value = term.fn(x)  # [N]
            r, means[name] = r + value, float(value.mean())
    return r, means
