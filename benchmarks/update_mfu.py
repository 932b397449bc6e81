"""Benchmark: throughput and model FLOPs utilisation (MFU) of the policy update on a real architecture.

One update step is what `train/update.py` does per micro-batch, on random token ids: the scoring
forward of mathrl (`model.scoring.response_logprobs`: the decoder over prompt + response, the lm head
in chunks over the response positions), a policy-gradient surrogate loss on random advantages, the
backward, gradient clipping at norm 1 and an AdamW step. The model is a shipped architecture with
random weights (`model.init=random`, no download). Under torchrun every rank shards the model with
FSDP2 exactly as training does (`train.dist.shard_model`: fp32 master weights and optimizer state, bf16
compute with train.dist.mixed_precision on CUDA); in one process it runs unsharded in --dtype.

    python benchmarks/update_mfu.py --arch tiny --batch 2 --prompt 16 --response 48   # CPU, seconds
    torchrun --standalone --nproc_per_node 1 benchmarks/update_mfu.py --arch qwen2.5-1.5b \\
        --batch 8 --prompt 128 --response 896 --out update_mfu.json                     # one GPU, FSDP2 bf16

FLOPs per step (model FLOPs: matmuls of the forward and backward, backward = 2 x forward), with B rows,
S = prompt + response positions, T = response positions, L layers, query width d = heads x head_dim:

    6 * N_layers * B * S            the decoder layers' weights (N_layers: their parameters)
  + 6 * V * H * B * T               the lm head, applied to the response positions only
  + 6 * L * d * (S + 1) * B * S     causal attention: QK^T and AV cost 4 * d * ctx per token and layer
                                    in the forward, ctx averages (S + 1) / 2 over the positions

Not counted: the embedding lookup, norms, softmax, the optimizer, and recomputation (with
--gradient-checkpointing: hardware work, not model work). tests/project/test_update_mfu.py checks the three
terms against torch's FLOP counter on a small model. MFU = FLOPs per
step / step seconds / the device's dense bf16 peak, from PEAK_TFLOPS by device name or --peak-tflops.
On CPU it reports tokens/s only. Numbers are per rank (each rank runs --batch rows).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

# dense (no sparsity) bf16 tensor-core peak, TFLOP/s, from NVIDIA's datasheets; the first name that is
# a substring of torch.cuda.get_device_name() wins, so the more specific names come first
PEAK_TFLOPS = [
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H200", 989.0),
    ("H100", 989.0),  # SXM
    ("GH200", 989.0),
    ("B200", 2250.0),
    ("A100", 312.0),
    ("L40S", 362.0),
    ("L4", 121.0),
]


def peak_tflops(device_name: str) -> float | None:
    for key, tflops in PEAK_TFLOPS:
        if key in device_name:
            return tflops
    return None


def build_config(arch: str):
    """The transformers config of `arch`: a shipped architecture, a config.json path, or `tiny` (the
    tiny base model's shape, for a dry run on CPU)."""
    from mathrl.model.init import architecture_config

    if arch != "tiny":
        return architecture_config(arch)
    from transformers import Qwen2Config

    from mathrl.config import BaseModelConfig

    b = BaseModelConfig()
    return Qwen2Config(vocab_size=99, hidden_size=b.hidden_size, intermediate_size=b.intermediate_size,
                       num_hidden_layers=b.num_layers, num_attention_heads=b.num_heads,
                       num_key_value_heads=b.num_kv_heads, max_position_embeddings=4096, tie_word_embeddings=True,
                       pad_token_id=0, eos_token_id=1, bos_token_id=None)


def step_flops(config, *, layer_params: int, batch: int, prompt: int, response: int) -> dict[str, float]:
    """Model FLOPs of one update step, by term (see the module docstring)."""
    s = prompt + response
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    d = config.num_attention_heads * head_dim
    layers = config.num_hidden_layers
    return {
        "layers": 6 * layers * layer_params * batch * s,
        "lm_head": 6 * config.vocab_size * config.hidden_size * batch * response,
        "attention": 6 * layers * d * (s + 1) * batch * s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="qwen2.5-1.5b", help="a shipped architecture (mathrl/model/configs), "
                        "a config.json path, or tiny")
    parser.add_argument("--batch", type=int, default=8, help="rows per step (per rank)")
    parser.add_argument("--prompt", type=int, default=128, help="prompt tokens per row")
    parser.add_argument("--response", type=int, default=896, help="response tokens per row")
    parser.add_argument("--steps", type=int, default=5, help="timed steps (after --warmup)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (allocator, kernels)")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                        help="as train.device: auto = this rank's GPU when CUDA is available, else the CPU")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                        help="weights and optimizer state in one process (under torchrun: fp32 master weights, "
                        "bf16 compute on CUDA)")
    parser.add_argument("--chunk-size", type=int, default=1024, help="model.logprob_chunk_size")
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="the device's dense bf16 peak (default: looked up by device name)")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here (rank 0)")
    args = parser.parse_args()

    from mathrl.model.init import build_random_model
    from mathrl.model.scoring import response_logprobs
    from mathrl.train.dist import close_distributed, init_distributed, shard_model

    ranks = init_distributed(timeout_s=600, device=args.device)  # the device rule of train.device
    device = ranks.device
    config = build_config(args.arch)
    model_dtype = "float32" if ranks.joined else args.dtype  # sharded: fp32 master weights, as in training
    model, _ = build_random_model(config, dtype=model_dtype, device=device, seed=0)
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    layer_params = sum(p.numel() for p in model.model.layers[0].parameters())
    params = sum(p.numel() for p in model.parameters())
    mixed = ranks.joined and device.type == "cuda"
    if ranks.joined:
        model = shard_model(model, ranks, mixed_precision=True, cpu_offload=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, betas=(0.9, 0.99))

    gen = torch.Generator().manual_seed(ranks.rank)
    b, p, t = args.batch, args.prompt, args.response
    prompt_ids = torch.randint(2, config.vocab_size, (b, p), generator=gen)
    response_ids = torch.randint(2, config.vocab_size, (b, t), generator=gen)
    prompt_mask, response_mask = torch.ones(b, p, dtype=torch.bool), torch.ones(b, t, dtype=torch.bool)
    advantages = torch.randn(b, 1, generator=gen).to(device)
    mask = response_mask.to(device).float()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def update() -> None:
        logprobs, _ = response_logprobs(model, prompt_ids, prompt_mask, response_ids, response_mask,
                                        chunk_size=args.chunk_size, with_entropy=False)
        ratio = torch.exp(logprobs - logprobs.detach())  # [B, T]: 1 in value, the policy gradient in grad
        loss = -(ratio * advantages * mask).sum() / mask.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(args.warmup):
        update()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for _ in range(args.steps):
        sync()
        t0 = time.perf_counter()
        update()
        sync()
        times.append(time.perf_counter() - t0)
    seconds = statistics.median(times)
    flops = step_flops(config, layer_params=layer_params, batch=b, prompt=p, response=t)
    total = sum(flops.values())
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = args.peak_tflops or (peak_tflops(device_name) if device.type == "cuda" else None)
    result = {
        "arch": args.arch, "parameters": params, "device": device_name, "ranks": ranks.world_size,
        "compute": "bf16 (FSDP2 mixed precision)" if mixed else f"{model_dtype}" + (" (FSDP2)" if ranks.joined else ""),
        "batch": b, "prompt": p, "response": t, "tokens_per_step": b * (p + t), "step_seconds": times,
        "median_step_seconds": seconds, "tokens_per_second": b * (p + t) / seconds,
        "flops_per_step": flops, "tflops_per_second": total / seconds / 1e12, "peak_tflops": peak,
        "mfu": total / seconds / (peak * 1e12) if peak else None,
        "peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
    }
    if ranks.main:
        print(f"{args.arch}: {params / 1e6:.1f}M parameters on {device_name} ({result['compute']}, "
              f"{ranks.world_size} rank(s)); {b} rows x ({p} prompt + {t} response) tokens per step")
        print(f"median step {seconds:.3f} s over {args.steps} steps ({', '.join(f'{x:.3f}' for x in times)})")
        print(f"model FLOPs per step {total / 1e12:.2f} T (layers {flops['layers'] / total:.0%}, lm head "
              f"{flops['lm_head'] / total:.0%}, attention {flops['attention'] / total:.0%})")
        mfu = (f"MFU {result['mfu']:.1%} of {peak:g} TFLOP/s bf16 peak" if peak else
               "MFU not computed (" + ("CPU" if device.type == "cpu" else f"no peak known for {device_name}: "
                                       "give --peak-tflops") + ")")
        print(f"{result['tokens_per_second']:.0f} tokens/s, {result['tflops_per_second']:.1f} TFLOP/s; {mfu}")
        if result["peak_memory_gib"] is not None:
            print(f"peak memory allocated {result['peak_memory_gib']:.1f} GiB")
        if args.out is not None:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=2))
    close_distributed()


if __name__ == "__main__":
    main()
