"""Pull the final answer out of a completion: the content of its ``\\boxed{...}`` answers.

`extract_boxed` returns the last box; `extract_boxes` every closed box; `final_answers` applies the
box policy (``reward.boxed``): which boxes make up the answer that is scored.

Model text is adversarial by accident (runaway generations, megabytes of braces, broken unicode),
so extraction is a linear scan: two regexes with no nested quantifiers, no recursion, and a cap on
how much text is looked at.

    >>> extract_boxed(r"so the answer is \\boxed{\\frac{1}{2}}.")
    '\\\\frac{1}{2}'
    >>> extract_boxed(r"\\boxed{1} then \\boxed{2") is None   # last box unterminated
    True
"""

from __future__ import annotations

import re
from typing import Literal

__all__ = ["BOX_POLICIES", "BoxPolicy", "extract_boxed", "extract_boxes", "final_answers", "reference_answer"]

# `\boxed{` or `\fbox{`, allowing spaces before the brace as LaTeX does. The lookahead rejects
# longer command names that merely start with these (`\fboxsep`, `\boxedanswer`).
_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])\s*\{")

# Tokens that matter for brace balance. A backslash escapes the next character, so `\{` and `\}`
# (literal braces, as in `\boxed{\{1,2\}}`) do not count, and `\\` (a line break) is consumed whole
# so the brace after it does count.
_BRACE_TOKEN = re.compile(r"\\.|[{}]", re.DOTALL)


def extract_boxed(text: str, *, max_chars: int = 1_000_000) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), stripped of outer whitespace.

    text: a model completion; max_chars: only the last ``max_chars`` characters are scanned (the answer is at
    the end, and this bounds time and memory on runaway generations). -> the content between the box's braces
    (``""`` for an empty box), or ``None`` when there is no box or the last box is never closed. Time is linear
    in ``min(len(text), max_chars)``.
    """
    if max_chars < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars}")
    if len(text) > max_chars:
        text = text[-max_chars:]

    last_open = None
    for last_open in _BOX_OPEN.finditer(text):
        pass
    if last_open is None:
        return None

    start = last_open.end()
    close = _closing_brace(text, start)
    return None if close is None else text[start : close.start()].strip()  # None: ran out of tokens mid-answer


def _closing_brace(text: str, start: int) -> re.Match | None:
    """The brace token that closes a box whose content starts at `start`, or None if it never closes.

    Walks the braces after the opening one; depth 0 means the box just closed. Linear time.
    """
    depth = 1
    for token in _BRACE_TOKEN.finditer(text, start):
        if token.group() == "{":
            depth += 1
        elif token.group() == "}":
            depth -= 1
            if depth == 0:
                return token
    return None


def extract_boxes(text: str, *, max_chars: int = 1_000_000) -> list[tuple[int, int, str]]:
    """Every closed top-level ``\\boxed{...}`` as ``(start, end, content)``, in order.

    ``start``/``end`` delimit the whole ``\\boxed{...}`` in the (tail-cut) text. A box nested inside
    another is part of the outer one's content. An unclosed box ends the scan (everything after it is
    inside it). Linear time, like `extract_boxed`.
    """
    if max_chars < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars}")
    if len(text) > max_chars:
        text = text[-max_chars:]
    boxes: list[tuple[int, int, str]] = []
    position = 0
    while True:
        opening = _BOX_OPEN.search(text, position)
        if opening is None:
            return boxes
        close = _closing_brace(text, opening.end())
        if close is None:
            return boxes  # unclosed: the model ran out of tokens inside it
        boxes.append((opening.start(), close.end(), text[opening.end() : close.start()].strip()))
        position = close.end()


BoxPolicy = Literal["last", "all", "any"]
BOX_POLICIES: tuple[str, ...] = ("all", "last", "any")

# What may stand between the boxes of one final answer: math delimiters, spacing, punctuation, the
# words "and"/"or", and a short label such as `x =` or `y=`. Anything else (a sentence) starts over.
_CONNECTOR = re.compile(
    r"(?:\\[()\[\]]|\$|\\[,;:! ]|\\q?quad|[\s,;.:&]|\band\b|\bor\b|\\text\{\s*(?:and|or|,)?\s*\}|"
    r"\\(?:quad|qquad)|[A-Za-z](?:_\{?[A-Za-z0-9]+\}?)?\s*=)*"
)


_ALTERNATIVES = re.compile(r"\b(?:and|or)\b")


def final_answers(text: str, policy: BoxPolicy = "all", *, max_chars: int = 1_000_000) -> list[str] | None:
    """The answer(s) to score under a box policy; ``None`` when there is no closed box.

    * ``last``: the last box only (a final box that is unclosed means no answer).
    * ``all``: the boxes of the final answer as one answer: the last box and the boxes just before it
      that are separated from it only by delimiters, commas, "and"/"or" or labels like ``y =``,
      joined with commas (with "and" where the text says "and" or "or"), repeats dropped.
      ``$\\boxed{1}$, $\\boxed{2}$ and $\\boxed{3}$`` is ``1, 2 and 3``;
      a box followed by a sentence and another box is just the last one.
    * ``any``: every box, each scored on its own; the completion is correct if one is. For scoring
      other people's outputs only: a policy can box every candidate, so never train with it.

    In every policy an unclosed box after the last closed one (a cut-off final answer) means no
    answer: the final answer is what counts.
    """
    boxes = extract_boxes(text, max_chars=max_chars)
    if not boxes:
        return None
    if len(text) > max_chars:
        text = text[-max_chars:]
    if _BOX_OPEN.search(text, boxes[-1][1]) is not None:
        return None  # the last box was never closed
    if policy == "last":
        return [boxes[-1][2]]
    if policy == "any":
        return [content for _, _, content in boxes]
    return [_joined_final_group(text, boxes)]


def _joined_final_group(text: str, boxes: list[tuple[int, int, str]]) -> str:
    """The last box and the boxes just before it that only connectors separate, joined with commas,
    repeats dropped (the ``all`` policy)."""
    group = [boxes[-1]]
    for previous in reversed(boxes[:-1]):
        between = text[previous[1] : group[0][0]]
        if len(between) > 80 or _CONNECTOR.fullmatch(between) is None:
            break
        group.insert(0, previous)
    joined, seen = "", []
    for index, (_, _, content) in enumerate(group):
        if content in seen:
            continue
        if seen:
            # "\boxed{1} and \boxed{2}": the words say these are alternatives (a set of answers);
            # keep them, so the comparison reads a set, not an ordered list.
            between = text[group[index - 1][1] : group[index][0]]
            joined += " and " if _ALTERNATIVES.search(between) else ", "
        joined += content
        seen.append(content)
    return joined


def reference_answer(text: str) -> str:
    """The gold answer in a reference text, read by the same rule as a model's answer.

    A reference with boxes (a worked solution, or an answer field such as ``\boxed{1} and \boxed{2}``)
    gives the boxes of its final answer joined as one (the ``all`` policy): ``1, 2``. A reference is
    data, not a cut-off generation, so an unclosed box at the end is ignored rather than fatal. A
    reference without a box is returned stripped. Returns ``""`` for a box that is empty.
    """
    boxes = extract_boxes(text)
    if not boxes:
        return text.strip()
    return _joined_final_group(text, boxes)


def has_final_answer(text: str) -> bool:
    """Whether `text` holds a closed \\boxed{...} answer (a tool episode's last turn without one is void)."""
    return extract_boxed(text) is not None
