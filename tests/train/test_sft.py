"""`mathrl sft`: the response-only loss, its invariance to the micro-batch split, a tiny SFT run that
learns, exact resume after an interruption, and the R1 path (SFT, then RL from its final/).

The end-to-end tests share one 20-step, hidden-32 tiny base model built into a temporary MATHRL_CACHE
and a jsonl of clean worked single-digit sums written by `write_arith_sft_jsonl`.

Run: python -m pytest tests/train/test_sft.py -q
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest
import torch
from rich.console import Console
from torch.testing import assert_close

from mathrl.algo.losses import aggregate, sft_loss
from mathrl.config import ConfigError, load_config
from mathrl.model.io import load_model_and_tokenizer
from mathrl.train.batching import micro_batches
from mathrl.train.sft import Example, collate, sft, sft_backward, write_arith_sft_jsonl

TINY = [
    "base.steps=20", "base.hidden_size=32", "base.intermediate_size=64", "base.num_layers=2", "base.num_heads=2",
    "base.num_kv_heads=1", "base.max_digits=1", "data.arith.max_digits=1", "data.eval_size=4", "eval.n=2",
    "reward.num_workers=0",
]


def quiet() -> Console:
    return Console(file=io.StringIO(), width=120)


def _examples(tokenizer, pairs: list[tuple[str, str]]) -> list[Example]:
    return [Example(tokenizer(p)["input_ids"], tokenizer(r, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id])
            for p, r in pairs]


PAIRS = [("3+4=", "3+4+0=07,\\boxed{7}"), ("12+9=", "2+9+0=11,1+0+1=02,\\boxed{21}"), ("5+5=", "\\boxed{10}"),
         ("987+6=", "7+6+0=13,\\boxed{993}"), ("1+1=", "2"), ("44+44=", "4+4+0=08,4+4+0=08,\\boxed{88}")]


# --------------------------------------------------------------------------------------------------
# the loss
# --------------------------------------------------------------------------------------------------
def test_token_mean_nll_by_hand():
    # Two responses of 2 and 1 counted tokens; the third column of row 0 and the tail of row 1 are
    # padding whose (garbage) logprobs must not count: (1 + 2 + 3) / 3 tokens = 2.
    logprobs = torch.tensor([[-1.0, -2.0, -50.0], [-3.0, -70.0, -90.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    loss = aggregate(sft_loss(logprobs, mask), mask, mode="token_mean", num_tokens=3, num_seqs=2)
    assert_close(loss, torch.tensor(2.0))


def test_loss_counts_response_tokens_only(make_tiny_qwen2, char_tokenizer):
    # Reference: each sequence on its own, unpadded, through the model's plain forward; the NLL of
    # the response tokens (EOS included) summed over both sequences over their token count. Prompt
    # tokens are predicted too by the forward but must not count.
    model = make_tiny_qwen2(seed=3)
    examples = _examples(char_tokenizer, PAIRS[:2])
    total, count = 0.0, 0
    for e in examples:
        ids = torch.tensor([e.prompt_ids + e.response_ids])
        with torch.no_grad():
            logprobs = torch.log_softmax(model(ids).logits[0].double(), -1)  # [L, V]
        p = len(e.prompt_ids)
        for t, tok in enumerate(e.response_ids):
            total -= float(logprobs[p + t - 1, tok])
            count += 1
    loss, tokens = sft_backward(model, collate(examples, pad_id=char_tokenizer.pad_token_id), micro_batch_tokens=10_000)
    assert tokens == count == sum(len(e.response_ids) for e in examples)
    assert loss == pytest.approx(total / count, rel=1e-5)


def _gradient(model, batch, budget: int) -> tuple[float, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss, _ = sft_backward(model, batch, micro_batch_tokens=budget)
    return loss, [p.grad.clone() for p in model.parameters()]


def test_gradient_does_not_depend_on_the_micro_batch_split(make_tiny_qwen2, char_tokenizer):
    # 1 micro-batch, a few, and one row each: the same loss and gradient (every micro-batch is divided by
    # the whole mini-batch's token count). Per-micro-batch normalisers would weigh short rows up.
    model = make_tiny_qwen2(seed=1).double()
    batch = collate(_examples(char_tokenizer, PAIRS), pad_id=char_tokenizer.pad_token_id)
    ref_loss, ref_grad = _gradient(model, batch, 10_000)
    assert sum(float(g.abs().sum()) for g in ref_grad) > 0  # not vacuous
    for budget in (60, 1):
        assert len(micro_batches(batch, budget)) > 1
        loss, grad = _gradient(model, batch, budget)
        assert loss == pytest.approx(ref_loss, rel=1e-10)
        for g, r in zip(grad, ref_grad):
            assert_close(g, r)


# --------------------------------------------------------------------------------------------------
# end to end on the tiny base model
# --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sft_setup(tmp_path_factory):
    """(root, overrides, run dir) of a 6-step SFT run on 300 clean worked single-digit sums."""
    root = tmp_path_factory.mktemp("sft")
    data = write_arith_sft_jsonl(root / "arith_sft.jsonl", rows=300, max_digits=1)
    overrides = [*TINY, f"data.train={data}", "sft.steps=6", "sft.batch_size=16", "sft.lr=3e-3", "sft.warmup_steps=1",
                 "sft.eval_rows=32", "eval.every=3", "train.save_every=2", "train.keep_last=5",
                 "train.micro_batch_tokens=400"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MATHRL_CACHE", str(root / "cache"))
        run = sft(load_config(None, [*overrides, f"run_dir={root / 'run'}"]), console=quiet())
    return root, overrides, run


def _rows(run: Path) -> list[dict]:
    """metrics.jsonl without wall-clock timings."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "perf/step_seconds"} for r in rows]


def test_sft_learns_and_writes_a_run_directory(sft_setup):
    root, _, run = sft_setup
    for name in ("config.yaml", "metrics.jsonl", "evals.jsonl", "summary.json", "final/config.json",
                 "checkpoints/step_000006/trainer_state.pt"):
        assert (run / name).exists(), name
    rows = _rows(run)
    for r in rows:
        assert all(isinstance(v, (int, float)) and math.isfinite(v) for v in r.values()), r
    losses = [r["sft/loss"] for r in rows if "sft/loss" in r]
    evals = [r["sft/eval_loss"] for r in rows if "sft/eval_loss" in r]
    assert len(losses) == 6 and len(evals) == 3  # steps 0, 3, 6
    assert losses[-1] < losses[0] and evals[-1] < evals[0]
    assert any("eval/arith_heldout/pass@1" in r for r in rows)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["sft_eval_loss"]["final"] == evals[-1]
    # the weights moved away from the base model's
    base_dir = next((root / "cache" / "base").iterdir())
    base, _ = load_model_and_tokenizer(base_dir)
    final, _ = load_model_and_tokenizer(run / "final")
    moved = [n for (n, a), b in zip(base.named_parameters(), final.parameters()) if not torch.equal(a, b)]
    assert len(moved) == len(list(base.parameters()))


def test_every_sft_metric_is_defined_in_the_glossary(sft_setup):
    glossary = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    keys = set().union(*_rows(sft_setup[2])) - {"step"}
    assert sorted(k for k in keys if not k.startswith("eval/") and f"`{k}`" not in glossary) == []


def test_resume_after_an_interruption_gives_identical_metrics(sft_setup, monkeypatch):
    # Killed during step 5 (after the step-4 checkpoint, with step 5's nothing logged) then rerun: the
    # log and the final weights match the uninterrupted run exactly (data order, optimizer, RNG restored).
    import mathrl.train.sft as sft_module

    root, overrides, reference = sft_setup
    monkeypatch.setenv("MATHRL_CACHE", str(root / "cache"))
    cfg = load_config(None, [*overrides, f"run_dir={root / 'resumed'}"])
    real, calls = sft_module.sft_backward, []

    def dies_at_step_5(*args, **kwargs):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(sft_module, "sft_backward", dies_at_step_5)
    with pytest.raises(KeyboardInterrupt):
        sft(cfg, console=quiet())
    monkeypatch.setattr(sft_module, "sft_backward", real)
    console = quiet()
    sft(cfg, console=console)
    assert "resuming" in console.file.getvalue()
    assert _rows(root / "resumed") == _rows(reference)
    a, _ = load_model_and_tokenizer(root / "resumed" / "final")
    b, _ = load_model_and_tokenizer(reference / "final")
    for x, y in zip(a.parameters(), b.parameters()):
        assert torch.equal(x, y)


def test_rl_continues_from_the_sft_model(sft_setup, monkeypatch):
    # The R1 path: `mathrl train model.path=<sft run>/final`. The RL run's step-0 evaluation (same eval
    # settings and seed) is the SFT run's last one: RL starts from the fine-tuned weights.
    from mathrl.train.loop import train

    root, _, run = sft_setup
    monkeypatch.setenv("MATHRL_CACHE", str(root / "cache"))
    cfg = load_config(None, [*TINY, f"model.path={run / 'final'}", "train.steps=2", "rollout.prompts_per_step=4",
                             "rollout.n=4", "train.mini_batch_size=8", f"run_dir={root / 'rl'}",
                             # every group trains: this briefly fine-tuned model gets whole groups wrong,
                             # which dynamic sampling would drop, and both steps must update
                             "data.dynamic_sampling.mode=none"])
    result = train(cfg, console=quiet())
    rows = _rows(result.run_dir)
    assert [r["step"] for r in rows if "actor/pg_loss" in r] == [1, 2]
    sft_last = [r for r in _rows(run) if "eval/arith_heldout/pass@1" in r][-1]
    rl_first = next(r for r in rows if "eval/arith_heldout/pass@1" in r)
    assert rl_first == {**sft_last, "step": 0}
    assert (result.run_dir / "final" / "model.safetensors").is_file()


# --------------------------------------------------------------------------------------------------
# bad input: one line naming the field and the fix
# --------------------------------------------------------------------------------------------------
def test_config_errors_name_the_field(tmp_path):
    from mathrl.train.sft import check_sft_config, load_examples

    with pytest.raises(ConfigError, match=r"data.train=arith has no responses"):
        check_sft_config(load_config(None, []))
    with pytest.raises(ConfigError, match=r"sft.lr=-1.0: must be > 0"):
        load_config(None, ["sft.lr=-1"])
    with pytest.raises(ConfigError, match=r"sft.eval_rows=-2"):
        load_config(None, ["sft.eval_rows=-2"])
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"problem": "1+1", "answer": "2", "solution": "\\boxed{2}"}) + "\n")
    with pytest.raises(ConfigError, match=r"sft.response_field='problem' is also the question"):
        load_examples(load_config(None, [f"data.train={data}", "sft.response_field=problem"]), None)
    from mathrl.model.tiny import build_char_tokenizer

    with pytest.raises(ValueError, match=r"no string field 'response' \(sft.response_field\)"):
        load_examples(load_config(None, [f"data.train={data}"]), build_char_tokenizer())
    examples, dropped = load_examples(load_config(None, [f"data.train={data}", "sft.response_field=solution"]),
                                      build_char_tokenizer())
    assert len(examples) == 1 and dropped["response_too_long"] == 0


def test_cli_reports_one_line(tmp_path, capsys):
    from mathrl.cli import main

    assert main(["sft", "--run-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mathrl: config error: data.train=arith has no responses")


def test_arith_sft_rows_are_training_split_and_clean(tmp_path):
    # SFT rows must never be held-out problems (the eval set stays unseen), and with slip_prob=0 every
    # worked solution ends in the right answer.
    from mathrl.tasks.arithmetic import ArithmeticTask
    from mathrl.tasks.rows import _last_boxed

    path = write_arith_sft_jsonl(tmp_path / "a.jsonl", rows=200, max_digits=2, seed=3)
    task = ArithmeticTask(min_digits=1, max_digits=2)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 200
    for row in rows:
        a, b = map(int, row["problem"].split("+"))
        assert not task.is_heldout(a, b)
        assert int(_last_boxed(row["response"])) == a + b == int(row["answer"])


def test_sigterm_saves_the_step_in_progress_and_the_rerun_matches(sft_setup, monkeypatch):
    # A scheduler's SIGTERM during step 3 (train.save_every=2: no checkpoint due there) ends the step,
    # saves it and stops with Preempted (exit 143 at the command line); the rerun finishes as if never stopped.
    import os
    import signal

    import mathrl.train.sft as sft_module
    from mathrl.train.preempt import Preempted

    root, overrides, reference = sft_setup
    monkeypatch.setenv("MATHRL_CACHE", str(root / "cache"))
    cfg = load_config(None, [*overrides, f"run_dir={root / 'preempted'}"])
    real, calls = sft_module.sft_backward, []

    def term_at_step_3(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGTERM)  # only a flag: the step goes on
        return real(*args, **kwargs)

    monkeypatch.setattr(sft_module, "sft_backward", term_at_step_3)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Preempted) as stopped:
        sft(cfg, console=quiet())
    assert stopped.value.step == 3 and stopped.value.exit_code == 143
    assert (root / "preempted" / "checkpoints" / "step_000003").is_dir()
    assert signal.getsignal(signal.SIGTERM) == before  # the run's handler is gone with the run
    monkeypatch.setattr(sft_module, "sft_backward", real)
    sft(cfg, console=quiet())
    assert _rows(root / "preempted") == _rows(reference)
