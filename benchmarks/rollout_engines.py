"""Benchmark: rollout throughput of mathrl's TorchEngine (HF forward or lean decode loop), the vLLM engine
and Hugging Face `model.generate`.

All of them sample continuations of the same prompts (arithmetic questions + "=", each repeated
`--samples` times, `--batch` rows in all) from the same weights, at temperature 1.0 with top_p 1.0, and
stop a row at EOS. Every runner returns or computes the logprobs of its sampled tokens (HF:
`output_logits=True` plus the log_softmax/gather that the engines do), so they do the same job. Token
counts differ between runners with different random draws (rows stop at different EOS), so the table
compares tokens/s. Runners are interleaved after one warm-up call each; the table reports the median call.

The torch engine's runners: `torch` (`rollout.decode: hf`, the Hugging Face forward at every token),
`lean` (`rollout.decode: lean`, rollout/lean.py's forward over a preallocated cache) and `lean-compiled`
(the same with its one-token step compiled by torch.compile; every shape is compiled before the
warm-up call, `LeanDecoder.warm_up`, and the time it took is reported). The three use the same seeds
and draw the same samples (the table says whether they did), so their tokens/s compare like for like;
`vs torch` per round is each runner's tokens/s over torch's in the same round. `--memory` runs each
runner again in a fresh process and reports its peak resident memory (whole process; and during
one timed call after the warm-up).

    python benchmarks/rollout_engines.py                                   # tiny base model, CPU
    python benchmarks/rollout_engines.py --batch 128 --samples 8 --runners torch lean lean-compiled \
        --threads 1 --repeats 3 --memory                                   # the tiny default's rollout
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
import subprocess
import sys
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
RUNNERS = ("torch", "lean", "lean-compiled", "vllm", "hf")
TORCH_ENGINE = {"torch": {}, "lean": {"decode": "lean"}, "lean-compiled": {"decode": "lean", "compile": True}}


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
                        help="default: torch, lean and hf, and vllm where it is installed")
    parser.add_argument("--samples", type=int, default=4, help="samples per question (rollout.n; the default run's is 8)")
    parser.add_argument("--memory", action="store_true",
                        help="also measure each runner's peak resident memory, each in a fresh process")
    parser.add_argument("--rss-child", default=None, help=argparse.SUPPRESS)  # internal: one runner's memory
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args()

    console = Console()
    if args.rss_child is not None:
        args.runners = [args.rss_child]
    if args.runners is None:
        args.runners = [n for n in RUNNERS if n != "lean-compiled" and (n != "vllm" or importlib.util.find_spec("vllm"))]
        if "vllm" not in args.runners:
            console.print("vLLM is not installed: timing torch, lean and hf only")
    torch.set_num_threads(args.threads)
    model, tokenizer, description = load_policy(args.arch, args.model, dtype=args.dtype, device=args.device)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    questions = [p.question for p in ArithmeticTask().heldout_problems(max(1, args.batch // args.samples))]
    prompts = [tokenizer(q + "=")["input_ids"] for q in questions for _ in range(args.samples)]  # like rollout.n
    prompts = prompts[: args.batch]
    longest = max(len(p) for p in prompts) + args.max_new_tokens
    params = sum(p.numel() for p in model.parameters())
    console.print(f"model: {description} ({params / 1e6:.1f}M parameters, {args.dtype}, {args.device}); "
                  f"torch {torch.__version__}, transformers {transformers.__version__}, threads {args.threads}; "
                  f"{len(prompts)} rows x up to {args.max_new_tokens} new tokens")

    calls, setup, samples = {}, {}, {}
    rss_after_load = _rss_mb("VmRSS")
    for name in [n for n in TORCH_ENGINE if n in args.runners]:
        engine = TorchEngine(model, eos_token_id=eos, pad_token_id=pad, batch_size=len(prompts), **TORCH_ENGINE[name])
        if name != "torch" and engine.lean is None:
            raise SystemExit(f"{name}: the lean decode loop does not support this model (see the log line above)")
        if name == "lean-compiled":
            t0 = time.perf_counter()
            engine.lean.warm_up(len(prompts), longest)
            setup[name] = {"compile_seconds": time.perf_counter() - t0}
            console.print(f"{name}: compiled every batch bucket in {setup[name]['compile_seconds']:.1f} s")

        def torch_call(seed, engine=engine, name=name):
            out = engine.generate(prompts, max_new_tokens=args.max_new_tokens, temperature=TEMPERATURE, seed=seed)
            samples[name, seed] = out.response_ids
            return int(out.response_mask.sum()), float(out.rollout_logprobs.sum())
        calls[name] = torch_call
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
            return int(out.response_mask.sum()), float(out.rollout_logprobs.sum())
        calls["vllm"] = vllm_call
    names = [n for n in RUNNERS if n in calls]

    for name in names:  # warm-up: lazy init, allocator, first-call compilation
        calls[name](args.seed)
    if args.rss_child is not None:  # one timed call; the peak resident memory during it and over the process
        peak_so_far = _rss_mb("VmHWM")  # not ru_maxrss: Linux carries that over from the parent through exec
        _reset_peak_rss()
        calls[args.rss_child](args.seed + 1)
        peak_call = _rss_mb("VmHWM")
        print(json.dumps({"rss_after_load_mb": rss_after_load, "peak_rss_call_mb": peak_call,
                          "peak_rss_process_mb": max(peak_so_far, peak_call)}))
        return
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

    memory = {name: _memory_of(name) for name in names} if args.memory else {}
    results = {}
    for name in names:
        tps = [t / s for t, s in zip(tokens[name], times[name])]
        results[name] = {
            "seconds": times[name], "tokens": tokens[name], "median_seconds": statistics.median(times[name]),
            "tokens_per_second": tps, "tokens_per_second_median": statistics.median(tps),
            "tokens_per_second_max": max(tps), "mean_token_logprob": sum(lp_sums[name]) / max(1, sum(tokens[name])),
            **setup.get(name, {}), **memory.get(name, {}),
        }
        if "torch" in results:  # per round: tokens/s over torch's in the same round
            results[name]["ratio_vs_torch"] = [a / b for a, b in zip(tps, results["torch"]["tokens_per_second"])]
        if name in TORCH_ENGINE and "torch" in names:  # same seeds, same sampler: the same samples?
            results[name]["same_samples_as_torch"] = all(
                samples[name, s].equal(samples["torch", s]) for s in range(args.seed + 1, args.seed + 1 + args.repeats))
    table = Table(title=f"rollout engines: {description} ({args.device}, {args.dtype}, {len(prompts)} rows, "
                        f"<= {args.max_new_tokens} new tokens, {args.threads} threads, median of {args.repeats})")
    columns = ["runner", "median s", "tokens / call", "tokens/s (median)", "tokens/s (best)", "vs torch (rounds)",
               "same samples", "mean logprob"] + (["peak RSS MB: call / process (after load)"] if memory else [])
    for col in columns:
        table.add_column(col, justify="left" if col == "runner" else "right")
    for name in names:
        r = results[name]
        ratios = r.get("ratio_vs_torch")
        table.add_row(name, f"{r['median_seconds']:.3f}", f"{statistics.median(r['tokens']):.0f}",
                      f"{r['tokens_per_second_median']:.0f}", f"{r['tokens_per_second_max']:.0f}",
                      "-" if ratios is None else f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})",
                      {True: "yes", False: "NO", None: "-"}[r.get("same_samples_as_torch")],
                      f"{r['mean_token_logprob']:.4f}",
                      *([f"{r['peak_rss_call_mb']:.0f} / {r['peak_rss_process_mb']:.0f} ({r['rss_after_load_mb']:.0f})"]
                        if memory else []))
    console.print(table)
    console.print("vs torch = tokens/s over TorchEngine's (HF forward) in the same round, median (min-max) over the "
                  "rounds; > 1: faster. The torch engine's runners draw the same samples from the same seeds; mean "
                  "logprob per sampled token must agree between all runners up to sampling noise.")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "model": description, "parameters": params, "arch": args.arch, "device": args.device, "dtype": args.dtype,
            "batch": len(prompts), "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
            "threads": args.threads, "torch": torch.__version__, "transformers": transformers.__version__,
            "machine": platform.platform(), "samples": args.samples, "cpu": _cpu_model(), "results": results,
        }, indent=2))
        console.print(f"wrote {args.out}")


def _rss_mb(field: str) -> float:
    """A memory line of /proc/self/status (VmRSS: resident now; VmHWM: the peak since the last reset), in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _reset_peak_rss() -> None:
    """Set VmHWM back to the current resident size (Linux: "5" into clear_refs)."""
    Path("/proc/self/clear_refs").write_text("5")


def _memory_of(name: str) -> dict:
    """Run this script again with only runner `name`, in a fresh process (`--rss-child`): its peak memory."""
    argv = [a for a in sys.argv[1:] if a != "--memory"]
    if "--out" in argv:
        i = argv.index("--out")
        del argv[i : i + 2]
    done = subprocess.run([sys.executable, __file__, *argv, "--rss-child", name], capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


if __name__ == "__main__":
    main()
