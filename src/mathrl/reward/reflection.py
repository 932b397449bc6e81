"""Reflection markers in responses: how often a policy stops to check its work.

R1-style runs track how often responses contain words such as "wait" or "verify" (the "aha moment"),
and whether that rate grows under RL. `log.reflection_words` lists the markers; the built-in
reflective arithmetic task writes its self-checks as "?" (recipes/arith_check_grpo.yaml).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence


def count_reflections(text: str, words: Sequence[str]) -> int:
    """Occurrences of any marker in `text`, counted without overlap, longest marker first at each place.

    >>> count_reflections("Wait, 3+4=7. Wait, verify: 7.", ["Wait", "verify"])
    3
    """
    words = tuple(w for w in words if w)  # an empty marker would match everywhere
    return len(_pattern(words).findall(text)) if words else 0


@functools.lru_cache(maxsize=8)
def _pattern(words: tuple[str, ...]) -> re.Pattern:
    """One regex for the markers: a single C-level scan per response (long traces, every step)."""
    return re.compile("|".join(re.escape(w) for w in sorted(set(words), key=len, reverse=True)))


def reflection_stats(texts: Sequence[str], words: Sequence[str]) -> dict[str, float]:
    """`reflection_rate`: share of texts with at least one marker; `reflections_per_response`: mean count."""
    counts = [count_reflections(t, words) for t in texts]
    if not counts:
        return {"reflection_rate": 0.0, "reflections_per_response": 0.0}
    return {"reflection_rate": sum(c > 0 for c in counts) / len(counts),
            "reflections_per_response": sum(counts) / len(counts)}
