"""The loop's combined loss (policy + entropy bonus with ref_gain_clip + KL loss + positive-example LM)
gives the same update however the mini-batch is split into micro-batches, for every aggregation mode.

A regression guard for the classic bug of normalising each micro-batch by its own token count.
"""

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from mathrl.config import load_config
from mathrl.train.batching import TrainBatch
from mathrl.train.update import update_policy


def tiny_model(seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=23, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    return Qwen2ForCausalLM(cfg).float()


def random_batch(n: int = 8, t: int = 6, seed: int = 1) -> TrainBatch:
    g = torch.Generator().manual_seed(seed)
    prompt_lens = torch.randint(1, 4, (n,), generator=g)
    resp_lens = torch.randint(1, t + 1, (n,), generator=g)
    p = int(prompt_lens.max())
    prompt_ids = torch.zeros((n, p), dtype=torch.long)
    prompt_mask = torch.zeros((n, p), dtype=torch.long)
    response_ids = torch.zeros((n, t), dtype=torch.long)
    response_mask = torch.zeros((n, t))
    for i in range(n):
        prompt_ids[i, p - prompt_lens[i]:] = torch.randint(3, 23, (int(prompt_lens[i]),), generator=g)
        prompt_mask[i, p - prompt_lens[i]:] = 1
        response_ids[i, : resp_lens[i]] = torch.randint(3, 23, (int(resp_lens[i]),), generator=g)
        response_mask[i, : resp_lens[i]] = 1
    noise = lambda: torch.randn((n, t), generator=g) * 0.3 * response_mask  # noqa: E731
    return TrainBatch(
        prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids, response_mask=response_mask,
        loss_mask=response_mask.clone(),
        old_logprobs=-2.5 + noise(),  # ratios away from 1 so some tokens are clipped
        advantages=torch.randn((n, 1), generator=g).expand(n, t) * response_mask,
        ref_logprobs=-3.0 + noise(),
        ref_entropy=(2.5 + noise()).clamp(min=0),
        correct=(torch.rand(n, generator=g) > 0.5).float(),
    )


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
