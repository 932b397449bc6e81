"""model.dtype=float16: float32 master weights, float16 autocast, a dynamic loss scaler (arXiv 2510.26788).

- an overflowing scaled gradient skips the optimizer step, leaves every weight and the schedule as they
  were, halves the scale and is logged (actor/skipped_inf_steps, actor/loss_scale);
- the trainer's float16 logprobs are within float16's rounding of the float32 ones, and closer than
  bfloat16's;
- a 2-step tiny `mathrl train model.dtype=float16` run: float32 trainer, float16 engine, finite metrics;
- `mathrl sft` refuses float16 (it has no loss scaler).
Resuming with the scaler's state: tests/train/test_resume.py; 2 gloo ranks: tests/train/test_dist_train.py.
"""

from __future__ import annotations

import io
import math
from pathlib import Path

import pytest
import torch

from mathrl.config import ConfigError, load_config
from mathrl.model.dtypes import autocast
from mathrl.model.scoring import response_logprobs
from mathrl.train.update import loss_scaler, update_policy
from update_helpers import random_batch, tiny_model

BATCH = ["rollout.prompts_per_step=2", "rollout.n=4", "train.mini_batch_size=8", "rollout.max_new_tokens=6"]


def test_scaler_only_for_float16():
    assert loss_scaler(load_config(None, BATCH), torch.device("cpu"), distributed=False) is None
    scaler = loss_scaler(load_config(None, [*BATCH, "model.dtype=float16"]), torch.device("cpu"), distributed=False)
    assert isinstance(scaler, torch.amp.GradScaler) and scaler.get_scale() == 2.0**16


def test_overflowing_gradient_skips_the_step_halves_the_scale_and_is_logged():
    # A huge advantage: the loss (~1e35) is finite in float32, but times the initial scale 2^16 it is
    # above float32's maximum (3.4e38), so the scaled gradient is inf. The scaler must skip the step
    # (weights and schedule unchanged), halve the scale and count it; the next, ordinary mini-batch
    # trains at the halved scale.
    cfg = load_config(None, [*BATCH, "model.dtype=float16"])
    model = tiny_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    scaler = loss_scaler(cfg, torch.device("cpu"), distributed=False)
    batch = random_batch()
    huge = random_batch()
    huge.advantages = huge.advantages * 1e35
    before = [p.detach().clone() for p in model.parameters()]
    coefs = {"entropy": 0.0, "kl": 0.0}

    updated = update_policy(model, optimizer, scheduler, huge, cfg, step=1, coefs=coefs, ptx=None, scaler=scaler)
    m = updated.metrics
    assert updated.skipped == 0  # the loss scaler's own skip is not a non-finite update
    assert math.isfinite(m["actor/pg_loss"])  # the loss itself was fine: an overflow of the scaled gradient
    assert m["actor/skipped_inf_steps"] == 1.0 and m["actor/updates"] == 0.0
    assert m["perf/skipped_updates"] == 0.0  # expected under dynamic scaling: not a non-finite step
    assert m["actor/loss_scale"] == 2.0**15
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters()))
    assert scheduler.last_epoch == 0

    m = update_policy(model, optimizer, scheduler, batch, cfg, step=2, coefs=coefs, ptx=None, scaler=scaler).metrics
    assert m["actor/skipped_inf_steps"] == 0.0 and m["actor/updates"] == 1.0
    assert m["actor/loss_scale"] == 2.0**15  # growth only after growth_interval (2000) good steps
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
    assert all(p.dtype == torch.float32 for p in model.parameters())  # master weights stay float32
    assert all(v.dtype == torch.float32 for s in optimizer.state.values() for v in s.values() if v.is_floating_point())


def test_float16_step_follows_the_float32_step():
    # The unscaled gradient of the float16 forward is the float32 one to float16's rounding: one SGD step
    # (lr 1: the update is the gradient, largest entry 0.09) from the same weights lands within 5e-4 of the
    # float32 step (measured 5e-5; a gradient left multiplied by the scale 65536 would be off by far more).
    coefs = {"entropy": 0.0, "kl": 0.0}
    deltas = {}
    for dtype in ("float32", "float16"):
        cfg = load_config(None, [*BATCH, f"model.dtype={dtype}", "train.max_grad_norm=1e9"])
        model = tiny_model()
        before = [p.detach().clone() for p in model.parameters()]
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
        update_policy(model, optimizer, scheduler, random_batch(), cfg, step=1, coefs=coefs, ptx=None,
                      scaler=loss_scaler(cfg, torch.device("cpu"), distributed=False))
        deltas[dtype] = torch.cat([(b - p.detach()).flatten() for b, p in zip(before, model.parameters())])
    assert deltas["float32"].abs().max() > 1e-2  # a real step
    torch.testing.assert_close(deltas["float16"], deltas["float32"], rtol=0, atol=5e-4)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_float16_logprobs_are_close_to_float32(seed, make_tiny_qwen2):
    # float16 keeps 11 significant bits (relative rounding 2^-11 ~ 5e-4); the tiny model's logprobs are
    # ~ -5 and go through a few float16 matrix products, so they differ from float32 by a few 1e-3
    # (measured max 2.4e-3 - 3.7e-3 over these seeds). Tolerance 1.5e-2 absolute; and the mean error is
    # below a third of bfloat16's (8 bits: measured ~10x larger), the paper's point in miniature.
    model = make_tiny_qwen2(seed=seed)
    b = random_batch(seed=seed)
    args = (b.prompt_ids, b.prompt_mask, b.response_ids, b.response_mask)
    with torch.no_grad():
        lp32, _ = response_logprobs(model, *args)
        with autocast("float16", "cpu"):
            lp16, _ = response_logprobs(model, *args)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            lpbf, _ = response_logprobs(model, *args)
    m = b.response_mask.bool()
    assert lp16.dtype == torch.float32  # the logprobs themselves are computed in float32
    torch.testing.assert_close(lp16[m], lp32[m], rtol=0, atol=1.5e-2)
    assert (lp16 - lp32)[m].abs().mean() < (lpbf - lp32)[m].abs().mean() / 3


TINY = [
    "base.steps=200", "base.max_digits=1", "data.arith.max_digits=1", "base.hidden_size=32",
    "base.intermediate_size=64", "base.num_layers=2", "base.num_heads=2", "base.num_kv_heads=1",
    "train.steps=2", "rollout.prompts_per_step=4", "rollout.n=4", "train.mini_batch_size=8", "data.eval_size=4",
    "eval.n=2", "eval.every=2", "reward.num_workers=0", "data.dynamic_sampling.mode=none", "train.save_every=0",
    "algo.entropy.mode=fixed", "algo.entropy.coef=0.01",  # a gradient even where every reward is equal
]


@pytest.mark.slow
def test_two_step_float16_run_trains_in_float32_and_samples_in_float16(tmp_path, monkeypatch):
    from rich.console import Console

    from mathrl.track.sinks import read_metrics
    from mathrl.train.dist import Ranks
    from mathrl.train.loop import train
    from mathrl.train.trainer import build_trainer

    monkeypatch.setenv("MATHRL_CACHE", str(tmp_path / "cache"))
    cfg = load_config(None, [*TINY, "model.dtype=float16", f"run_dir={tmp_path / 'run'}"])
    result = train(cfg, console=Console(file=io.StringIO()))
    rows = [r for r in read_metrics(result.run_dir / "metrics.jsonl") if "actor/pg_loss" in r]
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        for key, value in row.items():
            assert isinstance(value, (int, float)) and math.isfinite(value), (key, value)
        assert row["actor/loss_scale"] > 0 and "actor/skipped_inf_steps" in row
        assert row["rollout/logprob_mismatch"] > 0  # float16 engine vs float16 autocast: recomputed, compared
    glossary = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    assert "`actor/loss_scale`" in glossary and "`actor/skipped_inf_steps`" in glossary
    # what the run holds: float32 master weights and optimizer, a float16 engine copy, a scaler
    t = build_trainer(load_config(None, [*TINY, "model.dtype=float16", f"run_dir={tmp_path / 'other'}"]),
                      Ranks(),
                      console=Console(file=io.StringIO()))
    assert {p.dtype for p in t.model.parameters()} == {torch.float32}
    assert {p.dtype for p in t.engine.model.parameters()} == {torch.float16}
    assert t.scaler is not None and "loss_scalers" in t.state()


def test_sft_refuses_float16():
    from mathrl.train.sft import check_sft_config

    with pytest.raises(ConfigError, match="model.dtype=float16 trains with a loss scaler in `mathrl train` only"):
        check_sft_config(load_config(None, ["model.dtype=float16", "data.train=x.jsonl"], check_paths=False))
