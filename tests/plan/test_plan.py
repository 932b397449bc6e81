"""`mathrl plan`: the memory estimate against hand-computed numbers and against measurements on the CPU."""

from __future__ import annotations

import json

import pytest
import torch

from mathrl.cli import main
from mathrl.config import load_config
from mathrl.model.init import CONFIG_DIR, build_random_model
from mathrl.plan.arch import GIB, architecture_of
from mathrl.plan.format import format_plan
from mathrl.plan.memory import estimate_memory, generator_layout_error
from mathrl.plan.trainer import activation_bytes_per_token


def test_tiny_model_by_hand():
    # The tiny base model: vocab 99, hidden 128, MLP 384, 4 layers, 4 heads / 2 kv heads (head dim 32), tied.
    # Per layer: q 128*128+128, k and v 2*(128*64+64), o 128*128 -> 49,408; MLP 3*128*384 = 147,456;
    # 2 norms 256 -> 197,120. Model: 4 layers + embeddings 99*128 + final norm 128 = 801,280.
    cfg = load_config(None, [])
    plan = estimate_memory(cfg, gpus=2, gpu_mem_gib=80)
    assert plan.arch.params == 801_280
    assert plan.arch.param_tensors == 4 * 12 + 2  # 12 tensors per layer, embeddings, final norm
    assert plan.components["params"] == 801_280 * 4 // 2
    assert plan.components["grads"] == 801_280 * 4 // 2
    assert plan.components["optimizer"] == (2 * 801_280 * 4 + 4 * 50) // 2  # exp_avg, exp_avg_sq, one step per tensor
    # bf16 compute: norms 2*(4*128 + 2*128 + 4) = 1,544; attention 5*2*128 + 4*4 + 2*2*32 = 1,424; MLP 4*2*384 = 3,072
    assert activation_bytes_per_token(plan.arch, 2) == 6_040
    head = 4 * 1024 * 99 * 4 + 8192 * 128 * 2  # one chunk of float32 logits (x4 in its backward), and the final hidden states
    assert plan.components["activations"] == 4 * 6_040 * 8192 + head
    assert plan.components["head gradients"] == 2 * 99 * 128 * 2  # head and embedding weight gradients, bf16
    # no reference model and no critic in the default run; the torch engine's KV cache instead of vLLM
    assert "reference model" not in plan.components and "critic" not in plan.components
    # 64 sequences per GPU (a batch bucket) x (512 prompt + 48 response tokens, 560 -> 576 in 64-column blocks:
    # the lean decode loop, the default, preallocates it) x K and V of 4 layers x 2 kv heads x 32 x 2 B
    assert plan.components["torch engine KV cache"] == 64 * 576 * (2 * 4 * 2 * 32) * 2
    assert plan.fits


def test_the_lean_decode_loop_plans_its_preallocated_cache():
    # rollout.decode=lean (the default) allocates its cache for a batch bucket of rows (40 -> 48) and whole blocks of
    # 64 columns (512 + 48 = 560 -> 576), on the trainer's GPU and in a torch generator alike
    cfg = load_config(None, ["rollout.decode=lean", "rollout.batch_size=40"])
    plan = estimate_memory(cfg, gpus=2, gpu_mem_gib=80)
    assert plan.components["torch engine KV cache"] == 48 * 576 * (2 * 4 * 2 * 32) * 2
    assert "lean" in plan.notes["torch engine KV cache"]
    hf = estimate_memory(load_config(None, ["rollout.decode=hf", "rollout.batch_size=40"]), gpus=2, gpu_mem_gib=80)
    assert hf.components["torch engine KV cache"] == 40 * 560 * (2 * 4 * 2 * 32) * 2


def test_checkpointing_keeps_layer_inputs_and_one_layer():
    cfg = load_config(None, ["model.gradient_checkpointing=true"])
    plan = estimate_memory(cfg, gpus=1, gpu_mem_gib=80)
    head = 4 * 1024 * 99 * 4 + 8192 * 128 * 2
    assert plan.components["activations"] == 4 * 128 * 2 * 8192 + 6_040 * 8192 + head
    assert plan.activations_other_setting == 4 * 6_040 * 8192 + head


def test_vllm_kv_cache_of_the_deepscaler_recipe_by_hand():
    # 0.85 x 80 GiB = 68 GiB for vLLM; bf16 weights 1,777,088,000 x 2 B; K and V of 28 layers x 2 kv
    # heads x 128 dims x 2 B = 28,672 B per token -> (73,014,444,032 - 3,554,176,000) // 28,672 tokens.
    cfg = load_config("recipes/real/deepscaler_1.5b_8k.yaml", check_paths=False)
    plan = estimate_memory(cfg, gpus=8, gpu_mem_gib=80)
    assert plan.components["vLLM (weights + KV cache)"] == 68 * GIB
    assert "2,422,581 tokens" in plan.notes["vLLM (weights + KV cache)"]
    # with sleep mode the update phase holds no vLLM memory; generation holds the trainer's states + vLLM
    states = sum(plan.components[k] for k in ("params", "optimizer", "reference model", "runtime"))
    assert plan.generation_peak == states + 68 * GIB  # gradients are freed after every optimizer step
    transient = sum(plan.components[k] for k in ("grads", "activations", "gathered weights", "head gradients"))
    assert plan.update_peak == states + transient
    # vLLM holds its own weights: the trainer keeps no engine copy of the policy for it
    assert "torch engine weights" not in plan.components
    # the reference model's shards stay float32 as loaded (1/8 of 4 B each), plus its gathered layers in bf16
    arch = plan.arch
    assert plan.components["reference model"] == -(-arch.params * 4 // 8) + (2 * arch.layer_params + arch.root_params) * 2


def test_torch_engine_copy_is_counted_on_several_gpus():
    # under torchrun the torch engine samples from an unsharded float32 copy of the policy on every rank
    cfg = load_config(None, ["model.path=config:qwen2.5-1.5b", "model.init=random"])
    one, two = (estimate_memory(cfg, gpus=n, gpu_mem_gib=80) for n in (1, 2))
    assert "torch engine weights" not in one.components  # one process samples from the policy itself
    assert two.components["torch engine weights"] == two.arch.params * 4
    assert two.generation_peak - two.components["torch engine weights"] == sum(
        v for k, v in two.components.items()
        if k not in ("grads", "activations", "gathered weights", "head gradients", "torch engine weights"))


def test_more_gpus_shard_the_states():
    cfg = load_config(None, ["model.path=config:qwen2.5-math-7b", "model.init=random"])
    one, eight = (estimate_memory(cfg, gpus=n, gpu_mem_gib=80) for n in (1, 8))
    assert one.arch.params == 7_615_616_512
    assert one.components["optimizer"] == 8 * 7_615_616_512 + 4 * one.arch.param_tensors
    assert eight.components["params"] == -(-one.components["params"] // 8)
    assert not one.fits  # 7.6B parameters with float32 AdamW do not fit one 80 GiB GPU


def _small_random_cfg(tmp_path, dtype="float32"):
    raw = json.loads((CONFIG_DIR / "qwen2.5-0.5b.json").read_text())
    raw.update(hidden_size=256, intermediate_size=704, num_hidden_layers=4, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=1000)
    path = tmp_path / "small.json"
    path.write_text(json.dumps(raw))
    return load_config(None, [f"model.path=config:{path}", "model.init=random", f"model.dtype={dtype}"]), path


def test_parameter_and_optimizer_bytes_equal_the_measured_ones(tmp_path):
    cfg, path = _small_random_cfg(tmp_path)
    plan = estimate_memory(cfg, gpus=1, gpu_mem_gib=80, mixed_precision=False)
    model, _ = build_random_model(str(path))
    assert plan.components["params"] == sum(p.nbytes for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(input_ids=torch.tensor([[3, 4, 5]])).logits.sum().backward()
    assert plan.components["grads"] == sum(p.grad.nbytes for p in model.parameters())
    optimizer.step()
    measured = sum(t.nbytes for state in optimizer.state.values() for t in state.values() if torch.is_tensor(t))
    assert plan.components["optimizer"] == measured


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_activation_model_against_autograds_saved_tensors(tmp_path, dtype):
    # Measured: every tensor autograd saves for the backward pass of the decoder stack, counted once
    # per storage (views share one), parameters excluded. The estimate enumerates the same tensors by
    # hand; what it leaves out (a few scalars per token) keeps it within 2% here (measured: 0.2%
    # under in float32, 1.3% under in bfloat16).
    cfg, path = _small_random_cfg(tmp_path, dtype)
    arch = architecture_of(cfg)
    model, _ = build_random_model(str(path), dtype=dtype)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    batch, length = 2, 128
    ids = torch.randint(3, 1000, (batch, length))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.model(input_ids=ids, attention_mask=torch.ones_like(ids))
    measured = sum(saved.values())
    estimated = arch.layers * activation_bytes_per_token(arch, torch.tensor([], dtype=getattr(torch, dtype)).element_size()) * batch * length
    assert abs(estimated - measured) / measured < 0.02, (estimated, measured)


def test_cli_prints_the_plan_and_exits_1_when_it_does_not_fit(capsys):
    assert main(["plan", "model.path=config:qwen2.5-0.5b", "model.init=random", "--gpus", "2", "--gpu-mem", "80"]) == 0
    out = capsys.readouterr().out
    assert "0.49B parameters" in out and "fits: peak" in out and "optimizer" in out
    assert main(["plan", "model.path=config:qwen2.5-0.5b", "model.init=random", "--gpu-mem", "1"]) == 1
    assert "DOES NOT FIT" in capsys.readouterr().out


def test_a_hub_model_without_a_shipped_architecture_is_a_clear_error():
    cfg = load_config(None, ["model.path=SomeOrg/unknown-model"], check_paths=False)
    with pytest.raises(ValueError, match="config.json is not on this machine.*model.init=random"):
        estimate_memory(cfg, gpus=1, gpu_mem_gib=80)


def test_update_memory_bounds_the_measured_peak_of_a_training_pass(tmp_path):
    # PyTorch's MemTracker counts every live tensor (parameters, gradients, activations, temporaries)
    # through one forward/backward of the trainer's scoring pass. The plan's update phase without the
    # optimizer must cover that peak and not overshoot it by much. (Measured on the 0.5B width with
    # 4 layers and 2,048 tokens: peak 5.56 GiB, plan 5.64 GiB.)
    mem_tracker = pytest.importorskip("torch.distributed._tools.mem_tracker")
    from mathrl.model.scoring import response_logprobs

    cfg, path = _small_random_cfg(tmp_path)
    cfg.train.micro_batch_tokens = 2 * 256
    plan = estimate_memory(cfg, gpus=1, gpu_mem_gib=80, mixed_precision=False)
    model, _ = build_random_model(str(path))
    prompt, response = torch.randint(3, 1000, (2, 16)), torch.randint(3, 1000, (2, 240))
    tracker = mem_tracker.MemTracker()
    tracker.track_external(model)
    with tracker:
        logprobs, entropy = response_logprobs(model, prompt, torch.ones(2, 16), response, torch.ones(2, 240), chunk_size=1024)
        (logprobs.sum() + entropy.sum()).backward()
    measured = next(iter(tracker.get_tracker_snapshot("peak").values()))["Total"]
    planned = sum(plan.components[k] for k in ("params", "grads", "activations", "head gradients"))
    assert measured <= planned <= 1.3 * measured, (measured, planned)


def test_ppo_critic_by_hand():
    # Qwen2ForTokenClassification on the tiny model: the backbone (801,280 minus nothing: the head is
    # tied) plus a 128 -> 1 score layer with bias = 801,409 parameters in 52 tensors.
    cfg = load_config(None, ["algo.adv.estimator=gae"])
    plan = estimate_memory(cfg, gpus=1, gpu_mem_gib=80)
    assert (plan.arch.critic_params, plan.arch.critic_param_tensors) == (801_409, 52)
    assert plan.components["critic"] == 801_409 * 4 * 3 + 4 * 52  # weights + exp_avg + exp_avg_sq, steps
    policy = sum(plan.components[k] for k in ("grads", "activations", "gathered weights", "head gradients"))
    critic = plan.components["critic update"]
    assert critic == 801_409 * 4 + 4 * 6_040 * 8192  # its gradients and the backbone's activations
    resident = sum(plan.components[k] for k in ("params", "optimizer", "critic", "runtime"))
    assert plan.update_peak == resident + max(policy, critic)  # the two updates run one after the other


# ---- generator processes (rollout.max_staleness >= 1) ------------------------------------------------------
# The tiny model on a GPU (float32 master weights, bfloat16 compute, one trainer rank, no reference model):
# its resident states are params 801,280 x 4 = 3,205,120 B + AdamW 2 x 3,205,120 + 4 x 50 = 6,410,440 B
# + the 1 GiB runtime allowance. Its state dict holds 801,280 + 99 x 128 (the tied head again) = 813,952
# numbers, so a kept version is 3,255,808 B and, all float32 and under 256 MiB, one weight bucket.
TINY_RESIDENT = 3_205_120 + 6_410_440 + GIB
TINY_VERSION = 813_952 * 4


def _tiny_buckets(bucket_mb: float = 256.0):
    """The weight buckets train/generators/host.py cuts the tiny model's state dict into (built on the meta device)."""
    from transformers import AutoModelForCausalLM

    from mathrl.plan.arch import hf_config
    from mathrl.rollout import weight_sync as ws

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config(load_config(None, [])))
    return ws.plan_buckets(ws.tensor_specs(model.state_dict().items()), bucket_bytes=int(bucket_mb * 2**20))


def test_a_vllm_generator_on_a_gpu_of_its_own():
    cfg = load_config(None, ["rollout.max_staleness=1", "rollout.engine=vllm", "rollout.vllm.gpu_memory_utilization=0.4"])
    plan = estimate_memory(cfg, gpus=2, gpu_mem_gib=80, trainer_gpus=[0])
    (gen,) = plan.generators
    assert (gen.gpu, gen.engine, gen.bytes, gen.share) == (1, "vLLM", 32 * GIB, 0.4)  # 0.4 x 80 GiB, from the config
    assert plan.backend == "nccl"  # a GPU of its own: weights over NCCL through one staging bucket on GPU 0
    buckets = _tiny_buckets()
    assert plan.staging == max(b.nbytes for b in buckets) == TINY_VERSION
    assert plan.host == {"kept policy versions": 2 * TINY_VERSION} and sum(b.nbytes for b in buckets) == TINY_VERSION
    # the trainer's own vLLM engine only evaluates: 32 GiB then, nothing while it updates
    assert plan.generation_peak == 0 and plan.evaluation_peak == TINY_RESIDENT + 32 * GIB
    assert plan.update_peak == TINY_RESIDENT + sum(plan.components[k] for k in ("grads", "activations", "gathered weights", "head gradients"))
    gpu0, gpu1, host = plan.loads
    assert gpu0.parts == (("trainer", TINY_RESIDENT + 32 * GIB), ("weight staging bucket", TINY_VERSION))
    assert gpu1.parts == (("generator 0 vLLM", 32 * GIB),) and gpu1.describe() == "GPU 1: generator 0 vLLM 32.00 GiB of 80 GiB (40%)"
    assert host.parts == (("kept policy versions", 2 * TINY_VERSION),) and host.capacity is None
    assert plan.fits and generator_layout_error(cfg, trainer_gpus=[0], gpus=2, gpu_mem_gib=80) is None


def test_a_vllm_generator_sharing_the_trainers_gpu():
    cfg = load_config(None, ["rollout.max_staleness=1", "rollout.engine=vllm"])  # gpu_memory_utilization 0.5
    plan = estimate_memory(cfg, gpus=1, gpu_mem_gib=80)
    assert plan.backend == "gloo" and plan.staging == 0  # NCCL refuses two ranks on one device
    (gpu0, _host) = plan.loads
    # trainer: its states + its evaluation engine's 40 GiB; the generator's 40 GiB beside them
    assert gpu0.parts == (("trainer", TINY_RESIDENT + 40 * GIB), ("generator 0 vLLM", 40 * GIB))
    assert gpu0.over == TINY_RESIDENT and not plan.fits  # 9,615,560 B + 1 GiB = 1.009 GiB too much
    line = "GPU 0: trainer 41.01 GiB + generator 0 vLLM 40.00 GiB = 81.01 GiB > 80 GiB (over by 1.01 GiB)"
    assert gpu0.describe() == line
    error = generator_layout_error(cfg, trainer_gpus=[0], gpus=1, gpu_mem_gib=80)
    assert error is not None and line in error and "\n" not in error and "rollout.vllm.gpu_memory_utilization" in error
    # 0.3 each: 24 + 24 GiB beside 1.01 GiB of states
    low = load_config(None, ["rollout.max_staleness=1", "rollout.engine=vllm", "rollout.vllm.gpu_memory_utilization=0.3"])
    assert generator_layout_error(low, trainer_gpus=[0], gpus=1, gpu_mem_gib=80) is None
    # 0.6 each: the two vLLM shares of GPU 0 alone exceed it
    high = load_config(None, ["rollout.max_staleness=1", "rollout.engine=vllm", "rollout.vllm.gpu_memory_utilization=0.6"])
    error = generator_layout_error(high, trainer_gpus=[0], gpus=1, gpu_mem_gib=80)
    assert "GPU 0: vLLM shares the trainer's evaluation engine 0.6 + generator 0 0.6 = 1.2 > 1" in error


def test_two_vllm_generators_on_own_gpus_and_on_one():
    base = ["rollout.max_staleness=1", "rollout.engine=vllm", "rollout.vllm.gpu_memory_utilization=0.6",
            "rollout.generator.workers=2", "data.dynamic_sampling.mode=none"]
    cfg = load_config(None, base)
    plan = estimate_memory(cfg, gpus=4, gpu_mem_gib=80, trainer_gpus=[0, 1])
    assert [(g.gpu, g.bytes) for g in plan.generators] == [(2, 48 * GIB), (3, 48 * GIB)]  # 0.6 x 80 GiB each
    assert plan.backend == "nccl" and plan.fits
    assert generator_layout_error(cfg, trainer_gpus=[0, 1], gpus=4, gpu_mem_gib=80) is None
    shared = load_config(None, [*base, "rollout.generator.devices=[2]"])
    plan = estimate_memory(shared, gpus=4, gpu_mem_gib=80, trainer_gpus=[0, 1])
    assert plan.backend == "gloo" and [g.gpu for g in plan.generators] == [2, 2]
    gpu2 = next(load for load in plan.loads if load.name == "GPU 2")
    assert gpu2.total == 96 * GIB and gpu2.over == 16 * GIB
    error = generator_layout_error(shared, trainer_gpus=[0, 1], gpus=4, gpu_mem_gib=80)
    assert "GPU 2: vLLM shares generator 0 0.6 + generator 1 0.6 = 1.2 > 1" in error
    assert "GPU 0" not in error and "GPU 1" not in error  # the trainer's GPUs hold no generator


def test_a_torch_engine_generator():
    # its own float32 copy 3,205,120 B; a KV cache of min(rollout.batch_size 512, 128 rows) x (512 + 48 -> 576,
    # the lean loop's 64-column blocks) tokens x 512 (K and V: 2 x 4 layers x 2 kv heads x 32) x 4 B
    # = 150,994,944 B; the 1 GiB runtime
    cfg = load_config(None, ["rollout.max_staleness=1"])
    plan = estimate_memory(cfg, gpus=2, gpu_mem_gib=80, trainer_gpus=[0])
    (gen,) = plan.generators
    assert (gen.gpu, gen.engine, gen.share) == (1, "torch", None)
    assert gen.bytes == 3_205_120 + 150_994_944 + GIB
    # the trainer's torch engine evaluates from its own module: its bf16 KV cache 128 x 576 x 512 x 2 B
    assert plan.evaluation_peak == TINY_RESIDENT + 75_497_472
    # sharing a 1 GiB GPU: over, and the fix named is the torch engine's
    error = generator_layout_error(cfg, trainer_gpus=[0], gpus=1, gpu_mem_gib=1)
    assert error.startswith("rollout.generator: the generators do not fit: GPU 0: trainer ") and "rollout.batch_size" in error


def test_a_cpu_run_puts_everything_in_host_memory():
    cfg = load_config(None, ["rollout.max_staleness=1", "train.device=cpu"])
    plan = estimate_memory(cfg, gpus=0, gpu_mem_gib=80, host_mem_gib=0.1)
    assert "runtime" not in plan.components and "gathered weights" not in plan.components  # float32 compute
    (gen,) = plan.generators
    assert (gen.gpu, gen.bytes) == (None, 3_205_120 + 150_994_944)  # no CUDA context on a CPU
    assert plan.evaluation_peak == 3_205_120 + 6_410_440 + 150_994_944  # the trainer's float32 KV cache
    (host,) = plan.loads
    assert host.parts == (("trainer", plan.total), ("generator 0 torch", gen.bytes), ("kept policy versions", 2 * TINY_VERSION))
    assert host.capacity == int(0.1 * GIB) and not plan.fits
    assert "DOES NOT FIT: host: trainer" in format_plan(plan)
    unchecked = estimate_memory(cfg, gpus=0, gpu_mem_gib=80)
    assert unchecked.fits and "give --host-mem" in format_plan(unchecked)
    assert generator_layout_error(cfg, trainer_gpus=[], gpus=0, gpu_mem_gib=80) is None


def test_dapo_7b_with_one_generator_on_8_gpus():
    cfg = load_config("recipes/real/dapo_qwen2.5_math_7b.yaml", ["rollout.max_staleness=1"], check_paths=False)
    plan = estimate_memory(cfg, gpus=8, gpu_mem_gib=80)  # the trainer on all 8: the generator shares GPU 0
    gpu0 = plan.loads[0]
    assert gpu0.parts == (("trainer", plan.total), ("generator 0 vLLM", 64 * GIB))  # 0.8 x 80 GiB
    assert gpu0.over == plan.total - 16 * GIB > 0 and plan.loads[1].fits
    text = format_plan(plan)
    assert f"DOES NOT FIT: {gpu0.describe()}" in text and "--trainer-gpus 7" in text
    assert f"GPU 1-7: trainer {plan.total / GIB:.2f} GiB of 80 GiB" in text  # the seven alike in one row
    error = generator_layout_error(cfg, trainer_gpus=list(range(8)), gpus=8, gpu_mem_gib=80, arch=plan.arch)
    assert "GPU 0: vLLM shares the trainer's evaluation engine 0.8 + generator 0 0.8 = 1.6 > 1" in error
    # seven trainer ranks: the generator has GPU 7; weights over NCCL through a staging bucket the size of
    # the largest tensor (the embeddings, 152,064 x 3,584 x 4 B > 256 MiB); two float32 versions on the host
    own = estimate_memory(cfg, gpus=8, gpu_mem_gib=80, trainer_gpus=list(range(7)), arch=plan.arch)
    assert own.fits and own.backend == "nccl" and own.generators[0].gpu == 7
    assert own.staging == 152_064 * 3_584 * 4
    assert own.host["kept policy versions"] == 2 * 7_615_616_512 * 4
    assert own.loads[0].parts[1] == ("weight staging bucket", 152_064 * 3_584 * 4)
    assert generator_layout_error(cfg, trainer_gpus=list(range(7)), gpus=8, gpu_mem_gib=80, arch=plan.arch) is None


def test_cli_plans_the_generators(capsys):
    argv = ["plan", "model.path=config:qwen2.5-0.5b", "model.init=random", "rollout.max_staleness=1", "--gpus", "2"]
    assert main([*argv, "--trainer-gpus", "1"]) == 0
    out = capsys.readouterr().out
    assert "generator 0 torch" in out and "GPU 1: generator 0 torch" in out and "kept policy versions" in out
    assert main([*argv, "--trainer-gpus", "3"]) != 0
    assert "--trainer-gpus must be between 1 and --gpus (2)" in capsys.readouterr().err


def test_plan_states_the_setup_time_of_the_base_model(tmp_path, monkeypatch, capsys):
    # Bug story: the tool recipes' base-model builds (5.5 and 17.5 min) were stated only in docs/findings.md,
    # and `mathrl plan` on them reported GPU memory only. Its last line now says what the run does first.
    from mathrl.model.tiny import recipe_hash
    from mathrl.plan.setup_time import MEASURED_BUILDS, setup_time

    monkeypatch.setenv("MATHRL_CACHE", str(tmp_path / "empty-cache"))  # nothing built here
    for recipe, minutes in [("recipes/arith_tools.yaml", "5.5 min"), ("recipes/arith_tools_mul.yaml", "17.5 min")]:
        cfg = load_config(recipe, check_paths=False)
        assert recipe_hash(cfg.base) in MEASURED_BUILDS  # a changed base-model recipe needs its build measured again
        line = setup_time(cfg)
        assert line.startswith("setup: the tiny base model of this recipe is not cached: the run builds it first "
                               "(1500 pretraining steps; measured: ") and minutes in line
    assert recipe_hash(load_config(None, []).base) in MEASURED_BUILDS
    # a base never measured: an estimate, and said to be one (800 steps' 0.10-0.70 s per step, from the table)
    assert "an estimate, not a measurement: 3-23 min" in setup_time(load_config(None, ["base.steps=2000"]))
    assert main(["plan", "recipes/arith_tools.yaml", "--gpus", "0"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert next(x for x in out if x.startswith("setup: ")).startswith("setup: the tiny base model of this recipe is not cached")
    assert out[-1] == "launch: mathrl train recipes/arith_tools.yaml"  # --gpus 0: one process on the CPU
    built = tmp_path / "empty-cache" / "base" / f"tiny-arith-{recipe_hash(load_config(None, []).base)}"
    built.mkdir(parents=True)
    (built / "model.safetensors").write_bytes(b"")
    assert setup_time(load_config(None, [])) == f"setup: the tiny base model of this recipe is cached ({built}): no build"
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    hub = load_config(None, ["model.path=SomeOrg/some-model"], check_paths=False)
    assert setup_time(hub) == "setup: SomeOrg/some-model is not cached (the local Hugging Face cache): the run downloads it first"
    # Bug story: under HF_HUB_OFFLINE=1 the plan said "the run downloads it first"; the run stopped instead
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert setup_time(hub) == ("setup: SomeOrg/some-model is not cached, and HF_HUB_OFFLINE is set: the run will stop; "
                               "download it first with `hf download SomeOrg/some-model` where the hub is reachable")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))  # not cached, whatever this machine holds
    capsys.readouterr()
    assert main(["plan", "model.path=Qwen/Qwen2.5-Math-1.5B", "--gpus", "8"]) == 1  # it fits (built-in data), but the run would stop
    out = capsys.readouterr().out
    assert "fits: peak" in out and "HF_HUB_OFFLINE is set: the run will stop" in out


@pytest.mark.parametrize("gpus, trainer_gpus, expected, why", [
    (0, None, "launch: mathrl train r.yaml train.steps=5", "a CPU run: one process"),
    (1, None, "launch: mathrl train r.yaml train.steps=5", "one GPU: one process"),
    (8, None, "launch: mathrl train --nproc 8 r.yaml train.steps=5", "one machine: a rank per GPU"),
    (8, 7, "launch: mathrl train --nproc 7 r.yaml train.steps=5", "the generator process takes GPU 7"),
    (32, None, "launch, on each of the 4 machines (8 GPUs each), from a directory they share: torchrun --nnodes 4 "
               "--nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint NODE0:29500 --rdzv-id r -m mathrl.train r.yaml "
               "train.steps=5", "more GPUs than a machine has: torchrun on each machine"),
])
def test_plan_prints_the_launch_line_of_its_plan(gpus, trainer_gpus, expected, why):
    from mathrl.plan.setup_time import launch_line

    assert launch_line("r.yaml", ["train.steps=5"], gpus=gpus, trainer_gpus=trainer_gpus) == expected, why


def test_plan_checks_the_recipes_data_files(tmp_path, monkeypatch, capsys):
    # Bug story: `mathrl plan` passed a recipe whose data files were not there; the run stopped on them later
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.jsonl").write_text('{"problem": "1+1", "answer": "2"}\n')
    code = main(["plan", "data.train=train.jsonl", "data.eval=[missing.jsonl]", "--gpus", "0"])
    out = capsys.readouterr().out.splitlines()
    assert "data: data.train train.jsonl: found" in out
    assert f"data: data.eval missing.jsonl: no such file (from {tmp_path}): the run will stop; run from the directory the " \
           "recipe's paths are relative to, or override the key" in out
    assert code == 1  # the run would stop: the plan says no


# Distillation's teacher, by hand. Qwen2.5-1.5B (hidden 1536, MLP 8960, 28 layers, 12 heads / 2 kv, head dim 128,
# vocab 151,936, tied): per layer q 1536*1536+1536, k and v 2*(1536*256+256), o 1536*1536 -> 5,507,072; MLP
# 3*1536*8960 = 41,287,680; 2 norms 3,072 -> 46,797,824; model 28 layers + embeddings 151,936*1536 + final norm
# 1,536 = 1,543,714,304; outside the layers 233,375,232. The student Qwen2.5-0.5B has the same vocabulary.
TEACHER_1_5B = -(-1_543_714_304 * 2 // 4) + (2 * 46_797_824 + 233_375_232) * 2  # bf16 shards / 4 + gathered layers
LOGITS = 8192 * 151_936 * 4  # train.micro_batch_tokens x vocabulary, float32
STUDENT = ["model.path=config:qwen2.5-0.5b", "model.init=random", "model.dtype=bfloat16"]


@pytest.mark.parametrize("overrides, model, topk, why", [
    (["algo.distill.mode=reverse_kl", "teacher.path=config:qwen2.5-1.5b"], TEACHER_1_5B, False,
     "teacher.path: a second frozen model, sharded and gathered like the reference; only its pass holds the logits"),
    (["algo.distill.mode=forward_kl_topk", "teacher.path=config:qwen2.5-1.5b"], TEACHER_1_5B, True,
     "a top-k mode: the update holds the student's full logits beside its activations"),
    (["algo.distill.mode=jsd", "teacher.self=true"], -(-494_032_768 * 2 // 4) + (2 * 14_912_384 + 136_135_552) * 2,
     True, "teacher.self: a frozen copy of the starting model (Qwen2.5-0.5B: 494,032,768 params, 14,912,384 a layer)"),
    (["algo.distill.mode=reverse_kl", "teacher.self=true", "teacher.self_update=true"], 0, False,
     "teacher.self_update: the policy itself scores, no second model, but its pass still holds the logits"),
])
def test_the_teacher_is_counted_in_the_trainer(overrides, model, topk, why):
    cfg = load_config(None, [*STUDENT, *overrides], check_paths=False)
    plan = estimate_memory(cfg, gpus=4, gpu_mem_gib=80)
    assert plan.components["teacher model"] == model, why
    assert plan.components["teacher logits"] == LOGITS, why
    c = plan.components
    resident = sum(v for k, v in c.items() if k not in ("grads", "activations", "gathered weights", "head gradients",
                                                         "teacher logits", "torch engine weights", "torch engine KV cache"))
    update = c["grads"] + c["activations"] + c["gathered weights"] + c["head gradients"] + (LOGITS if topk else 0)
    assert plan.update_peak == resident + c["torch engine weights"] + max(update, LOGITS), why


def test_no_teacher_no_teacher_memory_and_a_missing_teacher_config_is_one_line():
    plain = estimate_memory(load_config(None, STUDENT, check_paths=False), gpus=4, gpu_mem_gib=80)
    assert "teacher model" not in plain.components and "teacher logits" not in plain.components
    with_teacher = estimate_memory(load_config(None, [*STUDENT, "algo.distill.mode=reverse_kl",
                                                      "teacher.path=config:qwen2.5-1.5b"], check_paths=False),
                                   gpus=4, gpu_mem_gib=80)
    assert with_teacher.total > plain.total  # the teacher's weights stay for the whole run
    cfg = load_config(None, [*STUDENT, "algo.distill.mode=reverse_kl", "teacher.path=/nonexistent/teacher"],
                      check_paths=False)
    with pytest.raises(ValueError, match=r"^teacher.path='/nonexistent/teacher': its config.json is not on this machine"):
        estimate_memory(cfg, gpus=4, gpu_mem_gib=80)


@pytest.mark.parametrize("mode, logits, why", [
    ("reverse_kl", None, "the server's pass holds its logits on its own machine; reverse_kl's update needs none"),
    ("forward_kl_topk", LOGITS, "a top-k mode's update still holds the student's full logits here"),
])
def test_a_teacher_server_holds_nothing_in_the_trainer(mode, logits, why):
    cfg = load_config(None, [*STUDENT, f"algo.distill.mode={mode}", "teacher.url=http://10.0.0.2:8100"], check_paths=False)
    plan = estimate_memory(cfg, gpus=4, gpu_mem_gib=80)
    assert plan.components["teacher model"] == 0, why
    assert plan.components.get("teacher logits") == logits, why


@pytest.mark.parametrize("gpus, want, why", [
    (1, int(0.3 * 80 * 2**30), "on a GPU: its engine's share, teacher.gpu_memory_utilization (0.3) x 80 GiB"),
    (0, 1_543_714_304 * 2 + 2**30, "on a CPU: its bfloat16 weights (Qwen2.5-1.5B, above) and vLLM's 1 GiB KV cache"),
])
def test_a_vllm_teacher_is_its_engines_memory_not_the_trainers(gpus, want, why):
    cfg = load_config(None, [*STUDENT, "algo.distill.mode=reverse_kl", "teacher.path=config:qwen2.5-1.5b",
                             "teacher.engine=vllm"], check_paths=False)
    plan = estimate_memory(cfg, gpus=gpus, gpu_mem_gib=80)
    assert plan.components["teacher vLLM (weights + KV cache)"] == want, why
    assert "teacher model" not in plan.components and "teacher logits" not in plan.components, why
