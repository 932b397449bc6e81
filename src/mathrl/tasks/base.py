"""The problem record every task source produces."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Problem:
    """One math problem with a verifiable answer.

    `question` is the raw problem text (no prompt template applied); `answer` is the gold answer as a
    string that the verifier compares against (a list-valued gold answer is joined with ", ").
    """

    id: str
    question: str
    answer: str
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
