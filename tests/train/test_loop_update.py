"""The loop's combined loss (policy + entropy bonus with ref_gain_clip + KL loss + positive-example LM)
gives the same update however the mini-batch is split into micro-batches, for every aggregation mode.

A regression guard for the classic bug of normalising each micro-batch by its own token count.
"""

import pytest
import torch

from mathrl.config import load_config
from mathrl.train.update import update_policy
from update_helpers import random_batch, tiny_model


def one_update(agg: str, micro_batch_tokens: int) -> tuple[list[torch.Tensor], dict]:
    cfg = load_config(None, [
        f"algo.loss_agg={agg}", "rollout.max_new_tokens=6", "rollout.prompts_per_step=2", "rollout.n=4",
        "train.mini_batch_size=8", f"train.micro_batch_tokens={micro_batch_tokens}", "train.max_grad_norm=1e9",
        "algo.entropy.mode=fixed", "algo.entropy.coef=0.05", "algo.entropy.ref_gain_clip.max_gain=0.1",
        "algo.kl.use=loss", "algo.pos_lm.coef=0.1",
    ])
    model = tiny_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)  # update = -gradient, so params compare gradients
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    before = [p.detach().clone() for p in model.parameters()]
    metrics = update_policy(model, optimizer, scheduler, random_batch(), cfg, step=1,
                            coefs={"entropy": 0.05, "kl": 0.1}, ptx=None).metrics
    return [b - p.detach() for b, p in zip(before, model.parameters())], metrics


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"])
def test_update_does_not_depend_on_micro_batch_split(agg):
    whole, m_whole = one_update(agg, micro_batch_tokens=10_000)  # one micro-batch
    split, m_split = one_update(agg, micro_batch_tokens=1)  # one row per micro-batch
    assert any(g.abs().sum() > 0 for g in whole)
    for a, b in zip(whole, split):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    for key in ("actor/pg_loss", "actor/entropy_loss", "actor/kl_loss", "actor/pos_lm_loss", "actor/entropy_clipfrac"):
        assert m_whole[key] == pytest.approx(m_split[key], rel=1e-4, abs=1e-6), key
    # the test batch really exercises the switches it is meant to
    assert 0 < m_whole["actor/entropy_clipfrac"] < 1
    assert m_whole["actor/pg_clipfrac"] > 0


def test_non_finite_gradient_skips_the_optimizer_step():
    # A NaN advantage (e.g. from a broken reward) makes the loss and gradient NaN: the optimizer step
    # must be skipped, leaving every weight as it was, and counted in perf/skipped_updates.
    cfg = load_config(None, ["rollout.prompts_per_step=2", "rollout.n=4", "train.mini_batch_size=8",
                             "rollout.max_new_tokens=6"])
    model = tiny_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    batch = random_batch()
    batch.advantages = batch.advantages.clone()
    batch.advantages[0, 0] = float("nan")
    before = [p.detach().clone() for p in model.parameters()]
    updated = update_policy(model, optimizer, scheduler, batch, cfg, step=1, coefs={"entropy": 0.0, "kl": 0.0}, ptx=None)
    assert updated.skipped == 1 and updated.metrics["perf/skipped_updates"] == 1.0
    assert updated.metrics["actor/updates"] == 0.0
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters()))
    assert scheduler.last_epoch == 0  # the schedule does not advance on a skipped step
