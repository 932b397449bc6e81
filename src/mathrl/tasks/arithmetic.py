"""The built-in arithmetic task: multi-digit addition with a digit-by-digit worked solution.

Problems are `a+b` with operands of `min_digits..max_digits` digits. The worked solution adds column by
column from the right, writing the carry in explicitly, and ends in `\\boxed{answer}`:

    0347+0589=7+9+0=16,4+8+1=13,3+5+1=09,0+0+0=00,\\boxed{0936}

Operands are written zero-padded to `max_digits` (`pad_operands`): every column then sits at a fixed
offset from the digits it adds, which a ~1M-parameter model learns in a couple of CPU minutes; with
natural-width operands it must first learn to locate digits by content, which takes many times longer.
The boxed answer keeps the padding; the verifier compares numbers, so `0936` equals the gold `936`.

Train/held-out split: a problem belongs to the held-out set iff a keyed hash of its canonical text
falls in the first `heldout_permille` of 1000 buckets (`is_heldout`). Training problems and the base
model's pretraining data are drawn by rejection from the complement, so the two sets are disjoint by
construction, for every seed, not just for the problems that happen to be sampled.

    python -m mathrl.tasks.arithmetic   # prints a few problems and worked solutions
"""

from __future__ import annotations

import functools
import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass

from mathrl.tasks.base import Problem


@dataclass(frozen=True)
class ArithmeticTask:
    min_digits: int = 1
    max_digits: int = 4
    pad_operands: bool = False  # write operands zero-padded to max_digits (see the module docstring)
    heldout_permille: int = 50  # share of the problem space reserved for evaluation, in 1/1000
    split_key: str = "mathrl-arith-v1"  # changing it reshuffles which problems are held out

    def __post_init__(self) -> None:
        if not 1 <= self.min_digits <= self.max_digits <= 18:
            raise ValueError(f"need 1 <= min_digits <= max_digits <= 18, got {self.min_digits}..{self.max_digits}")
        if not 1 <= self.heldout_permille < 1000:
            raise ValueError(f"heldout_permille must be in 1..999, got {self.heldout_permille}")

    # -- the split ----------------------------------------------------------------------------------
    def is_heldout(self, a: int, b: int) -> bool:
        digest = hashlib.blake2b(f"{self.split_key}:{a}+{b}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") % 1000 < self.heldout_permille

    def _operand(self, rng: random.Random) -> int:
        digits = rng.randint(self.min_digits, self.max_digits)
        low = 0 if digits == 1 else 10 ** (digits - 1)
        return rng.randint(low, 10**digits - 1)

    def _draw(self, rng: random.Random, *, heldout: bool) -> tuple[int, int]:
        for _ in range(1_000_000):
            a, b = self._operand(rng), self._operand(rng)
            if self.is_heldout(a, b) == heldout:
                return a, b
        raise ValueError(f"no {'held-out' if heldout else 'training'} problem found in the configured problem space")

    def train_problems(self, n: int, *, seed: int) -> list[Problem]:
        """`n` training problems (never held out), reproducible from `seed`."""
        rng = random.Random(f"train:{seed}")
        return [self._problem(*self._draw(rng, heldout=False)) for _ in range(n)]

    def heldout_problems(self, n: int, *, seed: int = 0) -> list[Problem]:
        """`n` distinct held-out problems. The default seed keeps the evaluation set fixed across runs."""
        rng = random.Random(f"heldout:{seed}")
        seen: dict[tuple[int, int], Problem] = {}
        for _ in range(200 * n + 10_000):  # bounded: a small problem space may hold fewer than n
            a, b = self._draw(rng, heldout=True)
            seen.setdefault((a, b), self._problem(a, b))
            if len(seen) == n:
                return list(seen.values())
        raise ValueError(
            f"could not find {n} distinct held-out problems with {self.min_digits}..{self.max_digits}-digit operands "
            f"and heldout_permille={self.heldout_permille} (found {len(seen)}); lower data.eval_size or widen the task"
        )

    def _problem(self, a: int, b: int) -> Problem:
        return Problem(id=f"{a}+{b}", question=self.question(a, b), answer=str(a + b), meta={"digits": max(len(str(a)), len(str(b)))})

    def question(self, a: int, b: int) -> str:
        width = self.max_digits if self.pad_operands else 0
        return f"{a:0{width}d}+{b:0{width}d}"

    @staticmethod
    def operands(problem: Problem) -> tuple[int, int]:
        a, b = problem.question.split("+")
        return int(a), int(b)

    # -- worked solutions (pretraining data for the tiny base model) --------------------------------
    def pretraining_examples(self, count: int, rng: random.Random, *, slip_prob: float = 0.0,
                             check_prob: float = 0.0) -> list[tuple[str, str]]:
        """`count` random training problems as (prompt, worked solution) text pairs, the prompt ending
        in "=": the tiny base model's pretraining text (model/tiny.py). One draw from `rng` seeds the
        problems; the solutions' slips and checks draw from it in turn."""
        problems = self.train_problems(count, seed=rng.randrange(2**62))
        return [(p.question + "=", self.worked_solution(*self.operands(p), rng=rng, slip_prob=slip_prob,
                                                        check_prob=check_prob)) for p in problems]

    def worked_solution(self, a: int, b: int, *, rng: random.Random | None = None, slip_prob: float = 0.0,
                        check_prob: float = 0.0) -> str:
        """Column-by-column addition ending in `\\boxed{}`.

        With `slip_prob` > 0 each column's written sum is, with that probability, replaced by a wrong
        value; later carries and the final answer follow the written (wrong) sums, the way a person's
        slip propagates. A model pretrained on such text samples slips at roughly that rate, which is
        what makes the tiny base model only partly competent at temperature 1.

        With `check_prob` > 0 a column is, with that probability and independently of whether it
        slipped, followed by a self-check: `?`, the column written again, and its correct sum, which
        the carry and the digit then follow (`7+9+0=13?7+9+0=16,`: "wait, 7+9+0 is 16"). A check
        always recomputes correctly, so it repairs a slip and changes nothing otherwise; it costs 9
        tokens. Whether to check is one sampled token (`?` or `,`) after each column sum, which is how
        a policy pretrained on this text can learn that checking pays (recipes/arith_check_grpo.yaml).
        """
        width = self.max_digits if self.pad_operands else 0
        da, db = f"{a:0{width}d}"[::-1], f"{b:0{width}d}"[::-1]
        carry, columns, digits = 0, [], []
        for i in range(max(len(da), len(db))):
            x = int(da[i]) if i < len(da) else 0
            y = int(db[i]) if i < len(db) else 0
            total = x + y + carry
            correct = total
            if rng is not None and slip_prob > 0 and rng.random() < slip_prob:
                total = rng.choice([v for v in range(20) if v != total])
            column = f"{x}+{y}+{carry}={total:02d}"
            if rng is not None and check_prob > 0 and rng.random() < check_prob:
                column += f"?{x}+{y}+{carry}={correct:02d}"
                total = correct
            columns.append(column)
            digits.append(str(total % 10))
            carry = total // 10
        answer = (str(carry) if carry else "") + "".join(reversed(digits))
        return ",".join(columns) + ",\\boxed{" + answer + "}"


if __name__ == "__main__":
    task = ArithmeticTask()
    for p in task.train_problems(5, seed=0):
        a, b = map(int, p.question.split("+"))
        print(p.question + "=" + task.worked_solution(a, b))


def base_pretraining_text(base) -> Callable[[int, random.Random], list[tuple[str, str]]]:
    """The pretraining text of the tiny base model a `BaseModelConfig` describes (operand sizes,
    slips, checks), as the `pretraining_text` callable that `model/tiny.py` builds it from."""
    task = ArithmeticTask(min_digits=base.min_digits, max_digits=base.max_digits)
    return functools.partial(task.pretraining_examples, slip_prob=base.slip_prob, check_prob=base.check_prob)
