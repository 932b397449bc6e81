"""Temperature 0 is greedy decoding (evaluation only; the config refuses it for training rollouts).

Run: python -m pytest tests/rollout/test_greedy.py -q
"""

from __future__ import annotations

import torch

from mathrl.rollout.engine import TorchEngine


def test_temperature_zero_is_greedy_with_untempered_logprobs(tiny_model, char_tokenizer):
    # Bug story: eval.temperature=0 divided the logits by 0 and crashed after the model had loaded
    # ("probability tensor contains inf/nan"). Greedy must pick the argmax at every step, ignore the
    # seed, and report the model's own (temperature-1) logprobs: a point mass would make them all 0,
    # which the garbled-text detector and the eval logs could not use.
    tok = char_tokenizer
    engine = TorchEngine(tiny_model, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    prompt = tok("12+34=")["input_ids"]
    a = engine.generate([prompt, prompt], max_new_tokens=8, temperature=0.0, seed=0)
    b = engine.generate([prompt], max_new_tokens=8, temperature=0.0, seed=99)
    assert torch.equal(a.response_ids[0], a.response_ids[1])
    assert torch.equal(a.response_ids[:1, : b.response_ids.shape[1]], b.response_ids)

    # the same quantities from one full forward pass over prompt + response
    length = int(a.response_mask[0].sum())
    ids = torch.tensor([prompt + a.response_ids[0, :length].tolist()])
    with torch.no_grad():
        logp = torch.log_softmax(tiny_model(ids).logits[0, len(prompt) - 1 : -1].float(), dim=-1)  # [T, V]
    assert torch.equal(logp.argmax(-1), a.response_ids[0, :length])
    torch.testing.assert_close(logp.max(-1).values, a.rollout_logprobs[0, :length], atol=1e-5, rtol=1e-5)
