"""Benchmark: the torch engine's rollout with rollout.draws=row (a random stream per row) against
rollout.draws=chunk (one generator per chunk of rows, the default), on the same prompts.

The model and the rollout settings are the default run's (recipes/arith_grpo.yaml: its tiny base
model, built once and cached; 128 rows of its training problems, 48 new tokens), without tools, and
with the calculator on the same problems, each prompt ending in the opening of a python block (as in
benchmarks/tool_rollout.py) with rollout.tool_delay_steps 1 and the tool recipe's limits. The two
draw modes run alternately, `--repeats` times each (seeds 1, 2, ...) after one warm-up. The two modes
draw different samples, of other lengths and calls, so the comparison is of tokens per second (model
and observation tokens: each costs a row's forward): the median of each mode, and the ratio chunk /
row of those rates (above 1 is what row draws cost). That ratio moves by a few percent with the
samples and the machine's load, so the work row draws add is also timed alone, on the same shapes:
the rows' streams (`row_uniforms`, once per chunk) and, at each of max_new_tokens steps, the gather
of the rows' uniforms in place of a draw of as many from one generator; its share of the no-tool
rollout's seconds is the cost.

    taskset -c 0 env OMP_NUM_THREADS=1 python benchmarks/row_draws.py --threads 1   # what docs/tools.md reports
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=128, help="rows per rollout call (default 128: the recipe's 16 x 8)")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)

    from rich.console import Console

    from mathrl.config import load_config
    from mathrl.model.io import load_model_and_tokenizer
    from mathrl.model.paths import resolve_model_path
    from mathrl.rollout.engine import TorchEngine
    from mathrl.rollout.episodes import ToolUse, call_format
    from mathrl.rollout.sampling import row_uniforms
    from mathrl.tasks.arithmetic import base_pretraining_text
    from mathrl.tasks.sources import arithmetic_task, prompt_encoder
    from mathrl.tools import ToolPool, ToolSpec

    cfg = load_config(None, [])
    r, limits = cfg.rollout, load_config("recipes/arith_tools.yaml", []).rollout
    path = resolve_model_path(cfg, Console(stderr=True), pretraining_text=base_pretraining_text(cfg.base))
    model, tokenizer = load_model_and_tokenizer(path)
    model.eval()
    problems = arithmetic_task(cfg).train_problems(a.batch, seed=0)
    _, plain, _ = prompt_encoder(cfg, tokenizer, max_new_tokens=r.max_new_tokens).encode(problems)
    opening = tokenizer("```python\n", add_special_tokens=False)["input_ids"]
    print(f"{a.batch} rows, max {r.max_new_tokens} tokens, {a.threads} threads, median of {a.repeats}:")
    for label, with_tool in (("no tool", False), ("calculator, D=1", True)):
        prompts = [p + opening for p in plain] if with_tool else plain
        engines = {}
        for draws in ("chunk", "row"):
            tools = None
            if with_tool:
                pool = ToolPool([ToolSpec(name="python", fn="calculator")], workers=r.tool_workers)
                tools = ToolUse(fmt=call_format(limits.tool_format), pool=pool, tokenizer=tokenizer,
                                max_turns=limits.max_turns, max_tool_calls=limits.max_tool_calls,
                                observation_max_tokens=limits.observation_max_tokens)
            engines[draws] = TorchEngine(model, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                                         tools=tools, tool_delay_steps=1, decode=r.decode, draws=draws)
        rates, seconds = {draws: [] for draws in engines}, {draws: [] for draws in engines}
        for i in range(a.repeats + 1):
            for draws, engine in engines.items():
                t0 = time.perf_counter()
                out = engine.generate(prompts, max_new_tokens=r.max_new_tokens, seed=i)
                if i:  # the first call of each warms up
                    seconds[draws].append(time.perf_counter() - t0)
                    rates[draws].append(int(out.context_lengths.sum()) / seconds[draws][-1])
        for engine in engines.values():
            engine.close()
        chunk, row = (statistics.median(rates[d]) for d in ("chunk", "row"))
        print(f"  {label:16s} tokens/s: chunk {chunk:.0f}  row {row:.0f}  chunk / row {chunk / row:.3f}")
        if not with_tool:
            rollout_s = statistics.median(seconds["chunk"])
    extra = []
    for _ in range(a.repeats):
        n, t = a.batch, r.max_new_tokens
        generator, rows, column = torch.Generator().manual_seed(0), torch.arange(n), torch.zeros(n, dtype=torch.long)
        t0 = time.perf_counter()
        for _ in range(t):
            torch.rand((n, 1), generator=generator, dtype=torch.float64)
        drawn = time.perf_counter() - t0
        t0 = time.perf_counter()
        uniforms = row_uniforms(0, 0, n, t, "cpu")
        for _ in range(t):
            uniforms[rows, column[rows]][:, None]
        extra.append(time.perf_counter() - t0 - drawn)
    added = statistics.median(extra)
    print(f"  the work row draws add: {added * 1000:.2f} ms per rollout, {added / rollout_s:.2%} of the no-tool rollout "
          f"({rollout_s:.3f} s)")


if __name__ == "__main__":
    main()
