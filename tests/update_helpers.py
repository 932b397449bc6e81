"""A tiny Qwen2 model and a random TrainBatch, shared by the update tests (the policy's, the critic's,
float16's): the same batch everywhere, so their invariance checks run on the same data."""

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from mathrl.train.batching import TrainBatch


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
