"""Per-token scores of a response under one model (each token's probability, logprob and the entropy of its
distribution), with the tokenization helpers and text contexts around them.

The scoring side of `mathrl inspect` (docs/inspect.md), beside `analysis/tokens/comparison.py` (what RL changed),
`analysis/entropy_probe.py`, `analysis/tokens/html.py` (rendering) and `analysis/inspect_cli.py` (command line):

    from mathrl.analysis.tokens import compare, exploration_table, token_probs
    base = token_probs(base_model, tokenizer, prompt, response)      # TokenScores, T tokens
    rl = token_probs(rl_model, tokenizer, prompt, response)
    cmp = compare(base, rl, threshold=0.1)                            # per-token deltas + summary by class
    exploration_table((0.9, 0.99, 0.999), (1, 4, 8, 16, 64))         # 1 - p^n

Prompt and response are tokenized separately and joined as training lays out `[prompt | response]` (response ids,
e.g. a rollouts.jsonl record's `token_ids`, are used as is); probabilities are at temperature 1, under `torch.no_grad()`.
Tool observations (`token_probs(..., observation=...)`) are scored in place; every statistic counts only sampled tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from mathrl.model.scoring import response_logprobs

__all__ = [
    "TokenScores",
    "TokenizerMismatchError",
    "check_same_tokenizer",
    "context_before",
    "context_segments",
    "context_text",
    "encode",
    "observation_mask",
    "token_probs",
    "token_texts",
]


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

