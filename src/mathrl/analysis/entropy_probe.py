"""The entropy probe: where a model is uncertain in one response (its highest-entropy positions, the
next-token distribution at one of them, per checkpoint) and which tokens carry the most entropy across
many responses (`entropy_by_token`; `top_entropy_tokens`, per training step). Only sampled tokens count;
tool output is left out. Scores come from `analysis/tokens/scores.py`; docs/inspect.md is the guide.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from mathrl.algo.entropy import entropy_from_logits
from mathrl.analysis.tokens.scores import TokenScores, context_before, context_text, encode, token_probs, token_texts
from mathrl.model.scoring import backbone_and_head

__all__ = [
    "CheckpointProbe",
    "EntropyPosition",
    "EntropyTokensOverSteps",
    "NextTokenDistribution",
    "TokenEntropy",
    "entropy_by_token",
    "next_token_distribution",
    "probe_checkpoint",
    "top_entropy_positions",
    "top_entropy_tokens",
]


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
