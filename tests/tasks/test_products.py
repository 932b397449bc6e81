"""Products in the arithmetic task (data.arith.mul_share, base.mul_share): long multiplication as the
worked solution, the tool trace that replaces it, the split, and the defaults they leave alone.

Run: python -m pytest tests/tasks/test_products.py -q
"""

from __future__ import annotations

import json
import random
import re

import pytest

from mathrl.config import Config, ConfigError, load_config
from mathrl.model.tiny import recipe_hash
from mathrl.tasks.arithmetic import ArithmeticTask, base_pretraining_text
from mathrl.tools.calculator import calculator

MUL_COLUMN = re.compile(r"(\d)\*(\d)\+(\d)=(\d\d)")
ADD_COLUMN = re.compile(r"(\d)\+(\d)\+(\d)=(\d\d)")


def boxed(solution: str) -> str:
    return solution.rsplit("\\boxed{", 1)[1].rstrip("}")


def parts(solution: str) -> list[str]:
    """The `;`-separated parts of a product solution: the partial products, then the sums."""
    return solution.rsplit(",\\boxed{", 1)[0].split(";")


def read_partial(part: str) -> tuple[int, list[tuple[int, ...]], str]:
    """(the factor digit d, its columns (x, d, carry, written value), the partial as written)."""
    head, rest = part.split(":", 1)
    body, written = rest.rsplit(",=", 1)
    columns = [tuple(int(g) for g in MUL_COLUMN.fullmatch(c).groups()) for c in body.split(",")]
    return int(head), columns, written


# --------------------------------------------------------------------------------------------------
# the worked solution, against hand-computed values
# --------------------------------------------------------------------------------------------------
def test_long_multiplication_by_hand():
    # 347*26: 347*6 = 2082 (7*6=42, 4*6+4=28, 3*6+2=20), 347*2 = 694 (7*2=14, 4*2+1=09, 3*2+0=06),
    # 2082 + 6940 = 9022
    task = ArithmeticTask(mul_share=1.0)
    assert task.product_solution(347, 26) == (
        "6:7*6+0=42,4*6+4=28,3*6+2=20,=2082;2:7*2+0=14,4*2+1=09,3*2+0=06,=694;"
        "2082+6940=2+0+0=02,8+4+0=12,0+9+1=10,2+6+1=09,\\boxed{9022}")
    # a one-digit factor is one partial product and no sum; a zero digit writes a zero partial
    assert task.product_solution(12, 3) == "3:2*3+0=06,1*3+0=03,=36,\\boxed{36}"
    assert task.product_solution(45, 10) == ("0:5*0+0=00,4*0+0=00,=00;1:5*1+0=05,4*1+0=04,=45;"
                                             "0+450=0+0+0=00,0+5+0=05,0+4+0=04,\\boxed{450}")


@pytest.mark.parametrize("seed", range(5))
def test_clean_solutions_and_tool_traces_are_right(seed):
    task = ArithmeticTask(min_digits=1, max_digits=5, mul_share=1.0, mul_digits=3)
    for p in task.train_problems(300, seed=seed):
        a, b = map(int, p.question.split("*"))
        assert p.answer == str(a * b) and task.is_product(p)
        assert boxed(task.solution(p)) == p.answer
        trace = task.tool_solution(p)
        assert trace == f"```python\n{a}*{b}\n```\n```output\n{a * b}\n```\n\\boxed{{{a * b}}}"
        assert calculator(f"{a}*{b}") == str(a * b)  # what the recipe's tool answers the call with


@pytest.mark.parametrize("seed", range(10))
def test_slips_propagate_through_the_partials_and_the_sums(seed):
    # slip_prob=1: every column, of a partial or of a sum, is written wrong; each next carry, each
    # partial as written, each sum's operands and the box follow what was written.
    rng = random.Random(seed)
    a, b = rng.randrange(100, 10**4), rng.randrange(10, 100)
    solution = ArithmeticTask(mul_share=1.0).product_solution(a, b, rng=rng, slip_prob=1.0)
    *partials, total = parts(solution)
    written = []
    for (d, columns, partial), digit in zip(map(read_partial, partials), reversed(str(b))):
        assert d == int(digit)
        carry, digits = 0, []
        for (x, dd, c, value), xd in zip(columns, reversed(str(a))):
            assert (x, dd, c) == (int(xd), d, carry) and value != x * d + c and 0 <= value <= 89
            digits.append(str(value % 10))
            carry = value // 10
        assert partial == (str(carry) if carry else "") + "".join(reversed(digits))
        written.append(int(partial))
    operands, columns = total.split("=", 1)
    assert operands == f"{written[0]}+{written[1] * 10}"
    carry, digits = 0, []
    for column in columns.split(","):
        x, y, c, value = (int(g) for g in ADD_COLUMN.fullmatch(column).groups())
        assert c == carry and value != x + y + c
        digits.append(str(value % 10))
        carry = value // 10
    assert boxed(solution) == str(int((str(carry) if carry else "") + "".join(reversed(digits))))


def test_slip_rate_matches_slip_prob():
    # 3000+ columns at p=0.2: std 0.007, the band is 7 of them (the rng is seeded).
    rng, task = random.Random(0), ArithmeticTask(mul_share=1.0)
    slipped = total = 0
    while total < 3000:
        solution = task.product_solution(rng.randrange(100, 10**4), rng.randrange(10, 100), rng=rng, slip_prob=0.2)
        for column in re.findall(r"\d\*\d\+\d=\d\d|\d\+\d\+\d=\d\d", solution):
            x, op, y, c, value = re.fullmatch(r"(\d)([*+])(\d)\+(\d)=(\d\d)", column).groups()
            right = int(x) * int(y) + int(c) if op == "*" else int(x) + int(y) + int(c)
            slipped += int(value) != right
            total += 1
    assert abs(slipped / total - 0.2) < 0.05


# --------------------------------------------------------------------------------------------------
# the split and the mix
# --------------------------------------------------------------------------------------------------
def test_products_have_a_split_of_their_own_and_training_never_draws_a_held_out_one():
    task = ArithmeticTask(min_digits=3, max_digits=4, mul_share=1.0)
    for p in task.train_problems(500, seed=3):
        assert not task.is_heldout(*task.operands(p), mul=True)
    held = task.heldout_problems(80)
    assert len({p.id for p in held}) == 80 and all(task.is_product(p) for p in held)
    assert all(task.is_heldout(*task.operands(p), mul=True) for p in held)
    pairs = [(a, b) for a in range(100, 160) for b in range(10, 60)]  # 347*26 and 347+26 are held out independently
    assert [task.is_heldout(a, b) for a, b in pairs] != [task.is_heldout(a, b, mul=True) for a, b in pairs]
    assert all(len(str(task.operands(p)[1])) == 2 and 3 <= len(str(task.operands(p)[0])) <= 4 for p in held)


def test_mul_share_mixes_problems_and_zero_draws_what_it_drew_before():
    # 2000 draws at 0.5: the binomial sd is 0.011, the band is 4 of them (seeded)
    problems = ArithmeticTask(max_digits=3, mul_share=0.5).train_problems(2000, seed=0)
    assert 0.455 < sum(ArithmeticTask.is_product(p) for p in problems) / 2000 < 0.545
    assert [p.question for p in ArithmeticTask(max_digits=3, mul_share=0.0).train_problems(8, seed=5)] == \
        [p.question for p in ArithmeticTask(max_digits=3).train_problems(8, seed=5)]


def test_the_pretraining_text_holds_products_sums_and_tool_traces_and_no_eval_problem():
    cfg = load_config("recipes/arith_tools_mul.yaml", [], check_paths=False)
    text = base_pretraining_text(cfg.base)(2000, random.Random(0))
    questions = [prompt.removesuffix("=") for prompt, _ in text]
    products = sum("*" in q for q in questions)
    traces = sum(solution.startswith("```python") for _, solution in text)
    assert 900 < products < 1100 and 300 < traces < 500  # shares 0.5 and 0.2 of 2000
    from mathrl.model.tiny import build_char_tokenizer
    from mathrl.tasks.sources import build_eval_sets

    (heldout,) = build_eval_sets(cfg, build_char_tokenizer(), limit=None)
    assert all("*" in p.question for p in heldout.problems)
    assert not set(questions) & {p.question for p in heldout.problems}
    longest = max(len(prompt) + len(solution) for prompt, solution in text)
    assert longest < cfg.base.max_positions  # every pretraining text and its EOS fit the context


def test_the_base_model_hash_changes_only_with_products():
    assert recipe_hash(Config().base) == "710f9396d286"  # the default model: mul fields left out at 0
    at_zero = load_config(None, ["base.mul_digits=3"], check_paths=False)
    assert recipe_hash(at_zero.base) == "710f9396d286"  # mul_digits means nothing without products
    with_products = load_config(None, ["base.mul_share=0.5"], check_paths=False)
    assert recipe_hash(with_products.base) != "710f9396d286"


def test_sft_traces_of_products(tmp_path):
    from mathrl.train.sft import write_arith_sft_jsonl

    path = write_arith_sft_jsonl(tmp_path / "t.jsonl", rows=50, min_digits=3, max_digits=4, tool_share=1.0, mul_share=1.0)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 50
    for row in rows:
        a, b = map(int, row["problem"].split("*"))
        assert row["answer"] == str(a * b) and row["response"].startswith(f"```python\n{a}*{b}\n```\n```output\n{a * b}\n")


# --------------------------------------------------------------------------------------------------
# bad input
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, match", [
    ({"mul_share": 1.5}, "mul_share"),
    ({"mul_share": 0.5, "decimal_share": 0.5}, "integer problems"),
    ({"mul_digits": 0}, "mul_digits"),
])
def test_invalid_task_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ArithmeticTask(**kwargs)


@pytest.mark.parametrize("overrides, match", [
    (["data.arith.mul_share=0.5", "data.arith.decimal_share=0.2"], "data.arith.mul_share=0.5: products are integer problems"),
    (["base.mul_share=1", "base.decimal_share=0.1"], "base.mul_share=1.0: products are integer problems"),
    (["data.arith.mul_share=2"], r"data.arith.mul_share=2.0: must be in \[0, 1\]"),
    (["base.mul_digits=0"], "base.mul_digits=0"),
])
def test_config_errors(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config(None, overrides, check_paths=False)
