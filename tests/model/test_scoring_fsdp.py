"""Scoring passes through an FSDP2-sharded model: the same logprobs as the plain model, only the last
hidden states kept, and the root resharded after a no-grad pass (FSDP2 leaves a root gathered after
its forward, waiting for a backward that a scoring pass never runs)."""

from __future__ import annotations

import torch

from mathrl.model.scoring import response_logprobs


def _model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2,
                         num_key_value_heads=1, max_position_embeddings=64, tie_word_embeddings=False)
    return Qwen2ForCausalLM(config).eval()


def test_sharded_scoring_matches_and_reshards_the_root(tmp_path):
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    prompt = torch.randint(2, 50, (3, 5), generator=torch.Generator().manual_seed(1))
    response = torch.randint(2, 50, (3, 7), generator=torch.Generator().manual_seed(2))
    pmask, rmask = torch.ones(3, 5), torch.ones(3, 7)
    plain = _model()
    with torch.no_grad():
        want, want_entropy = response_logprobs(plain, prompt, pmask, response, rmask)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        sharded = _model()
        for layer in sharded.model.layers:
            fully_shard(layer)
        fully_shard(sharded)
        captured = []
        hook = sharded.model.layers[-1].register_forward_hook(lambda m, a, o: captured.append(o))
        with torch.no_grad():
            got, got_entropy = response_logprobs(sharded, prompt, pmask, response, rmask)
        hook.remove()
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(got_entropy, want_entropy)
        # after the no-grad pass the root's own parameters are shards again, not a gathered copy
        assert isinstance(sharded.model.embed_tokens.weight, DTensor)
        assert isinstance(sharded.lm_head.weight, DTensor)
        # and with grad the pass still backpropagates through the hooked decoder output
        logprobs, _ = response_logprobs(sharded, prompt, pmask, response, rmask)
        logprobs.sum().backward()
        assert sharded.model.layers[0].mlp.up_proj.weight.grad is not None
    finally:
        dist.destroy_process_group()
