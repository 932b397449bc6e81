"""A user-written reward for the arithmetic task: partial credit per correct digit.

The math checker gives 1 for a right sum and 0 otherwise; a response that gets three of four
digits right scores 0 like one that writes nothing. `digit_credit` scores the share of the gold
answer's digits that the boxed answer has right, aligned from the units column (the task writes
its sums column by column from the right), and logs how far off the number is. Run with the math
checker beside it, so a right answer still earns the most:

    mathrl train examples/rewards/digits.yaml

This file is plain Python that mathrl imports by its path (`fn: examples/rewards/digits.py:digit_credit`,
relative to the directory the command runs in); a module on the Python path works the same way
(`fn: mypackage.rewards:digit_credit`). The contract is the one in docs/rewards.md.
"""

from __future__ import annotations

import re

_BOXED_INT = re.compile(r"\\boxed\{\s*(-?\d+)\s*\}")


def digit_credit(prompts: list[str], responses: list[str], fields: list[dict], tokens: list[list[int]], *,
                 min_digits: int = 1) -> list[dict[str, float]]:
    """Per sample: {"score": share of the gold's digits right (units first), "abs_error": |answer - gold|};
    score 0 and abs_error = gold when there is no boxed integer.

    Args (the entry's kwargs):
        min_digits: compare at least this many columns, so a one-digit gold still needs its zeros.
    """
    out = []
    for response, row in zip(responses, fields):
        gold = str(int(row["answer"]))
        found = _BOXED_INT.findall(response)
        if not found:
            out.append({"score": 0.0, "abs_error": float(abs(int(gold)))})
            continue
        answer = str(int(found[-1]))  # the task pads sums with zeros ("0936"); 936 is meant
        width = max(len(gold), len(answer), min_digits)
        g, a = gold.zfill(width)[::-1], answer.zfill(width)[::-1]
        right = sum(x == y for x, y in zip(g, a))
        out.append({"score": right / width, "abs_error": float(abs(int(answer) - int(gold)))})
    return out
