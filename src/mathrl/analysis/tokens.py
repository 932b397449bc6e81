"""Token-level views of what RL changed: per-token probabilities under two models, the change between
them, the exploration odds of a peaked policy, and an entropy probe across checkpoints.

The computation side of `mathrl inspect` (rendering: `analysis/token_html.py`; command line:
`analysis/inspect_cli.py`; guide: `docs/inspect.md`):

    from mathrl.analysis.tokens import compare, exploration_table, token_probs
    base = token_probs(base_model, tokenizer, prompt, response)      # TokenScores, T tokens
    rl = token_probs(rl_model, tokenizer, prompt, response)
    cmp = compare(base, rl, threshold=0.1)                            # per-token deltas + summary by class
    exploration_table((0.9, 0.99, 0.999), (1, 4, 8, 16, 64))         # 1 - p^n

Layout: the prompt and the response are tokenized separately and their ids concatenated, exactly as
training lays out `[prompt | response]` (a response given as ids, e.g. the `token_ids` of a
rollouts.jsonl record, is used as is). Every probability is at temperature 1: the model's own
distribution, not the sampler's. Everything runs under `torch.no_grad()`.

Tool episodes: a response may hold tool observations (the `observation` field of a rollouts.jsonl
record, 1 = written by a tool). They are scored like every token, since they are context the model's
later turns read and must stay in place, but they are not the model's choices: `token_probs(...,
observation=...)` records them, and every statistic here (moved, over-confident, the class summary,
the exploration counts, the entropy probe) counts only the sampled tokens.

Run the tests with ``python -m pytest tests/test_inspect.py -q``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from mathrl.algo.entropy import entropy_from_logits
from mathrl.model.scoring import backbone_and_head, response_logprobs

__all__ = [
    "TOKEN_CLASSES",
    "CheckpointProbe",
    "ClassSummary",
    "Comparison",
    "EntropyPosition",
    "EntropyTokensOverSteps",
    "ExplorationRow",
    "InspectReport",
    "NextTokenDistribution",
    "TokenEntropy",
    "TokenScores",
    "TokenizerMismatchError",
    "check_same_tokenizer",
    "classify_token",
    "compare",
    "context_before",
    "context_segments",
    "context_text",
    "encode",
    "entropy_by_token",
    "exploration_table",
    "next_token_distribution",
    "observation_mask",
    "probe_checkpoint",
    "token_probs",
    "token_texts",
    "top_entropy_positions",
    "top_entropy_tokens",
]

# Defaults shared by the library, the command line and the docs.
EXPLORATION_PS = (0.9, 0.99, 0.999)
EXPLORATION_NS = (1, 4, 8, 16, 64)
TOKEN_CLASSES = ("formula", "word", "other")


class TokenizerMismatchError(ValueError):
    """Two models' tokenizers disagree, so token-by-token comparisons between them mean nothing."""


# ---------------------------------------------------------------------------- tokenization


def encode(
    tokenizer, prompt: str, response: str | Sequence[int], *, add_special_tokens: bool = True,
) -> tuple[list[int], list[int]]:
    """(prompt_ids, response_ids), tokenized separately as in training.

    The prompt gets the tokenizer's special tokens (BOS, where it has one) unless
    `add_special_tokens=False` (a rendered chat template already contains them; `PromptEncoder` does
    the same). The response text never gets special tokens; a response given as ids is used as is.
    """
    prompt_ids = list(tokenizer(prompt, add_special_tokens=add_special_tokens)["input_ids"])
    if isinstance(response, str):
        response_ids = list(tokenizer(response, add_special_tokens=False)["input_ids"])
    else:
        response_ids = [int(i) for i in response]
    if not prompt_ids:
        raise ValueError("the prompt encodes to no tokens; the first response token needs at least one token before it")
    if not response_ids:
        raise ValueError("the response encodes to no tokens; nothing to inspect")
    return prompt_ids, response_ids


def token_texts(tokenizer, ids: Sequence[int]) -> list[str]:
    """Readable text of each token: byte-level symbols ('Ġ' space, 'Ċ' newline) decoded one token at a time.

    Per token, `convert_tokens_to_string([tok])`. SentencePiece decoders drop the leading space of a
    text's first token, which here is every token, so a '▁' prefix is turned back into a space. A byte
    that is only part of a UTF-8 character decodes to '�' (hover titles also show the raw token).
    """
    out = []
    for i, tok in zip(ids, tokenizer.convert_ids_to_tokens(list(ids))):
        if tok is None:  # an id past the tokenizer's vocabulary (models often pad the embedding matrix)
            out.append(f"<id {i}>")
            continue
        text = tokenizer.convert_tokens_to_string([tok])
        if tok.startswith("▁") and not text.startswith(" "):
            text = " " + text
        out.append(text)
    return out


def check_same_tokenizer(a, b, texts: Sequence[str] = (), *, names: tuple[str, str] = ("base", "model")) -> None:
    """Raise TokenizerMismatchError unless `a` and `b` have the same vocabulary and encode `texts` alike.

    The vocabulary check catches different model families; the encodings catch equal vocabularies with
    different merges, normalisers or special-token handling.
    """
    va, vb = a.get_vocab(), b.get_vocab()
    if va != vb:
        only_a = sorted(set(va) - set(vb))[:3]
        only_b = sorted(set(vb) - set(va))[:3]
        moved = sorted(t for t in set(va) & set(vb) if va[t] != vb[t])[:3]
        details = []
        if len(va) != len(vb):
            details.append(f"{len(va)} vs {len(vb)} entries")
        if only_a:
            details.append(f"only in {names[0]}: {only_a}")
        if only_b:
            details.append(f"only in {names[1]}: {only_b}")
        if moved:
            details.append(f"different ids for {moved}")
        raise TokenizerMismatchError(
            f"the {names[0]} and {names[1]} tokenizers have different vocabularies ({'; '.join(details)}); "
            "token-level comparison needs two checkpoints of the same model family"
        )
    for text in texts:
        for special in (True, False):
            ea = list(a(text, add_special_tokens=special)["input_ids"])
            eb = list(b(text, add_special_tokens=special)["input_ids"])
            if ea != eb:
                raise TokenizerMismatchError(
                    f"the {names[0]} and {names[1]} tokenizers encode {text[:40]!r} differently "
                    f"({len(ea)} vs {len(eb)} tokens, add_special_tokens={special}); they must be the same tokenizer"
                )


# ---------------------------------------------------------------------------- per-token scores


@dataclass
class TokenScores:
    """One response scored by one model. T = number of response tokens.

    `logprobs[t]` is log p(token t | prompt, tokens < t) and `entropy[t]` the full-distribution entropy
    (nats) of that same next-token distribution, both at temperature 1. `observation[t]` is True where
    a tool wrote token t (context, scored but not the model's choice); None: every token was sampled.
    """

    prompt: str  # the prompt text (for the context shown before a position)
    prompt_ids: list[int]  # [P]
    token_ids: list[int]  # [T]
    tokens: list[str]  # [T] readable text of each response token
    logprobs: Tensor  # [T] float32
    entropy: Tensor  # [T] float32
    observation: Tensor | None = None  # [T] bool, True = tool output

    @property
    def probs(self) -> Tensor:  # [T]
        return self.logprobs.exp()

    @property
    def sampled(self) -> Tensor:  # [T] bool: the tokens the model chose, the only ones any statistic counts
        if self.observation is None:
            return torch.ones(len(self.token_ids), dtype=torch.bool)
        return ~self.observation

    def __len__(self) -> int:
        return len(self.token_ids)


def observation_mask(observation: Sequence[int] | Tensor | None, length: int) -> Tensor | None:
    """A rollouts.jsonl `observation` list (1 = a tool wrote the token) as a [T] bool tensor; None stays None.

    Raises ValueError unless it has one 0/1 entry per response token."""
    if observation is None:
        return None
    values = [int(x) for x in (observation.tolist() if isinstance(observation, Tensor) else observation)]
    if len(values) != length:
        raise ValueError(f"the observation mask has {len(values)} entries for {length} response tokens; "
                         "it needs one 0/1 entry per token")
    if any(v not in (0, 1) for v in values):
        raise ValueError("the observation mask holds values other than 0 and 1")
    return torch.tensor(values, dtype=torch.bool)


@torch.no_grad()
def token_probs(
    model, tokenizer, prompt: str, response: str | Sequence[int], *, add_special_tokens: bool = True,
    chunk_size: int = 1024, observation: Sequence[int] | Tensor | None = None,
) -> TokenScores:
    """Score every response token under `model` with `scoring.response_logprobs` (temperature 1).

    `observation` ([T] 0/1, 1 = tool output) does not change the scores: tool tokens are scored as the
    context they are; it is kept on the result so that statistics leave them out."""
    prompt_ids, response_ids = encode(tokenizer, prompt, response, add_special_tokens=add_special_tokens)
    mask = observation_mask(observation, len(response_ids))
    was_training = model.training
    model.eval()
    try:
        lp, ent = response_logprobs(
            model,
            torch.tensor([prompt_ids]), torch.ones(1, len(prompt_ids), dtype=torch.long),  # [1, P]
            torch.tensor([response_ids]), torch.ones(1, len(response_ids), dtype=torch.long),  # [1, T]
            temperature=1.0, chunk_size=chunk_size, with_entropy=True,
        )
    finally:
        model.train(was_training)
    return TokenScores(
        prompt=prompt, prompt_ids=prompt_ids, token_ids=response_ids, tokens=token_texts(tokenizer, response_ids),
        logprobs=lp[0].float().cpu(), entropy=ent[0].float().cpu(), observation=mask,
    )


def context_before(scores: TokenScores, position: int, width: int = 20) -> str:
    """The last `width` characters before response token `position` (reaching into the prompt if needed)."""
    return context_text(scores.prompt, scores.tokens, position, width)


def context_text(prompt: str, tokens: Sequence[str], position: int, width: int = 20) -> str:
    """The last `width` characters of prompt + tokens[:position]."""
    text = "".join(tokens[:position])
    if len(text) < width:
        text = prompt + text
    return text[-width:]


def context_segments(
    prompt: str, tokens: Sequence[str], position: int, width: int = 20, *, observation: Tensor | None = None,
) -> list[tuple[str, bool]]:
    """`context_text` cut into runs of (text, written by a tool), so that a view can show tool output apart.

    "".join(text for text, _ in context_segments(...)) == context_text(...)."""
    runs: list[tuple[str, bool]] = []
    for i, tok in enumerate(tokens[:position]):
        tool = observation is not None and bool(observation[i])
        if runs and runs[-1][1] == tool:
            runs[-1] = (runs[-1][0] + tok, tool)
        else:
            runs.append((tok, tool))
    if sum(len(t) for t, _ in runs) < width:
        if runs and not runs[0][1]:
            runs[0] = (prompt + runs[0][0], False)
        else:
            runs.insert(0, (prompt, False))
    out: list[tuple[str, bool]] = []
    left = width
    for text, tool in reversed(runs):  # keep the last `width` characters
        if left <= 0:
            break
        piece = text[-left:] if left < len(text) else text
        if piece:
            out.insert(0, (piece, tool))
        left -= len(piece)
    return out


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


# ---------------------------------------------------------------------------- entropy probe


@dataclass
class EntropyPosition:
    position: int  # response token index
    entropy: float  # nats, of the distribution that produced the token
    token: str
    prob: float  # the model's probability of the response token there
    context: str  # ~20 characters before the token


def top_entropy_positions(scores: TokenScores, k: int = 5, *, context_width: int = 20) -> list[EntropyPosition]:
    """The k sampled response positions with the highest next-token entropy, highest first (ties: earlier
    first); tool output is left out."""
    sampled = scores.sampled
    order = sorted((i for i in range(len(scores)) if sampled[i]), key=lambda i: (-float(scores.entropy[i]), i))[:k]
    return [
        EntropyPosition(
            position=i, entropy=float(scores.entropy[i]), token=scores.tokens[i], prob=float(scores.probs[i]),
            context=context_before(scores, i, context_width),
        )
        for i in order
    ]


@dataclass
class TokenEntropy:
    """One token (with the token before it) across many responses: its mean next-token entropy."""

    token: str
    previous: str  # the token before it ("" at a response's first token)
    entropy: float  # mean over its occurrences, nats
    count: int


def _entropy_sums(responses: Sequence[TokenScores]) -> dict[tuple[str, str], list[float]]:
    """(previous token, token) -> [sum of next-token entropy, occurrences] over the sampled tokens of `responses`."""
    sums: dict[tuple[str, str], list[float]] = {}
    for scores in responses:
        sampled = scores.sampled
        for i, token in enumerate(scores.tokens):
            if not sampled[i]:  # tool output: the model did not choose it
                continue
            acc = sums.setdefault((scores.tokens[i - 1] if i else "", token), [0.0, 0])
            acc[0] += float(scores.entropy[i])
            acc[1] += 1
    return sums


def entropy_by_token(responses: Sequence[TokenScores], k: int = 10, *, min_count: int = 5) -> list[TokenEntropy]:
    """The k (previous token, token) pairs with the highest mean entropy over `responses`, highest
    first (ties: more occurrences first, then the text), among pairs seen at least `min_count` times.

    The field report's table of an entropy bonus gone wrong reads this way: the comma after "wait",
    near-deterministic in the base model, climbs to a high entropy over a long run. Tracking the
    same table over checkpoints (`top_entropy_tokens`) shows which tokens a bonus acts on."""
    rows = [TokenEntropy(token=t, previous=p, entropy=total / n, count=int(n))
            for (p, t), (total, n) in _entropy_sums(responses).items() if n >= min_count]
    rows.sort(key=lambda r: (-r.entropy, -r.count, r.previous, r.token))
    return rows[:k]


@dataclass
class EntropyTokensOverSteps:
    """The highest-entropy tokens of several checkpoints of one run (or one variant's runs).

    `top[step]` is `entropy_by_token` of that step's responses. `tracked` follows every pair that is in
    any step's top through all the steps: pair -> step -> its mean entropy and count there (a step
    where the pair never occurs is absent), so a token that climbs into the top late shows where it
    started."""

    steps: list[int]  # ascending
    top: dict[int, list[TokenEntropy]]
    tracked: dict[tuple[str, str], dict[int, TokenEntropy]]  # (previous, token) -> step -> row


def top_entropy_tokens(
    by_step: Mapping[int, Sequence[TokenScores]], k: int = 10, *, min_count: int = 5,
) -> EntropyTokensOverSteps:
    """Per step, the k (previous token, token) pairs of highest mean entropy (`entropy_by_token`, pairs
    seen at least `min_count` times), and those pairs' mean entropy and count at every step.

    `by_step`: step -> the responses sampled from that step's checkpoint, scored by it (TokenScores:
    per-token entropy and token text). Tracked pairs are ordered by their entropy at the last step
    (absent there: after the others), then by their first appearance in a top."""
    steps = sorted(by_step)
    sums = {step: _entropy_sums(by_step[step]) for step in steps}
    top = {step: entropy_by_token(by_step[step], k, min_count=min_count) for step in steps}
    pairs = list(dict.fromkeys((r.previous, r.token) for step in steps for r in top[step]))
    tracked = {
        pair: {step: TokenEntropy(token=pair[1], previous=pair[0], entropy=sums[step][pair][0] / sums[step][pair][1],
                                  count=int(sums[step][pair][1]))
               for step in steps if pair in sums[step]}
        for pair in pairs
    }
    last = steps[-1] if steps else None
    order = sorted(range(len(pairs)), key=lambda i: (
        last not in tracked[pairs[i]], -tracked[pairs[i]][last].entropy if last in tracked[pairs[i]] else 0.0, i))
    return EntropyTokensOverSteps(steps=steps, top=top, tracked={pairs[i]: tracked[pairs[i]] for i in order})


@dataclass
class NextTokenDistribution:
    """The model's distribution over response token `position` given everything before it."""

    position: int
    context: str  # ~20 characters before the position
    actual_id: int  # the response's token there
    actual_token: str
    actual_prob: float
    actual_rank: int  # 1 = the most likely token
    entropy: float  # nats, full distribution
    top: list[tuple[str, int, float]]  # [(token text, id, prob)] * k, most likely first


@torch.no_grad()
def next_token_distribution(
    model, tokenizer, prompt: str, response: str | Sequence[int], position: int, k: int = 5, *,
    add_special_tokens: bool = True,
) -> NextTokenDistribution:
    """Top-k of p(· | prompt, response[:position]) at temperature 1.

    Only the logits of that one position are materialised: the backbone's last hidden state goes
    through the lm head (`scoring.backbone_and_head`), [H] -> [V].
    """
    prompt_ids, response_ids = encode(tokenizer, prompt, response, add_special_tokens=add_special_tokens)
    if not 0 <= position < len(response_ids):
        raise ValueError(f"position {position} is outside the response (0 .. {len(response_ids) - 1})")
    device = next(model.parameters()).device
    ids = torch.tensor([prompt_ids + response_ids[:position]], device=device)  # [1, L]
    backbone, head = backbone_and_head(model)
    was_training = model.training
    model.eval()
    try:
        hidden = backbone(
            input_ids=ids, attention_mask=torch.ones_like(ids), position_ids=torch.arange(ids.shape[1], device=device)[None],
        ).last_hidden_state[0, -1]  # [H]
    finally:
        model.train(was_training)
    logits = F.linear(hidden, head.weight, getattr(head, "bias", None)).float()  # [V]
    probs = logits.softmax(-1)  # [V]
    top = probs.topk(min(k, probs.shape[0]))
    top_ids = top.indices.tolist()
    actual = response_ids[position]
    return NextTokenDistribution(
        position=position, context=context_text(prompt, token_texts(tokenizer, response_ids[:position]), position),
        actual_id=actual, actual_token=token_texts(tokenizer, [actual])[0], actual_prob=float(probs[actual]),
        actual_rank=int((probs > probs[actual]).sum()) + 1, entropy=float(entropy_from_logits(logits)),
        top=list(zip(token_texts(tokenizer, top_ids), top_ids, top.values.tolist())),
    )


@dataclass
class CheckpointProbe:
    """One checkpoint's view of the response: its highest-entropy positions and, at the chosen position,
    its next-token distribution."""

    name: str
    path: str
    mean_entropy: float  # over the sampled response tokens (nan if a tool wrote them all)
    top_positions: list[EntropyPosition]
    distribution: NextTokenDistribution | None


def probe_checkpoint(
    model, tokenizer, prompt: str, response: str | Sequence[int], *, name: str, path: str = "",
    entropy_k: int = 5, position: int | None = None, dist_k: int = 5, scores: TokenScores | None = None,
    add_special_tokens: bool = True, observation: Sequence[int] | Tensor | None = None,
) -> CheckpointProbe:
    """Entropy probe of one checkpoint (`scores`: this model's TokenScores, if already computed; else
    the response is scored here, with `observation` marking tool output)."""
    if scores is None:
        scores = token_probs(model, tokenizer, prompt, response, add_special_tokens=add_special_tokens,
                             observation=observation)
    dist = None
    if position is not None:
        dist = next_token_distribution(model, tokenizer, prompt, scores.token_ids, position, dist_k,
                                       add_special_tokens=add_special_tokens)
    return CheckpointProbe(
        name=name, path=path, mean_entropy=float(scores.entropy[scores.sampled].mean()),
        top_positions=top_entropy_positions(scores, entropy_k), distribution=dist,
    )


# ---------------------------------------------------------------------------- the whole report


@dataclass
class InspectReport:
    """Everything `mathrl inspect` shows, for the console and the HTML page."""

    source: str  # where the response came from (a rollouts.jsonl record or "--prompt/--response")
    prompt: str
    base_path: str
    model_path: str
    comparison: Comparison
    exploration: list[ExplorationRow]
    probes: list[CheckpointProbe] = field(default_factory=list)
    position: int | None = None  # the probed position
    notes: list[str] = field(default_factory=list)
