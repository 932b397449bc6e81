"""The built-in arithmetic task: multi-digit addition with a digit-by-digit worked solution.

Problems are `a+b` with operands of `min_digits..max_digits` digits. The worked solution adds column by
column from the right, writing the carry in explicitly, and ends in `\\boxed{answer}`:

    0347+0589=7+9+0=16,4+8+1=13,3+5+1=09,0+0+0=00,\\boxed{0936}

Operands are written zero-padded to `max_digits` (`pad_operands`): every column then sits at a fixed
offset from the digits it adds, which a ~1M-parameter model learns in a couple of CPU minutes; with
natural-width operands it must first learn to locate digits by content, which takes many times longer.
The boxed answer keeps the padding; the verifier compares numbers, so `0936` equals the gold `936`.

Decimal problems (`decimal_share` > 0: that share of the problems) have operands with one decimal
place, `2.5+13.7`. Their worked solution is the integer solution of the operands scaled by 10, column
for column, and the box places the point, one digit from the right:

    2.5+13.7=5+7+0=12,2+3+1=06,0+1+0=01,\\boxed{16.2}

A decimal operand is an integer operand of `min_digits..max_digits` digits divided by 10 (`0.7`, `2.5`,
`13.7` for 1, 2 and 3 digits), so it adds in as many columns as the integer problem of the same
digits. A whole-number sum keeps its `.0` (`2.5+1.5` is `4.0`, gold answer `4.0`): the point is part
of the decimal format, and the verifier compares values, so a boxed `4` is right too. The DAPO
integer-answer transform (tasks/transforms.py) keeps exactly those problems (answer `4`) and drops the
others.

Hard problems (`min_carries` > 0): only problems whose column addition carries at least that often
(`carries`: 458+67 carries twice), by rejection sampling.

Train/held-out split: a problem belongs to the held-out set iff a keyed hash of its canonical text
(`2.5+13.7` and `25+137` are different problems) falls in the first `heldout_permille` of 1000
buckets (`is_heldout`). Training problems and the base model's pretraining data are drawn by
rejection from the complement, so the two sets are disjoint by construction, for every seed, not just
for the problems that happen to be sampled.

    python -m mathrl.tasks.arithmetic   # prints a few problems and worked solutions
"""

from __future__ import annotations

import functools
import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass

from mathrl.tasks.base import Problem


def carries(a: int, b: int) -> int:
    """How many columns of the column addition a + b (non-negative integers; decimal operands scaled
    by 10) carry into the next: 458+67 carries twice (8+7=15, 5+6+1=12, 4+0+1=5), 999+1 three times."""
    count = carry = 0
    while a or b:
        carry = (a % 10 + b % 10 + carry) // 10
        count += carry
        a, b = a // 10, b // 10
    return count


def decimal_text(scaled: int) -> str:
    """A number with one decimal place, from its value times 10: 137 -> "13.7", 7 -> "0.7", 40 -> "4.0"."""
    return f"{scaled // 10}.{scaled % 10}"


@dataclass(frozen=True)
class ArithmeticTask:
    min_digits: int = 1
    max_digits: int = 4
    pad_operands: bool = False  # write operands zero-padded to max_digits (see the module docstring)
    heldout_permille: int = 50  # share of the problem space reserved for evaluation, in 1/1000
    split_key: str = "mathrl-arith-v1"  # changing it reshuffles which problems are held out
    decimal_share: float = 0.0  # share of problems whose operands have one decimal place (see the module docstring)
    min_carries: int = 0  # only problems whose column addition carries at least this often (0: every problem)

    def __post_init__(self) -> None:
        if not 1 <= self.min_digits <= self.max_digits <= 18:
            raise ValueError(f"need 1 <= min_digits <= max_digits <= 18, got {self.min_digits}..{self.max_digits}")
        if not 1 <= self.heldout_permille < 1000:
            raise ValueError(f"heldout_permille must be in 1..999, got {self.heldout_permille}")
        if not 0.0 <= self.decimal_share <= 1.0:
            raise ValueError(f"decimal_share must be in [0, 1], got {self.decimal_share}")
        if self.decimal_share > 0 and self.pad_operands:
            raise ValueError("pad_operands writes integer operands; decimal problems (decimal_share > 0) are not padded")
        if not 0 <= self.min_carries <= self.max_digits:
            raise ValueError(f"min_carries must be in 0..max_digits={self.max_digits} (a column addition of "
                             f"{self.max_digits}-digit operands carries at most {self.max_digits} times), got {self.min_carries}")

    # -- the split ----------------------------------------------------------------------------------
    def is_heldout(self, a: int, b: int, *, decimal: bool = False) -> bool:
        """Whether the problem a+b (decimal: a/10 + b/10) is held out: a keyed hash of its canonical text."""
        text = f"{decimal_text(a)}+{decimal_text(b)}" if decimal else f"{a}+{b}"
        digest = hashlib.blake2b(f"{self.split_key}:{text}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") % 1000 < self.heldout_permille

    def _operand(self, rng: random.Random) -> int:
        digits = rng.randint(self.min_digits, self.max_digits)
        low = 0 if digits == 1 else 10 ** (digits - 1)
        return rng.randint(low, 10**digits - 1)

    def _draw(self, rng: random.Random, *, heldout: bool) -> tuple[int, int, bool]:
        """(a, b, decimal) with decimal operands scaled by 10. With decimal_share 0 and min_carries 0 it
        draws exactly what it drew before either existed (no extra draws from `rng`)."""
        for _ in range(1_000_000):
            decimal = self.decimal_share > 0 and rng.random() < self.decimal_share
            a, b = self._operand(rng), self._operand(rng)
            if self.is_heldout(a, b, decimal=decimal) == heldout and (not self.min_carries or carries(a, b) >= self.min_carries):
                return a, b, decimal
        raise ValueError(f"no {'held-out' if heldout else 'training'} problem found in the configured problem space")

    def train_problems(self, n: int, *, seed: int, keep: Callable[[Problem], bool] | None = None) -> list[Problem]:
        """`n` training problems (never held out), reproducible from `seed`. With `keep`, problems it
        rejects are drawn again (the DAPO transform on a decimal stream keeps integer answers only)."""
        rng = random.Random(f"train:{seed}")
        if keep is None:
            return [self._problem(*self._draw(rng, heldout=False)) for _ in range(n)]
        out: list[Problem] = []
        draws = 1000 * n + 10_000  # bounded: `keep` may reject every problem
        for _ in range(draws):
            if len(out) == n:
                break
            problem = self._problem(*self._draw(rng, heldout=False))
            if keep(problem):
                out.append(problem)
        if len(out) < n:
            raise ValueError(f"only {len(out)} of {n} training problems were kept after {draws} draws")
        return out

    def heldout_problems(self, n: int, *, seed: int = 0) -> list[Problem]:
        """`n` distinct held-out problems. The default seed keeps the evaluation set fixed across runs."""
        rng = random.Random(f"heldout:{seed}")
        seen: dict[tuple[int, int, bool], Problem] = {}
        for _ in range(200 * n + 10_000):  # bounded: a small problem space may hold fewer than n
            a, b, decimal = self._draw(rng, heldout=True)
            seen.setdefault((a, b, decimal), self._problem(a, b, decimal))
            if len(seen) == n:
                return list(seen.values())
        raise ValueError(
            f"could not find {n} distinct held-out problems with {self.min_digits}..{self.max_digits}-digit operands, "
            f"heldout_permille={self.heldout_permille} and min_carries={self.min_carries} (found {len(seen)}); "
            "lower data.eval_size or widen the task"
        )

    def _problem(self, a: int, b: int, decimal: bool = False) -> Problem:
        meta: dict = {"digits": max(len(str(a)), len(str(b)))}
        if decimal:
            meta["decimal"] = True
            return Problem(id=self.question(a, b, decimal=True), question=self.question(a, b, decimal=True),
                           answer=decimal_text(a + b), meta=meta)
        return Problem(id=f"{a}+{b}", question=self.question(a, b), answer=str(a + b), meta=meta)

    def question(self, a: int, b: int, *, decimal: bool = False) -> str:
        if decimal:
            return f"{decimal_text(a)}+{decimal_text(b)}"
        width = self.max_digits if self.pad_operands else 0
        return f"{a:0{width}d}+{b:0{width}d}"

    @staticmethod
    def parse(problem: Problem) -> tuple[int, int, bool]:
        """(a, b, decimal) of a problem's question; decimal operands scaled by 10 ("2.5+13.7" -> 25, 137, True)."""
        a, b = problem.question.split("+")
        decimal = "." in problem.question
        return int(a.replace(".", "")), int(b.replace(".", "")), decimal

    @staticmethod
    def operands(problem: Problem) -> tuple[int, int]:
        """The integer operands of an integer problem (`parse` reads decimal ones too)."""
        a, b, decimal = ArithmeticTask.parse(problem)
        if decimal:
            raise ValueError(f"{problem.question!r} is a decimal problem; ArithmeticTask.parse gives its scaled operands")
        return a, b

    # -- worked solutions (pretraining data for the tiny base model) --------------------------------
    def pretraining_examples(self, count: int, rng: random.Random, *, slip_prob: float = 0.0,
                             check_prob: float = 0.0, tool_share: float = 0.0) -> list[tuple[str, str]]:
        """`count` random training problems as (prompt, worked solution) text pairs, the prompt ending
        in "=": the tiny base model's pretraining text (model/tiny.py). One draw from `rng` seeds the
        problems; the solutions' slips and checks draw from it in turn. With tool_share > 0 that share
        of the solutions are tool traces (`tool_solution`), as a real base model has seen some code."""
        problems = self.train_problems(count, seed=rng.randrange(2**62))
        if tool_share <= 0:  # no extra draws: the models built before tool_share existed keep their text
            return [(p.question + "=", self.solution(p, rng=rng, slip_prob=slip_prob, check_prob=check_prob)) for p in problems]
        return [(p.question + "=", self.tool_solution(p) if rng.random() < tool_share
                 else self.solution(p, rng=rng, slip_prob=slip_prob, check_prob=check_prob)) for p in problems]

    def tool_solution(self, problem: Problem) -> str:
        """The sum computed by a python tool call, in the python_blocks format (rollout/episodes.py), its
        output, and the boxed answer copied from it:

            123+45=```python
            123+45
            ```
            ```output
            168
            ```
            \\boxed{168}
        """
        a, b, decimal = self.parse(problem)
        if decimal:
            raise ValueError("tool traces are written for integer problems")
        return f"```python\n{a}+{b}\n```\n```output\n{a + b}\n```\n\\boxed{{{a + b}}}"

    def solution(self, problem: Problem, *, rng: random.Random | None = None, slip_prob: float = 0.0,
                 check_prob: float = 0.0) -> str:
        """The worked solution of a problem of this task, integer or decimal (`worked_solution`)."""
        a, b, decimal = self.parse(problem)
        return self.worked_solution(a, b, decimal=decimal, rng=rng, slip_prob=slip_prob, check_prob=check_prob)

    def worked_solution(self, a: int, b: int, *, decimal: bool = False, rng: random.Random | None = None,
                        slip_prob: float = 0.0, check_prob: float = 0.0) -> str:
        """Column-by-column addition ending in `\\boxed{}`.

        With `decimal`, a and b are the operands scaled by 10: the columns are those of a + b and the
        box places the point one digit from the right (25, 137 -> ...,\\boxed{16.2}: 2.5 + 13.7).

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
        if decimal:  # the digits as written (a slip included), the point before the last one
            answer = (answer[:-1] or "0") + "." + answer[-1]
        return ",".join(columns) + ",\\boxed{" + answer + "}"


if __name__ == "__main__":
    task = ArithmeticTask()
    for p in task.train_problems(5, seed=0):
        print(p.question + "=" + task.solution(p))
    for p in ArithmeticTask(decimal_share=1.0).train_problems(3, seed=0):
        print(p.question + "=" + task.solution(p))


def base_pretraining_text(base) -> Callable[[int, random.Random], list[tuple[str, str]]]:
    """The pretraining text of the tiny base model a `BaseModelConfig` describes (operand sizes,
    decimal share, slips, checks), as the `pretraining_text` callable that `model/tiny.py` builds it from."""
    task = ArithmeticTask(min_digits=base.min_digits, max_digits=base.max_digits, decimal_share=base.decimal_share)
    return functools.partial(task.pretraining_examples, slip_prob=base.slip_prob, check_prob=base.check_prob,
                             tool_share=base.tool_share)
