"""Benchmark: rollout throughput with a tool against the same rollout without it, and the python tool's latency.

The model is the tool-capable tiny base model of recipes/arith_tools.yaml (built once and cached).
Every prompt is a 5-6 digit sum followed by the opening of a python block ("...=```python\\n"), so
every row writes a call: with the tool, the call runs and its output is appended as forced tokens,
and the row goes on to its answer; without it, the same prompts run as single-turn rows (the model
writes on through the place where the output would be). Rows differ in what they write, so the table
compares model tokens per second (observation tokens are not the model's and are not counted).
Each configuration is timed over `--repeats` calls after one warm-up; the median is reported.

    python benchmarks/tool_rollout.py                       # tiny tool base model, CPU, 2 threads
    python benchmarks/tool_rollout.py --out benchmarks/results/tool_rollout_cpu.json

The python tool's latency is measured in the tool pool alone: `--calls` calls of a typical block
(`a+b`, its value shown as a REPL shows it), p50 and p95, sandbox start-up included, in every
sandbox mode that works on the machine, against the calculator answering the same block.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time
from pathlib import Path

import torch


def tool_model(threads: int):
    from rich.console import Console

    from mathrl.config import load_config
    from mathrl.model.io import load_model_and_tokenizer
    from mathrl.model.paths import resolve_model_path
    from mathrl.tasks.arithmetic import base_pretraining_text

    cfg = load_config("recipes/arith_tools.yaml", [])
    torch.set_num_threads(threads)
    path = resolve_model_path(cfg, Console(stderr=True), pretraining_text=base_pretraining_text(cfg.base))
    model, tokenizer = load_model_and_tokenizer(path)
    return cfg, model.eval(), tokenizer


def rollout_rates(cfg, model, tokenizer, *, batch: int, repeats: int, tool_fns: list[str]) -> dict:
    from mathrl.rollout.engine import TorchEngine
    from mathrl.rollout.episodes import ToolUse, call_format
    from mathrl.tasks.arithmetic import ArithmeticTask
    from mathrl.tools import ToolPool, ToolSpec

    task = ArithmeticTask(min_digits=5, max_digits=6)
    prompts = [tokenizer(p.question + "=```python\n", add_special_tokens=False)["input_ids"]
               for p in task.train_problems(batch, seed=0)]
    r = cfg.rollout
    out = {}
    for name in ["none", *tool_fns]:
        tools = None
        if name != "none":
            pool = ToolPool([ToolSpec(name="python", fn=name, timeout_s=10.0)], workers=r.tool_workers)
            tools = ToolUse(fmt=call_format(r.tool_format), pool=pool, tokenizer=tokenizer, max_turns=r.max_turns,
                            max_tool_calls=r.max_tool_calls, observation_max_tokens=r.observation_max_tokens)
        engine = TorchEngine(model, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, tools=tools)
        times, tokens, calls, observed = [], [], [], []
        for i in range(repeats + 1):
            t0 = time.perf_counter()
            got = engine.generate(prompts, max_new_tokens=r.max_new_tokens, seed=i)
            if i:  # the first call warms up
                times.append(time.perf_counter() - t0)
                tokens.append(int(got.response_lengths.sum()))
                calls.append(int(got.tool_calls.sum()) if got.tool_calls is not None else 0)
                observed.append(int(got.observation_mask.sum()) if got.observation_mask is not None else 0)
        engine.close()
        k = times.index(statistics.median(times))
        out[name] = {"seconds": times[k], "model_tokens": tokens[k], "model_tokens_per_s": tokens[k] / times[k],
                     "calls": calls[k], "observation_tokens": observed[k],
                     "all_tokens_per_s": (tokens[k] + observed[k]) / times[k]}  # observations cost a forward too
    for name in tool_fns:
        out[name]["ratio_to_no_tool"] = out[name]["model_tokens_per_s"] / out["none"]["model_tokens_per_s"]
        out[name]["all_tokens_ratio_to_no_tool"] = out[name]["all_tokens_per_s"] / out["none"]["all_tokens_per_s"]
    return out


def latencies(calls: int, workers: int) -> dict:
    from mathrl.tools import ToolPool, ToolSpec, sandbox_works

    rng = random.Random(0)
    blocks = [f"{rng.randrange(10**4, 10**6)}+{rng.randrange(10**4, 10**6)}\n" for _ in range(calls)]
    specs = {"calculator": ToolSpec(name="t", fn="calculator")}
    for mode in ("bwrap", "unshare", "rlimit"):
        if sandbox_works(mode):
            specs[f"python ({mode})"] = ToolSpec(name="t", fn="python", kwargs={"sandbox": mode}, timeout_s=10.0)
    out = {}
    for name, spec in specs.items():
        with ToolPool([spec], workers=workers) as pool:
            pool.call("t", blocks[0])  # warm-up
            t0 = time.perf_counter()
            results = [f.result() for f in [pool.submit("t", b) for b in blocks]]
            wall = time.perf_counter() - t0
        seconds = sorted(r.seconds for r in results)
        assert all(r.status == "ok" for r in results), [r for r in results if r.status != "ok"][:1]
        out[name] = {"p50_ms": 1000 * seconds[len(seconds) // 2], "p95_ms": 1000 * seconds[int(0.95 * (len(seconds) - 1))],
                     "calls_per_s_in_pool": calls / wall, "workers": workers}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=128, help="rows per rollout call (default 128: the recipe's 16 x 8)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--calls", type=int, default=60, help="python tool calls for the latency table")
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    cfg, model, tokenizer = tool_model(a.threads)
    from mathrl.tools import sandbox_mode

    result = {
        "machine": {"cpu": platform.processor() or platform.machine(), "threads": a.threads, "torch": torch.__version__,
                    "sandbox_auto": sandbox_mode()},
        "rollout": rollout_rates(cfg, model, tokenizer, batch=a.batch, repeats=a.repeats, tool_fns=["calculator", "python"]),
        "latency": latencies(a.calls, cfg.rollout.tool_workers),
    }
    print(f"rollout of {a.batch} rows, max {cfg.rollout.max_new_tokens} tokens, {a.threads} threads (median of {a.repeats}):")
    for name, r in result["rollout"].items():
        ratio = (f"  {r['ratio_to_no_tool']:.2f}x the no-tool rate ({r['all_tokens_ratio_to_no_tool']:.2f}x counting "
                 "observation tokens)") if "ratio_to_no_tool" in r else ""
        print(f"  tool={name:10s} {r['model_tokens_per_s']:8.0f} model tokens/s  ({r['model_tokens']} tokens, "
              f"{r['calls']} calls, {r['observation_tokens']} observation tokens, {r['seconds']:.2f} s){ratio}")
    print(f"tool latency per call ({a.calls} calls, {cfg.rollout.tool_workers} workers):")
    for name, r in result["latency"].items():
        print(f"  {name:18s} p50 {r['p50_ms']:7.2f} ms  p95 {r['p95_ms']:7.2f} ms  {r['calls_per_s_in_pool']:7.1f} calls/s")
    if a.out:
        a.out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
