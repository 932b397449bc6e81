"""Drop individual collapsed samples from a rollout batch: repetitive loops, garbage, no answer.

The detectors are passed in, so this module depends on none of them (the shared ones live in
``mathrl.reward.collapse``; the no-answer verdict is the verifier's ``RewardResult.reason``):

    from mathrl.reward.collapse import is_garbled, is_repetitive
    res = sample_filter(texts, no_answer=[r.reason == "no_answer" for r in results],
                        is_repetitive=is_repetitive, is_garbled=is_garbled,
                        drop=set(cfg.data.sample_filter.drop))
    res.keep_rows   # [N] bool; res.counts -> {"repetitive": 3, "garbled": 0, "no_answer": 5}

What the loop does with dropped rows is its choice: zero their loss mask (group sizes, and so the group baselines,
stay as sampled), or remove them before advantages (the baseline is then taken over the remaining samples only).
Metrics: ``filter/dropped_repetitive``, ``filter/dropped_garbled``, ``filter/dropped_no_answer``.
Run the tests with ``python -m pytest tests/algo/test_sample_filter.py -q``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["REASONS", "Detector", "SampleFilterResult", "sample_filter"]

REASONS: tuple[str, ...] = ("repetitive", "garbled", "no_answer", "void_turn")
"""Drop reasons, in priority order: a sample with several is counted under the first."""

Detector = Callable[[str], bool] | Sequence[bool]
"""``(text) -> bool``, or N precomputed flags (e.g. ``is_garbled`` given each row's logprobs)."""


@dataclass(frozen=True)
class SampleFilterResult:
    keep_rows: Tensor
    """[N] bool, False for dropped samples."""
    reasons: list[str | None]
    """Per sample: the first reason in ``REASONS`` order that is in ``drop`` and applies; None if kept."""
    counts: dict[str, int]
    """Dropped samples per reason; every reason in ``REASONS`` is a key (0 when not in ``drop``),
    so logged metric names do not change with the config. The counts sum to the dropped total."""


def sample_filter(
    texts: Sequence[str],
    *,
    no_answer: Sequence[bool],
    is_repetitive: Detector,
    is_garbled: Detector,
    drop: Collection[str],
    void_turn: Sequence[bool] | None = None,
) -> SampleFilterResult:
    """Which samples to drop, and why.

    A sample is dropped when any reason in ``drop`` applies to it. Reasons are checked in the order
    repetitive, garbled, no_answer and the first that applies is recorded, so a repetitive response
    that never reached an answer counts once, under "repetitive". Reasons not in ``drop`` are not
    checked at all: their detectors are never called, and a callable detector is not called on a
    sample that an earlier reason already dropped (detectors can be slow on long texts).

    texts: N decoded responses; no_answer: N flags, True where the verifier found no final answer;
    is_repetitive, is_garbled: the detectors of reasons "repetitive" and "garbled" (each a callable on the text,
    or N flags); drop: which reasons drop a sample, a subset of ``REASONS`` (config
    ``data.sample_filter.drop``); void_turn: N flags, True where a tool episode's last turn holds neither a tool
    call nor a final answer (SimpleTIR, Xue et al. 2025, section 3: such trajectories carry the low-probability
    tokens and gradient-norm spikes that tool outputs cause), None when no sample has one. -> a
    ``SampleFilterResult``.
    """
    unknown = sorted(set(drop) - set(REASONS))
    if unknown:
        raise ValueError(f"unknown sample_filter reason(s) {unknown}; valid reasons are {list(REASONS)}")
    n = len(texts)
    detectors: dict[str, Detector] = {"repetitive": is_repetitive, "garbled": is_garbled, "no_answer": no_answer,
                                      "void_turn": [False] * n if void_turn is None else void_turn}
    for name, det in detectors.items():
        if not callable(det) and len(det) != n:
            raise ValueError(f"{name} has {len(det)} flags for {n} texts; give one per text")
    active = [name for name in REASONS if name in drop]  # priority order, whatever order `drop` has

    reasons: list[str | None] = []
    for i, text in enumerate(texts):
        reason = None
        for name in active:
            det = detectors[name]
            if det(text) if callable(det) else det[i]:
                reason = name
                break  # first reason wins; later detectors are not run on this sample
        reasons.append(reason)

    counts = {name: 0 for name in REASONS}
    for reason in reasons:
        if reason is not None:
            counts[reason] += 1
    keep_rows = torch.tensor([r is None for r in reasons], dtype=torch.bool)  # [N]
    return SampleFilterResult(keep_rows=keep_rows, reasons=reasons, counts=counts)
