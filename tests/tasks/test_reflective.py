"""The reflective arithmetic task: worked solutions with optional self-checks, and the reflection metrics.

A check is `?` followed by the column written again with its correct sum; the carry and the digit then
follow the check. These tests pin the trace format the tiny base model is pretrained on
(recipes/arith_check_grpo.yaml) and the markers `rollout/reflection_rate` counts.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from mathrl.config import load_config
from mathrl.reward.reflection import count_reflections, reflection_stats
from mathrl.tasks.arithmetic import ArithmeticTask

REPO = Path(__file__).resolve().parents[2]
COLUMN = re.compile(r"(\d)\+(\d)\+(\d)=(\d\d)(?:\?(\d)\+(\d)\+(\d)=(\d\d))?")
BOXED = re.compile(r",\\boxed\{(\d+)\}$")


def parse(solution: str) -> tuple[list[tuple], str]:
    """Columns as (x, y, carry_in, written, checked_or_None), rightmost first, and the boxed answer."""
    m = BOXED.search(solution)
    assert m, f"no trailing box in {solution!r}"
    cols = []
    for part in solution[: m.start()].split(","):
        c = COLUMN.fullmatch(part)
        assert c, f"malformed column {part!r} in {solution!r}"
        x, y, carry, written = (int(g) for g in c.groups()[:4])
        if c.group(5) is not None:  # a check repeats the column's operands and carry exactly
            assert tuple(int(g) for g in c.groups()[4:7]) == (x, y, carry), part
            cols.append((x, y, carry, written, int(c.group(8))))
        else:
            cols.append((x, y, carry, written, None))
    return cols, m.group(1)


@pytest.mark.parametrize("seed", range(30))
def test_checks_repair_every_slip(seed):
    # slip_prob=1, check_prob=1: every written sum is wrong and every column is checked, so every
    # check carries the true sum, later carries follow the checked sums, and the answer is right.
    rng = random.Random(seed)
    a, b = rng.randrange(10**6), rng.randrange(10**6)
    cols, answer = parse(ArithmeticTask(max_digits=18).worked_solution(a, b, rng=rng, slip_prob=1.0, check_prob=1.0))
    carry = 0
    for x, y, c, written, checked in cols:
        assert c == carry
        assert written != x + y + c and checked == x + y + c
        carry = checked // 10
    assert int(answer) == a + b


@pytest.mark.parametrize("seed", range(30))
def test_slips_without_checks_still_propagate(seed):
    # Mixed: a column's digit and carry follow its check where there is one, else its written sum.
    rng = random.Random(seed)
    a, b = rng.randrange(10**6), rng.randrange(10**6)
    cols, answer = parse(ArithmeticTask(max_digits=18).worked_solution(a, b, rng=rng, slip_prob=0.5, check_prob=0.5))
    carry, digits = 0, []
    for x, y, c, written, checked in cols:
        assert c == carry
        if checked is not None:
            assert checked == x + y + c  # a check is always right
        used = written if checked is None else checked
        digits.append(str(used % 10))
        carry = used // 10
    assert answer == (str(carry) if carry else "") + "".join(reversed(digits))


def test_check_rate_is_check_prob_and_independent_of_slips():
    # 6000 columns at check_prob 0.2: std 0.005, so 0.03 is 6 standard deviations; the check rate is
    # the same after a slip as after a correct sum (a check is never a hint that a slip happened).
    rng = random.Random(1)
    task = ArithmeticTask(max_digits=18)
    checked = {True: [0, 0], False: [0, 0]}  # slipped -> [checked columns, columns]
    while sum(v[1] for v in checked.values()) < 6000:
        a, b = rng.randrange(10**6), rng.randrange(10**6)
        for x, y, c, written, check in parse(task.worked_solution(a, b, rng=rng, slip_prob=0.3, check_prob=0.2))[0]:
            slipped = written != x + y + c
            checked[slipped][0] += check is not None
            checked[slipped][1] += 1
    rates = {k: v[0] / v[1] for k, v in checked.items()}
    assert abs(rates[True] - 0.2) < 0.04 and abs(rates[False] - 0.2) < 0.03, rates


def test_check_prob_zero_keeps_the_original_pretraining_text():
    # The default base model's corpus must not change: with check_prob 0 the rng is consumed exactly
    # as before checks existed (strings produced by the previous version of worked_solution).
    task, rng = ArithmeticTask(max_digits=3), random.Random(7)
    got = [task.worked_solution(a, b, rng=rng, slip_prob=0.3) for a, b in [(347, 589), (5, 96), (999, 1), (120, 43)]]
    assert got == ["7+9+0=16,4+8+1=01,3+5+0=18,\\boxed{1816}", "5+6+0=19,0+9+1=17,\\boxed{179}",
                   "9+1+0=02,9+0+0=09,9+0+0=02,\\boxed{292}", "0+3+0=03,2+4+0=19,1+0+1=08,\\boxed{893}"]


def test_checked_solution_fits_the_recipe_budget():
    # Three checked columns of 3-digit operands and the box must fit rollout.max_new_tokens (one token
    # per character with the tiny model's tokenizer, plus EOS).
    cfg = load_config(REPO / "recipes" / "arith_check_grpo.yaml")
    longest = ArithmeticTask(max_digits=cfg.base.max_digits).worked_solution(999, 999, rng=random.Random(0),
                                                                             check_prob=1.0)
    assert len(longest) + 1 <= cfg.rollout.max_new_tokens
    assert cfg.base.check_prob > 0 and cfg.log.reflection_words == ["?"]


def test_base_recipe_hash_ignores_a_zero_check_prob():
    # Models built before check_prob existed keep their cache key; a nonzero check_prob is a new model.
    from mathrl.config import BaseModelConfig
    from mathrl.model.tiny import recipe_hash

    assert recipe_hash(BaseModelConfig()) == "710f9396d286"
    assert recipe_hash(BaseModelConfig(check_prob=0.15)) != "710f9396d286"


@pytest.mark.parametrize("text, words, count", [
    ("", ["wait"], 0),
    ("no markers here", ["wait"], 0),
    ("Wait, wait. Wait!", ["wait", "Wait"], 3),
    ("waitwait", ["wait"], 2),
    ("double-check and check", ["check", "double-check"], 2),  # longest first: one marker per place
    ("7+9+0=13?7+9+0=16,2+2+1=05?2+2+1=05,\\boxed{56}", ["?"], 2),
    ("anything", [], 0),
    ("a?b", ["", "?"], 1),  # an empty marker counts nothing
])
def test_count_reflections(text, words, count):
    assert count_reflections(text, words) == count


def test_reflection_stats():
    stats = reflection_stats(["a?b?", "none", "?", ""], ["?"])
    assert stats == {"reflection_rate": 0.5, "reflections_per_response": 0.75}
    assert reflection_stats([], ["?"]) == {"reflection_rate": 0.0, "reflections_per_response": 0.0}


def test_batch_metrics_length_spread_and_reflection():
    # Two groups of n=2: lengths (3, 5) and (4, 4) -> population std 1 and 0 -> mean 0.5; one of the
    # four texts holds the marker twice, another once -> reflection rate 0.5, 0.75 markers per response.
    from types import SimpleNamespace

    import torch

    from mathrl.train.step import batch_metrics

    lengths = torch.tensor([3, 5, 4, 4])
    mask = (torch.arange(5)[None, :] < lengths[:, None]).float()  # [4, 5]
    got = SimpleNamespace(results=[SimpleNamespace(reason="correct")] * 4,
                          correct=torch.tensor([1.0, 0.0, 1.0, 1.0]), rewards=torch.tensor([1.0, 0.0, 1.0, 1.0]),
                          problems=["p", "q"], texts=["a?b?", "c", "?d", "e"])
    batch = SimpleNamespace(old_logprobs=torch.zeros(4, 5), rollout_logprobs=torch.zeros(4, 5), response_mask=mask,
                            response_lengths=lengths, truncated=torch.zeros(4, dtype=torch.bool))
    m = batch_metrics(got, batch, n=2, prompts_too_long=0, reflection_words=["?"])
    assert m["rollout/response_length_group_std"] == pytest.approx(0.5)
    assert m["rollout/reflection_rate"] == 0.5 and m["rollout/reflections_per_response"] == 0.75
    assert m["rollout/response_length"] == 4.0


@pytest.mark.parametrize("seed", range(20))
def test_the_checker_scores_a_reflective_trace_by_its_final_box(seed):
    # A trace's checks add "?" and digits but no box: the verifier reads only the final \boxed{},
    # so a repaired slip scores 1 and an unrepaired one 0, whatever the checks wrote on the way.
    from mathrl.reward.verify import verify_one

    task, rng = ArithmeticTask(max_digits=3), random.Random(seed)
    (problem,) = task.train_problems(1, seed=seed)
    a, b = task.operands(problem)
    repaired = task.worked_solution(a, b, rng=rng, slip_prob=1.0, check_prob=1.0)
    assert verify_one(repaired, problem.answer).score == 1.0
    unrepaired = task.worked_solution(a, b, rng=rng, slip_prob=1.0, check_prob=0.0)
    expected = 1.0 if int(parse(unrepaired)[1]) == int(problem.answer) else 0.0  # slips can cancel out
    assert verify_one(unrepaired, problem.answer).score == expected


def test_reflective_sft_rows_are_training_problems(tmp_path):
    # The R1 path's distillation data must never hold a held-out problem (the eval set stays unseen),
    # and with check_prob 1 every row is checked at every column and ends in the right answer.
    import json

    from mathrl.train.sft import write_arith_sft_jsonl

    task = ArithmeticTask(max_digits=3)
    path = write_arith_sft_jsonl(tmp_path / "r.jsonl", rows=300, seed=0, slip_prob=0.3, check_prob=1.0)
    for line in path.read_text().splitlines():
        row = json.loads(line)
        x, y = (int(v) for v in row["problem"].split("+"))
        assert not task.is_heldout(x, y)
        cols, answer = parse(row["response"])
        assert all(check is not None for *_, check in cols) and answer == row["answer"]
