"""Benchmark: rollout throughput of mathrl's TorchEngine, the vLLM engine and Hugging Face `model.generate`.

All three sample continuations of the same prompts (arithmetic questions + "=", repeated to
`--batch` rows) from the same weights, at temperature 1.0 with top_p 1.0, and stop a row at EOS.
Every runner returns or computes the logprobs of its sampled tokens (HF: `output_logits=True` plus
the log_softmax/gather that the engines do), so they do the same job. Token counts differ between
runners (different random draws, rows stop at different EOS), so the table compares tokens/s.
Runners are interleaved after one warm-up call each; the table reports the median call.

    python benchmarks/rollout_engines.py                                   # tiny base model, CPU
    python benchmarks/rollout_engines.py --arch qwen2.5-0.5b --batch 16 --max-new-tokens 32 --repeats 2
    python benchmarks/rollout_engines.py --device cuda --dtype bfloat16 --arch qwen2.5-1.5b \\
        --batch 256 --max-new-tokens 512 --out benchmarks/results/rollout_engines_gpu.json   # a GPU machine

Models: `--arch tiny` is the cached tiny base model (`mathrl base` builds it; a random model of its
shape otherwise); `--arch <name>` is a real architecture from `mathrl/model/configs/` (Qwen2.5-0.5B,
...) with random weights and the character tokenizer padded to its vocabulary (`model.init=random`:
no download; compute and memory are those of the real model, the samples are noise and rarely
stop); `--model DIR` is any local Hugging Face causal LM. vLLM starts from the model's config with
placeholder weights and gets the policy's weights through `update_weights`, exactly as training
syncs them, so all runners sample from identical weights.

vLLM runs in-process and, on CPUs, limits torch to one thread once it starts; every runner is
therefore timed with `--threads` (default 1) so they share the same budget. The mean logprob per
sampled token must agree between runners up to sampling noise: a check that all three sample the
same distribution.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
import transformers
from rich.console import Console
from rich.table import Table

from mathrl.config import BaseModelConfig, VLLMConfig
from mathrl.model.tiny import base_model_dir, build_char_tokenizer
from mathrl.rollout.base import left_pad
from mathrl.rollout.engine import TorchEngine
from mathrl.tasks.arithmetic import ArithmeticTask

TEMPERATURE = 1.0
RUNNERS = ("torch", "vllm", "hf")


def load_policy(arch: str, model_dir: str | None, *, dtype: str, device: str):
    """(model, tokenizer, description) on `device` in `dtype`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from mathrl.model.io import DTYPES

    if model_dir is None and arch == "tiny" and (base_model_dir(BaseModelConfig()) / "model.safetensors").exists():
        model_dir = str(base_model_dir(BaseModelConfig()))
    if model_dir is not None:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=DTYPES[dtype])
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        description = model_dir
    elif arch == "tiny":
        c, tokenizer = BaseModelConfig(), build_char_tokenizer()
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(Qwen2Config(
            vocab_size=len(tokenizer), hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
            num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads, num_key_value_heads=c.num_kv_heads,
            max_position_embeddings=c.max_positions, tie_word_embeddings=True,
            pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
        )).to(DTYPES[dtype])
        description = "random-init Qwen2 of the tiny base model's shape (no cached base model)"
    else:
        from mathrl.model.init import build_random_model

        model, tokenizer = build_random_model(arch, dtype=dtype, device="cpu", seed=0)
        description = f"{arch} architecture, random weights (model.init=random)"
    # neutral sampling defaults: a directory's generation_config.json must not add top_k, penalties, ...
    model.generation_config = GenerationConfig(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    return model.to(device).eval(), tokenizer, description


def build_vllm(model, tokenizer, *, dtype: str, max_model_len: int, kv_cache_gb: float | None, eager: bool | None):
    """A VLLMEngine on the policy's config with placeholder weights, then synced from the policy."""
    from mathrl.rollout.vllm_engine import VLLMEngine

    config_dir = Path(tempfile.mkdtemp(prefix="mathrl-bench-vllm-"))
    model.config.to_json_file(config_dir / "config.json")
    settings = VLLMConfig(max_model_len=max_model_len, kv_cache_gb=kv_cache_gb, enforce_eager=eager,
                          gpu_memory_utilization=0.6)
    t0 = time.perf_counter()
    engine = VLLMEngine(config_dir, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                        settings=settings, dtype=dtype, load_format="dummy")
    start = time.perf_counter() - t0
    engine.update_weights(model.state_dict().items())
    return engine, start, engine.last_sync_seconds


def hf_generate(model, prompts, *, pad: int, eos: int, max_new_tokens: int, seed: int) -> tuple[int, float]:
    """(tokens up to and including each row's EOS, sum of their logprobs) from `model.generate`."""
    device = next(model.parameters()).device
    ids, mask = left_pad(prompts, pad)
    ids, mask = ids.to(device), mask.to(device)
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=TEMPERATURE, top_k=0,
                             top_p=1.0, max_new_tokens=max_new_tokens, pad_token_id=pad, eos_token_id=eos,
                             output_logits=True, return_dict_in_generate=True)
        new = out.sequences[:, ids.shape[1]:]  # [B, T]
        lp = torch.log_softmax(torch.stack(out.logits, 1).float() / TEMPERATURE, -1).gather(-1, new[..., None])[..., 0]
        is_eos = new == eos
        lengths = torch.where(is_eos.any(-1), is_eos.float().argmax(-1) + 1, torch.tensor(new.shape[1], device=device))
        keep = torch.arange(new.shape[1], device=device)[None, :] < lengths[:, None]  # [B, T]
    return int(keep.sum()), float((lp * keep).sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="tiny", help="tiny, or a shipped architecture (qwen2.5-0.5b, ...)")
    parser.add_argument("--model", default=None, help="a local Hugging Face causal LM directory instead of --arch")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--batch", type=int, default=128, help="rows per generate call")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per runner (after one warm-up)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for every runner (CPU)")
    parser.add_argument("--kv-cache-gb", type=float, default=None, help="vLLM KV cache (default: 1 GiB on CPU, "
                        "gpu_memory_utilization 0.6 on GPU)")
    parser.add_argument("--eager", dest="eager", action="store_const", const=True, default=None,
                        help="vLLM without CUDA graphs / compilation (the default on CPUs)")
    parser.add_argument("--compiled", dest="eager", action="store_const", const=False,
                        help="vLLM with compilation (and CUDA graphs on GPUs; the default there)")
    parser.add_argument("--runners", nargs="+", default=None, choices=RUNNERS,
                        help="default: torch and hf, and vllm where it is installed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args()

    console = Console()
    if args.runners is None:
        args.runners = [n for n in RUNNERS if n != "vllm" or importlib.util.find_spec("vllm") is not None]
        if "vllm" not in args.runners:
            console.print("vLLM is not installed: timing torch and hf only")
    torch.set_num_threads(args.threads)
    model, tokenizer, description = load_policy(args.arch, args.model, dtype=args.dtype, device=args.device)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    questions = [p.question for p in ArithmeticTask().heldout_problems(max(1, args.batch // 4))]
    prompts = [tokenizer(q + "=")["input_ids"] for q in questions] * 4  # 4 samples per question, like rollout.n
    prompts = prompts[: args.batch]
    longest = max(len(p) for p in prompts) + args.max_new_tokens
    params = sum(p.numel() for p in model.parameters())
    console.print(f"model: {description} ({params / 1e6:.1f}M parameters, {args.dtype}, {args.device}); "
                  f"torch {torch.__version__}, transformers {transformers.__version__}, threads {args.threads}; "
                  f"{len(prompts)} rows x up to {args.max_new_tokens} new tokens")

    calls, setup = {}, {}
    if "torch" in args.runners:
        engine = TorchEngine(model, eos_token_id=eos, pad_token_id=pad, batch_size=len(prompts))

        def torch_call(seed, engine=engine):
            out = engine.generate(prompts, max_new_tokens=args.max_new_tokens, temperature=TEMPERATURE, seed=seed)
            return int(out.response_mask.sum()), float(out.logprobs.sum())
        calls["torch"] = torch_call
    if "hf" in args.runners:
        calls["hf"] = lambda seed: hf_generate(model, prompts, pad=pad, eos=eos, max_new_tokens=args.max_new_tokens,
                                               seed=seed)
    if "vllm" in args.runners:  # last: on CPUs vLLM pins torch to one thread once it starts
        vllm, start_s, sync_s = build_vllm(model, tokenizer, dtype=args.dtype, max_model_len=longest,
                                           kv_cache_gb=args.kv_cache_gb, eager=args.eager)
        setup["vllm"] = {"start_seconds": start_s, "weight_sync_seconds": sync_s}
        console.print(f"vLLM started in {start_s:.1f} s; weight sync {sync_s * 1000:.0f} ms")

        def vllm_call(seed):
            out = vllm.generate(prompts, max_new_tokens=args.max_new_tokens, temperature=TEMPERATURE, seed=seed)
            return int(out.response_mask.sum()), float(out.logprobs.sum())
        calls["vllm"] = vllm_call
    names = [n for n in RUNNERS if n in calls]

    for name in names:  # warm-up: lazy init, allocator, first-call compilation
        calls[name](args.seed)
    times = {n: [] for n in names}
    tokens = {n: [] for n in names}
    lp_sums = {n: [] for n in names}
    for r in range(args.repeats):
        for name in names:
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            n_tokens, lp_sum = calls[name](args.seed + 1 + r)
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - t0)
            tokens[name].append(n_tokens)
            lp_sums[name].append(lp_sum)

    results = {}
    for name in names:
        tps = [t / s for t, s in zip(tokens[name], times[name])]
        results[name] = {
            "seconds": times[name], "tokens": tokens[name], "median_seconds": statistics.median(times[name]),
            "tokens_per_second_median": statistics.median(tps), "tokens_per_second_max": max(tps),
            "mean_token_logprob": sum(lp_sums[name]) / max(1, sum(tokens[name])),
            **setup.get(name, {}),
        }
    base = results.get("torch", results[names[0]])["tokens_per_second_median"]
    table = Table(title=f"rollout engines: {description} ({args.device}, {args.dtype}, {len(prompts)} rows, "
                        f"<= {args.max_new_tokens} new tokens, median of {args.repeats})")
    for col in ("runner", "median s", "tokens / call", "tokens/s (median)", "tokens/s (best)", "vs torch",
                "mean logprob"):
        table.add_column(col, justify="left" if col == "runner" else "right")
    for name in names:
        r = results[name]
        table.add_row(name, f"{r['median_seconds']:.3f}", f"{statistics.median(r['tokens']):.0f}",
                      f"{r['tokens_per_second_median']:.0f}", f"{r['tokens_per_second_max']:.0f}",
                      f"{r['tokens_per_second_median'] / base:.2f}x", f"{r['mean_token_logprob']:.4f}")
    console.print(table)
    console.print("vs torch = tokens/s relative to TorchEngine (> 1: faster). mean logprob per sampled token must "
                  "agree between runners up to sampling noise (all sample the same distribution).")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "model": description, "parameters": params, "arch": args.arch, "device": args.device, "dtype": args.dtype,
            "batch": len(prompts), "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
            "threads": args.threads, "torch": torch.__version__, "transformers": transformers.__version__,
            "machine": platform.platform(), "results": results,
        }, indent=2))
        console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
