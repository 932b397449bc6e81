"""Tests for mathrl.rollout.engine: TorchEngine against references, and its helpers.

The sampler itself (`sample_top_p`) is tested in tests/rollout/test_sampling.py. A tiny random Qwen2
(conftest.py) is the real model; a mock LM whose next token is a known function
of the position tests stopping and the logprob bookkeeping exactly (STYLE.md point 6: engines are
testable with a mock model).

Run: python -m pytest tests/rollout/test_engine.py -q
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from torch.testing import assert_close

from mathrl.model.scoring import response_logprobs
from mathrl.rollout.engine import RolloutBatch, TorchEngine, left_pad

PAD, EOS = 0, 1


@pytest.fixture(scope="module")
def prompts(char_tokenizer):
    """Prompts of different lengths, so every batch is left-padded."""
    texts = ["1+2=", "123+456=", "9=", "77+8=", "5+5=", "300+21="]
    return [char_tokenizer(t)["input_ids"] for t in texts]


def make_engine(model, batch_size: int = 512) -> TorchEngine:
    return TorchEngine(model, eos_token_id=EOS, pad_token_id=PAD, batch_size=batch_size)


def assert_well_formed(out: RolloutBatch, *, max_new_tokens: int) -> None:
    """The RolloutBatch contract: masks are a prefix of ones, padding after the end, EOS only at the end."""
    n, t = out.response_ids.shape
    assert out.response_mask.shape == out.rollout_logprobs.shape == (n, t) and t <= max_new_tokens
    for i in range(n):
        length = int(out.response_mask[i].sum())
        assert length >= 1
        assert torch.equal(out.response_mask[i, :length], torch.ones(length))  # a prefix of ones ...
        assert torch.equal(out.response_mask[i, length:], torch.zeros(t - length))  # ... then zeros
        assert (out.response_ids[i, length:] == PAD).all()  # nothing sampled after the end
        assert (out.rollout_logprobs[i, length:] == 0).all()
        assert (out.rollout_logprobs[i, :length] <= 0).all()
        assert (out.response_ids[i, : length - 1] != EOS).all()  # an EOS always ends the response
        ended = bool(out.response_ids[i, length - 1] == EOS)
        assert bool(out.truncated[i]) == (not ended)
        if not ended:
            assert length == max_new_tokens  # only hitting the limit ends a response without EOS


# --------------------------------------------------------------------------------------------------
# a mock LM: EOS is certain once the NEXT position reaches `eos_position`, else uniform over the
# ordinary tokens (ids 3..V-1). Response token t of a prompt of length L sits at position L + t.
# --------------------------------------------------------------------------------------------------
class NullCache:
    """The mock needs no KV cache; engines that prune finished rows from the cache may call this."""

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        pass


class CountdownLM(torch.nn.Module):
    def __init__(self, vocab: int, eos_position: int):
        super().__init__()
        self.vocab = vocab
        self.eos_position = eos_position
        self.dummy = torch.nn.Parameter(torch.zeros(1))  # the engine reads the device from the parameters

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=False,
                logits_to_keep=0):
        b, s = input_ids.shape
        logits = torch.zeros(b, s, self.vocab)
        logits[..., :3] = -1e9  # never pad, EOS or unk ...
        stop = (position_ids + 1) >= self.eos_position  # [B, S]: ... unless the next position must be EOS
        logits[stop] = -1e9
        logits[..., EOS] = torch.where(stop, torch.tensor(0.0), torch.tensor(-1e9))
        if logits_to_keep:
            logits = logits[:, -logits_to_keep:]
        return SimpleNamespace(logits=logits, past_key_values=NullCache())


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_stops_at_eos_with_exact_lengths_and_logprobs(temperature):
    # With the mock, a prompt of length L gets exactly eos_position - L + 1 response tokens (the last
    # is EOS), unless that exceeds max_new_tokens (truncated). The logprobs are hand-computable:
    # uniform over V - 3 tokens at any temperature, and log 1 = 0 for the certain EOS.
    vocab, eos_position, max_new = 20, 8, 6
    engine = TorchEngine(CountdownLM(vocab, eos_position), eos_token_id=EOS, pad_token_id=PAD)
    lengths = [7, 5, 3, 2, 8]  # -> 2, 4, 6 (EOS at the limit), 7 > 6 (truncated), 1 (EOS at once)
    out = engine.generate([[5] * n for n in lengths], max_new_tokens=max_new, temperature=temperature, seed=0)
    assert_well_formed(out, max_new_tokens=max_new)
    assert out.response_lengths.tolist() == [2, 4, 6, 6, 1]
    assert out.truncated.tolist() == [False, False, False, True, False]
    for i, length in enumerate(out.response_lengths.tolist()):
        expected = torch.full((length,), -math.log(vocab - 3))
        if not out.truncated[i]:
            expected[-1] = 0.0
            assert out.response_ids[i, length - 1] == EOS
        assert_close(out.rollout_logprobs[i, :length], expected)
    assert out.response_ids.shape[1] == 6  # trimmed to the longest response


def test_all_rows_stop_immediately():
    # Every row ends with EOS at t=0: responses are one token wide and nothing is truncated.
    engine = TorchEngine(CountdownLM(10, eos_position=0), eos_token_id=EOS, pad_token_id=PAD)
    out = engine.generate([[4, 5], [6]], max_new_tokens=5, seed=0)
    assert out.response_ids.tolist() == [[EOS], [EOS]]
    assert out.response_mask.tolist() == [[1.0], [1.0]]
    assert not out.truncated.any()


def biased_head(model, *, weight_std: float, bias: torch.Tensor) -> None:
    """Replace the (tied, bias-free) lm_head of a Qwen2 by an untied Linear with a bias."""
    hidden, vocab = model.config.hidden_size, model.config.vocab_size
    head = torch.nn.Linear(hidden, vocab, bias=True)
    with torch.no_grad():
        head.weight.normal_(0.0, weight_std) if weight_std > 0 else head.weight.zero_()
        head.bias.copy_(bias)
    model.lm_head = head


def test_eos_forced_on_a_real_model(make_tiny_qwen2):
    # A real Qwen2 whose head is zero weights plus a bias of 50 on EOS: EOS has probability
    # 1 - 98 e^-50, so every response is exactly [EOS], nothing is truncated, and its logprob is 0.
    model = make_tiny_qwen2(seed=3)
    biased_head(model, weight_std=0.0, bias=torch.nn.functional.one_hot(torch.tensor(EOS), model.config.vocab_size) * 50.0)
    out = make_engine(model).generate([[5, 6, 7], [8]], max_new_tokens=4, seed=0)
    assert out.response_ids.tolist() == [[EOS], [EOS]]
    assert not out.truncated.any()
    assert_close(out.rollout_logprobs, torch.zeros(2, 1))


def test_logprobs_with_a_biased_head(make_tiny_qwen2, prompts):
    # Some architectures have an lm_head bias; the scoring pass passes it to the chunked logprob
    # kernel separately, so check it is applied exactly like the sampler's full forward applies it.
    model = make_tiny_qwen2(seed=4)
    vocab = model.config.vocab_size
    biased_head(model, weight_std=0.3, bias=torch.randn(vocab, generator=torch.Generator().manual_seed(0)))
    out = make_engine(model).generate(prompts, max_new_tokens=8, temperature=0.7, seed=0)
    with torch.no_grad():
        lp, _ = response_logprobs(model, out.prompt_ids, out.prompt_mask, out.response_ids, out.response_mask,
                                  temperature=0.7)
    mask = out.response_mask.bool()
    assert_close(lp[mask], out.rollout_logprobs[mask], rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------------------------------
# the real model
# --------------------------------------------------------------------------------------------------
def test_same_seed_same_samples_different_seed_different(tiny_model, prompts):
    # Reproducibility is an engine contract (explicit seed, no global RNG): the same seed must give
    # identical tokens and logprobs even after other sampling consumed the global RNG.
    engine = make_engine(tiny_model)
    a = engine.generate(prompts, max_new_tokens=12, seed=7)
    torch.rand(100)  # disturb the global generator: the engine must not use it
    b = engine.generate(prompts, max_new_tokens=12, seed=7)
    c = engine.generate(prompts, max_new_tokens=12, seed=8)
    for name in ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "rollout_logprobs", "truncated"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    # 6 rows x 12 tokens from peaked-but-not-degenerate distributions: two seeds agreeing on every
    # token has negligible probability (and the outcome is deterministic given the seeds).
    assert not torch.equal(a.response_ids, c.response_ids)


def test_generate_restores_training_mode(make_tiny_qwen2):
    # The engine switches to eval() for sampling; the trainer's model must come back in train mode.
    model = make_tiny_qwen2(seed=1).train()
    make_engine(model).generate([[5, 6]], max_new_tokens=2, seed=0)
    assert model.training


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_equal_a_fresh_forward_pass(tiny_model, prompts, temperature):
    # The sampler's logprobs (incremental KV-cache decoding, left-padded batch) must equal the
    # trainer's scoring pass (one full forward) at every sampled position; otherwise the PPO ratio
    # is off from the first update. Temperature must be applied identically on both sides.
    out = make_engine(tiny_model).generate(prompts, max_new_tokens=16, temperature=temperature, seed=0)
    assert_well_formed(out, max_new_tokens=16)
    assert out.prompt_mask.sum(-1).tolist() == [len(p) for p in prompts]  # prompts really differ in length
    with torch.no_grad():
        lp, _ = response_logprobs(tiny_model, out.prompt_ids, out.prompt_mask, out.response_ids, out.response_mask,
                                  temperature=temperature)
    mask = out.response_mask.bool()
    assert_close(lp[mask], out.rollout_logprobs[mask], rtol=1e-5, atol=1e-5)


def test_logprobs_equal_unpadded_per_row_scoring(tiny_model, prompts):
    # Stronger reference: each row scored ALONE, with no padding at all. Equality shows that left
    # padding plus position ids that skip it leave every real token's logprob unchanged.
    out = make_engine(tiny_model).generate(prompts, max_new_tokens=10, seed=1)
    for i, prompt in enumerate(prompts):
        length = int(out.response_mask[i].sum())
        resp = out.response_ids[i : i + 1, :length]
        with torch.no_grad():
            lp, _ = response_logprobs(tiny_model, torch.tensor([prompt]), torch.ones(1, len(prompt), dtype=torch.long),
                                      resp, torch.ones(1, length))
        assert_close(lp[0], out.rollout_logprobs[i, :length], rtol=1e-5, atol=1e-5)


def greedy_reference(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Argmax decoding with a full forward pass per token: no cache, no padding, no batching."""
    ids = list(prompt)
    out = []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            token = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
            out.append(token)
            ids.append(token)
            if token == EOS:
                break
    return out


@pytest.mark.parametrize("batch_size", [512, 4])
def test_tiny_top_p_is_greedy(tiny_model, prompts, batch_size):
    # top_p -> 0 keeps only the most likely token (the nucleus always holds the top token), so the
    # engine must reproduce plain argmax decoding, whatever the seed and the batching.
    engine = make_engine(tiny_model, batch_size=batch_size)
    out = engine.generate(prompts, max_new_tokens=10, top_p=1e-6, seed=123)
    other_seed = engine.generate(prompts, max_new_tokens=10, top_p=1e-6, seed=456)
    assert torch.equal(out.response_ids, other_seed.response_ids)
    for i, prompt in enumerate(prompts):
        length = int(out.response_mask[i].sum())
        assert out.response_ids[i, :length].tolist() == greedy_reference(tiny_model, prompt, 10)


def test_truncated_flag_when_max_new_tokens_is_hit(tiny_model, prompts):
    # max_new_tokens=1: every response is one token; it is truncated iff that token is not EOS.
    out = make_engine(tiny_model).generate(prompts, max_new_tokens=1, seed=0)
    assert out.response_ids.shape == (len(prompts), 1)
    assert out.truncated.tolist() == (out.response_ids[:, 0] != EOS).tolist()
    assert out.truncated.any()  # the random model does not say EOS first for all 6 prompts


def test_chunking_keeps_shapes_and_valid_masks(tiny_model, prompts):
    # Decoding in chunks of 4 (2 chunks of unequal prompt widths) must give one batch with the same
    # row count, left-padded prompts and well-formed right-padded responses.
    many = prompts * 2  # 12 prompts
    whole = make_engine(tiny_model, batch_size=512).generate(many, max_new_tokens=8, seed=5)
    chunked = make_engine(tiny_model, batch_size=5).generate(many, max_new_tokens=8, seed=5)
    assert chunked.response_ids.shape[0] == whole.response_ids.shape[0] == 12
    assert chunked.prompt_ids.shape == whole.prompt_ids.shape  # widest prompt sets the width
    assert torch.equal(chunked.prompt_ids, whole.prompt_ids) and torch.equal(chunked.prompt_mask, whole.prompt_mask)
    assert_well_formed(chunked, max_new_tokens=8)
    # the concatenated chunks are still a valid scoring input: logprobs match a fresh forward pass
    with torch.no_grad():
        lp, _ = response_logprobs(tiny_model, chunked.prompt_ids, chunked.prompt_mask, chunked.response_ids,
                                  chunked.response_mask)
    mask = chunked.response_mask.bool()
    assert_close(lp[mask], chunked.rollout_logprobs[mask], rtol=1e-5, atol=1e-5)


def test_a_chunk_does_not_depend_on_later_chunks(tiny_model, prompts):
    # Documented: each chunk draws from its own generator seeded by (seed, chunk index), so the first
    # chunk's samples are the same whether or not more prompts follow.
    engine = make_engine(tiny_model, batch_size=3)
    alone = engine.generate(prompts[:3], max_new_tokens=8, seed=9)
    with_more = engine.generate(prompts, max_new_tokens=8, seed=9)
    width = alone.response_ids.shape[1]
    assert torch.equal(with_more.response_ids[:3, :width], alone.response_ids)
    assert torch.equal(with_more.rollout_logprobs[:3, :width], alone.rollout_logprobs)
    assert (with_more.response_mask[:3, width:] == 0).all()


# --------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------
def test_left_pad():
    # Hand-computed: tokens go to the right, pad and mask 0 to the left; an empty sequence is all pad.
    ids, mask = left_pad([[1, 2, 3], [4], []], pad_id=9)
    assert ids.tolist() == [[1, 2, 3], [9, 9, 4], [9, 9, 9]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1], [0, 0, 0]]
    assert ids.dtype == mask.dtype == torch.long


def test_left_pad_single_row_needs_no_padding():
    ids, mask = left_pad([[7, 8]], pad_id=0)
    assert ids.tolist() == [[7, 8]] and mask.tolist() == [[1, 1]]


# --------------------------------------------------------------------------------------------------
# update_weights: a no-op on the shared training model, a copy into an engine's own model
# --------------------------------------------------------------------------------------------------
def test_update_weights_is_free_when_the_engine_shares_the_model(make_tiny_qwen2):
    # The usual CPU setup: the engine samples from the trainer's model itself. Syncing must not copy
    # (the tensors are the model's own) and must leave every parameter as it was.
    model = make_tiny_qwen2(seed=2)
    engine = make_engine(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    pointers = {k: v.data_ptr() for k, v in model.state_dict().items()}
    engine.update_weights(model.state_dict().items())
    engine.update_weights(model.named_parameters())
    assert {k: v.data_ptr() for k, v in model.state_dict().items()} == pointers
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_update_weights_copies_into_an_own_copy(make_tiny_qwen2, prompts):
    # An engine holding its own model (the unsharded copy beside an FSDP trainer): after a sync it
    # samples exactly what an engine on the trainer's model samples, tied head included.
    trainer, copy = make_tiny_qwen2(seed=2), make_tiny_qwen2(seed=3)
    own = make_engine(copy)
    a = own.generate(prompts, max_new_tokens=8, seed=1)
    b = make_engine(trainer).generate(prompts, max_new_tokens=8, seed=1)
    assert not torch.equal(a.rollout_logprobs, b.rollout_logprobs)  # different weights before the sync
    own.update_weights(trainer.named_parameters())  # a tied model lists the embedding only
    a = own.generate(prompts, max_new_tokens=8, seed=1)
    assert torch.equal(a.response_ids, b.response_ids)
    assert_close(a.rollout_logprobs, b.rollout_logprobs)
    assert copy.lm_head.weight is copy.model.embed_tokens.weight  # still tied after the copy


def test_update_weights_rejects_unknown_names(make_tiny_qwen2):
    engine = make_engine(make_tiny_qwen2(seed=2))
    with pytest.raises(KeyError, match="no tensor named 'model.layers.9.mlp.up_proj.weight'"):
        engine.update_weights([("model.layers.9.mlp.up_proj.weight", torch.zeros(1))])


def test_torch_engine_is_an_engine(tiny_model):
    from mathrl.rollout.base import Engine

    assert isinstance(make_engine(tiny_model), Engine)
