"""`stream_plain_weights`: the merged LoRA weights an engine without adapters loads, one tensor at a time.

The same quantity computed two ways must agree, bit for bit:
  - the stream vs `plain_weights` (the whole merged state dict), one process, a tiny peft model;
  - the stream of an FSDP2-sharded model (gathered one tensor at a time) vs `plain_weights` of the same
    model unsharded: a 1-rank process group here, and 2 ranks under torchrun (gloo, CPU) on every rank.
And the stream is lazy: each pulled item gathers only its own tensors (W, A and B for an adapted layer),
in state dict order, and the stream holds none of the items it has yielded.

    python -m pytest tests/model/test_lora_stream.py -q      (about 30 seconds on 2 CPU cores)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import weakref
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mathrl.model.lora import LoraError, add_adapters, merge_lora, merged_weights, plain_weights, stream_plain_weights

pytest.importorskip("peft", reason="LoRA needs peft (a dependency: pip install -e .)")

HANG_GUARD_S = 300  # a hang fails the test instead of blocking CI; never a performance threshold
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj")


def settings(r: int = 4, alpha: float = 8.0):
    return SimpleNamespace(r=r, alpha=alpha, dropout=0.0, target_modules=list(TARGETS))


def randomize_adapters(model, seed: int):
    """Random B (fresh adapters have B = 0, which would make the merge the identity)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
    return model


def tiny_qwen2(*, seed: int, vocab: int = 51, tied: bool = True):
    """A random Qwen2 whose dims do not all divide by 2 (vocab 51, r 3 below): FSDP2 pads uneven shards."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, max_position_embeddings=64, tie_word_embeddings=tied, initializer_range=0.2)
    return Qwen2ForCausalLM(config).eval()


def adapted_tiny(*, seed: int, r: int = 3, tied: bool = True):
    return randomize_adapters(add_adapters(tiny_qwen2(seed=seed, tied=tied), settings(r=r, alpha=2.0 * r), seed=seed), seed + 100)


def assert_bit_identical(streamed: list[tuple[str, torch.Tensor]], reference: dict[str, torch.Tensor]) -> None:
    names = [n for n, _ in streamed]
    assert len(names) == len(set(names)), "a name streamed twice"
    assert names == list(reference), "another set or order of names than plain_weights"
    for name, tensor in streamed:
        want = reference[name]
        assert tensor.dtype == want.dtype and tensor.shape == want.shape, name
        assert torch.equal(tensor, want), f"{name}: max |diff| {float((tensor - want).abs().max())}"


# ---- one process ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("tied", [True, False])
def test_the_stream_equals_plain_weights_bit_for_bit(make_tiny_qwen2, tied):
    model = randomize_adapters(add_adapters(make_tiny_qwen2(seed=1, tie_word_embeddings=tied), settings()), 101)
    reference = plain_weights(model)
    streamed = list(stream_plain_weights(model))
    assert_bit_identical(streamed, reference)
    assert not any(".lora_" in n or ".base_layer." in n or n.startswith("base_model.") for n, _ in streamed)
    base = make_tiny_qwen2(seed=1, tie_word_embeddings=tied).state_dict()
    assert [n for n, _ in streamed] == list(base)  # exactly the base model's names, in its order
    got = dict(streamed)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(got[q], base[q])  # the negative control: the adapters do change the weight
    assert torch.equal(got["model.norm.weight"], base["model.norm.weight"])  # not adapted: unchanged


def test_the_stream_of_a_bf16_model_merges_in_float32_and_returns_bf16(make_tiny_qwen2):
    model = randomize_adapters(add_adapters(make_tiny_qwen2(seed=2).to(torch.bfloat16), settings()), 102)
    streamed = list(stream_plain_weights(model))
    assert_bit_identical(streamed, plain_weights(model))
    q = dict(streamed)["model.layers.1.mlp.down_proj.weight"]
    state = model.state_dict()
    prefix = "base_model.model.model.layers.1.mlp.down_proj."
    w, a, b = (state[prefix + k] for k in ("base_layer.weight", "lora_A.default.weight", "lora_B.default.weight"))
    assert q.dtype == torch.bfloat16
    assert torch.equal(q, (w.float() + 2.0 * (b.float() @ a.float())).to(torch.bfloat16))  # by hand: alpha / r = 8 / 4


def test_merge_lora_is_w_plus_scaled_b_a_and_keeps_shapes():
    gen = torch.Generator().manual_seed(0)
    w, a, b = torch.randn(5, 7, generator=gen), torch.randn(2, 7, generator=gen), torch.randn(5, 2, generator=gen)
    merged = merge_lora(w, a, b, scaling=0.5)
    assert merged.shape == (5, 7)
    torch.testing.assert_close(merged, w + 0.5 * b @ a, rtol=0, atol=1e-6)
    assert torch.equal(merge_lora(w, a, torch.zeros(5, 2), scaling=3.0), w)  # B = 0: the base weight itself
    # merged_weights and the stream both go through merge_lora: the same op order, the same bits
    state = {"base_model.model.l.base_layer.weight": w, "base_model.model.l.lora_A.default.weight": a,
             "base_model.model.l.lora_B.default.weight": b, "base_model.model.n.weight": torch.ones(3)}
    assert torch.equal(merged_weights(state, scaling=0.5)["l.weight"], merged)


def test_a_model_without_adapters_streams_its_own_state_dict(make_tiny_qwen2):
    model = make_tiny_qwen2(seed=3)
    streamed = list(stream_plain_weights(model))
    assert [n for n, _ in streamed] == list(model.state_dict())
    own = model.state_dict()
    assert all(t.data_ptr() == own[n].data_ptr() for n, t in streamed)  # no copies in one process


def test_an_unsupported_adapter_config_fails_at_the_call_before_anything_is_pulled(make_tiny_qwen2):
    model = add_adapters(make_tiny_qwen2(seed=4), settings())
    model.peft_config["default"].use_rslora = True
    with pytest.raises(LoraError, match="rslora"):
        stream_plain_weights(model)


def test_the_stream_reads_the_weights_when_pulled(make_tiny_qwen2):
    # the engine consumes the stream after it is made: it must see the weights as they are then
    model = randomize_adapters(add_adapters(make_tiny_qwen2(seed=5), settings()), 105)
    stream = stream_plain_weights(model)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.mul_(2.0)
    assert_bit_identical(list(stream), plain_weights(model))


# ---- sharded, one rank in this process -------------------------------------------------------------------
@pytest.fixture
def one_rank_group(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def shard(model, world_size: int = 1):
    from mathrl.train.dist import Ranks, shard_model

    return shard_model(model, Ranks(rank=0, world_size=world_size, joined=True), mixed_precision=False, cpu_offload=False)


def counting_gathers(monkeypatch) -> list[tuple[int, ...]]:
    """Every DTensor.full_tensor() call from now on, by the shape it gathers (one entry per call)."""
    from torch.distributed.tensor import DTensor

    calls: list[tuple[int, ...]] = []
    original = DTensor.full_tensor

    def counted(self, *args, **kwargs):
        calls.append(tuple(self.shape))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(DTensor, "full_tensor", counted)
    return calls


def test_a_sharded_model_streams_lazily_one_items_tensors_per_pull(one_rank_group, monkeypatch):
    from torch.distributed.tensor import DTensor

    reference = plain_weights(adapted_tiny(seed=6))  # the same model, never sharded
    model = shard(adapted_tiny(seed=6))
    state = model.state_dict()
    assert all(isinstance(t, DTensor) for t in state.values())  # every tensor has to be gathered
    calls = counting_gathers(monkeypatch)
    stream = stream_plain_weights(model)
    assert calls == []  # nothing is gathered before the first pull
    streamed, gathered_so_far = [], 0
    for name, tensor in stream:
        # this item's own gathers, and no more: W, A, B for an adapted weight; the tensor itself otherwise
        adapted = any(f".{t}.weight" in name for t in TARGETS)
        gathered_so_far += 3 if adapted else 1
        assert len(calls) == gathered_so_far, (name, calls)
        assert calls[-3 if adapted else -1] == tuple(tensor.shape)  # W (first of W, A, B) or the tensor
        assert not isinstance(tensor, DTensor)
        streamed.append((name, tensor))
    assert_bit_identical(streamed, reference)
    assert len(calls) == len(state)  # every state dict tensor gathered exactly once (a tied one under each name)


def test_the_stream_keeps_none_of_the_tensors_it_has_yielded(one_rank_group):
    model = shard(adapted_tiny(seed=7))
    stream = stream_plain_weights(model)
    previous = None
    for name, tensor in stream:
        if previous is not None:  # freed by reference counting the moment nothing holds it (no collection needed)
            assert previous() is None, "the stream still holds the previous item's tensor"
        previous = weakref.ref(tensor)
        del tensor  # a consumer that has copied it (vLLM's loader) drops it


# ---- two ranks under torchrun -------------------------------------------------------------------------------
@pytest.mark.slow
def test_two_ranks_each_stream_the_unsharded_models_merged_weights(tmp_path):
    """Each rank builds the same adapted model, computes `plain_weights` unsharded, shards it with FSDP2
    over 2 gloo ranks and streams it; every rank must get the reference bit for bit, gathering one item
    at a time. The worker is this file's `__main__`."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(Path(__file__).resolve()), str(tmp_path)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for r, report in enumerate(reports):
        assert report["world_size"] == 2 and report["sharded"], report
        assert report["mismatches"] == [], f"rank {r}: {report['mismatches']}"
        assert report["names_equal"] and report["count"] == reports[0]["count"] > 0
        assert report["ahead"] == 0, f"rank {r} gathered ahead of the items pulled"
        assert report["gathers"] == report["state_dict_size"]


def _rank_main(out_dir: Path) -> None:
    """One torchrun rank of the test above: its findings in <out_dir>/rank<r>.json."""
    from torch.distributed.tensor import DTensor

    from mathrl.train.dist import close_distributed, exit_rank, init_distributed, is_sharded, shard_model

    torch.set_num_threads(1)
    ranks = init_distributed(timeout_s=120, device="cpu")
    reference = plain_weights(adapted_tiny(seed=8))  # the unsharded model
    model = shard_model(adapted_tiny(seed=8), ranks, mixed_precision=False, cpu_offload=False)
    calls = []
    original = DTensor.full_tensor

    def counted(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    DTensor.full_tensor = counted
    streamed, ahead, expected = [], 0, 0
    for name, tensor in stream_plain_weights(model):
        expected += 3 if any(f".{t}.weight" in name for t in TARGETS) else 1
        ahead = max(ahead, len(calls) - expected)
        streamed.append((name, tensor))
    DTensor.full_tensor = original
    mismatches = [n for n, t in streamed if n not in reference or not torch.equal(t, reference[n])]
    report = {"rank": ranks.rank, "world_size": ranks.world_size, "sharded": is_sharded(model), "count": len(streamed),
              "names_equal": [n for n, _ in streamed] == list(reference), "mismatches": mismatches, "ahead": ahead,
              "gathers": len(calls), "state_dict_size": len(model.state_dict())}
    (out_dir / f"rank{ranks.rank}.json").write_text(json.dumps(report))
    close_distributed()
    exit_rank(0)


if __name__ == "__main__":
    _rank_main(Path(sys.argv[1]))
