"""LoRA (model.lora, peft): the same quantity computed two ways must agree.

  - the merged weights an engine without adapters loads vs peft's own `merge_and_unload`;
  - only the adapters get gradients and move, the base weights stay bit-identical;
  - the reference (the policy with its adapters disabled) vs a separately built base model;
  - after 3 policy updates and syncs, the logprobs of the torch engine (sampling from the adapted
    model, and from a plain copy fed the merged weights) and of vLLM (when it imports) vs the trainer's;
  - `mathrl plan`'s LoRA counts vs the parameters of a real PeftModel;
  - a LoRA run killed with SIGKILL and rerun vs the uninterrupted run, and its final/ (merged model and
    adapter) vs the trained policy;
  - 2 ranks (FSDP2, gloo) vs 1 process.

    python -m pytest tests/model/test_lora.py -q
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mathrl.config import load_config
from mathrl.model.lora import LoraError, adapter_params, add_adapters, is_lora, merged_weights, plain_weights
from mathrl.rollout.engine import TorchEngine
from mathrl.train.batching import TrainBatch
from mathrl.train.passes import scoring_pass
from mathrl.train.update import update_policy

pytest.importorskip("peft", reason="LoRA needs peft (a dependency: pip install -e .)")

TOL = 1e-4
PROMPTS = ["12+7=", "3+4=", "105+27=", "9="]


def settings(r: int = 4, alpha: float = 8.0, dropout: float = 0.0, targets=("q_proj", "v_proj", "o_proj", "up_proj", "down_proj")):
    return SimpleNamespace(r=r, alpha=alpha, dropout=dropout, target_modules=list(targets))


def config(*extra: str):
    return load_config(None, ["rollout.max_new_tokens=16", "rollout.prompts_per_step=2", "rollout.n=4",
                              "train.mini_batch_size=4", "model.lora.r=4", *extra])


def adapted(make_tiny_qwen2, seed: int = 0, **kw):
    """A tiny model with adapters whose B is random (fresh adapters are the identity: B = 0)."""
    model = add_adapters(make_tiny_qwen2(seed=seed, **kw), settings())
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
    return model


def engine_batch(engine, tokenizer, *, seed: int) -> TrainBatch:
    """8 samples of the engine with random advantages, old logprobs the engine's."""
    out = engine.generate([tokenizer(p)["input_ids"] for p in PROMPTS for _ in range(2)], max_new_tokens=16,
                          temperature=1.0, seed=seed)
    g = torch.Generator().manual_seed(seed)
    n, t = out.response_ids.shape
    zeros = torch.zeros((n, t))
    return TrainBatch(prompt_ids=out.prompt_ids, prompt_mask=out.prompt_mask, response_ids=out.response_ids,
                      response_mask=out.response_mask, loss_mask=out.response_mask.clone(),
                      old_logprobs=out.rollout_logprobs * out.response_mask,
                      advantages=torch.randn((n, 1), generator=g).expand(n, t) * out.response_mask,
                      ref_logprobs=zeros.clone(), ref_entropy=zeros.clone(), correct=torch.zeros(n))


def engine_gap(engine, model, tokenizer, cfg, *, seed: int) -> float:
    """Max |engine's sampling logprob - the trainer's scoring pass| over the engine's samples."""
    batch = engine_batch(engine, tokenizer, seed=seed)
    trainer, _ = scoring_pass(model, batch, cfg, with_entropy=False)
    assert batch.response_mask.sum() > len(batch)  # responses of several tokens
    return float(((trainer - batch.old_logprobs).abs() * batch.response_mask).max())


def test_merged_weights_equal_peft_merge_and_unload(make_tiny_qwen2):
    # why: an engine without adapters (vLLM, a plain copy) must load exactly what peft would merge
    model = adapted(make_tiny_qwen2, seed=1)
    ours = merged_weights(model.state_dict(), scaling=8.0 / 4)
    theirs = copy.deepcopy(model).merge_and_unload().state_dict()
    assert sorted(ours) == sorted(theirs)  # the base model's names, no lora_ or base_layer left
    for name in theirs:
        torch.testing.assert_close(ours[name], theirs[name], rtol=0, atol=1e-6)
    base = make_tiny_qwen2(seed=1).state_dict()
    assert not torch.equal(ours["model.layers.0.self_attn.q_proj.weight"], base["model.layers.0.self_attn.q_proj.weight"])
    assert torch.equal(ours["model.layers.0.self_attn.k_proj.weight"], base["model.layers.0.self_attn.k_proj.weight"])  # not targeted
    assert plain_weights(make_tiny_qwen2(seed=1)).keys() == base.keys()  # a model without adapters: its own state dict


def test_only_the_adapters_get_gradients_and_move(make_tiny_qwen2, char_tokenizer):
    model = add_adapters(make_tiny_qwen2(seed=2), settings()).train()
    trained = adapter_params(model)
    assert trained and all("lora_" in n for n, p in model.named_parameters() if p.requires_grad)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.AdamW(trained, lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    engine = TorchEngine(model, eos_token_id=char_tokenizer.eos_token_id, pad_token_id=char_tokenizer.pad_token_id)
    batch = engine_batch(engine, char_tokenizer, seed=0)
    grads = {}
    hooks = [p.register_hook(lambda g, n=n: grads.__setitem__(n, g)) for n, p in model.named_parameters() if p.requires_grad]
    metrics = update_policy(model, optimizer, scheduler, batch, config(), step=1, coefs={"entropy": 0.0, "kl": 0.0},
                            ptx=None).metrics
    for h in hooks:
        h.remove()
    assert metrics["actor/updates"] == 2 and metrics["perf/skipped_updates"] == 0
    assert grads and all("lora_" in n for n in grads)
    for n, p in model.named_parameters():
        if "lora_" in n:
            assert not torch.equal(p, before[n]), n  # every adapter matrix moved (B too, from 0)
        else:
            assert p.grad is None and torch.equal(p, before[n]), n  # frozen, bit-identical


def test_the_reference_is_the_base_model_with_the_adapters_disabled(make_tiny_qwen2, char_tokenizer):
    model = adapted(make_tiny_qwen2, seed=3)
    base = make_tiny_qwen2(seed=3)  # the same base, built separately
    engine = TorchEngine(model, eos_token_id=char_tokenizer.eos_token_id, pad_token_id=char_tokenizer.pad_token_id)
    batch = engine_batch(engine, char_tokenizer, seed=1)
    cfg = config()
    with model.disable_adapter():
        ref, ref_entropy = scoring_pass(model, batch, cfg, with_entropy=True)
    expected, expected_entropy = scoring_pass(base, batch, cfg, with_entropy=True)
    torch.testing.assert_close(ref, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(ref_entropy, expected_entropy, rtol=0, atol=1e-6)
    policy, _ = scoring_pass(model, batch, cfg, with_entropy=False)  # adapters on again after the block
    assert float((policy - expected).abs().max()) > 1e-2  # the negative control: the adapters do change it


def test_engines_match_the_trainer_after_three_updates_and_syncs(make_tiny_qwen2, char_tokenizer):
    # The torch engine samples from the adapted model itself; a plain copy of the base (what several
    # ranks and vLLM hold) is fed the merged weights after every update. Both must give the trainer's
    # logprobs; before its sync the plain copy must not (so the comparison can fail).
    tok = char_tokenizer
    model = add_adapters(make_tiny_qwen2(seed=4), settings()).train()
    optimizer = torch.optim.AdamW(adapter_params(model), lr=3e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    own = TorchEngine(model, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    copy_engine = TorchEngine(make_tiny_qwen2(seed=4), eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    cfg = config()
    for round_ in range(3):
        batch = engine_batch(own, tok, seed=round_)
        update_policy(model, optimizer, scheduler, batch, cfg, step=round_ + 1, coefs={"entropy": 0.0, "kl": 0.0}, ptx=None)
        assert engine_gap(copy_engine, model, tok, cfg, seed=10 + round_) > 1e-3  # not synced yet
        own.update_weights(model.state_dict().items())  # its own tensors: nothing to copy
        copy_engine.update_weights(plain_weights(model).items())
        assert engine_gap(own, model, tok, cfg, seed=20 + round_) <= TOL
        assert engine_gap(copy_engine, model, tok, cfg, seed=30 + round_) <= TOL


@pytest.mark.slow
def test_vllm_matches_the_trainer_after_three_updates_and_merged_syncs(make_tiny_qwen2, char_tokenizer, tmp_path):
    pytest.importorskip("vllm", reason="vLLM is not installed (docs/guide.md: Rollouts with vLLM)", exc_type=ImportError)
    from mathrl.config import VLLMConfig
    from mathrl.rollout.vllm_engine import VLLMEngine

    tok = char_tokenizer
    kw = dict(hidden_size=64, num_layers=2, max_positions=128)  # vLLM's CPU attention needs head_dim 32
    make_tiny_qwen2(seed=5, **kw).save_pretrained(tmp_path, safe_serialization=True)
    tok.save_pretrained(tmp_path)
    model = add_adapters(make_tiny_qwen2(seed=5, **kw), settings()).train()
    optimizer = torch.optim.AdamW(adapter_params(model), lr=3e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    own = TorchEngine(model, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    engine = VLLMEngine(tmp_path, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                        settings=VLLMConfig(enforce_eager=True), seed=0)
    cfg = config()
    try:
        for round_ in range(3):
            update_policy(model, optimizer, scheduler, engine_batch(own, tok, seed=round_), cfg, step=round_ + 1,
                          coefs={"entropy": 0.0, "kl": 0.0}, ptx=None)
            assert engine_gap(engine, model, tok, cfg, seed=10 + round_) > 1e-3  # not synced yet
            engine.update_weights(plain_weights(model).items())
            assert engine_gap(engine, model, tok, cfg, seed=20 + round_) <= TOL
    finally:
        engine.close()


def test_fresh_adapters_depend_on_the_seed_only(make_tiny_qwen2):
    # why: a run that just built its base model (drawing from the global RNG) and one that found it
    # cached must start from the same adapters, or a resumed run would not match the uninterrupted one
    base = make_tiny_qwen2(seed=0)  # (it seeds the global RNG itself)
    torch.manual_seed(123)
    state = torch.get_rng_state()
    a = add_adapters(base, settings(), seed=7).state_dict()
    assert torch.equal(torch.get_rng_state(), state)  # the caller's random state is untouched
    base = make_tiny_qwen2(seed=0)
    torch.rand(10)
    b = add_adapters(base, settings(), seed=7).state_dict()
    c = add_adapters(make_tiny_qwen2(seed=0), settings(), seed=8).state_dict()
    name = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight"
    assert torch.equal(a[name], b[name]) and not torch.equal(a[name], c[name])


def test_target_modules_the_model_lacks_are_a_clear_error(make_tiny_qwen2):
    with pytest.raises(LoraError, match=r"model.lora.target_modules=\['qkv'\].*q_proj"):
        add_adapters(make_tiny_qwen2(seed=0), settings(targets=("qkv",)))


@pytest.mark.parametrize("override, fragment", [
    ("model.lora.r=-1", "model.lora.r=-1"),
    ("model.lora.dropout=1.0", "model.lora.dropout"),
    ("model.lora.target_modules=[]", "model.lora.target_modules"),
])
def test_settings_out_of_their_domain_are_refused(override, fragment):
    from mathrl.config import ConfigError

    with pytest.raises(ConfigError, match=fragment):
        load_config(None, [override])


def test_plan_counts_the_adapters_and_no_reference_copy(make_tiny_qwen2):
    from mathrl.plan.arch import architecture_of
    from mathrl.plan.memory import estimate_memory

    cfg = load_config(None, ["model.lora.r=8", "algo.kl.use=loss"])
    arch = architecture_of(cfg)
    # the adapters peft builds on the tiny base's architecture (same numbers as plan.arch's Qwen2Config)
    from transformers import AutoModelForCausalLM

    from mathrl.plan.arch import hf_config

    real = adapter_params(add_adapters(AutoModelForCausalLM.from_config(hf_config(cfg)), cfg.model.lora))
    assert arch.lora_params == sum(p.numel() for p in real) and arch.lora_param_tensors == len(real)
    # by hand: 4 layers x (q 8*(128+128), k and v 8*(128+64) each, o 8*(128+128), gate and up 8*(128+384)
    # each, down 8*(384+128)) = 4 x (2,048 + 2 x 1,536 + 2,048 + 3 x 4,096) = 4 x 19,456
    assert arch.lora_params == 4 * 19_456 and arch.lora_param_tensors == 4 * 7 * 2
    full = estimate_memory(load_config(None, ["algo.kl.use=loss"]), gpus=2, gpu_mem_gib=80)
    plan = estimate_memory(cfg, gpus=2, gpu_mem_gib=80)
    p = arch.lora_params
    assert plan.components["params"] == (arch.params + p) * 4 // 2
    assert plan.components["grads"] == p * 4 // 2
    assert plan.components["optimizer"] == (2 * p * 4 + 4 * 56) // 2
    assert plan.components["head gradients"] == 0
    assert plan.components["reference model"] == 0 < full.components["reference model"]
    assert plan.update_peak < full.update_peak


# ---- whole runs (subprocesses): resume after SIGKILL, final/, 2 ranks ------------------------------------
SMALL = [
    "base.steps=200", "base.max_digits=1", "data.arith.max_digits=1", "base.hidden_size=32",
    "base.intermediate_size=64", "base.num_layers=2", "base.num_heads=2", "base.num_kv_heads=1",
    "train.steps=4", "train.save_every=2", "rollout.prompts_per_step=4", "rollout.n=4", "rollout.batch_size=8",
    "train.mini_batch_size=8", "data.eval_size=4", "eval.n=2", "eval.every=2", "reward.num_workers=0",
    "model.lora.r=4", "train.lr=2e-3", "algo.kl.use=loss", "algo.kl.coef=0.01",  # the reference is the base
    "data.dynamic_sampling.mode=none",  # every step updates the adapters
]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    return {**os.environ, "MATHRL_CACHE": str(cache), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def rows(run_dir: Path) -> list[dict]:
    out = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("perf/") or k == "perf/skipped_steps"} for r in out]


KILL_DRIVER = r'''
import os, signal, sys, json
from rich.console import Console
from mathrl.config import load_config
from mathrl.train import loop, step
real = step.update_policy
def update_then_die(*args, step, **kwargs):
    if step == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    return real(*args, step=step, **kwargs)
step.update_policy = update_then_die
loop.train(load_config(None, json.loads(sys.argv[1])), console=Console(quiet=True))
'''


def train(env, run_dir: Path, *extra: str, nproc: int = 1) -> None:
    cmd = [sys.executable, "-m", "mathrl.cli", "train", *SMALL, *extra, "--run-dir", str(run_dir)]
    if nproc > 1:
        cmd += ["--nproc", str(nproc)]
    proc = subprocess.run(cmd, env=env, capture_output=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr).decode()[-4000:]


@pytest.fixture(scope="module")
def uninterrupted(env, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("lora") / "uninterrupted"
    train(env, run)
    return run


@pytest.mark.slow
def test_a_killed_lora_run_resumes_exactly(env, uninterrupted, tmp_path):
    run = tmp_path / "killed"
    driver = tmp_path / "driver.py"
    driver.write_text(KILL_DRIVER)
    proc = subprocess.run([sys.executable, str(driver), json.dumps([*SMALL, f"run_dir={run}"])], env=env,
                          capture_output=True, timeout=900)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-3000:]
    checkpoint = run / "checkpoints" / "step_000002"
    # the checkpoint holds the adapter (peft's format) and its optimizer state, not the base weights
    assert (checkpoint / "adapter_model.safetensors").is_file() and not (checkpoint / "model.safetensors").exists()
    optimizer = torch.load(checkpoint / "trainer_state.pt", weights_only=True)["optimizer"]
    assert len(optimizer["param_groups"][0]["params"]) == 2 * 7 * 2  # A and B of 7 modules in 2 layers
    train(env, run)  # the same command again resumes from step 2
    assert rows(run) == rows(uninterrupted)


@pytest.mark.slow
def test_final_holds_a_merged_model_and_the_adapter(env, uninterrupted):
    from peft import PeftModel

    from mathrl.model.io import load_model_and_tokenizer

    final = uninterrupted / "final"
    merged, tok = load_model_and_tokenizer(final)  # what mathrl eval reads: a plain Hugging Face model
    assert not is_lora(merged)
    base_path = json.loads((final / "adapter" / "adapter_config.json").read_text())["base_model_name_or_path"]
    base, _ = load_model_and_tokenizer(base_path)
    policy = PeftModel.from_pretrained(base, final / "adapter")
    ids = torch.tensor([tok("12+7=1+7+0=08,")["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(merged(ids).logits, policy(ids).logits, rtol=0, atol=1e-5)
        with policy.disable_adapter():
            assert float((merged(ids).logits - policy(ids).logits).abs().max()) > 1e-3  # the adapter trained
    # a checkpoint directory (adapter only) loads as its merged model too (evaluation sweeps)
    ckpt, _ = load_model_and_tokenizer(uninterrupted / "checkpoints" / "step_000004")
    with torch.no_grad():
        torch.testing.assert_close(ckpt(ids).logits, merged(ids).logits, rtol=0, atol=1e-5)


@pytest.mark.slow
def test_two_ranks_with_fsdp2_match_one_process(env, uninterrupted, tmp_path):
    from run_helpers import assert_same_steps, metrics

    run = tmp_path / "two"
    train(env, run, nproc=2)
    two, one = metrics(run), metrics(uninterrupted)
    trained = [s for s in one if s > 0 and "actor/pg_loss" in one[s]]
    assert trained and any(two[s]["actor/ref_kl"] > 0 for s in trained)  # the adapters moved away from the base
    assert_same_steps(two, one, trained)
    assert (run / "checkpoints" / "step_000004" / "adapter_model.safetensors").is_file()
    assert (run / "final" / "model.safetensors").is_file() and (run / "final" / "adapter" / "adapter_config.json").is_file()


@pytest.mark.slow
def test_a_vllm_run_samples_the_merged_policy(env, tmp_path):
    # The trainer's own path (Trainer.engine_weights after every update): vLLM's logprobs of what it
    # sampled equal the trainer's scoring pass of the same tokens (rollout/logprob_mismatch) at every
    # step, so every sync gave vLLM the adapted policy, not the base.
    pytest.importorskip("vllm", reason="vLLM is not installed (docs/guide.md: Rollouts with vLLM)", exc_type=ImportError)
    from run_helpers import metrics

    run = tmp_path / "vllm"
    train(env, run, "rollout.engine=vllm", "rollout.vllm.enforce_eager=true", "base.num_heads=1",  # head_dim 32 for vLLM's CPU kernels
          "train.steps=3",
          # an entropy bonus moves the adapters even when no sample earns a reward (some CPU types build a
          # base model that earns none in 3 steps: every advantage is then 0)
          "algo.entropy.mode=fixed", "algo.entropy.coef=0.01")
    steps = metrics(run)
    trained = [s for s in steps if s > 0 and "actor/pg_loss" in steps[s]]
    assert len(trained) == 3 and steps[3]["actor/ref_kl"] > 0  # the adapters moved away from the base
    assert all(steps[s]["rollout/logprob_mismatch"] < 1e-5 for s in trained), [steps[s]["rollout/logprob_mismatch"] for s in trained]
