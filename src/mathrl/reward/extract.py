"""Pull the final answer out of a completion: the content of its last ``\\boxed{...}``.

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

__all__ = ["extract_boxed"]

# `\boxed{` or `\fbox{`, allowing spaces before the brace as LaTeX does. The lookahead rejects
# longer command names that merely start with these (`\fboxsep`, `\boxedanswer`).
_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])\s*\{")

# Tokens that matter for brace balance. A backslash escapes the next character, so `\{` and `\}`
# (literal braces, as in `\boxed{\{1,2\}}`) do not count, and `\\` (a line break) is consumed whole
# so the brace after it does count.
_BRACE_TOKEN = re.compile(r"\\.|[{}]", re.DOTALL)


def extract_boxed(text: str, *, max_chars: int = 1_000_000) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), stripped of outer whitespace.

    Args:
        text: a model completion.
        max_chars: only the last ``max_chars`` characters are scanned; the answer is at the end,
            and this bounds time and memory on runaway generations.

    Returns:
        The content between the box's braces (``""`` for an empty box), or ``None`` when there is
        no box or the last box is never closed. Time is linear in ``min(len(text), max_chars)``.
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

    # Walk the braces after the opening one; depth 0 means we just closed the box.
    start = last_open.end()
    depth = 1
    for token in _BRACE_TOKEN.finditer(text, start):
        brace = token.group()
        if brace == "{":
            depth += 1
        elif brace == "}":
            depth -= 1
            if depth == 0:
                return text[start : token.start()].strip()
    return None  # unterminated: the model ran out of tokens mid-answer
