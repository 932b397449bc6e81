"""What RL changed at each token of one response: token classes (formula, word, other), the per-token
comparison of two models' scores (`compare`: moved and over-confident tokens, a summary by class) and
the exploration odds of a peaked policy (`exploration_table`: 1 - p^n). Only sampled tokens count;
tool output is left out. Scores come from `analysis/tokens/scores.py`; docs/inspect.md is the guide.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from mathrl.analysis.tokens.scores import TokenScores

__all__ = [
    "TOKEN_CLASSES",
    "ClassSummary",
    "Comparison",
    "ExplorationRow",
    "classify_token",
    "compare",
    "exploration_table",
]

# Defaults shared by the library, the command line and the docs.
EXPLORATION_PS = (0.9, 0.99, 0.999)
EXPLORATION_NS = (1, 4, 8, 16, 64)
TOKEN_CLASSES = ("formula", "word", "other")


# ---------------------------------------------------------------------------- token classes

# A whole token (whitespace removed) made only of these: digits, arithmetic operators and formula
# punctuation, or LaTeX commands (a backslash and letters, e.g. \frac, \boxed). The command
# alternative comes first so that "\frac" is one command, not "\" followed by letters.
_FORMULA_RE = re.compile(r"(?:\\[A-Za-z]+|[0-9+\-*/=^()\[\]{}\\<>.,])+")


def classify_token(text: str) -> str:
    """'formula', 'word' or 'other' for a token's readable text. Whitespace is removed first; then

    * formula: non-empty and made only of the digits 0-9, the symbols + - * / = ^ ( ) [ ] { } \\ < > . ,
      and LaTeX commands (backslash + ASCII letters): "7", " 12", "+", "=", "\\frac", "\\boxed{", ").";
    * word: non-empty and every character alphabetic (`str.isalpha`, Unicode letters): " the", "So",
      "x", "α" (a one-letter variable counts as a word);
    * other: everything else: whitespace-only tokens, other punctuation (":", "?", "!", "$", "'"),
      mixed tokens ("2x", "x^"), special tokens ("<eos>", "<|im_end|>").
    """
    s = "".join(text.split())
    if not s:
        return "other"
    if _FORMULA_RE.fullmatch(s):
        return "formula"
    if s.isalpha():
        return "word"
    return "other"


# ---------------------------------------------------------------------------- base vs RL


@dataclass
class ClassSummary:
    """Counts over the response tokens of one class ('formula', 'word', 'other' or 'all')."""

    n_tokens: int
    n_moved: int  # |Δp| > threshold
    n_up: int  # moved, p_rl > p_base
    n_down: int  # moved, p_rl < p_base
    n_overconfident: int

    @property
    def share_moved(self) -> float:
        """n_moved / n_tokens (nan for a class with no tokens)."""
        return self.n_moved / self.n_tokens if self.n_tokens else math.nan


@dataclass
class Comparison:
    """Base vs RL on the same response tokens. T = number of response tokens.

    Δ is always RL minus base: delta_logp = logp_rl - logp_base (> 0: RL made the token more likely).
    A token is *moved* when |p_rl - p_base| > threshold, and *over-confident* when the base already
    found it likely and RL pushed it toward 1: p_base >= confident, p_rl > p_base and p_rl >= saturated.
    Tool output (`observation`) is never moved or over-confident, is never in `top_moved` and is in no
    `summary` row: the per-token values are kept for display, every count is over `sampled` tokens.
    """

    tokens: list[str]  # [T]
    token_ids: list[int]  # [T]
    p_base: Tensor  # [T]
    p_rl: Tensor  # [T]
    delta_logp: Tensor  # [T]
    delta_p: Tensor  # [T]
    entropy_base: Tensor  # [T]
    entropy_rl: Tensor  # [T]
    classes: list[str]  # [T] see classify_token
    observation: Tensor  # [T] bool, True = written by a tool (all False without tools)
    moved: Tensor  # [T] bool
    overconfident: Tensor  # [T] bool
    top_moved: list[int]  # positions of the top_k largest |Δp|, largest first
    summary: dict[str, ClassSummary]  # TOKEN_CLASSES and "all"
    threshold: float
    confident: float
    saturated: float

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def sampled(self) -> Tensor:  # [T] bool: the model's own tokens
        return ~self.observation


def compare(
    base: TokenScores, rl: TokenScores, *, threshold: float = 0.1, confident: float = 0.9, saturated: float = 0.99,
    top_k: int = 10,
) -> Comparison:
    """Per-token change from `base` to `rl` and its summary by token class (see Comparison for the terms).

    Ties in |Δp| keep the earlier position first, so `top_moved` is deterministic. Tool output
    (`base.observation`) is left out of every count.
    """
    if base.token_ids != rl.token_ids:
        raise ValueError("base and rl scores are for different token sequences; score the same response with both")
    if not torch.equal(base.sampled, rl.sampled):
        raise ValueError("base and rl scores mark different tokens as tool output; give both the same observation mask")
    if not 0 <= threshold < 1:
        raise ValueError(f"threshold is a probability difference in [0, 1), got {threshold}")
    sampled = base.sampled  # [T] bool
    p_base, p_rl = base.probs, rl.probs  # [T]
    delta_p = p_rl - p_base  # [T]
    moved = (delta_p.abs() > threshold) & sampled
    overconfident = (p_base >= confident) & (p_rl > p_base) & (p_rl >= saturated) & sampled
    classes = [classify_token(t) for t in base.tokens]
    model_rows = [i for i in range(len(delta_p)) if sampled[i]]
    order = sorted(model_rows, key=lambda i: (-abs(float(delta_p[i])), i))

    def summarise(rows: list[int]) -> ClassSummary:
        idx = torch.tensor(rows, dtype=torch.long)
        return ClassSummary(
            n_tokens=len(rows),
            n_moved=int(moved[idx].sum()),
            n_up=int((moved & (delta_p > 0))[idx].sum()),
            n_down=int((moved & (delta_p < 0))[idx].sum()),
            n_overconfident=int(overconfident[idx].sum()),
        )

    summary = {c: summarise([i for i in model_rows if classes[i] == c]) for c in TOKEN_CLASSES}
    summary["all"] = summarise(model_rows)
    return Comparison(
        tokens=list(base.tokens), token_ids=list(base.token_ids), p_base=p_base, p_rl=p_rl,
        delta_logp=rl.logprobs - base.logprobs, delta_p=delta_p, entropy_base=base.entropy, entropy_rl=rl.entropy,
        classes=classes, observation=~sampled, moved=moved, overconfident=overconfident, top_moved=order[:top_k], summary=summary,
        threshold=threshold, confident=confident, saturated=saturated,
    )


# ---------------------------------------------------------------------------- exploration odds


@dataclass
class ExplorationRow:
    """For a position whose top token has probability p: chance[n] = 1 - p^n, the probability that at
    least one of n independent rollouts samples some other token there. `n_base` / `n_rl` (when
    given) count the response tokens whose own probability is >= p under each model."""

    p: float
    chance: dict[int, float]
    n_base: int | None = None
    n_rl: int | None = None


def exploration_table(
    ps: Sequence[float] = EXPLORATION_PS, ns: Sequence[int] = EXPLORATION_NS, *, comparison: Comparison | None = None,
) -> list[ExplorationRow]:
    """1 - p^n for each p in `ps` and n in `ns`: how rarely n rollouts leave a peaked token.

    A policy at p = 0.99 on a token samples an alternative in at least one of 16 rollouts only
    1 - 0.99^16 = 14.9% of the time (at p = 0.999, 1.6%), so GRPO's group rarely contains the
    contrast that would teach it anything at that position. Computed as -expm1(n log p), exact for p
    near 1. With `comparison`, each row also counts this response's sampled tokens at or above p.
    """
    rows = []
    for p in ps:
        if not 0 <= p <= 1:
            raise ValueError(f"probabilities must lie in [0, 1], got {p}")
        chance = {int(n): (1.0 if p == 0 else -math.expm1(n * math.log(p))) for n in ns}
        row = ExplorationRow(p=float(p), chance=chance)
        if comparison is not None:
            row.n_base = int(((comparison.p_base >= p) & comparison.sampled).sum())
            row.n_rl = int(((comparison.p_rl >= p) & comparison.sampled).sum())
        rows.append(row)
    return rows

