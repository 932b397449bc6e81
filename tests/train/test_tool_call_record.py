"""The call bonus (reward.functions entry ``fn: tool_call``) as the two callers that score episodes give
it its rows: training's `generate_and_score` (train/collect.py) and evaluation's `sample_rows`
(evaluation/evaluate.py) pass each row's ``tool_calls`` from the engine's record, so the bonus counts
the calls that ran, never call blocks in the text.

An engine stub answers every prompt with one text that holds two complete call blocks (a tool that
printed them), while its record says how many calls ran. Expected values by hand, per row: 1.0 where
the record says at least min_calls ran, else 0.0, whatever the text holds.

Run: python -m pytest tests/train/test_tool_call_record.py -q
"""

from __future__ import annotations

import pytest
import torch

from mathrl.config import load_config
from mathrl.evaluation.evaluate import sample_rows
from mathrl.reward.functions import Rewarder, components
from mathrl.reward.verify import Verifier
from mathrl.rollout.base import RolloutBatch
from mathrl.tasks.base import Problem
from mathrl.train.collect import generate_and_score

# what a tool printed: two call blocks, each followed by an observation's opening tag (the pattern a
# text count would take for a call), then the answer
TEXT = "```python\n1+2\n```\n```output\n3\n```\n```python\n1+2\n```\n```output\n3\n```\n\\boxed{3}"


class RecordedEngine:
    """Every row's response is TEXT; `calls[i]` is the record of row i: the calls the engine ran."""

    def __init__(self, tokenizer, calls: list[int]):
        self.ids = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
        self.calls = calls

    def generate(self, prompts, *, max_new_tokens, temperature, top_p, seed, first_row=0):
        n, width = len(prompts), len(self.ids)
        rows = slice(first_row, first_row + n)
        return RolloutBatch(
            prompt_ids=torch.tensor(prompts), prompt_mask=torch.ones(n, len(prompts[0]), dtype=torch.long),
            response_ids=torch.tensor([self.ids] * n), response_mask=torch.ones(n, width),
            rollout_logprobs=torch.zeros(n, width), truncated=torch.zeros(n, dtype=torch.bool),
            observation_mask=torch.zeros(n, width), tool_calls=torch.tensor(self.calls[rows]),
            tool_errors=torch.zeros(n, dtype=torch.long), tool_timeouts=torch.zeros(n, dtype=torch.long),
            tool_capped=torch.zeros(n, dtype=torch.long), turns=torch.tensor(self.calls[rows]) + 1,
            tool_seconds=torch.zeros(n))


CASES = [
    # (the record per row, min_calls, the bonus per row); the text shows two calls in every row
    ([1, 0, 2, 0], 1, [1.0, 0.0, 1.0, 0.0]),  # a row that ran none gets nothing, though its text shows two
    ([1, 0, 2, 0], 2, [0.0, 0.0, 1.0, 0.0]),  # one call run is not two, though its text shows two
]


@pytest.fixture(scope="module")
def verifier():
    with Verifier(num_workers=1, timeout_s=60.0) as v:
        yield v


def rewarder(verifier, min_calls: int) -> Rewarder:
    entries = f"[{{fn: math}}, {{name: tool, fn: tool_call, kwargs: {{min_calls: {min_calls}}}}}]"
    return Rewarder(components(load_config(None, [f"reward.functions={entries}"]).reward), verifier)


def problems(n: int) -> list[Problem]:
    return [Problem(str(i), "1+2", "3") for i in range(n)]


@pytest.mark.parametrize("calls, min_calls, expected", CASES)
def test_training_scores_the_calls_the_engine_ran(char_tokenizer, verifier, calls, min_calls, expected):
    n = len(calls)
    cfg = load_config(None, [f"rollout.n={n}", f"rollout.batch_size={n}"])
    prompts = [char_tokenizer("1+2=")["input_ids"]] * n
    _, texts, scores, _, _ = generate_and_score(cfg, prompts, problems(n), seed=0,
                                                engine=RecordedEngine(char_tokenizer, calls),
                                                tokenizer=char_tokenizer, verifier=rewarder(verifier, min_calls))
    assert texts == [TEXT] * n
    assert scores.values["tool"] == expected


@pytest.mark.parametrize("calls, min_calls, expected", CASES)
def test_evaluation_scores_the_calls_the_engine_ran(char_tokenizer, verifier, calls, min_calls, expected):
    n = len(calls)
    prompts = [char_tokenizer("1+2=")["input_ids"]] * n
    sampled = sample_rows(prompts, problems(n), first_row=0, engine=RecordedEngine(char_tokenizer, calls),
                          tokenizer=char_tokenizer, verifier=rewarder(verifier, min_calls), max_new_tokens=len(TEXT),
                          temperature=1.0, top_p=1.0, seed=0)
    assert sampled.texts == [TEXT] * n
    assert sampled.scores.values["tool"] == expected
