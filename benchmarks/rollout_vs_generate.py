"""Benchmark: mathrl's `TorchEngine.generate` against Hugging Face `model.generate`.

Both sample continuations of the same left-padded batch of arithmetic prompts (`question + "="`, the
`arith` template) from the same model, at temperature 1.0 with no top-k and no top-p truncation, with
a KV cache. Run from the repository root:

    python benchmarks/rollout_vs_generate.py                                  # defaults below
    python benchmarks/rollout_vs_generate.py --batch 128 --max-new-tokens 48 --repeats 5 \\
        --threads 2 --out benchmarks/rollout_vs_generate.json
    python benchmarks/rollout_vs_generate.py --model /path/to/hf/causal-lm   # any local HF causal LM

Model: the cached tiny base model (`mathrl base` builds it) if present, else a randomly initialised
Qwen2 of the same shape with the character tokenizer (speed does not depend on the weights).

Two modes:

* `fixed length`: nobody stops at EOS, so every row produces exactly `--max-new-tokens` tokens and
  both sides do the same work. The engine gets `eos_token_id=-1` (no sampled id equals it); HF gets
  `eos_token_id=None`, which (as a keyword of `generate` in transformers 5.x) disables the EOS
  stopping criterion. `min_new_tokens` would also force the length, but it sets the EOS logit to -inf,
  so HF would sample from a different distribution than the engine.
* `with EOS`: both stop a row at its first EOS and the batch when every row has stopped. The
  number of tokens differs between runs (different random draws), so compare tokens/s there.

The engine always returns per-token logprobs of the sampled tokens; plain `generate` does not. So
HF is timed twice: plain (`hf`), and with `output_logits=True, return_dict_in_generate=True` plus the
log_softmax/gather that turns those logits into the same logprobs (`hf+logprobs`). Runners are
interleaved (engine, hf, hf+logprobs, engine, ...) after one warm-up call each, so slow drift of a
shared machine hits all of them alike; the table reports medians (and minima). ratio = runner time /
engine time, so ratio > 1 means mathrl's engine is faster. The mean logprob per sampled token of
`engine` and `hf+logprobs` must agree up to sampling noise, which checks that both sample the same
distribution.

On a machine whose cores are busy with other work, torch's default thread count oversubscribes the
CPU and single calls vary tenfold; pass `--threads 1` there (the thread count is printed and saved).
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import statistics
import time
from pathlib import Path

import torch
import transformers
from rich.console import Console
from rich.table import Table

from mathrl.config import BaseModelConfig
from mathrl.model.tiny import base_model_dir, build_char_tokenizer
from mathrl.rollout.engine import TorchEngine, left_pad
from mathrl.tasks.arithmetic import ArithmeticTask

RUNNERS = ("engine", "hf", "hf+logprobs")
MODES = ("fixed length", "with EOS")
TEMPERATURE = 1.0  # top_p 1.0 and no top-k: plain softmax sampling on both sides


def load_model(path: str | None):
    """(model, tokenizer, description): `path`, else the cached tiny base model, else a random Qwen2 of its shape."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    if path is None:
        cached = base_model_dir(BaseModelConfig())
        if (cached / "model.safetensors").exists():
            path = str(cached)
    if path is not None:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        if tokenizer.pad_token_id is None:  # as mathrl.model.io does
            tokenizer.pad_token = tokenizer.eos_token
        description = path
    else:
        cfg = BaseModelConfig()
        tokenizer = build_char_tokenizer()
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(Qwen2Config(
            vocab_size=len(tokenizer), hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
            num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
            max_position_embeddings=cfg.max_positions, tie_word_embeddings=True,
            pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
        ))
        description = "random-init Qwen2 of the tiny base model's shape (no cached base model found)"
    # A model directory may ship sampling defaults (repetition_penalty, top_k, ...); start HF from neutral
    # ones so that both sides sample from softmax(logits / T) and nothing else.
    model.generation_config = GenerationConfig(pad_token_id=tokenizer.pad_token_id,
                                               eos_token_id=tokenizer.eos_token_id)
    model.eval()
    return model, tokenizer, description


def first_eos_lengths(new_tokens: torch.Tensor, eos_id: int) -> torch.Tensor:
    """[B] tokens up to and including the first EOS (the full width if none). new_tokens: [B, T]."""
    is_eos = new_tokens == eos_id  # [B, T]
    first = torch.where(is_eos.any(-1), is_eos.float().argmax(-1) + 1, torch.tensor(new_tokens.shape[1]))
    return first.long()


def run_engine(engine: TorchEngine, prompts, *, max_new_tokens: int, seed: int) -> tuple[int, float]:
    """One engine call; returns (tokens produced, sum of their logprobs)."""
    out = engine.generate(prompts, max_new_tokens=max_new_tokens, temperature=TEMPERATURE, top_p=1.0, seed=seed)
    return int(out.response_mask.sum()), float(out.rollout_logprobs.sum())


def run_hf(model, ids, mask, *, max_new_tokens: int, eos_id: int | None, pad_id: int, logprobs: bool,
           seed: int, real_eos: int) -> tuple[int, float | None]:
    """One HF generate call; returns (tokens produced up to and including each row's EOS, sum of their
    logprobs or None without `logprobs`)."""
    torch.manual_seed(seed)
    kwargs = dict(
        input_ids=ids, attention_mask=mask, do_sample=True, temperature=TEMPERATURE, top_k=0, top_p=1.0,
        max_new_tokens=max_new_tokens, use_cache=True, output_scores=False,
        pad_token_id=pad_id, eos_token_id=eos_id,
    )
    lp_sum = None
    with torch.no_grad():
        if not logprobs:
            sequences = model.generate(**kwargs)
            new = sequences[:, ids.shape[1]:]  # [B, T]
        else:
            out = model.generate(**kwargs, output_logits=True, return_dict_in_generate=True)
            new = out.sequences[:, ids.shape[1]:]  # [B, T]
            logits = torch.stack(out.logits, dim=1).float() / TEMPERATURE  # [B, T, V], raw logits
            lp = torch.log_softmax(logits, dim=-1).gather(-1, new[:, :, None]).squeeze(-1)  # [B, T]
            if eos_id is not None:  # zero the positions after each row's EOS, as the engine does
                lengths = first_eos_lengths(new, eos_id)
                lp = lp * (torch.arange(new.shape[1])[None, :] < lengths[:, None])
            assert torch.isfinite(lp).all()
            lp_sum = float(lp.sum())
    if eos_id is None:
        if new.shape[1] != max_new_tokens:  # the comparison would be unfair: say so rather than report it
            raise RuntimeError(f"HF generate stopped after {new.shape[1]} of {max_new_tokens} tokens although "
                               "eos_token_id=None; this transformers version treats None differently")
        return new.numel(), lp_sum
    return int(first_eos_lengths(new, real_eos).sum()), lp_sum


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None,
                        help="local Hugging Face causal LM directory (default: the tiny base model)")
    parser.add_argument("--batch", type=int, default=128, help="prompts per generate call")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per runner and mode (after one warm-up)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args()

    console = Console()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    model, tokenizer, description = load_model(args.model)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    problems = ArithmeticTask().heldout_problems(args.batch)
    prompts = [tokenizer(p.question + "=")["input_ids"] for p in problems]
    ids, mask = left_pad(prompts, pad)  # the same left-padded batch the engine builds internally
    params = sum(p.numel() for p in model.parameters())
    console.print(f"model: {description} ({params / 1e6:.2f}M parameters)")
    console.print(f"torch {torch.__version__}, transformers {transformers.__version__}, threads {threads}, "
                  f"batch {args.batch}, max_new_tokens {args.max_new_tokens}, repeats {args.repeats}")

    results: dict[str, dict[str, dict]] = {}
    for mode in MODES:
        stop = mode == "with EOS"
        # one chunk, like HF's single batch; eos_token_id=-1 is never sampled, so no row ever stops
        engine = TorchEngine(model, eos_token_id=eos if stop else -1, pad_token_id=pad, batch_size=max(args.batch, 1))
        hf = functools.partial(run_hf, model, ids, mask, max_new_tokens=args.max_new_tokens,
                               eos_id=eos if stop else None, pad_id=pad, real_eos=eos)
        calls = {
            "engine": functools.partial(run_engine, engine, prompts, max_new_tokens=args.max_new_tokens),
            "hf": functools.partial(hf, logprobs=False),
            "hf+logprobs": functools.partial(hf, logprobs=True),
        }
        for name in RUNNERS:  # warm-up: allocator, lazy init, first-call overheads
            calls[name](seed=args.seed)
        times = {name: [] for name in RUNNERS}
        tokens = {name: [] for name in RUNNERS}
        lp_sums = {name: [] for name in RUNNERS}
        for r in range(args.repeats):
            for name in RUNNERS:
                t0 = time.perf_counter()
                n_tokens, lp_sum = calls[name](seed=args.seed + 1 + r)
                times[name].append(time.perf_counter() - t0)
                tokens[name].append(n_tokens)
                lp_sums[name].append(lp_sum)
        engine_median, engine_min = statistics.median(times["engine"]), min(times["engine"])
        engine_tps = sum(tokens["engine"]) / sum(times["engine"])
        results[mode] = {}
        for name in RUNNERS:
            median = statistics.median(times[name])
            tps = sum(tokens[name]) / sum(times[name])  # tokens/s over all timed calls
            results[mode][name] = {
                "seconds": times[name], "tokens": tokens[name], "median_seconds": median,
                "min_seconds": min(times[name]), "median_tokens": statistics.median(tokens[name]),
                "tokens_per_second": tps,
                "time_ratio_vs_engine": median / engine_median,  # hf time / engine time, medians
                "min_time_ratio_vs_engine": min(times[name]) / engine_min,  # the same with the fastest calls
                "throughput_ratio_engine_vs": engine_tps / tps,
                # sanity check that both sample the same distribution: the mean logprob of the sampled
                # tokens must agree within sampling noise (None where the runner returns no logprobs)
                "mean_token_logprob": None if lp_sums[name][0] is None else sum(lp_sums[name]) / sum(tokens[name]),
            }

    table = Table(title=f"TorchEngine vs HF generate ({args.batch} prompts, {args.max_new_tokens} new tokens, "
                        f"{threads} threads, median of {args.repeats})")
    columns = ("mode", "runner", "median s", "min s", "tokens / call", "tokens/s",
               "ratio (median)", "ratio (min)", "tok/s ratio", "mean logprob")
    for col in columns:
        table.add_column(col, justify="left" if col in ("mode", "runner") else "right", overflow="fold")
    for mode in MODES:
        for name in RUNNERS:
            r = results[mode][name]
            table.add_row(mode, name, f"{r['median_seconds']:.3f}", f"{r['min_seconds']:.3f}",
                          f"{r['median_tokens']:.0f}", f"{r['tokens_per_second']:.0f}",
                          f"{r['time_ratio_vs_engine']:.2f}", f"{r['min_time_ratio_vs_engine']:.2f}",
                          f"{r['throughput_ratio_engine_vs']:.2f}",
                          "-" if r["mean_token_logprob"] is None else f"{r['mean_token_logprob']:.4f}")
    console.print(table)
    console.print("ratio = runner time / engine time (median, and of the fastest call); tok/s ratio = engine "
                  "tokens/s / runner tokens/s. > 1 means mathrl's engine is faster. In 'with EOS' mode the "
                  "token counts differ between runners: compare tok/s there. On a shared machine the spread "
                  "between median and min shows the noise; --threads 1 avoids oversubscription. mean logprob "
                  "(per sampled token) must agree between engine and hf+logprobs up to sampling noise.")

    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "model": description, "parameters": params, "batch": args.batch,
            "max_new_tokens": args.max_new_tokens, "repeats": args.repeats, "threads": threads, "seed": args.seed,
            "torch": torch.__version__, "transformers": transformers.__version__,
            "machine": platform.platform(), "processor": platform.processor(),
            "results": results,
        }, indent=2))
        console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
