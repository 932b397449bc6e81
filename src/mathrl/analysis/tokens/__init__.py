"""Per-token views of a response: its scores under one model, and what RL changed between two.

    from mathrl.analysis.tokens import compare, exploration_table, token_probs
    base = token_probs(base_model, tokenizer, prompt, response)      # TokenScores, T tokens
    rl = token_probs(rl_model, tokenizer, prompt, response)
    cmp = compare(base, rl, threshold=0.1)                            # per-token deltas + summary by class

This package is the scoring side of `mathrl inspect`; its modules, by concern:

    scores.py       per-token probabilities, logprobs and entropy under one model; tokenization and contexts
    comparison.py   base vs RL per token: token classes, moved and over-confident tokens, exploration odds
    html.py         the self-contained HTML page of `mathrl inspect`, and the record it shows

html.py is imported by its own path: it draws the entropy probe (analysis/entropy_probe.py), which
scores with scores.py, so this face leaves it out to import no circle. docs/inspect.md is the guide.
"""

from mathrl.analysis.tokens.comparison import (
    EXPLORATION_NS,
    EXPLORATION_PS,
    TOKEN_CLASSES,
    ClassSummary,
    Comparison,
    ExplorationRow,
    classify_token,
    compare,
    exploration_table,
)
from mathrl.analysis.tokens.scores import (
    TokenizerMismatchError,
    TokenScores,
    check_same_tokenizer,
    context_before,
    context_segments,
    context_text,
    encode,
    observation_mask,
    token_probs,
    token_texts,
)

__all__ = [
    "EXPLORATION_NS",
    "EXPLORATION_PS",
    "TOKEN_CLASSES",
    "ClassSummary",
    "Comparison",
    "ExplorationRow",
    "TokenScores",
    "TokenizerMismatchError",
    "check_same_tokenizer",
    "classify_token",
    "compare",
    "context_before",
    "context_segments",
    "context_text",
    "encode",
    "exploration_table",
    "observation_mask",
    "token_probs",
    "token_texts",
]
