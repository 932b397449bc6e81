"""train.old_logprobs: the torch engine's sampling logprobs stand in for the old-policy scoring pass
only where they are the same numbers.

The claim behind `reuse_engine` (and `auto`): the torch engine samples from the training model's own
float32 weights, so the logprob it records for each sampled token (cached, token-by-token decoding)
equals the one a full no-grad forward of the trainer gives, up to float rounding. The tests measure
that gap, then show that a whole policy update (two mini-batches, the second one off-policy) gives
the same loss and the same parameters with either source of old logprobs.

    python -m pytest tests/train/test_old_logprobs.py -q
"""

import copy

import pytest
import torch

from mathrl.config import ConfigError, load_config
from mathrl.rollout.engine import TorchEngine
from mathrl.train.batching import TrainBatch
from mathrl.train.passes import engine_logprobs_are_old, scoring_pass
from mathrl.train.update import update_policy

PROMPTS = ["12+7=", "3+4=", "105+27=", "9="]  # different lengths: the engine left-pads them


def rollout_batch(model, tokenizer, *, temperature: float, seed: int = 0) -> tuple[TrainBatch, torch.Tensor]:
    """(batch with zero old logprobs and random advantages, the engine's logprobs) of 8 samples."""
    engine = TorchEngine(model, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    prompts = [tokenizer(p)["input_ids"] for p in PROMPTS for _ in range(2)]
    out = engine.generate(prompts, max_new_tokens=16, temperature=temperature, seed=seed)
    g = torch.Generator().manual_seed(seed)
    n, t = out.response_ids.shape
    zeros = torch.zeros((n, t))
    batch = TrainBatch(
        prompt_ids=out.prompt_ids, prompt_mask=out.prompt_mask, response_ids=out.response_ids,
        response_mask=out.response_mask, loss_mask=out.response_mask.clone(), old_logprobs=zeros,
        advantages=torch.randn((n, 1), generator=g).expand(n, t) * out.response_mask,
        ref_logprobs=zeros.clone(), ref_entropy=zeros.clone(), correct=(torch.rand(n, generator=g) > 0.5).float(),
    )
    return batch, out.rollout_logprobs


def config(temperature: float = 1.0, *extra: str):
    return load_config(None, [f"rollout.temperature={temperature}", "rollout.max_new_tokens=16",
                              "rollout.prompts_per_step=2", "rollout.n=4", "train.mini_batch_size=4",
                              "train.max_grad_norm=1e9", *extra])


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_engine_logprobs_equal_the_scoring_pass(make_tiny_qwen2, char_tokenizer, temperature):
    # why: reuse_engine is only sound if the two agree to float rounding (measured ~1e-6 here, and
    # ~2e-6 on a 29M-parameter model with a 32k vocabulary and 256-token responses)
    model = make_tiny_qwen2(seed=3)
    batch, engine_logprobs = rollout_batch(model, char_tokenizer, temperature=temperature)
    recomputed, _ = scoring_pass(model, batch, config(temperature), with_entropy=False)
    assert batch.response_mask.sum() > len(batch)  # responses of several tokens, not only an EOS
    gap = ((recomputed - engine_logprobs).abs() * batch.response_mask).max()
    assert gap < 1e-4, gap


def test_update_is_the_same_with_engine_or_recomputed_old_logprobs(make_tiny_qwen2, char_tokenizer):
    # why: two mini-batches of 4 -> the second optimizer step is off-policy, so the old logprobs enter
    # the clipped ratio; SGD with lr 1 makes the parameter change the (summed) gradient itself
    model = make_tiny_qwen2(seed=5)
    batch, engine_logprobs = rollout_batch(model, char_tokenizer, temperature=1.0, seed=1)
    cfg = config(1.0)
    recomputed, _ = scoring_pass(model, batch, cfg, with_entropy=False)
    results = []
    for old in (recomputed, engine_logprobs * batch.response_mask):
        m = copy.deepcopy(model).train()
        optimizer = torch.optim.SGD(m.parameters(), lr=1.0)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
        b = copy.copy(batch)
        b.old_logprobs = old
        metrics = update_policy(m, optimizer, scheduler, b, cfg, step=1, coefs={"entropy": 0.0, "kl": 0.0}, ptx=None).metrics
        results.append((metrics, [p.detach().clone() for p in m.parameters()]))
    (m_re, p_re), (m_en, p_en) = results
    assert m_re["actor/updates"] == 2
    torch.testing.assert_close(m_en["actor/pg_loss"], m_re["actor/pg_loss"], rtol=0, atol=1e-5)
    torch.testing.assert_close(m_en["actor/ppo_kl"], m_re["actor/ppo_kl"], rtol=0, atol=1e-5)
    moved = max(float((a - b.detach()).abs().max()) for a, b in zip(p_re, model.parameters()))
    assert moved > 1e-3  # the update did something, so agreeing below is not trivial
    for a, b in zip(p_en, p_re):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("overrides, reuse", [
    ([], True),  # the default: torch engine, float32, no correction, no entropy controller
    (["train.old_logprobs=recompute"], False),
    (["train.old_logprobs=reuse_engine"], True),
    (["model.dtype=bfloat16"], False),  # cached decoding and the full forward round differently in bf16
    (["algo.rollout_correction.mode=tis"], False),  # it weighs the engine/trainer gap: it needs both
    (["algo.entropy.mode=adaptive", "algo.entropy.coef=0.01"], False),  # the controller reads the pass's entropy
    (["algo.entropy.mode=fixed", "algo.entropy.coef=0.01"], True),  # a fixed coefficient reads nothing
])
def test_auto_reuses_the_engine_only_where_it_is_exact(tiny_model, overrides, reuse):
    assert engine_logprobs_are_old(config(1.0, *overrides), tiny_model) is reuse


def test_auto_recomputes_for_the_vllm_engine(tiny_model):
    cfg = config(1.0)
    cfg.rollout.engine = "vllm"  # set directly: loading a vllm config needs vLLM installed
    assert engine_logprobs_are_old(cfg, tiny_model) is False


@pytest.mark.parametrize("overrides, named", [
    (["model.dtype=bfloat16"], "model.dtype=bfloat16"),
    (["algo.rollout_correction.mode=mis"], "algo.rollout_correction.mode=mis"),
    (["algo.entropy.mode=skywork", "algo.entropy.coef=0.01"], "algo.entropy.mode=skywork"),
])
def test_reuse_engine_where_it_is_not_exact_is_refused(overrides, named):
    with pytest.raises(ConfigError) as err:
        config(1.0, "train.old_logprobs=reuse_engine", *overrides)
    assert "train.old_logprobs=reuse_engine" in str(err.value) and named in str(err.value)
    assert "recompute" in str(err.value)  # the fix
