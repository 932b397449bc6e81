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
from mathrl.train.collect import DynamicSamplingExhausted, GroupDrops, collect_rollouts

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
            response_mask=torch.ones(len(prompts), 3), rollout_logprobs=torch.full((len(prompts), 3), -0.1),
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
    cap = [] if "data.dynamic_sampling.mode=none" in overrides else ["data.dynamic_sampling.max_rounds=3"]  # none: 1
    cfg = load_config(None, [f"rollout.prompts_per_step={PROMPTS}", f"rollout.n={N}", f"train.mini_batch_size={N}",
                             *cap, *overrides])
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
    assert collected.drops == GroupDrops(all_correct=3 + 2 + 3, all_wrong=0 + 2 + 1)  # what the run reads; the log says the same
    assert len(collected.problems) == 1 and len(collected.rollout) == N


def test_bound_hit_with_nothing_kept_returns_an_empty_batch(char_tokenizer) -> None:
    collected, _, _ = collect(char_tokenizer, [[4, 4, 4, 4]] * 3, "data.dynamic_sampling.mode=nonconstant",
                              "log.rollouts_per_step=6")
    assert collected.problems == [] and collected.rollout is None
    assert collected.metrics["filter/kept_groups"] == 0.0
    # what was sampled is still there to read: round 1's first whole groups, enough for 6 logged rows
    assert len(collected.dropped.problems) == 2 and len(collected.dropped.rollout) == 2 * N
    assert collected.dropped.correct.tolist() == [1.0] * 2 * N
    kept, _, _ = collect(char_tokenizer, [[4, 4, 4, 2], [0, 4, 0, 4], [4, 4, 0, 4]], "data.dynamic_sampling.mode=nonconstant")
    assert kept.dropped is None  # a step that kept a group logs that group


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
    assert collected.drops == GroupDrops(all_correct=1, all_wrong=1, out_of_band=2)
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
    # Bug story: such steps wrote no rollouts, so there was nothing to read when it mattered most. Their
    # dropped samples are logged, marked as dropped.
    logged = [json.loads(line) for line in (result.run_dir / "rollouts.jsonl").read_text().splitlines()]
    assert sorted({r["step"] for r in logged}) == [1, 2, 3] and all(r["dropped"] is True for r in logged)
    assert all(r["reward"] == 0.0 and len(r["logprobs"]) == len(r["token_ids"]) for r in logged)


def test_a_run_whose_every_sample_is_wrong_stops_and_says_why(tmp_path, make_tiny_qwen2, char_tokenizer, capsys) -> None:
    # Bug story: a 20-row jsonl of multiplication problems (question/answer fields) that the model could
    # not solve printed "dynamic sampling kept no group; update skipped" at every step and exited 0, as if
    # it had trained. Now the run stops after data.dynamic_sampling.max_empty_steps (5) such steps in a
    # row, exit 1, saying that every reward was 0 and what to try. A random model never closes a \boxed{}
    # in 6 tokens, so every sample is wrong.
    import json

    from mathrl.cli import main
    from mathrl.model.io import save_model

    model_dir = save_model(make_tiny_qwen2(seed=3), char_tokenizer, tmp_path / "model")
    data = tmp_path / "mult.jsonl"
    data.write_text("".join(json.dumps({"question": f"{a}*{a + 3}=?", "answer": str(a * (a + 3))}) + "\n"
                            for a in range(11, 31)))
    run = tmp_path / "run"
    capsys.readouterr()
    code = main(["train", f"model.path={model_dir}", f"data.train={data}", f"data.eval=[{data}]", "data.question_field=question",
                 "data.template=plain", "data.dynamic_sampling.max_rounds=1", "rollout.max_new_tokens=6", "train.steps=20",
                 "rollout.prompts_per_step=2", "rollout.n=2", "train.mini_batch_size=4", "eval.n=1", "data.eval_size=2",
                 "reward.num_workers=0", "--run-dir", str(run)])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 1, err
    assert len(err) == 1 and err[0].startswith(
        "mathrl: error: steps 1-5 trained nothing: every one of the 20 samples (10 groups of 2) was wrong (reward 0): "
        "the model solves none of these problems, so no group had a signal to learn from. To fix: check the prompt "
        f"template and the answer fields first (`mathrl eval {model_dir} --data {data}`"), err
    assert "use easier problems, or start from a model fine-tuned on worked solutions (`mathrl sft`)" in err[0]
    assert err[0].endswith("(the run stops after data.dynamic_sampling.max_empty_steps=5 such steps in a row)")
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert max(steps) == 5 and not (run / "summary.json").exists()


def _empty(wrong: int, right: int = 0, band: int = 0):
    from mathrl.train.collect import GroupDrops
    from mathrl.train.monitors import GroupOutcomes

    return GroupOutcomes(kept=0, kept_all_wrong=0, kept_all_correct=0,
                         dropped=GroupDrops(all_correct=right, all_wrong=wrong, out_of_band=band))


def test_the_no_signal_count_is_consecutive_and_names_the_cause() -> None:
    import io

    from rich.console import Console

    from mathrl.train.monitors import GroupOutcomes, NoSignalError, SignalWatch

    cfg = load_config(None, ["data.dynamic_sampling.max_empty_steps=2"])
    console = Console(file=io.StringIO(), width=400)
    watch = SignalWatch()
    watch.record(1, _empty(4), n=8)
    watch.check(1, cfg, console)
    trained = GroupOutcomes(kept=4, kept_all_wrong=2, kept_all_correct=0)  # two groups of four had a signal
    watch.record(2, trained, n=8)  # a step that trained ends the streak
    watch.record(3, _empty(0, 4), n=8)
    watch.check(3, cfg, console)
    watch.record(4, _empty(0, 4), n=8)
    with pytest.raises(NoSignalError, match=r"^steps 3-4 trained nothing: every one of the 64 samples \(8 groups of 8\) "
                                            r"was right: these problems are too easy to learn from\. To fix: use harder"):
        watch.check(4, cfg, console)
    mixed = SignalWatch()
    for step in (1, 2):
        mixed.record(step, _empty(2, 1, 1), n=4)
    with pytest.raises(NoSignalError, match="of 8 groups of 4 samples 4 had every sample wrong, 2 every sample right, 2 an accuracy "
                                            "outside the band. To fix: widen data.dynamic_sampling's band"):
        mixed.check(2, cfg, console)
    never = load_config(None, ["data.dynamic_sampling.max_empty_steps=0"])
    mixed.check(2, never, console)  # 0: never stops


def test_without_dynamic_sampling_a_no_signal_streak_warns_once() -> None:
    # mode none trains every group by request (KL, entropy or a critic may still move the weights), so a
    # streak of all-wrong steps is a warning, printed once per streak, not a stop.
    import io

    from rich.console import Console

    from mathrl.train.monitors import GroupOutcomes, SignalWatch

    cfg = load_config(None, ["data.dynamic_sampling.mode=none", "data.dynamic_sampling.max_empty_steps=2"])
    console = Console(file=io.StringIO(), width=400)
    watch = SignalWatch()
    all_wrong = GroupOutcomes(kept=4, kept_all_wrong=4, kept_all_correct=0)
    for step in (1, 2, 3):
        watch.record(step, all_wrong, n=2)
        watch.check(step, cfg, console)
    text = console.file.getvalue()
    assert text.count("warning:") == 1
    assert "steps 1-2 had no reward signal: every one of the 16 samples (8 groups of 2) was wrong (reward 0)" in text
    assert "the policy gradient is 0 while this lasts" in text


def test_a_step_whose_groups_are_all_uniform_counts_exactly() -> None:
    # 10 kept groups, 1 all wrong and 9 all right: no group has a signal. Read back from the logged
    # float32 shares, 0.1 + 0.9 summed to 0.99999998 < 1 and such a step passed for one with a signal;
    # the watch now reads the step's group counts.
    from types import SimpleNamespace

    from mathrl.train.monitors import SignalWatch
    from mathrl.train.step import group_outcomes, uniform_groups

    correct = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 0.0])  # n = 2: all right, all wrong, mixed
    all_correct, all_wrong = uniform_groups(correct, 2)
    assert all_correct.tolist() == [True, False, False] and all_wrong.tolist() == [False, True, False]
    got = SimpleNamespace(correct=torch.tensor([0.0, 0.0] + [1.0, 1.0] * 9), problems=list(range(10)),
                                drops=GroupDrops())
    outcomes = group_outcomes(got, 2)
    assert (outcomes.kept, outcomes.kept_all_wrong, outcomes.kept_all_correct) == (10, 1, 9)
    watch = SignalWatch()
    watch.record(1, outcomes, n=2)
    assert (watch.in_a_row, watch.groups, watch.all_wrong, watch.all_correct) == (1, 10, 1, 9)
