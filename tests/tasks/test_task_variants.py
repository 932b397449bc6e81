"""The arithmetic task's variants: decimal problems (data.arith.decimal_share, base.decimal_share), hard
problems (data.arith.min_carries, the eval source arith_hard), the integer-answer transform on a decimal
stream, the eval sets arith_decimal / arith_hard and eval/<set>/integer_answer_rate.

Run: python -m pytest tests/tasks/test_task_variants.py -q
"""

from __future__ import annotations

import json
import random
from fractions import Fraction
from pathlib import Path

import pytest

from mathrl.config import Config, ConfigError, load_config
from mathrl.evaluation.evaluate import EvalResult, integer_answer_rate
from mathrl.model.tiny import recipe_hash
from mathrl.reward.numeric import answer_form
from mathrl.reward.verify import verify_one
from mathrl.seeds import derive_seed
from mathrl.tasks.arithmetic import ArithmeticTask, base_pretraining_text, carries, decimal_text
from mathrl.tasks.sources import PretrainText, ProblemStream, build_eval_sets

CHECK_RECIPE = str(Path(__file__).resolve().parents[2] / "recipes" / "arith_check_grpo.yaml")


def boxed(solution: str) -> str:
    return solution.rsplit("\\boxed{", 1)[1].rstrip("}")


def body(solution: str) -> str:
    """The columns of a worked solution, without the box."""
    return solution.rsplit(",\\boxed{", 1)[0]


# --------------------------------------------------------------------------------------------------
# pure functions, against hand-computed values
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("a, b, expected", [
    (458, 67, 2),  # 8+7=15 carries, 5+6+1=12 carries, 4+0+1=5 does not
    (999, 1, 3),  # every column carries, the last one into a new digit
    (123, 456, 0),  # no column reaches 10
    (5, 5, 1),  # one column, 10
    (0, 0, 0),
    (95, 5, 2),  # 5+5=10, 9+0+1=10
    (50, 50, 1),  # 0+0=0, 5+5=10
])
def test_carries_by_hand(a, b, expected):
    assert carries(a, b) == expected
    assert carries(b, a) == expected  # column addition is symmetric


@pytest.mark.parametrize("scaled, text", [(137, "13.7"), (7, "0.7"), (40, "4.0"), (0, "0.0"), (1000, "100.0")])
def test_decimal_text_by_hand(scaled, text):
    assert decimal_text(scaled) == text


@pytest.mark.parametrize("a, b, solution", [
    # 2.5 + 13.7: the columns of 25 + 137, the point one digit from the right of the box
    (25, 137, "5+7+0=12,2+3+1=06,0+1+0=01,\\boxed{16.2}"),
    # a whole-number sum keeps its .0: the gold answer of 2.5+1.5 is written 4.0
    (25, 15, "5+5+0=10,2+1+1=04,\\boxed{4.0}"),
    # one-digit scaled operands: 0.3 + 0.5, and 0.7 + 0.5 whose carry becomes the units digit
    (3, 5, "3+5+0=08,\\boxed{0.8}"),
    (7, 5, "7+5+0=12,\\boxed{1.2}"),
])
def test_decimal_worked_solution_by_hand(a, b, solution):
    task = ArithmeticTask(max_digits=3, decimal_share=1.0)
    assert task.worked_solution(a, b, decimal=True) == solution
    problem = task._problem(a, b, decimal=True)
    assert problem.question == f"{decimal_text(a)}+{decimal_text(b)}"
    assert problem.answer == boxed(solution) and problem.id == problem.question
    assert task.parse(problem) == (a, b, True)
    assert task.solution(problem) == solution
    with pytest.raises(ValueError, match="decimal problem"):
        task.operands(problem)  # int("2.5") would fail far from here


def test_decimal_problem_as_typed():
    task = ArithmeticTask(max_digits=3, decimal_share=1.0)
    problem = task._problem(25, 137, decimal=True)
    assert (problem.question, problem.answer) == ("2.5+13.7", "16.2")
    assert problem.meta == {"digits": 3, "decimal": True}


def test_decimal_solution_is_the_scaled_integer_solution_with_a_point():
    # For every pair, slips and checks included (same rng state), the decimal working is the integer
    # working of the scaled operands, and the box is the integer box with the point placed.
    task, checked = ArithmeticTask(max_digits=3, decimal_share=1.0), 0
    for seed in range(300):
        pick = random.Random(seed)
        a, b = pick.randint(0, 999), pick.randint(0, 999)
        dec = task.worked_solution(a, b, decimal=True, rng=random.Random(seed), slip_prob=0.3, check_prob=0.3)
        whole = task.worked_solution(a, b, rng=random.Random(seed), slip_prob=0.3, check_prob=0.3)
        assert body(dec) == body(whole)
        assert Fraction(boxed(dec)) == Fraction(int(boxed(whole)), 10)
        clean = task.worked_solution(a, b, decimal=True)
        assert Fraction(boxed(clean)) == Fraction(a + b, 10)  # without slips the box is the sum
        checked += 1
    assert checked == 300


@pytest.mark.parametrize("response, gold, right", [
    ("\\boxed{16.2}", "16.2", True),
    ("\\boxed{4}", "4.0", True),  # the documented choice: gold 4.0, a boxed 4 is the same value
    ("\\boxed{4.0}", "4.0", True),
    ("\\boxed{162}", "16.2", False),  # the point dropped: a different number
    ("\\boxed{16}", "16.2", False),  # the integer-answer hack: rounded off
])
def test_verifier_on_decimal_golds(response, gold, right):
    assert (verify_one(response, gold).score > 0) is right


def test_integer_answer_rate_by_hand():
    golds = ["16.2", "4.0", "0.8", "1.2"]
    completions = ["...,\\boxed{16}", "...,\\boxed{4.0}", "no box at all", "...,\\boxed{12}"]
    # integer: "16" and "12"; "4.0" is written as a decimal; the third has no boxed answer: 2 of 4
    assert integer_answer_rate(completions, golds) == 0.5
    assert integer_answer_rate(["\\boxed{3}"], ["3", "12"]) is None  # every gold is an integer: not measured
    assert integer_answer_rate(["\\boxed{3}"], ["3", "\\frac{1}{2}"]) == 1.0  # one non-integer gold is enough
    assert [answer_form(g) for g in golds] == ["decimal"] * 4


def test_integer_answer_rate_is_logged_only_when_set():
    result = EvalResult(name="x", n=1, num_problems=1, pass_at_1=1.0, pass_at_k={}, maj_at_n=1.0, no_answer_rate=0.0,
                        truncated_rate=0.0, mean_response_length=3.0)
    assert "eval/x/integer_answer_rate" not in result.metrics("eval/x")  # the default run's metrics keep their keys
    result.integer_answer_rate = 0.25
    assert result.metrics("eval/x")["eval/x/integer_answer_rate"] == 0.25


# --------------------------------------------------------------------------------------------------
# the problem streams and the split
# --------------------------------------------------------------------------------------------------
def test_decimal_share_mixes_problems():
    # 2000 draws at share 0.3: the binomial standard deviation is 0.010, the band is 4 of them
    # (false-failure odds ~6e-5; the draw is seeded, so it either always passes or never does).
    problems = ArithmeticTask(max_digits=3, decimal_share=0.3).train_problems(2000, seed=0)
    share = sum("." in p.question for p in problems) / len(problems)
    assert 0.26 < share < 0.34
    assert all("." in p.question for p in ArithmeticTask(max_digits=3, decimal_share=1.0).train_problems(200, seed=0))
    for p in problems:  # every gold answer is the exact sum, written like the box of its worked solution
        a, b, decimal = ArithmeticTask.parse(p)
        assert p.answer == (decimal_text(a + b) if decimal else str(a + b))
        assert boxed(ArithmeticTask(max_digits=3, decimal_share=0.3).solution(p)) == p.answer


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_decimal_problems_respect_the_split(seed):
    # Training draws (and so the base model's pretraining text) never hold a held-out decimal problem,
    # and every held-out decimal problem is one: the keyed hash is on the problem's text.
    task = ArithmeticTask(max_digits=3, decimal_share=0.5)
    for p in task.train_problems(500, seed=seed):
        assert not task.is_heldout(*task.parse(p)[:2], decimal=task.parse(p)[2]), p
    held = ArithmeticTask(max_digits=3, decimal_share=1.0).heldout_problems(60)
    assert len({p.id for p in held}) == 60
    assert all(task.is_heldout(a, b, decimal=d) and d for a, b, d in map(ArithmeticTask.parse, held))
    # 2.5+13.7 and 25+137 are different problems, held out independently
    pairs = [(a, b) for a in range(100) for b in range(100)]
    assert [task.is_heldout(a, b) for a, b in pairs] != [task.is_heldout(a, b, decimal=True) for a, b in pairs]


def test_pretraining_text_never_holds_an_eval_problem():
    cfg = load_config(None, ["base.decimal_share=0.5", "data.arith.decimal_share=0.5", "data.eval=[arith,arith_decimal]",
                             "data.eval_size=150"], check_paths=False)
    pretrain = base_pretraining_text(cfg.base)(3000, random.Random(0))
    prompts = {prompt.removesuffix("=") for prompt, _ in pretrain}
    assert sum("." in q for q in prompts) > 1000  # decimal problems are in the text
    from mathrl.model.tiny import build_char_tokenizer

    sets = build_eval_sets(cfg, build_char_tokenizer(), limit=None)
    assert [s.name for s in sets] == ["arith_heldout", "arith_decimal_heldout"]
    for es in sets:
        assert not prompts & {p.question for p in es.problems}


@pytest.mark.parametrize("k", [1, 2, 3])
def test_min_carries_filters_the_stream_and_arith_hard(k):
    task = ArithmeticTask(max_digits=3, min_carries=k)
    assert all(carries(*task.operands(p)) >= k for p in task.train_problems(300, seed=0))
    assert all(carries(*task.operands(p)) >= k for p in task.heldout_problems(30))
    assert not any(task.is_heldout(*task.operands(p)) for p in task.train_problems(300, seed=0))


def test_stream_with_min_carries_and_the_hard_eval_set(char_tokenizer):
    cfg = load_config(None, ["data.arith.min_carries=2", "data.eval=[arith,arith_hard]", "data.arith.hard_min_carries=3",
                             "data.eval_size=40"], check_paths=False)
    stream = ProblemStream(cfg, char_tokenizer)
    problems, _, _ = stream.next_batch(16)
    assert len(problems) == 16 and all(carries(*ArithmeticTask.operands(p)) >= 2 for p in problems)
    ordinary, hard = build_eval_sets(cfg, char_tokenizer, limit=None)
    assert (ordinary.name, hard.name) == ("arith_heldout", "arith_hard_heldout")
    assert all(carries(*ArithmeticTask.operands(p)) >= 3 for p in hard.problems)
    # the ordinary held-out set ignores data.arith.min_carries: it is the default run's set
    default = build_eval_sets(Config(), char_tokenizer, limit=40)[0]
    assert [p.id for p in ordinary.problems] == [p.id for p in default.problems]
    assert min(carries(*ArithmeticTask.operands(p)) for p in ordinary.problems) == 0


def test_integer_answer_transform_on_a_decimal_stream(char_tokenizer):
    # Every drawn problem is decimal (share 1), and only 1 in 10 has a whole-number sum: the stream
    # still fills each batch, with the transform's integer gold answers ("4.0" -> "4").
    cfg = load_config(None, ["data.arith.decimal_share=1.0", "data.transform=integer_answer"], check_paths=False)
    stream = ProblemStream(cfg, char_tokenizer)
    for _ in range(3):
        problems, ids, texts = stream.next_batch(16)
        assert len(problems) == len(ids) == len(texts) == 16
        for p in problems:
            a, b, decimal = ArithmeticTask.parse(p)
            assert decimal and (a + b) % 10 == 0
            assert p.answer == str((a + b) // 10) and answer_form(p.answer) == "integer"
    assert any("integer-answer transform" in n for n in stream.notes)
    mixed = ProblemStream(load_config(None, ["data.arith.decimal_share=1.0"], check_paths=False), char_tokenizer)
    answers = [p.answer for _ in range(3) for p in mixed.next_batch(16)[0]]
    assert all(answer_form(a) == "decimal" for a in answers)  # 4.0 included: the untransformed gold keeps its point
    assert any((int(a.replace(".", "")) % 10) for a in answers)  # and decimal sums are there to drop


def test_decimal_ptx_text(char_tokenizer):
    cfg = load_config(CHECK_RECIPE, ["base.decimal_share=1.0"], check_paths=False)
    ptx = PretrainText(cfg, char_tokenizer)
    docs = [ptx._doc() for _ in range(5)]
    assert all("." in doc.split("=", 1)[0] and "." in boxed(doc) for doc in docs)


# --------------------------------------------------------------------------------------------------
# the defaults are unchanged (values computed before decimal_share and min_carries existed)
# --------------------------------------------------------------------------------------------------
def test_default_problems_and_base_model_are_unchanged(char_tokenizer, tmp_path):
    assert recipe_hash(Config().base) == "710f9396d286"
    check = load_config(CHECK_RECIPE, [], check_paths=False)
    assert recipe_hash(check.base) == "a0ac6fb082d9"
    decimal = load_config(CHECK_RECIPE, ["base.decimal_share=0.3"], check_paths=False)
    assert recipe_hash(decimal.base) != recipe_hash(check.base)  # a decimal base model is another model

    task = ArithmeticTask(min_digits=1, max_digits=3)
    assert [p.question for p in task.train_problems(8, seed=derive_seed(0, 1))] == [
        "25+213", "98+92", "7+9", "942+9", "0+3", "409+8", "876+234", "94+0"]
    assert [p.question for p in task.heldout_problems(8)] == [
        "45+4", "224+79", "298+623", "1+92", "9+170", "51+3", "180+9", "90+2"]
    stream = ProblemStream(Config(), char_tokenizer)  # the stream's first batch: draw 1
    assert [p.question for p in stream.next_batch(8)[0]] == [
        "25+213", "98+92", "7+9", "942+9", "0+3", "409+8", "876+234", "94+0"]

    check.base.check_prob = 0.3
    assert base_pretraining_text(check.base)(3, random.Random(0)) == [
        ("7+6=", "7+6+0=13,\\boxed{13}"), ("4+83=", "4+3+0=17,0+8+1=09,\\boxed{97}"), ("5+7=", "5+7+0=12,\\boxed{12}")]
    ptx = PretrainText(load_config(CHECK_RECIPE, [], check_paths=False), char_tokenizer)
    assert [ptx._doc() for _ in range(3)] == [
        "585+2=5+2+0=07,8+0+0=08,5+0+0=05?5+0+0=05,\\boxed{587}",
        "152+83=2+3+0=05,5+8+0=13,1+0+1=02,\\boxed{235}",
        "16+67=6+7+0=00,1+6+0=07,\\boxed{70}"]

    from mathrl.train.sft import write_arith_sft_jsonl

    rows = [json.loads(line) for line in write_arith_sft_jsonl(tmp_path / "sft.jsonl", rows=3, slip_prob=0.3,
                                                                check_prob=0.3).read_text().splitlines()]
    assert rows[0] == {"problem": "209+337", "answer": "546",
                       "response": "9+7+0=04,0+3+0=03?0+3+0=03,2+3+0=05?2+3+0=05,\\boxed{534}"}


# --------------------------------------------------------------------------------------------------
# bad input
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, match", [
    ({"decimal_share": -0.1}, "decimal_share"),
    ({"decimal_share": 1.5}, "decimal_share"),
    ({"max_digits": 3, "min_carries": 4}, "min_carries"),  # three columns carry at most three times
    ({"min_carries": -1}, "min_carries"),
    ({"decimal_share": 0.5, "pad_operands": True}, "pad_operands"),
])
def test_invalid_task_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ArithmeticTask(**kwargs)


@pytest.mark.parametrize("overrides, match", [
    (["data.arith.decimal_share=1.5"], r"data.arith.decimal_share=1.5: must be in \[0, 1\]"),
    (["base.decimal_share=-0.1"], r"base.decimal_share=-0.1: must be in \[0, 1\]"),
    (["data.arith.min_carries=4"], "data.arith.min_carries=4: operands of at most 3 digits"),
    (["data.arith.max_digits=2", "data.arith.hard_min_carries=3", "data.eval=[arith,arith_hard]"],
     "data.arith.hard_min_carries=3"),
    (["data.transform=integer_answer"], "answers are integers already"),  # no decimal problems: nothing to drop
    (["data.eval=[arith,arith_decimals]"], "give arith, arith_decimal, arith_hard"),
    (["data.train=arith_decimal"], "data.train: 'arith_decimal' is not a data source"),
])
def test_config_errors(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config(None, overrides, check_paths=False)


def test_valid_variant_configs_load():
    cfg = load_config(None, ["data.arith.decimal_share=0.3", "data.transform=integer_answer",
                             "data.eval=[arith,arith_decimal,arith_hard]"], check_paths=False)
    assert (cfg.data.arith.decimal_share, cfg.data.transform) == (0.3, "integer_answer")
    assert cfg.data.eval == ["arith", "arith_decimal", "arith_hard"]
    cfg = load_config(None, ["data.arith.min_carries=3", "data.arith.hard_min_carries=3", "data.eval=[arith,arith_hard]"],
                      check_paths=False)
    assert (cfg.data.arith.min_carries, cfg.data.arith.hard_min_carries) == (3, 3)
    # ... and it counts only there: set without arith_hard, it is refused as having no effect
    with pytest.raises(ConfigError, match="data.arith.hard_min_carries=3 has no effect .* arith_hard in data.eval"):
        load_config(None, ["data.arith.hard_min_carries=3"], check_paths=False)
    # hard_min_carries is checked only where arith_hard is evaluated: 1-digit tasks keep the default 2
    cfg = load_config(None, ["data.arith.max_digits=1", "data.arith.min_digits=1"], check_paths=False)
    assert cfg.data.arith.max_digits == 1 and cfg.data.arith.hard_min_carries == 2


# --------------------------------------------------------------------------------------------------
# the findings grids
# --------------------------------------------------------------------------------------------------
def test_findings_grids_validate_and_share_run_names_only_for_the_same_run():
    # scripts/ablate.py skips a variant whose run directory holds a finished run, and every grid writes
    # under the same --out: a name that two grids give to different configs would silently reuse the
    # other grid's run (an earlier draft named both grids' control arm "mixed").
    import sys

    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "scripts"))
    from ablate import load_grid

    seen: dict[str, tuple] = {}
    for grid in sorted((root / "recipes" / "findings").glob("*.yaml")):
        recipe, variants, _ = load_grid(grid)
        for v in variants:
            key = (recipe, sorted(v.overrides))
            assert seen.setdefault(v.name, key) == key, f"{grid.name}: run name {v.name!r} names another run too"
            if grid.stem in ("integer_hack", "difficulty"):
                load_config(str(root / recipe), v.overrides, check_paths=False)
    recipe, variants, columns = load_grid(root / "recipes" / "findings" / "integer_hack.yaml")
    assert {v.name for v in variants} >= {"decimal_mixed", "decimal_integer_answer_seed4"}
    assert "eval/arith_decimal_heldout/integer_answer_rate" in columns
    recipe, variants, columns = load_grid(root / "recipes" / "findings" / "difficulty.yaml")
    assert {v.name for v in variants} >= {"difficulty_mixed", "difficulty_hard_only_seed4"}
