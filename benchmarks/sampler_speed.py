"""Benchmark: one sampling call of the torch engine against `torch.multinomial`, per vocabulary size.

    python benchmarks/sampler_speed.py [--rows 16] [--vocab 32000 151936] [--threads 1 2] [--device cuda]

Times, for `--rows` rows of random logits: `torch.multinomial(softmax(logits), 1)` (how
`model.generate` samples), the inverse-CDF search over the float64 cumulative sum of all V
probabilities (the engine's path for vocabularies up to `BLOCKED_ABOVE`), and `sample_top_p` at top_p 1
(the engine's sampler: the two-level search above `BLOCKED_ABOVE`). Median of 5 rounds of 20 calls each,
the three alternating. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from mathrl.rollout.sampling import inverse_cdf, sample_top_p


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--vocab", type=int, nargs="+", default=[32_000, 151_936])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="CPU threads (ignored on CUDA)")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    gen = torch.Generator(device=device).manual_seed(0)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def multinomial(x):
        return torch.multinomial(torch.softmax(x, dim=-1), 1, generator=gen)

    def full_cumsum(x):
        weights = (x - x.amax(-1, keepdim=True)).exp_()
        cdf = weights.double().cumsum(-1)
        u = torch.rand((x.shape[0], 1), generator=gen, dtype=torch.float64, device=x.device)
        return inverse_cdf(cdf, cdf[:, -1:], u)

    def engine(x):
        return sample_top_p(x, 1.0, gen)

    samplers = {"torch.multinomial": multinomial, "float64 cumsum of all V": full_cumsum, "sample_top_p": engine}
    print(f"| vocabulary | threads | {' | '.join(samplers)} |")
    print("| --- | --- |" + " --- |" * len(samplers))
    for threads in args.threads if device.type == "cpu" else [torch.get_num_threads()]:
        torch.set_num_threads(threads)
        for vocab in args.vocab:
            logits = torch.randn(args.rows, vocab, generator=gen, device=device) * 3
            times: dict[str, list[float]] = {name: [] for name in samplers}
            for f in samplers.values():
                f(logits)  # warm-up
            for _ in range(5):
                for name, f in samplers.items():
                    sync()
                    t = time.perf_counter()
                    for _ in range(20):
                        f(logits)
                    sync()
                    times[name].append((time.perf_counter() - t) / 20 * 1e3)
            print(f"| {vocab:,} | {threads} | " + " | ".join(f"{statistics.median(v):.2f} ms" for v in times.values()) + " |")


if __name__ == "__main__":
    main()
