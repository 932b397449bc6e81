"""PPO-with-critic functions (mathrl.algo.critic) against hand-computed values.

Run: python -m pytest tests/algo/test_critic.py -q
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from mathrl.algo.critic import explained_variance, gae, length_adaptive_lambda, value_loss


def t(rows):
    return torch.tensor(rows, dtype=torch.float32)


def test_gae_by_hand_one_row() -> None:
    # 3 tokens, outcome reward 1 on the last, V = [0.5, 0.6, 0.8], gamma 1, lam 0.5:
    # delta_2 = 1 + 0 - 0.8 = 0.2                 A_2 = 0.2
    # delta_1 = 0 + 0.8 - 0.6 = 0.2               A_1 = 0.2 + 0.5 * 0.2 = 0.3
    # delta_0 = 0 + 0.6 - 0.5 = 0.1               A_0 = 0.1 + 0.5 * 0.3 = 0.25
    adv, ret = gae(t([[0, 0, 1]]), t([[0.5, 0.6, 0.8]]), t([[1, 1, 1]]), gamma=1.0, lam=0.5)
    assert_close(adv, t([[0.25, 0.3, 0.2]]))
    assert_close(ret, t([[0.75, 0.9, 1.0]]))


def test_gae_with_discount_by_hand() -> None:
    # gamma 0.9, lam 1, V = 0: A_t = discounted reward-to-go = [0.81, 0.9, 1.0]
    adv, ret = gae(t([[0, 0, 1]]), t([[0, 0, 0]]), t([[1, 1, 1]]), gamma=0.9, lam=1.0)
    assert_close(adv, t([[0.81, 0.9, 1.0]]))
    assert_close(ret, adv)


def test_gae_lambda_one_is_monte_carlo_and_zero_is_td() -> None:
    r, v, m = t([[0, 0.5, 1]]), t([[0.2, 0.4, 0.3]]), t([[1, 1, 1]])
    adv1, ret1 = gae(r, v, m, lam=1.0)
    assert_close(ret1, t([[1.5, 1.5, 1.0]]))  # reward-to-go, whatever V is
    assert_close(adv1, ret1 - v)
    adv0, _ = gae(r, v, m, lam=0.0)
    assert_close(adv0, t([[0 + 0.4 - 0.2, 0.5 + 0.3 - 0.4, 1 + 0 - 0.3]]))  # one-step TD errors


def test_gae_padding_is_terminal_and_ignored() -> None:
    # Row 0 ends after 2 tokens: its last real token bootstraps from 0, not from the padding's value
    # or reward; padded positions are 0 in both outputs.
    r = t([[0, 1, 7], [0, 0, 1]])
    v = t([[0.5, 0.5, 9], [0.5, 0.5, 0.5]])
    m = t([[1, 1, 0], [1, 1, 1]])
    adv, ret = gae(r, v, m, lam=1.0)
    assert_close(adv, t([[0.5, 0.5, 0.0], [0.5, 0.5, 0.5]]))
    assert_close(ret, t([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]))
    # and it equals running the short row on its own
    adv_alone, _ = gae(r[:1, :2], v[:1, :2], m[:1, :2], lam=1.0)
    assert_close(adv[:1, :2], adv_alone)


def test_gae_per_row_lambda() -> None:
    r, v, m = t([[0, 0, 1], [0, 0, 1]]), t([[0.5, 0.6, 0.8], [0.5, 0.6, 0.8]]), t([[1, 1, 1], [1, 1, 1]])
    adv, _ = gae(r, v, m, lam=torch.tensor([0.5, 1.0]))
    assert_close(adv[0], gae(r[:1], v[:1], m[:1], lam=0.5)[0][0])
    assert_close(adv[1], gae(r[1:], v[1:], m[1:], lam=1.0)[0][0])
    with pytest.raises(ValueError, match="lam must be"):
        gae(r, v, m, lam=torch.tensor([0.5, 1.0, 1.0]))


def test_gae_all_masked_row_is_zero() -> None:
    adv, ret = gae(t([[1, 1]]), t([[0.3, 0.3]]), t([[0, 0]]))
    assert adv.abs().sum() == 0 and ret.abs().sum() == 0


def test_length_adaptive_lambda_by_hand() -> None:
    # alpha 0.05: l = 100 -> 1 - 1/5 = 0.8; l = 1000 -> 0.98; l = 10 -> 1 - 2 < 0 -> 0
    lam = length_adaptive_lambda(torch.tensor([100, 1000, 10, 0]), alpha=0.05)
    assert_close(lam, t([0.8, 0.98, 0.0, 0.0]))
    # the GAE weight sum 1 / (1 - lam) is alpha * l: it grows with the length
    assert 1 / (1 - lam[1]) == pytest.approx(0.05 * 1000)
    with pytest.raises(ValueError):
        length_adaptive_lambda(torch.tensor([5]), alpha=0.0)


def test_value_loss_clipping_by_hand() -> None:
    # old 0.5, eps 0.2, return 1.0:
    #   V = 0.9 -> V_clip = 0.7: max((0.1)^2, (0.3)^2) = 0.09 -> 0.045, clipped term wins
    #   V = 0.6 -> inside the range: 0.5 * 0.16 = 0.08, not clipped
    #   V = 0.1 -> V_clip = 0.3: max(0.81, 0.49) = 0.81 -> 0.405, the unclipped term wins
    values, old, ret, m = t([[0.9, 0.6, 0.1]]), t([[0.5, 0.5, 0.5]]), t([[1.0, 1.0, 1.0]]), t([[1, 1, 1]])
    loss, clipped = value_loss(values, old, ret, m, clip_eps=0.2)
    assert_close(loss, t([[0.045, 0.08, 0.405]]))
    assert_close(clipped, t([[1.0, 0.0, 0.0]]))
    plain, none_clipped = value_loss(values, old, ret, m, clip_eps=None)
    assert_close(plain, t([[0.005, 0.08, 0.405]]))
    assert none_clipped.sum() == 0


def test_value_loss_gradient_stops_where_clipped() -> None:
    values = t([[0.9, 0.6]]).requires_grad_()
    loss, _ = value_loss(values, t([[0.5, 0.5]]), t([[1.0, 1.0]]), t([[1, 1]]), clip_eps=0.2)
    loss.sum().backward()
    # token 0: the clipped term is constant in V -> no gradient; token 1: d/dV 0.5 (V - R)^2 = V - R
    assert_close(values.grad, t([[0.0, -0.4]]))


def test_value_loss_masks_padding() -> None:
    loss, clipped = value_loss(t([[5.0, 5.0]]), t([[0.0, 0.0]]), t([[0.0, 0.0]]), t([[1, 0]]), clip_eps=0.2)
    assert loss[0, 1] == 0 and clipped[0, 1] == 0 and loss[0, 0] > 0


def test_explained_variance() -> None:
    ret, m = t([[1.0, 0.0, 1.0, 0.0]]), t([[1, 1, 1, 0]])
    assert explained_variance(ret, ret, m) == pytest.approx(1.0)
    mean = torch.full_like(ret, 2 / 3)
    assert explained_variance(mean, ret, m) == pytest.approx(0.0, abs=1e-7)
    assert math.isnan(explained_variance(ret, torch.ones_like(ret), m))  # constant returns


# ----------------------------------------------------------------------------- the critic model and update


def tiny_critic(seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForTokenClassification

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=23, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=64, num_labels=1, classifier_dropout=0.0)
    return Qwen2ForTokenClassification(cfg).float()


def test_response_values_are_the_outputs_before_each_response_token() -> None:
    # Independent computation: run the unpadded [prompt | response] of each row alone and read the
    # output at prompt_len - 1 + t. Padding (left prompt, right response) must not change it.
    from mathrl.model.value import response_values

    critic = tiny_critic().eval()
    prompt_ids = torch.tensor([[0, 5, 6], [7, 8, 9]])
    prompt_mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    response_ids = torch.tensor([[4, 5, 0], [6, 3, 2]])
    response_mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    with torch.no_grad():
        values = response_values(critic, prompt_ids, prompt_mask, response_ids, response_mask)
        for i in range(2):
            p = prompt_ids[i][prompt_mask[i].bool()]
            r = response_ids[i][response_mask[i].bool()]
            alone = critic(input_ids=torch.cat([p, r])[None]).logits[0, :, 0]
            assert_close(values[i, : len(r)], alone[len(p) - 1 : len(p) - 1 + len(r)], rtol=1e-5, atol=1e-5)


def test_load_critic_starts_at_zero_from_an_lm_and_keeps_a_saved_head(tmp_path, make_tiny_qwen2, char_tokenizer) -> None:
    from mathrl.model.io import save_model
    from mathrl.model.value import load_critic, response_values

    lm_dir = save_model(make_tiny_qwen2(seed=3), char_tokenizer, tmp_path / "lm")
    critic = load_critic(lm_dir)
    assert critic.dropout.p == 0.0
    ids, mask = torch.tensor([[5, 6, 7]]), torch.ones(1, 3, dtype=torch.long)
    assert response_values(critic, ids, mask, ids, mask).abs().sum() == 0  # zero head: every value is 0
    # the backbone is the LM's
    lm = make_tiny_qwen2(seed=3)
    for name, param in lm.model.named_parameters():
        assert torch.equal(param, dict(critic.model.named_parameters())[name]), name
    with torch.no_grad():
        critic.score.weight.normal_()
    critic.save_pretrained(tmp_path / "critic")
    again = load_critic(tmp_path / "critic")
    assert torch.equal(again.score.weight, critic.score.weight)


def test_the_critic_returns_values_of_its_own_not_a_view(tmp_path, make_tiny_qwen2, char_tokenizer) -> None:
    # Bug story: under --nproc the FSDP2-sharded critic warned "returned a view tensor" at every forward:
    # its one-wide head's [B, L, 1] output is a reshaped matrix-vector product. An in-place op on such a
    # view would skip FSDP2's pre-backward hook; the critic now returns a tensor of its own, same values.
    from mathrl.model.io import save_model
    from mathrl.model.value import load_critic

    critic = load_critic(save_model(make_tiny_qwen2(seed=3), char_tokenizer, tmp_path / "lm"))
    with torch.no_grad():
        critic.score.weight.normal_()
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    out = critic(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    assert out.requires_grad and out._base is None
    hidden = critic.model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state
    assert_close(out, hidden @ critic.score.weight.T)


def test_outcome_token_rewards_sit_on_the_last_token() -> None:
    from mathrl.algo.critic import outcome_token_rewards

    mask = t([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    assert_close(outcome_token_rewards(torch.tensor([1.0, 0.5, 1.0]), mask),
                 t([[0, 0, 1, 0], [0.5, 0, 0, 0], [0, 0, 0, 0]]))


def critic_update(micro_batch_tokens: int):
    from mathrl.config import load_config
    from mathrl.train.critic import update_critic
    from update_helpers import random_batch  # the same random rollout batch as the policy-update tests

    cfg = load_config(None, ["rollout.max_new_tokens=6", "rollout.prompts_per_step=2", "rollout.n=4",
                             "train.mini_batch_size=8", f"train.micro_batch_tokens={micro_batch_tokens}",
                             "train.max_grad_norm=1e9", "algo.adv.estimator=gae", "algo.critic.value_clip=0.05"])
    critic = tiny_critic(seed=1)
    optimizer = torch.optim.SGD(critic.parameters(), lr=1.0)  # update = -gradient
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    batch = random_batch()
    g = torch.Generator().manual_seed(7)
    batch.old_values = torch.randn(batch.response_mask.shape, generator=g) * 0.1 * batch.response_mask
    batch.returns = (torch.rand(batch.response_mask.shape, generator=g) > 0.5).float() * batch.response_mask
    before = [p.detach().clone() for p in critic.parameters()]
    metrics = update_critic(critic, optimizer, scheduler, batch, cfg, step=1).metrics
    return [b - p.detach() for b, p in zip(before, critic.parameters())], metrics


def test_critic_update_does_not_depend_on_micro_batch_split() -> None:
    whole, m_whole = critic_update(10_000)
    split, m_split = critic_update(1)
    assert any(d.abs().sum() > 0 for d in whole)
    for a, b in zip(whole, split):
        assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert m_whole["critic/value_loss"] == pytest.approx(m_split["critic/value_loss"], rel=1e-5)
    assert 0 < m_whole["critic/vf_clipfrac"] < 1  # the clip is exercised
