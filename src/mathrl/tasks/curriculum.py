"""Order training problems from easy to hard: by a difficulty field, or by pass rates measured
during training.

    cur = Curriculum(problems, mode="field", field="level")      # data.curriculum.mode / .field
    cur = Curriculum(problems, mode="online")                     # pass rates from rollouts
    order = cur.order()                   # list of indices into `problems`, easiest first
    cur.update([p.id for p in batch for _ in range(n)], correct.tolist())   # after each reward
    ckpt["curriculum"] = cur.state_dict() # JSON-serialisable; cur.load_state_dict(...) to resume

"field" is Kimi k1.5's curriculum sampling (Kimi Team 2025, §2.3.4: start from easy problems, move to hard
ones, using difficulty labels). "online" estimates difficulty from the model's own rollouts instead, with
running per-problem counts and a Beta prior (the success rates Kimi tracks for its prioritised sampling,
§2.3.4); the order is recomputed from the current counts at every ``order()`` call, so it follows the model.
How the loop walks the order is its choice; this class only ranks. Tests: ``tests/tasks/test_curriculum.py``.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any, Literal

from mathrl.tasks.base import Problem

__all__ = ["Curriculum", "CurriculumMode", "difficulty_value"]

CurriculumMode = Literal["field", "online"]

_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)")


def difficulty_value(value: Any) -> float | None:
    """A sortable difficulty from a meta value: numbers as they are (5, 4.0), strings by their
    first number ("Level 3" -> 3.0, "3" -> 3.0); None for missing, bool, NaN or number-free
    strings ("Level ?", "hard"), which sort last.
    """
    if isinstance(value, bool) or value is None:  # bool before int: True is not level 1
        return None
    if isinstance(value, (int, float)):
        x = float(value)
    elif isinstance(value, str):
        m = _NUMBER.search(value)
        if m is None:
            return None
        x = float(m.group())
    else:
        return None
    return None if math.isnan(x) else x


class Curriculum:
    """Ranks problem indices easiest-first.

    problems: the training problems, whose ids must be unique (they key the online counts); ``order()`` returns
    indices into this list. mode: ``"field"`` sorts by ``problem.meta[field]`` ascending (stable; unknown values
    last), ``"online"`` by estimated pass rate, descending (stable). field: the meta key for ``"field"`` mode,
    e.g. "level" (MATH500), "difficulty" (MATH train). prior: (alpha, beta) of the Beta prior on each problem's
    pass rate; the estimate is (alpha + successes) / (alpha + beta + attempts), 0.5 for an unseen problem with
    the default Beta(1, 1) (Laplace's rule of succession), so unseen problems sit between those solved often and
    those rarely solved.
    """

    def __init__(
        self,
        problems: Sequence[Problem],
        *,
        mode: CurriculumMode,
        field: str | None = None,
        prior: tuple[float, float] = (1.0, 1.0),
    ) -> None:
        if mode not in ("field", "online"):
            raise ValueError(f"mode must be 'field' or 'online', got {mode!r}")
        if mode == "field" and not field:
            raise ValueError("mode='field' needs `field`, the meta key holding the difficulty (e.g. 'level')")
        if prior[0] <= 0 or prior[1] <= 0:
            raise ValueError(f"prior (alpha, beta) must both be > 0, got {prior}")
        self.mode = mode
        self.field = field
        self.prior = (float(prior[0]), float(prior[1]))
        self.ids = [p.id for p in problems]
        self._index = {pid: i for i, pid in enumerate(self.ids)}
        if len(self._index) != len(self.ids):
            dupes = sorted(pid for pid, k in Counter(self.ids).items() if k > 1)[:5]
            raise ValueError(f"problem ids must be unique; repeated: {dupes}")
        self._difficulty = [difficulty_value(p.meta.get(field)) for p in problems] if field else None
        self.successes = [0.0] * len(self.ids)
        self.attempts = [0] * len(self.ids)

    # -- online statistics ---------------------------------------------------------------------
    def update(self, problem_ids: Sequence[str], correct: Sequence[float]) -> None:
        """Add rollout outcomes: one entry per sampled response (so a problem sampled n times
        appears n times). ``correct`` values are in [0, 1]. Counts are kept in both modes (they
        feed ``pass_rates()`` for logging); only ``"online"`` mode orders by them.
        """
        if len(problem_ids) != len(correct):
            raise ValueError(f"got {len(problem_ids)} problem ids but {len(correct)} outcomes")
        rows = []
        for pid, c in zip(problem_ids, correct):
            if pid not in self._index:
                raise ValueError(f"unknown problem id {pid!r}: update() takes training problem ids only")
            c = float(c)
            if not 0.0 <= c <= 1.0:
                raise ValueError(f"correct values must be in [0, 1], got {c} for {pid!r}")
            rows.append((self._index[pid], c))
        for i, c in rows:  # validated first, so a bad entry leaves the counts untouched
            self.successes[i] += c
            self.attempts[i] += 1

    def pass_rates(self) -> list[float]:
        """Posterior-mean pass rate per problem, (alpha + successes) / (alpha + beta + attempts)."""
        a, b = self.prior
        return [(a + s) / (a + b + n) for s, n in zip(self.successes, self.attempts)]

    # -- ranking -------------------------------------------------------------------------------
    def order(self) -> list[int]:
        """Indices of all problems, easiest first; ties keep the input order."""
        n = len(self.ids)
        if self.mode == "field":
            assert self._difficulty is not None
            diff = self._difficulty
            # (unknown?, value): unknown values after every known one; sorted() is stable.
            return sorted(range(n), key=lambda i: (diff[i] is None, diff[i] or 0.0))
        rates = self.pass_rates()
        return sorted(range(n), key=lambda i: -rates[i])

    # -- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state: the running counts by problem id (problems never sampled are
        left out) plus the settings they were gathered under."""
        counts = {pid: [s, n] for pid, s, n in zip(self.ids, self.successes, self.attempts) if n}
        return {"mode": self.mode, "field": self.field, "prior": list(self.prior), "counts": counts}

    def load_state_dict(self, state: dict[str, Any]) -> int:
        """Restore counts saved by ``state_dict``, replacing the current ones. Counts of ids that
        are not among this curriculum's problems (the data file changed) are ignored; their number
        is returned so the caller can warn. A different mode is an error. The prior is this
        instance's own: the counts do not depend on it."""
        if state.get("mode") != self.mode:
            raise ValueError(
                f"curriculum state was saved with mode={state.get('mode')!r} but this run uses "
                f"mode={self.mode!r}; set data.curriculum.mode to match, or start without the state"
            )
        self.successes = [0.0] * len(self.ids)
        self.attempts = [0] * len(self.ids)
        ignored = 0
        for pid, (s, n) in state.get("counts", {}).items():
            i = self._index.get(pid)
            if i is None:
                ignored += 1
                continue
            self.successes[i] = float(s)
            self.attempts[i] = int(n)
        return ignored
