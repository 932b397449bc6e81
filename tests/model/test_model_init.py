"""model.init=random: shipped real architectures built with random weights, no download."""

from __future__ import annotations

import json

import pytest
import torch

from mathrl.config import ConfigError, load_config
from mathrl.model.init import architecture_config, architecture_names, build_random_model, random_init_tokenizer
from mathrl.model.io import ModelLoadError, load_model_and_tokenizer


def qwen2_param_count(c: dict) -> int:
    """Parameters of a Qwen2 decoder from its config numbers, by hand: embeddings (x2 when untied),
    per layer q/k/v (with bias) and o (no bias) projections, the SwiGLU MLP's three matrices and two
    RMSNorm weights, and the final norm."""
    h, i, v, n = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["num_hidden_layers"]
    kv = c["num_key_value_heads"] * h // c["num_attention_heads"]
    attn = (h * h + h) + 2 * (h * kv + kv) + h * h
    per_layer = attn + 3 * h * i + 2 * h
    return v * h * (1 if c["tie_word_embeddings"] else 2) + n * per_layer + h


# The sizes the model cards state, in billions of parameters (rounded as published).
PUBLISHED = {
    "qwen2.5-0.5b": 0.49,
    "qwen2.5-1.5b": 1.54,
    "qwen2.5-math-1.5b": 1.54,
    "deepseek-r1-distill-qwen-1.5b": 1.78,  # untied embeddings: 0.23B more than Qwen2.5-1.5B
    "qwen2.5-math-7b": 7.62,
}


def test_every_required_architecture_is_shipped():
    assert set(PUBLISHED) <= set(architecture_names())


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_architecture_has_the_published_size(name):
    # Built on the meta device: the real module tree, no memory.
    from transformers import AutoModelForCausalLM

    from mathrl.model.init import CONFIG_DIR

    raw = json.loads((CONFIG_DIR / f"{name}.json").read_text())
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(architecture_config(name))
    count = sum(p.numel() for p in model.parameters())
    assert count == qwen2_param_count(raw)
    assert round(count / 1e9, 2) == PUBLISHED[name]


def qwen3_param_count(c: dict) -> int:
    """Parameters of a Qwen3 decoder by hand: as Qwen2 but no q/k/v bias, an explicit head_dim, and an
    RMSNorm over each head's query and key (q_norm, k_norm: head_dim weights each) in every layer."""
    h, i, v, n, d = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["num_hidden_layers"], c["head_dim"]
    q, kv = c["num_attention_heads"] * d, c["num_key_value_heads"] * d
    per_layer = (h * q + 2 * h * kv + q * h + 2 * d) + 3 * h * i + 2 * h
    return v * h * (1 if c["tie_word_embeddings"] else 2) + n * per_layer + h


def test_qwen3_8b_base_has_the_published_size():
    # The model card: 8.2B parameters, 6.95B of them outside the (untied) embeddings.
    from transformers import AutoModelForCausalLM

    from mathrl.model.init import CONFIG_DIR

    raw = json.loads((CONFIG_DIR / "qwen3-8b-base.json").read_text())
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(architecture_config("qwen3-8b-base"))
    count = sum(p.numel() for p in model.parameters())
    assert count == qwen3_param_count(raw)
    assert round(count / 1e9, 1) == 8.2
    assert round((count - 2 * raw["vocab_size"] * raw["hidden_size"]) / 1e9, 2) == 6.95


@pytest.mark.parametrize("name, total, outside_embeddings, why", [
    ("qwen3-1.7b-base", 1.7, 1.4, "the model card: 1.7B, 1.4B non-embedding (tied head: one vocab x hidden matrix)"),
    ("qwen3-8b", 8.2, 6.95, "the post-trained 8B: the base's architecture, a longer context and the chat EOS"),
])
def test_shipped_qwen3_architectures_have_the_published_sizes(name, total, outside_embeddings, why):
    from transformers import AutoModelForCausalLM

    from mathrl.model.init import CONFIG_DIR

    raw = json.loads((CONFIG_DIR / f"{name}.json").read_text())
    with torch.device("meta"):
        count = sum(p.numel() for p in AutoModelForCausalLM.from_config(architecture_config(name)).parameters())
    assert count == qwen3_param_count(raw), why
    embeddings = raw["vocab_size"] * raw["hidden_size"] * (1 if raw["tie_word_embeddings"] else 2)
    assert round(count / 1e9, 1) == total and round((count - embeddings) / 1e9, 2 if total > 2 else 1) == outside_embeddings, why


def _small_config_file(tmp_path, vocab_size=300):
    # The 0.5B's config with a small size: same code path as the shipped ones, seconds on a CPU.
    from mathrl.model.init import CONFIG_DIR

    raw = json.loads((CONFIG_DIR / "qwen2.5-0.5b.json").read_text())
    raw.update(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=vocab_size)
    path = tmp_path / "small.json"
    path.write_text(json.dumps(raw))
    return path


def test_same_seed_same_weights_and_caller_rng_untouched(tmp_path):
    path = _small_config_file(tmp_path)
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    a, _ = build_random_model(str(path))
    assert torch.equal(torch.rand(3), expected_next), "building a model must not consume the caller's random stream"
    b, _ = build_random_model(str(path))
    c, _ = build_random_model(str(path), seed=1)
    pa, pb, pc = (torch.cat([p.flatten() for p in m.parameters()]) for m in (a, b, c))
    assert torch.equal(pa, pb)  # the reference model equals the starting policy
    assert not torch.equal(pa, pc)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_dtype_is_applied_at_construction(tmp_path, dtype):
    # The shipped configs say torch_dtype bfloat16 (the checkpoints' storage); the caller's dtype wins.
    model, _ = build_random_model(str(_small_config_file(tmp_path)), dtype=dtype)
    assert {p.dtype for p in model.parameters()} == {getattr(torch, dtype)}
    assert torch.get_default_dtype() == torch.float32


def test_tokenizer_has_the_architecture_vocabulary_and_encodes_characters():
    tok = random_init_tokenizer(300)
    assert len(tok) == 300
    assert (tok.pad_token_id, tok.eos_token_id) == (0, 1)
    ids = tok("12+3=")["input_ids"]
    assert len(ids) == 5 and max(ids) < 99  # one token per character, never a placeholder
    assert tok.decode([*ids, 250]) == "12+3=<250>"  # a sampled placeholder stays visible
    with pytest.raises(ValueError, match="smaller than the character tokenizer"):
        random_init_tokenizer(50)


def test_config_path_loads_through_the_ordinary_loader_and_generates(tmp_path):
    path = _small_config_file(tmp_path)
    model, tok = load_model_and_tokenizer(f"config:{path}")
    assert model.config.eos_token_id == tok.eos_token_id == 1
    assert model.config.vocab_size == len(tok) == 300
    ids = torch.tensor([tok("1+1=")["input_ids"]])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=True)
    assert out.shape == (1, 8)
    with pytest.raises(ModelLoadError, match="unknown architecture"):
        load_model_and_tokenizer("config:llama-9000")


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["model.init=random"], "model.init=random needs model.path=config:<name>"),
        (["model.path=config:qwen2.5-0.5b"], "add model.init=random"),
        (["model.path=config:qwen3-9b", "model.init=random"], "choose one of .*qwen2.5-0.5b"),
        (["model.path=config:/nowhere/config.json", "model.init=random"], "no such config file"),
    ],
)
def test_config_validation_names_the_field_and_the_fix(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config(None, overrides)


def test_shipped_name_validates():
    cfg = load_config(None, ["model.path=config:qwen2.5-math-7b", "model.init=random"])
    assert cfg.model.init == "random"


def test_critic_of_a_random_init_policy_has_the_architecture_and_a_zero_head(tmp_path):
    # PPO's critic starts from the starting policy's path; for config: paths that is a random backbone.
    from mathrl.model.value import load_critic

    critic = load_critic(f"config:{_small_config_file(tmp_path)}")
    assert critic.config.hidden_size == 32 and critic.config.num_hidden_layers == 2
    values = critic(input_ids=torch.tensor([[5, 6, 7]])).logits
    assert values.shape == (1, 3, 1) and torch.equal(values, torch.zeros_like(values))


@pytest.mark.slow
def test_a_random_init_model_trains_and_its_final_model_reloads(tmp_path, monkeypatch):
    # The whole loop on a config: model: the real vocabulary (151,936) behind a small body, the
    # character tokenizer, a reference-free GRPO run of 2 steps, then final/ reloads as a plain HF model.
    import io
    import math

    from rich.console import Console

    from mathrl.track.sinks import read_metrics
    from mathrl.train.loop import train

    path = _small_config_file(tmp_path, vocab_size=151_936)
    cfg = load_config(None, [f"model.path=config:{path}", "model.init=random", "train.steps=2",
                             "rollout.prompts_per_step=2", "rollout.n=2", "train.mini_batch_size=4",
                             "rollout.max_new_tokens=8", "eval.n=1", "data.eval_size=2", "train.save_every=0",
                             "reward.num_workers=0", f"run_dir={tmp_path / 'run'}",
                             # every group trains: a random model is never right, so dynamic sampling would drop them all
                             "data.dynamic_sampling.mode=none"])
    train(cfg, console=Console(file=io.StringIO(), width=120))
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "actor/entropy" in r]
    assert len(rows) == 2
    # a random model's next-token distribution is close to uniform over the real vocabulary
    assert abs(rows[0]["actor/entropy"] - math.log(151_936)) < 0.1
    model, tok = load_model_and_tokenizer(tmp_path / "run" / "final")
    assert len(tok) == model.config.vocab_size == 151_936
