"""The built-in arithmetic task: multi-digit addition with a digit-by-digit worked solution (and products).

    0347+0589=7+9+0=16,4+8+1=13,3+5+1=09,0+0+0=00,\\boxed{0936}

Problems `a+b` (operands zero-padded to `max_digits`), with optional decimal problems
(`decimal_share`), carry-heavy problems (`min_carries`) and products worked as long multiplication
(`mul_share`); `is_heldout` splits train from held-out problems by a keyed hash of the problem's text,
so the two sets are disjoint for every seed. Pure functions of a seeded RNG: no files, no devices.
Why the padding, each variant's format, and the split: docs/guide.md, "The built-in arithmetic task".

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
    mul_share: float = 0.0  # share of problems that are products a*b (see the module docstring)
    mul_digits: int = 2  # digits of a product's second factor

    def __post_init__(self) -> None:
        if not 1 <= self.min_digits <= self.max_digits <= 18:
            raise ValueError(f"need 1 <= min_digits <= max_digits <= 18, got {self.min_digits}..{self.max_digits}")
        if not 1 <= self.heldout_permille < 1000:
            raise ValueError(f"heldout_permille must be in 1..999, got {self.heldout_permille}")
        if not 0.0 <= self.decimal_share <= 1.0:
            raise ValueError(f"decimal_share must be in [0, 1], got {self.decimal_share}")
        if self.decimal_share > 0 and self.pad_operands:
            raise ValueError("pad_operands writes integer operands; decimal problems (decimal_share > 0) are not padded")
        if not 0.0 <= self.mul_share <= 1.0:
            raise ValueError(f"mul_share must be in [0, 1], got {self.mul_share}")
        if self.mul_share > 0 and self.decimal_share > 0:
            raise ValueError("products are integer problems: mul_share > 0 needs decimal_share 0")
        if not 1 <= self.mul_digits <= 18:
            raise ValueError(f"mul_digits must be in 1..18, got {self.mul_digits}")
        if not 0 <= self.min_carries <= self.max_digits:
            raise ValueError(f"min_carries must be in 0..max_digits={self.max_digits} (a column addition of "
                             f"{self.max_digits}-digit operands carries at most {self.max_digits} times), got {self.min_carries}")

    # -- the split ----------------------------------------------------------------------------------
    def is_heldout(self, a: int, b: int, *, decimal: bool = False, mul: bool = False) -> bool:
        """Whether the problem a+b (decimal: a/10 + b/10; mul: a*b) is held out: a keyed hash of its canonical text."""
        text = f"{decimal_text(a)}+{decimal_text(b)}" if decimal else f"{a}*{b}" if mul else f"{a}+{b}"
        digest = hashlib.blake2b(f"{self.split_key}:{text}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") % 1000 < self.heldout_permille

    def _operand(self, rng: random.Random) -> int:
        digits = rng.randint(self.min_digits, self.max_digits)
        low = 0 if digits == 1 else 10 ** (digits - 1)
        return rng.randint(low, 10**digits - 1)

    def _factor(self, rng: random.Random) -> int:
        low = 0 if self.mul_digits == 1 else 10 ** (self.mul_digits - 1)
        return rng.randint(low, 10**self.mul_digits - 1)

    def _draw(self, rng: random.Random, *, heldout: bool) -> tuple[int, int, bool, bool]:
        """(a, b, decimal, mul) with decimal operands scaled by 10. With decimal_share 0, mul_share 0 and
        min_carries 0 it draws exactly what it drew before any of them existed (no extra draws from `rng`)."""
        for _ in range(1_000_000):
            decimal = self.decimal_share > 0 and rng.random() < self.decimal_share
            mul = self.mul_share > 0 and rng.random() < self.mul_share
            a, b = self._operand(rng), (self._factor(rng) if mul else self._operand(rng))
            hard_enough = mul or not self.min_carries or carries(a, b) >= self.min_carries
            if self.is_heldout(a, b, decimal=decimal, mul=mul) == heldout and hard_enough:
                return a, b, decimal, mul
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
        seen: dict[tuple[int, int, bool, bool], Problem] = {}
        for _ in range(200 * n + 10_000):  # bounded: a small problem space may hold fewer than n
            key = self._draw(rng, heldout=True)
            seen.setdefault(key, self._problem(*key))
            if len(seen) == n:
                return list(seen.values())
        raise ValueError(
            f"could not find {n} distinct held-out problems with {self.min_digits}..{self.max_digits}-digit operands, "
            f"heldout_permille={self.heldout_permille} and min_carries={self.min_carries} (found {len(seen)}); "
            "lower data.eval_size or widen the task"
        )

    def _problem(self, a: int, b: int, decimal: bool = False, mul: bool = False) -> Problem:
        meta: dict = {"digits": max(len(str(a)), len(str(b)))}
        if mul:
            meta["product"] = True
            return Problem(id=f"{a}*{b}", question=f"{a}*{b}", answer=str(a * b), meta=meta)
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
    def is_product(problem: Problem) -> bool:
        return "*" in problem.question

    @staticmethod
    def parse(problem: Problem) -> tuple[int, int, bool]:
        """(a, b, decimal) of a problem's question; decimal operands scaled by 10 ("2.5+13.7" -> 25, 137,
        True); a product's factors ("347*26" -> 347, 26, False: `is_product` tells it apart)."""
        a, b = problem.question.split("*" if ArithmeticTask.is_product(problem) else "+")
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
        """The sum (or product) computed by a python tool call, in the python_blocks format
        (rollout/episodes.py), its output, and the boxed answer copied from it:

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
        op, value = ("*", a * b) if self.is_product(problem) else ("+", a + b)
        return f"```python\n{a}{op}{b}\n```\n```output\n{value}\n```\n\\boxed{{{value}}}"

    def solution(self, problem: Problem, *, rng: random.Random | None = None, slip_prob: float = 0.0,
                 check_prob: float = 0.0) -> str:
        """The worked solution of a problem of this task, integer, decimal (`worked_solution`) or a product
        (`product_solution`)."""
        a, b, decimal = self.parse(problem)
        if self.is_product(problem):
            return self.product_solution(a, b, rng=rng, slip_prob=slip_prob)
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
        columns, answer = self._add_columns(a, b, width=width, rng=rng, slip_prob=slip_prob, check_prob=check_prob)
        if decimal:  # the digits as written (a slip included), the point before the last one
            answer = (answer[:-1] or "0") + "." + answer[-1]
        return ",".join(columns) + ",\\boxed{" + answer + "}"

    @staticmethod
    def _add_columns(a: int, b: int, *, width: int, rng: random.Random | None, slip_prob: float,
                     check_prob: float) -> tuple[list[str], str]:
        """The columns of a + b as written (`worked_solution`) and the sum their digits spell."""
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
        return columns, (str(carry) if carry else "") + "".join(reversed(digits))

    def product_solution(self, a: int, b: int, *, rng: random.Random | None = None, slip_prob: float = 0.0) -> str:
        """Long multiplication ending in `\\boxed{}` (the module docstring shows one).

        One partial product per digit `d` of b, from the right: `d:` and a column per digit x of a,
        from the right, `x*d+carry=value` (two digits: the digit and the next carry), then `=` and the
        partial as written. Then the partials, each shifted by its place, are added to the running
        total one at a time in `worked_solution`'s columns (`2082+6940=...`), and the last total is
        boxed. With `slip_prob` > 0 every column, of a partial or of a sum, slips with that chance the
        way `worked_solution`'s do, and what follows uses the written value.
        """
        slips = rng is not None and slip_prob > 0
        parts, partials = [], []
        for d in (int(c) for c in reversed(str(b))):
            carry, columns, digits = 0, [], []
            for x in (int(c) for c in reversed(str(a))):
                value = x * d + carry
                if slips and rng.random() < slip_prob:
                    value = rng.choice([v for v in range(90) if v != value])
                columns.append(f"{x}*{d}+{carry}={value:02d}")
                digits.append(str(value % 10))
                carry = value // 10
            partial = (str(carry) if carry else "") + "".join(reversed(digits))
            parts.append(f"{d}:" + ",".join(columns) + f",={partial}")
            partials.append(partial)
        total = partials[0]
        for place, partial in enumerate(partials[1:], start=1):
            shifted = partial + "0" * place
            columns, total_next = self._add_columns(int(total), int(shifted), width=0, rng=rng,
                                                    slip_prob=slip_prob, check_prob=0.0)
            parts.append(f"{int(total)}+{int(shifted)}=" + ",".join(columns))
            total = total_next
        return ";".join(parts) + ",\\boxed{" + str(int(total)) + "}"


if __name__ == "__main__":
    task = ArithmeticTask()
    for p in task.train_problems(5, seed=0):
        print(p.question + "=" + task.solution(p))
    for p in ArithmeticTask(decimal_share=1.0).train_problems(3, seed=0):
        print(p.question + "=" + task.solution(p))


def base_task(base) -> ArithmeticTask:
    """The problems of the tiny base model's pretraining text, from a `BaseModelConfig` (operand sizes,
    decimal and product shares): its text here, and the PTX source's (tasks/sources.py)."""
    return ArithmeticTask(min_digits=base.min_digits, max_digits=base.max_digits, decimal_share=base.decimal_share,
                          mul_share=base.mul_share, mul_digits=base.mul_digits)


def base_pretraining_text(base) -> Callable[[int, random.Random], list[tuple[str, str]]]:
    """The pretraining text of the tiny base model a `BaseModelConfig` describes (operand sizes,
    decimal share, products, slips, checks, tool traces), as the `pretraining_text` callable that `model/tiny.py` builds it from."""
    return functools.partial(base_task(base).pretraining_examples, slip_prob=base.slip_prob, check_prob=base.check_prob,
                             tool_share=base.tool_share)
