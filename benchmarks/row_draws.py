"""Benchmark: the torch engine's rollout with rollout.draws=row (a random stream per row) against
rollout.draws=chunk (one generator per chunk of rows, the default), on the same prompts.

The model is the tool-capable tiny base model of recipes/arith_tools.yaml (built once and cached);
the prompts are 5-6 digit sums ending in the opening of a python block, as in
benchmarks/tool_rollout.py, without tools and with the calculator (rollout.tool_delay_steps 1). The
two draw modes run alternately, `--repeats` times each after one warm-up, and the median seconds of
each are compared (the ratio row / chunk: above 1 is a cost).

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
    from mathrl.tasks.arithmetic import ArithmeticTask, base_pretraining_text
    from mathrl.tools import ToolPool, ToolSpec

    cfg = load_config("recipes/arith_tools.yaml", [])
    r = cfg.rollout
    path = resolve_model_path(cfg, Console(stderr=True), pretraining_text=base_pretraining_text(cfg.base))
    model, tokenizer = load_model_and_tokenizer(path)
    model.eval()
    prompts = [tokenizer(q.question + "=```python\n", add_special_tokens=False)["input_ids"]
               for q in ArithmeticTask(min_digits=5, max_digits=6).train_problems(a.batch, seed=0)]
    print(f"{a.batch} rows, max {r.max_new_tokens} tokens, {a.threads} threads, median of {a.repeats}:")
    for label, with_tool in (("no tool", False), ("calculator, D=1", True)):
        engines = {}
        for draws in ("chunk", "row"):
            tools = None
            if with_tool:
                pool = ToolPool([ToolSpec(name="python", fn="calculator")], workers=r.tool_workers)
                tools = ToolUse(fmt=call_format(r.tool_format), pool=pool, tokenizer=tokenizer, max_turns=r.max_turns,
                                max_tool_calls=r.max_tool_calls, observation_max_tokens=r.observation_max_tokens)
            engines[draws] = TorchEngine(model, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                                         tools=tools, tool_delay_steps=1, decode=r.decode, draws=draws)
        seconds = {draws: [] for draws in engines}
        for i in range(a.repeats + 1):
            for draws, engine in engines.items():
                t0 = time.perf_counter()
                engine.generate(prompts, max_new_tokens=r.max_new_tokens, seed=i)
                if i:  # the first call of each warms up
                    seconds[draws].append(time.perf_counter() - t0)
        for engine in engines.values():
            engine.close()
        chunk, row = (statistics.median(seconds[d]) for d in ("chunk", "row"))
        print(f"  {label:16s} chunk {chunk:.3f} s  row {row:.3f} s  row / chunk {row / chunk:.3f}")


if __name__ == "__main__":
    main()
