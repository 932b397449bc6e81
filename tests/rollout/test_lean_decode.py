"""The lean decode loop (rollout/lean.py) against the Hugging Face forward it replaces.

The reference is the HF model called exactly as `TorchEngine`'s decode loop calls it: a left-padded
prefill with `logits_to_keep=1`, then one token per row with a growing attention mask and the model's
own KV cache, finished rows dropped from that cache (`batch_select_indices`), and a tool observation
window (several tokens per row, right-aligned, the unused columns masked). The lean decoder runs the
same calls side by side; every step's logits and logprobs must agree: within 1e-5 in float32, within
bfloat16's own resolution in bfloat16. Then the engine: the same seed gives the same samples, the
samples and logprobs are the HF path's, a weight changed in place is seen by the next call, tool
episodes and finished-row dropping work, and unsupported models fall back to HF with one log line.

    python -m pytest tests/rollout/test_lean_decode.py -q            # the compiled test is marked slow
"""

from __future__ import annotations

import inspect
import logging

import pytest
import torch
from torch.testing import assert_close

from mathrl.rollout.base import left_pad
from mathrl.rollout.engine import TorchEngine
from mathrl.rollout.lean import LeanDecoder, bucket, unsupported_reason

PAD = 0
RAGGED = [[5, 6, 7], [8, 9, 10, 11, 12, 13, 14], [5, 6, 7], [20], [21, 22], [8, 9, 10, 11, 12, 13, 14],
          [30, 31, 32, 33], [5, 6, 7], [40, 41, 42, 43, 44], [50, 51]]  # 10 rows, 1-7 tokens, repeats


def tiny_llama(*, seed: int = 0, tie: bool = True, attention_bias: bool = False, mlp_bias: bool = False,
               rope: dict | None = None, vocab: int = 99, init_std: float = 0.2):
    """A random Llama: 2 layers, 4 query heads over 2 K/V heads (GQA), head_dim 8. `init_std` 0.2 (not
    Llama's 0.02) makes the next-token distributions peaked, as make_tiny_qwen2's."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      tie_word_embeddings=tie, attention_bias=attention_bias, mlp_bias=mlp_bias,
                      initializer_range=init_std, pad_token_id=PAD, eos_token_id=1, bos_token_id=None,
                      **({"rope_parameters": rope} if rope else {}))
    return LlamaForCausalLM(cfg).eval()


def hf_cache_kwarg(model) -> str:
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


@torch.no_grad()
def side_by_side(model, decoder, prompts, *, steps: int = 8, drops=None, window_at: int | None = 4, seed: int = 0):
    """[(HF logits, lean logits)] per call, [A, V] each: the prefill, then `steps` feeds. `drops` maps a
    step to the active rows kept before it; at `window_at` each row feeds 1-3 tokens in a right-aligned
    window (an observation after a tool call), the others masked."""
    drops = drops or {}
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(seed)
    ids, mask = left_pad(prompts, PAD)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
    hf_cache = out.past_key_values
    cache, logits = decoder.prefill(ids, mask, positions, new_columns=steps + 2)
    pairs = [(out.logits[:, -1], logits)]
    attention, nxt = mask, positions[:, -1:] + 1
    for t in range(steps):
        if t in drops:
            keep = torch.tensor(drops[t])
            hf_cache.batch_select_indices(keep)
            cache.batch_select_indices(keep)
            attention, nxt = attention[keep], nxt[keep]
        rows = len(nxt)
        if t == window_at:
            lengths = torch.randint(1, 4, (rows,), generator=g)
            width = int(lengths.max())
            offset = torch.arange(width)[None] - (width - lengths[:, None])  # [A, W], >= 0 on used columns
            window = (offset >= 0).long()
            inputs = torch.randint(3, vocab, (rows, width), generator=g) * window
            pos = nxt + offset.clamp(min=0)  # unused columns take the row's next position, as the engine's
        else:
            lengths = torch.ones(rows, dtype=torch.long)
            inputs, window, pos = torch.randint(3, vocab, (rows, 1), generator=g), torch.ones((rows, 1), dtype=torch.long), nxt
        attention = torch.cat([attention, window], dim=1)
        out = model(input_ids=inputs, attention_mask=attention, position_ids=pos, use_cache=True,
                    **{hf_cache_kwarg(model): hf_cache})
        hf_cache = out.past_key_values
        pairs.append((out.logits[:, -1], decoder.feed(cache, inputs, window, pos)))
        nxt = nxt + lengths[:, None]
    return pairs


# 10 rows (bucket 16) -> 8 (bucket 8: the cache moves) -> 5 (stays in bucket 8: 3 padding rows) -> 2
DROPS = {2: [0, 2, 3, 5, 6, 7, 8, 9], 3: [0, 1, 3, 6, 7], 6: [1, 4]}


def assert_same(pairs, *, atol: float, rtol: float = 0.0):
    for step, (hf, lean) in enumerate(pairs):
        assert hf.shape == lean.shape, step
        assert_close(lean.float(), hf.float(), atol=atol, rtol=rtol, msg=lambda m: f"logits, call {step}: {m}")
        assert_close(torch.log_softmax(lean.float(), -1), torch.log_softmax(hf.float(), -1), atol=atol, rtol=rtol,
                     msg=lambda m: f"logprobs, call {step}: {m}")


# ------------------------------------------------------------------------------------------- the forward
MODELS = {
    # Qwen2.5-Math's architecture: q/k/v biases, tied head (the tiny default model's shape, smaller)
    "qwen2": lambda make_qwen2: make_qwen2(seed=0),
    "qwen2, untied head": lambda make_qwen2: make_qwen2(seed=1, tie_word_embeddings=False),
    # Llama: no biases, GQA with 2 query heads per K/V head
    "llama": lambda make_qwen2: tiny_llama(seed=0),
    # every projection biased (attention_bias also biases o_proj), untied head
    "llama, biases, untied": lambda make_qwen2: tiny_llama(seed=2, tie=False, attention_bias=True, mlp_bias=True),
    # the rotary types whose frequencies are fixed at build time: the model's inv_freq and scaling are read
    "llama, llama3 rope": lambda make_qwen2: tiny_llama(seed=3, rope={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
    "llama, linear rope": lambda make_qwen2: tiny_llama(seed=4, rope={"rope_type": "linear", "rope_theta": 1e6,
                                                                       "factor": 2.0}),
    # yarn scales cos and sin by its attention factor (1.14 here)
    "llama, yarn rope": lambda make_qwen2: tiny_llama(seed=5, rope={"rope_type": "yarn", "rope_theta": 10000.0,
                                                                     "factor": 4.0, "original_max_position_embeddings": 16}),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_lean_logits_equal_hf_in_float32(name, make_tiny_qwen2):
    model = MODELS[name](make_tiny_qwen2)
    decoder = LeanDecoder.for_model(model)
    assert decoder is not None
    pairs = side_by_side(model, decoder, RAGGED, drops=DROPS)
    assert [len(lean) for _, lean in pairs] == [10, 10, 10, 8, 5, 5, 5, 2, 2]
    assert_same(pairs, atol=1e-5)


@pytest.mark.parametrize("build", [
    lambda make_qwen2: make_qwen2(seed=0, init_std=0.02),
    lambda make_qwen2: tiny_llama(seed=0, init_std=0.02),
], ids=["qwen2", "llama"])
def test_lean_logits_equal_hf_in_bfloat16(build, make_tiny_qwen2):
    # bfloat16 keeps 8 significant bits and the two forwards round different products (HF's SDPA, the
    # lean matmuls), so their logits differ by about bfloat16's own error, which grows with the logits:
    # measured 0.002-0.004 at this init's logits (|z| < 0.8), where HF's bfloat16 is 0.001-0.003 off
    # its own float32; at init_std 0.2 (|z| ~ 3.5) both gaps are 0.03-0.09.
    model = build(make_tiny_qwen2).to(torch.bfloat16)
    pairs = side_by_side(model, LeanDecoder.for_model(model), RAGGED, drops=DROPS)
    assert pairs[-1][1].dtype == torch.bfloat16
    assert_same(pairs, atol=1e-2)


def test_prompts_shared_by_rows_are_prefilled_once(make_tiny_qwen2, monkeypatch):
    # the n samples of a problem repeat its prompt: one prefill row per distinct prompt, copied after
    import mathrl.rollout.lean as lean

    model = make_tiny_qwen2(seed=0)
    seen = []
    forward = lean.decoder_forward

    def spy(weights, k_cache, v_cache, tokens, *args, **kwargs):
        seen.append(tokens.shape)
        return forward(weights, k_cache, v_cache, tokens, *args, **kwargs)

    monkeypatch.setattr(lean, "decoder_forward", spy)
    pairs = side_by_side(model, LeanDecoder(model), RAGGED * 2, steps=1, window_at=None)
    assert seen[0] == (7, 7)  # 20 rows, 7 distinct prompts of at most 7 tokens
    assert seen[1] == (32, 1)  # decoding runs on the whole bucket
    assert_same(pairs, atol=1e-5)


@pytest.mark.parametrize("rows, expected", [
    (1, 1), (2, 2), (3, 4), (5, 8), (8, 8),  # powers of two up to 8
    (9, 16), (16, 16), (17, 32), (100, 112), (128, 128),  # then multiples of 16: at most 15 padding rows
])
def test_bucket(rows, expected):
    assert bucket(rows) == expected


@pytest.mark.slow
def test_compiled_step_equals_hf(make_tiny_qwen2, char_tokenizer, caplog):
    # inductor compiles the one-token step once per (batch bucket, attention span); after warm_up a
    # generation compiles nothing more (a guard that failed on every call, e.g. on two inputs being one
    # tensor, would recompile inside the timed calls)
    from torch._dynamo.utils import counters

    model = make_tiny_qwen2(seed=0)
    kwargs = dict(eos_token_id=char_tokenizer.eos_token_id, pad_token_id=char_tokenizer.pad_token_id)
    engine = TorchEngine(model, decode="lean", compile=True, **kwargs)
    prompts = [char_tokenizer(t)["input_ids"] for t in ["1+2=", "123+456=", "9=", "77+8=", "5+5="] for _ in range(4)]
    with caplog.at_level(logging.WARNING, logger="mathrl.rollout.lean"):
        engine.lean.warm_up(len(prompts), max(len(p) for p in prompts) + 24)
        graphs = counters["stats"]["unique_graphs"]
        out = engine.generate(prompts, max_new_tokens=24, seed=3)
        assert counters["stats"]["unique_graphs"] == graphs
        pairs = side_by_side(model, engine.lean, RAGGED, drops=DROPS)
    assert engine.lean._compiled is not None, caplog.text  # compiled, not fallen back to eager
    assert_same(pairs, atol=1e-5)
    reference = TorchEngine(model, **kwargs).generate(prompts, max_new_tokens=24, seed=3)
    assert torch.equal(out.response_ids, reference.response_ids)
    assert_close(out.rollout_logprobs, reference.rollout_logprobs, atol=1e-5, rtol=0)


def test_warm_up_compiles_every_shape_a_generation_reaches(make_tiny_qwen2, char_tokenizer):
    # a compile costs tens of seconds on a CPU: warm_up pays them all before the first timed call
    model = make_tiny_qwen2(seed=0)
    kwargs = dict(eos_token_id=char_tokenizer.eos_token_id, pad_token_id=char_tokenizer.pad_token_id)
    engine = TorchEngine(model, decode="lean", compile=True, **kwargs)
    shapes, forward = [], engine.lean._forward

    def recorder(weights, k, v, tokens, *args, span):  # records the compiled step's shapes, runs it eagerly
        shapes.append((tokens.shape[0], k.shape[3], span))
        return forward(weights, k, v, tokens, *args, span=span)

    engine.lean._compiled = recorder
    prompts = [char_tokenizer(t)["input_ids"] for t in ["1+2=", "123+456=", "9=", "77+8=", "5+5="] for _ in range(4)]
    engine.lean.warm_up(len(prompts), max(len(p) for p in prompts) + 70)  # 78 columns: spans 64 and 128
    warmed = set(shapes)
    assert {rows for rows, _, _ in warmed} == {1, 2, 4, 8, 16, 32} and {s for _, _, s in warmed} == {64, 128}
    shapes.clear()
    engine.generate(prompts, max_new_tokens=70, seed=0)
    assert set(shapes) <= warmed and len({rows for rows, _, _ in shapes}) >= 3


def test_a_failing_compile_falls_back_to_eager_with_one_log_line(make_tiny_qwen2, caplog):
    model = make_tiny_qwen2(seed=0)
    decoder = LeanDecoder(model, compile=True)

    def broken(*args, **kwargs):
        raise RuntimeError("no C++ compiler\nmore detail")

    decoder._compiled = broken
    with caplog.at_level(logging.WARNING, logger="mathrl.rollout.lean"):
        pairs = side_by_side(model, decoder, RAGGED, drops=DROPS)
    assert decoder._compiled is None
    assert len(caplog.records) == 1 and "no C++ compiler" in caplog.text and "eagerly" in caplog.text
    assert_same(pairs, atol=1e-5)


# ------------------------------------------------------------------------------------------- what falls back
def sliding_qwen2(make_qwen2):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return Qwen2ForCausalLM(Qwen2Config(vocab_size=99, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=1, use_sliding_window=True,
                                        sliding_window=4, max_window_layers=1))


def gpt2(make_qwen2):
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(vocab_size=99, n_embd=32, n_layer=1, n_head=2))


def lora_qwen2(make_qwen2):
    from mathrl.config import LoraConfig
    from mathrl.model.lora import add_adapters

    return add_adapters(make_qwen2(seed=0), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))


def gelu_llama(make_qwen2):
    model = tiny_llama()
    model.config.hidden_act = "gelu"
    return model


@pytest.mark.parametrize("build, words", [
    # another architecture: its forward is not the one written here
    (gpt2, "GPT2LMHeadModel"),
    # a sliding window limits what a layer attends to: the lean mask does not
    (sliding_qwen2, "sliding-window"),
    # dynamic rotary scaling changes the frequencies with the length: the lean forward reads them once
    (lambda make: tiny_llama(rope={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}), "'dynamic'"),
    # the MLP is written for SiLU only
    (gelu_llama, "gelu"),
    # LoRA layers add B A x to a projection: the lean forward reads plain weights only
    (lora_qwen2, "LoRA"),
])
def test_unsupported_models_name_the_reason(build, words, make_tiny_qwen2):
    assert words in unsupported_reason(build(make_tiny_qwen2))


def test_an_unsupported_model_keeps_the_hf_forward_with_one_log_line(char_tokenizer, caplog):
    model = sliding_qwen2(None).eval()
    prompts = [char_tokenizer(t)["input_ids"] for t in ["1+2=", "345+6="]]
    kwargs = dict(eos_token_id=char_tokenizer.eos_token_id, pad_token_id=char_tokenizer.pad_token_id)
    with caplog.at_level(logging.WARNING, logger="mathrl.rollout.lean"):
        engine = TorchEngine(model, decode="lean", **kwargs)
    assert engine.lean is None and len(caplog.records) == 1 and "sliding-window" in caplog.text
    a = engine.generate(prompts, max_new_tokens=8, seed=0)
    b = TorchEngine(model, **kwargs).generate(prompts, max_new_tokens=8, seed=0)
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.rollout_logprobs, b.rollout_logprobs)


def test_supported_models_have_no_reason(make_tiny_qwen2):
    assert unsupported_reason(make_tiny_qwen2(seed=0)) is None
    assert unsupported_reason(tiny_llama()) is None


# ------------------------------------------------------------------------------------------- the engine
def engines(model, tok, **kwargs):
    common = dict(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, **kwargs)
    return TorchEngine(model, **common), TorchEngine(model, decode="lean", **common)


@pytest.fixture
def prompts(char_tokenizer):
    return [char_tokenizer(t)["input_ids"] for t in ["1+2=", "123+456=", "9=", "77+8=", "5+5="] for _ in range(4)]


def test_the_same_seed_gives_the_same_samples(make_tiny_qwen2, char_tokenizer, prompts):
    model = make_tiny_qwen2(seed=0)
    _, lean = engines(model, char_tokenizer)
    a = lean.generate(prompts, max_new_tokens=24, seed=7)
    b = lean.generate(prompts, max_new_tokens=24, seed=7)
    c = lean.generate(prompts, max_new_tokens=24, seed=8)
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.rollout_logprobs, b.rollout_logprobs)
    assert not torch.equal(a.response_ids, c.response_ids)


@pytest.mark.parametrize("temperature, top_p, batch_size", [(1.0, 1.0, 512), (0.7, 0.9, 8), (0.0, 1.0, 6)])
def test_lean_engine_samples_what_the_hf_engine_samples(make_tiny_qwen2, char_tokenizer, prompts, temperature,
                                                        top_p, batch_size):
    # Same generator, same uniforms; the two forwards' logits differ by ~1e-6, so a token differs only
    # where a uniform falls within ~1e-6 of a boundary of the cumulative distribution: odds ~1e-6 per
    # draw, under 1e-3 over this test's ~500 draws. Rows finish at different lengths (finished rows are
    # dropped), chunks of 8 and 6 rows take other buckets.
    model = make_tiny_qwen2(seed=0)
    hf, lean = engines(model, char_tokenizer, batch_size=batch_size)
    a = hf.generate(prompts, max_new_tokens=24, temperature=temperature, top_p=top_p, seed=3)
    b = lean.generate(prompts, max_new_tokens=24, temperature=temperature, top_p=top_p, seed=3)
    assert len(set(a.response_mask.sum(-1).tolist())) >= 2  # rows of several lengths
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.response_mask, b.response_mask)
    assert torch.equal(a.truncated, b.truncated)
    assert_close(b.rollout_logprobs, a.rollout_logprobs, atol=1e-5, rtol=0)


def test_lean_engine_logprobs_equal_the_scoring_pass(make_tiny_qwen2, char_tokenizer, prompts):
    # train.old_logprobs: reuse_engine stands the sampling logprobs in for the trainer's scoring pass
    from mathrl.model.scoring import response_logprobs

    model = make_tiny_qwen2(seed=3)
    _, lean = engines(model, char_tokenizer)
    out = lean.generate(prompts, max_new_tokens=24, seed=0)
    with torch.no_grad():
        lp, _ = response_logprobs(model, out.prompt_ids, out.prompt_mask, out.response_ids, out.response_mask)
    assert_close(lp * out.response_mask, out.rollout_logprobs, atol=1e-5, rtol=0)


def test_a_weight_changed_in_place_is_seen_by_the_next_call(make_tiny_qwen2, char_tokenizer, prompts):
    # the lean forward reads the model's tensors at every call: an optimizer step is seen at once
    model = make_tiny_qwen2(seed=0)
    hf, lean = engines(model, char_tokenizer)
    before = lean.generate(prompts, max_new_tokens=16, seed=1)
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.mul_(-1.5)
        model.model.norm.weight.add_(0.5)
    after = lean.generate(prompts, max_new_tokens=16, seed=1)
    reference = hf.generate(prompts, max_new_tokens=16, seed=1)
    assert not torch.equal(before.rollout_logprobs, after.rollout_logprobs)
    assert torch.equal(after.response_ids, reference.response_ids)
    assert_close(after.rollout_logprobs, reference.rollout_logprobs, atol=1e-5, rtol=0)


def test_tool_episodes_are_the_hf_engines(make_tiny_qwen2, char_tokenizer):
    # Observations are fed as forced tokens in a right-aligned window (rows feeding fewer tokens masked
    # on the left); the lean cache takes the window's columns and grows when windows outrun its room.
    # The episodes, observations and logprobs must be the HF path's, and the logprobs a scoring pass's.
    from mathrl.model.scoring import response_logprobs
    from mathrl.rollout.episodes import CallFormat, ToolUse
    from tool_plugins import EchoPool

    model = make_tiny_qwen2(seed=1, tie_word_embeddings=False)
    star = char_tokenizer("*", add_special_tokens=False)["input_ids"][0]
    with torch.no_grad():
        model.lm_head.weight[star] += 0.6  # "*" closes a call: make the model write it often
    fmt = CallFormat("star", "", "*", "<", ">")
    prompts = [char_tokenizer(t)["input_ids"] for t in ["1+2=", "123+456=", "9=", "77+8="] * 4]

    def tools():
        return ToolUse(fmt=fmt, pool=EchoPool(), tokenizer=char_tokenizer, max_turns=4, max_tool_calls=3,
                       observation_max_tokens=12)

    kwargs = dict(eos_token_id=char_tokenizer.eos_token_id, pad_token_id=char_tokenizer.pad_token_id)
    a = TorchEngine(model, tools=tools(), **kwargs).generate(prompts, max_new_tokens=40, seed=3)
    b = TorchEngine(model, tools=tools(), decode="lean", **kwargs).generate(prompts, max_new_tokens=40, seed=3)
    assert a.tool_calls.sum() >= 5 and (a.observation_mask.sum(-1) > 0).sum() >= 3
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.observation_mask, b.observation_mask)
    assert torch.equal(a.tool_calls, b.tool_calls)
    assert_close(b.rollout_logprobs, a.rollout_logprobs, atol=1e-5, rtol=0)
    with torch.no_grad():
        lp, _ = response_logprobs(model, b.prompt_ids, b.prompt_mask, b.response_ids, b.context_mask)
    assert_close(lp * b.response_mask, b.rollout_logprobs, atol=1e-5, rtol=0)


def test_the_default_engine_is_lean_and_hf_is_one_switch_away(make_tiny_qwen2, char_tokenizer):
    from mathrl.config import load_config
    from mathrl.rollout.factory import build_engine

    model = make_tiny_qwen2(seed=0)
    default = build_engine(load_config(None, []), model=model, tokenizer=char_tokenizer, model_path="unused")
    hf = build_engine(load_config(None, ["rollout.decode=hf"]), model=model, tokenizer=char_tokenizer,
                      model_path="unused")
    assert isinstance(default.lean, LeanDecoder) and hf.lean is None  # lean is the default; hf one switch away
