"""Benchmark: the rollout/trainer logprob gap in float16 against bfloat16 (arXiv 2510.26788, "Defeating the
Training-Inference Mismatch via FP16").

For each of float16 and bfloat16, the rollout engine (TorchEngine, the lean decode loop as in training)
samples from a copy of the weights in that dtype, as a run with model.dtype=float16 does (and a vLLM
engine in that dtype); the trainer then scores the sampled tokens the way it trains: its float32 master
weights under autocast to the same dtype (model/scoring.py:response_logprobs; FSDP2's mixed precision
casts the parameters the same way). The gap of a dtype is

    gap = mean over sampled response tokens of |logprob_rollout - logprob_trainer|

and the key number is gap(float16) / gap(bfloat16): float16 keeps 10 mantissa bits to bfloat16's 7, so
the two sides' different kernels (cached one-token decoding vs the full forward) round less apart.
Below 1 is the paper's point. On the CPU with a tiny model it only shows that the measurement runs.

    python benchmarks/precision_mismatch.py                                       # tiny model, CPU
    python benchmarks/precision_mismatch.py --device cuda --arch qwen2.5-0.5b --batch 64 --max-new-tokens 128

Models: `--arch tiny` is the cached tiny base model of the default config (a random model of its shape
when it is not built); `--arch <name>` a shipped architecture (model/configs/) with random weights.
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import torch

from mathrl.config import load_config
from mathrl.model.dtypes import DTYPES
from mathrl.model.scoring import response_logprobs
from mathrl.rollout.engine import TorchEngine
from mathrl.tasks.arithmetic import ArithmeticTask


def load_trainer_model(arch: str, device: str):
    """(float32 model on `device`, tokenizer, description)."""
    if arch != "tiny":
        from mathrl.model.init import build_random_model

        model, tokenizer = build_random_model(arch, dtype="float32", device=device, seed=0)
        return model.eval(), tokenizer, f"{arch} architecture, random weights"
    from mathrl.model.io import load_model_and_tokenizer
    from mathrl.model.tiny import base_model_dir, build_char_tokenizer

    base = base_model_dir(load_config(None, [], check_paths=False).base)
    if (base / "config.json").is_file():
        model, tokenizer = load_model_and_tokenizer(base, dtype="float32")
        return model.to(device).eval(), tokenizer, f"the tiny base model {base.name}"
    from transformers import Qwen2Config, Qwen2ForCausalLM

    c, tokenizer = load_config(None, [], check_paths=False).base, build_char_tokenizer()
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads, num_key_value_heads=c.num_kv_heads,
        max_position_embeddings=c.max_positions, tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=None))
    return model.to(device).eval(), tokenizer, "a random model of the tiny base model's shape (not built here)"


def gap(trainer_model, tokenizer, prompts: list[list[int]], *, dtype: str, max_new_tokens: int, seed: int) -> dict:
    """Sample with a `dtype` copy of the weights, score under `dtype` autocast; the mean |difference|."""
    device = next(trainer_model.parameters()).device
    rollout_model = copy.deepcopy(trainer_model).to(DTYPES[dtype]).eval()
    engine = TorchEngine(rollout_model, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         batch_size=len(prompts), decode="lean")
    out = engine.generate(prompts, max_new_tokens=max_new_tokens, temperature=1.0, seed=seed)
    with torch.no_grad(), torch.autocast(device.type, dtype=DTYPES[dtype]):
        trainer_lp, _ = response_logprobs(trainer_model, out.prompt_ids, out.prompt_mask, out.response_ids,
                                          out.response_mask)
    mask = out.response_mask.bool()
    diff = (out.rollout_logprobs.float() - trainer_lp.float().to(out.rollout_logprobs.device))[mask].abs()
    return {"mean_abs_gap": float(diff.mean()), "max_abs_gap": float(diff.max()), "tokens": int(mask.sum())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="tiny", help="tiny, or a shipped architecture (qwen2.5-0.5b, ...)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--batch", type=int, default=16, help="rows sampled per dtype")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (CPU)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer, description = load_trainer_model(args.arch, args.device)
    questions = [p.question for p in ArithmeticTask().heldout_problems(args.batch)]
    prompts = [tokenizer(q + "=")["input_ids"] for q in questions][: args.batch]
    results = {dtype: gap(model, tokenizer, prompts, dtype=dtype, max_new_tokens=args.max_new_tokens, seed=args.seed)
               for dtype in ("float16", "bfloat16")}
    ratio = results["float16"]["mean_abs_gap"] / max(results["bfloat16"]["mean_abs_gap"], 1e-30)
    print(f"model: {description}, {args.device}; {len(prompts)} rows x up to {args.max_new_tokens} new tokens")
    for dtype, r in results.items():
        print(f"{dtype}: mean |logprob_rollout - logprob_trainer| {r['mean_abs_gap']:.3e} "
              f"(max {r['max_abs_gap']:.3e}) over {r['tokens']} tokens")
    print(f"ratio float16 / bfloat16: {ratio:.3f}")
    if args.out is not None:
        args.out.write_text(json.dumps({"model": description, "device": args.device, "results": results,
                                        "ratio": ratio}, indent=2))


if __name__ == "__main__":
    main()
