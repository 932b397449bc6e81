"""Dynamic sampling in the loop: `collect_rollouts` refills the batch with kept groups, stops at
`data.dynamic_sampling.max_rounds`, then trains on fewer groups or raises, and counts every drop.

The engine and the verifier are scripted fakes, so each round's per-group accuracy is chosen by the
test; the problem stream, group filter, row selection and concatenation are the real ones. The last
test runs the whole loop on a random tiny model, whose steps keep no group at all.
"""

from __future__ import annotations

import pytest
import torch

from mathrl.config import load_config
from mathrl.reward.verify import RewardResult
from mathrl.rollout.engine import RolloutBatch
from mathrl.tasks.sources import ProblemStream
from mathrl.train.collect import DynamicSamplingExhausted, collect_rollouts

PROMPTS, N = 4, 4


class ScriptedEngine:
    """Returns a 3-token response per prompt; records how many rounds were generated."""

    def __init__(self, pad_id: int):
        self.pad_id = pad_id
        self.calls = 0

    def generate(self, prompts, *, max_new_tokens, temperature, top_p, seed) -> RolloutBatch:
        self.calls += 1
        width = max(len(p) for p in prompts)
        prompt_ids = torch.full((len(prompts), width), self.pad_id)
        prompt_mask = torch.zeros(len(prompts), width, dtype=torch.long)
        for i, p in enumerate(prompts):
            prompt_ids[i, width - len(p):] = torch.tensor(p)
            prompt_mask[i, width - len(p):] = 1
        # row i's first token encodes its position in the round, to check which rows were kept
        response_ids = torch.stack([torch.tensor([10 + i % 20, 5, 6]) for i in range(len(prompts))])
        return RolloutBatch(
            prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids,
            response_mask=torch.ones(len(prompts), 3), logprobs=torch.full((len(prompts), 3), -0.1),
            truncated=torch.zeros(len(prompts), dtype=torch.bool),
        )


class ScriptedVerifier:
    """Round r marks the first `correct_per_group[r][g]` samples of group g correct."""

    def __init__(self, rounds: list[list[int]]):
        self.rounds = rounds
        self.calls = 0

    def score(self, texts, references):
        per_group = self.rounds[self.calls]
        self.calls += 1
        assert len(texts) == len(per_group) * N
        return [
            RewardResult(1.0, "x", "correct", "") if i % N < per_group[i // N] else RewardResult(0.0, "y", "wrong", "")
            for i in range(len(texts))
        ]


def collect(char_tokenizer, rounds: list[list[int]], *overrides: str):
    cfg = load_config(None, [f"rollout.prompts_per_step={PROMPTS}", f"rollout.n={N}", f"train.mini_batch_size={N}",
                             "data.dynamic_sampling.max_rounds=3",
                             *overrides])
    engine, verifier = ScriptedEngine(char_tokenizer.pad_token_id), ScriptedVerifier(rounds)
    stream = ProblemStream(cfg, char_tokenizer)
    collected = collect_rollouts(cfg, 1, train_stream=stream, engine=engine, tokenizer=char_tokenizer, verifier=verifier)
    return collected, engine, verifier


def test_nonconstant_refills_until_the_batch_is_full(char_tokenizer) -> None:
    # Round 1 keeps groups 2 and 3 (0/4 and 4/4 dropped); round 2 keeps its groups 0 and 2, which fill
    # the batch, so round 3 is never generated.
    collected, engine, _ = collect(char_tokenizer, [[4, 0, 2, 1], [2, 4, 3, 0], [1, 1, 1, 1]],
                                   "data.dynamic_sampling.mode=nonconstant")
    assert engine.calls == 2
    m = collected.metrics
    assert (m["filter/gen_rounds"], m["filter/kept_groups"]) == (2.0, 4.0)
    assert (m["filter/dropped_all_correct"], m["filter/dropped_all_wrong"]) == (2.0, 2.0)
    assert len(collected.problems) == PROMPTS and len(collected.rollout) == PROMPTS * N
    # kept groups, in order: round-1 groups 2, 3 then round-2 groups 0, 2 -> per-group accuracy 2, 1, 2, 3 of 4
    assert collected.correct.view(PROMPTS, N).sum(-1).tolist() == [2.0, 1.0, 2.0, 3.0]
    first_tokens = collected.rollout.response_ids[:, 0].view(PROMPTS, N)[:, 0].tolist()
    assert first_tokens == [10 + 8, 10 + 12, 10 + 0, 10 + 8]  # row index g * N of each kept group


def test_bound_hit_trains_on_the_smaller_batch(char_tokenizer) -> None:
    collected, engine, _ = collect(char_tokenizer, [[4, 4, 4, 2], [0, 4, 0, 4], [4, 4, 0, 4]],
                                   "data.dynamic_sampling.mode=nonconstant")
    assert engine.calls == 3  # max_rounds
    m = collected.metrics
    assert (m["filter/gen_rounds"], m["filter/kept_groups"]) == (3.0, 1.0)
    assert (m["filter/dropped_all_correct"], m["filter/dropped_all_wrong"]) == (3 + 2 + 3.0, 0 + 2 + 1.0)
    assert len(collected.problems) == 1 and len(collected.rollout) == N


def test_bound_hit_with_nothing_kept_returns_an_empty_batch(char_tokenizer) -> None:
    collected, _, _ = collect(char_tokenizer, [[4, 4, 4, 4]] * 3, "data.dynamic_sampling.mode=nonconstant")
    assert collected.problems == [] and collected.rollout is None
    assert collected.metrics["filter/kept_groups"] == 0.0


def test_bound_hit_with_on_exhausted_error_names_the_bound(char_tokenizer) -> None:
    with pytest.raises(DynamicSamplingExhausted, match=r"kept 1 of 4 groups after data.dynamic_sampling.max_rounds=3"):
        collect(char_tokenizer, [[4, 4, 4, 2], [0, 4, 0, 4], [4, 4, 0, 4]],
                "data.dynamic_sampling.mode=nonconstant", "data.dynamic_sampling.on_exhausted=error")


def test_band_keeps_only_groups_inside_it(char_tokenizer) -> None:
    # Band [0.3, 0.7] with 4 samples: only 2/4 is inside; 1/4 and 3/4 are out of band.
    collected, engine, _ = collect(char_tokenizer, [[1, 2, 3, 2], [2, 4, 2, 0], [2, 2, 2, 2]],
                                   "data.dynamic_sampling.mode=band", "data.dynamic_sampling.band_low=0.3",
                                   "data.dynamic_sampling.band_high=0.7")
    assert engine.calls == 2
    m = collected.metrics
    assert (m["filter/kept_groups"], m["filter/dropped_out_of_band"]) == (4.0, 2.0)
    assert (m["filter/dropped_all_correct"], m["filter/dropped_all_wrong"]) == (1.0, 1.0)
    assert collected.correct.view(PROMPTS, N).sum(-1).tolist() == [2.0] * 4


def test_without_dynamic_sampling_one_round_keeps_everything(char_tokenizer) -> None:
    # mode=none named: the default is nonconstant, which would drop all four of these groups
    collected, engine, _ = collect(char_tokenizer, [[4, 0, 4, 0]], "data.dynamic_sampling.mode=none")
    assert engine.calls == 1
    assert len(collected.problems) == PROMPTS
    assert collected.metrics["filter/gen_rounds"] == 1.0


def test_a_step_that_keeps_no_group_still_evaluates_and_checkpoints_on_schedule(tmp_path, make_tiny_qwen2,
                                                                                 char_tokenizer) -> None:
    # Bug story: a step whose groups were all dropped skipped the rest of the loop body, its due
    # evaluation and checkpoint included. When that was the last step, summary.json reported an
    # earlier evaluation as the final one and the finished run had no checkpoint of its last step
    # to continue from (train.init_from). Here no response can be correct (6 tokens cannot hold a
    # closed \boxed{}), so every group is all wrong and every step keeps nothing.
    import io
    import json

    from rich.console import Console

    from mathrl.model.io import save_model
    from mathrl.track.sinks import read_metrics
    from mathrl.train.checkpoint import complete_checkpoints
    from mathrl.train.loop import train

    model_dir = save_model(make_tiny_qwen2(seed=3), char_tokenizer, tmp_path / "model")
    cfg = load_config(None, [f"model.path={model_dir}", "data.dynamic_sampling.mode=nonconstant",
                             "data.dynamic_sampling.max_rounds=1", "rollout.max_new_tokens=6", "train.steps=3",
                             "rollout.prompts_per_step=2", "rollout.n=2", "train.mini_batch_size=4", "eval.n=1",
                             "data.eval_size=2", "eval.every=2", "train.save_every=2", "reward.num_workers=0",
                             f"run_dir={tmp_path / 'run'}"])
    result = train(cfg, console=Console(file=io.StringIO(), width=120))
    rows = read_metrics(result.run_dir / "metrics.jsonl")
    steps = [r for r in rows if "filter/kept_groups" in r]
    assert [r["step"] for r in steps] == [1, 2, 3] and all(r["filter/kept_groups"] == 0 for r in steps)
    assert not any("actor/pg_loss" in r for r in rows)  # nothing trained
    evals = [json.loads(line) for line in (result.run_dir / "evals.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [0, 2, 3]  # eval.every=2, and after the last step
    assert [s for s, _ in complete_checkpoints(result.run_dir / "checkpoints")] == [2, 3]
    assert json.loads((result.run_dir / "summary.json").read_text())["steps"] == 3
