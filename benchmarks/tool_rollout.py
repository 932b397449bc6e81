"""Benchmark: rollout throughput with a tool against the same rollout without it, and the python tool's latency.

The model is the tool-capable tiny base model of recipes/arith_tools.yaml (built once and cached).
Every prompt is a 5-6 digit sum followed by the opening of a python block ("...=```python\\n"), so
every row writes a call: with the tool, the call runs and its output is appended as forced tokens,
and the row goes on to its answer; without it, the same prompts run as single-turn rows (the model
writes on through the place where the output would be). Rows differ in what they write, so the table
gives three ratios to the no-tool run: model tokens per second (observation tokens are not the
model's and are not counted), all tokens per second (observation tokens cost a forward too), and
rollouts per second (the same 128 prompts, wall clock). Each setting is timed over `--repeats` calls
after one warm-up; the median is reported, with the seconds the engine stood waiting for tool output.

Settings: the calculator and the python tool (sandbox `auto`), the python tool with its sandboxes
started cold (one per call) or warm (`warm: --warm` sandboxes started ahead by the pool), each at
every `--delays` value of `rollout.tool_delay_steps` (0: the output fed with the closing token in one
window forward that waits for the step's calls; D >= 1: one token per step, the output read D steps
after the call, the other rows decoding meanwhile).

    python benchmarks/tool_rollout.py                       # tiny tool base model, CPU, 2 threads
    taskset -c 0 env OMP_NUM_THREADS=1 python benchmarks/tool_rollout.py --threads 1 \\
        --out benchmarks/results/tool_rollout_cpu.json      # what docs/tools.md reports (one core)

The python tool's latency is measured in the tool pool alone: `--calls` calls of a typical block
(`a+b`, its value shown as a REPL shows it), in every sandbox mode that works on the machine, cold and
warm, against the calculator answering the same block: one call at a time (p50 and p95 per call,
sandbox start-up included when cold), and all at once (calls per second with the recipe's workers).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
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


SETTINGS = {  # label -> (tool fn, the tool's kwargs); warm sandboxes get "warm" added
    "calculator": ("calculator", {}),
    "python": ("python", {}),
    "python warm": ("python", {"warm": None}),
}


def rollout_rates(cfg, model, tokenizer, *, batch: int, repeats: int, delays: list[int], warm: int) -> dict:
    from mathrl.rollout.engine import TorchEngine
    from mathrl.rollout.episodes import Episodes, ToolUse, call_format
    from mathrl.tasks.arithmetic import ArithmeticTask
    from mathrl.tools import ToolPool, ToolSpec

    task = ArithmeticTask(min_digits=5, max_digits=6)
    prompts = [tokenizer(p.question + "=```python\n", add_special_tokens=False)["input_ids"]
               for p in task.train_problems(batch, seed=0)]
    r = cfg.rollout
    waited = [0.0]  # seconds the engine stood waiting for a call's output
    output = Episodes.output

    def timed_output(self, row):
        t0 = time.perf_counter()
        ready = self.ready(row)
        ids = output(self, row)
        waited[0] += 0.0 if ready else time.perf_counter() - t0
        return ids

    Episodes.output = timed_output
    runs = [("none", None, {}, 0)] + [(f"{label} D={d}", fn, kwargs, d) for label, (fn, kwargs) in SETTINGS.items()
                                      for d in delays]
    out = {}
    for name, fn, kwargs, delay in runs:
        tools = None
        if fn is not None:
            kwargs = {k: warm if k == "warm" else v for k, v in kwargs.items()}
            pool = ToolPool([ToolSpec(name="python", fn=fn, kwargs=kwargs, timeout_s=10.0)], workers=r.tool_workers)
            tools = ToolUse(fmt=call_format(r.tool_format), pool=pool, tokenizer=tokenizer, max_turns=r.max_turns,
                            max_tool_calls=r.max_tool_calls, observation_max_tokens=r.observation_max_tokens)
        engine = TorchEngine(model, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                             tools=tools, tool_delay_steps=delay)
        rows = []
        for i in range(repeats + 1):
            waited[0] = 0.0
            t0 = time.perf_counter()
            got = engine.generate(prompts, max_new_tokens=r.max_new_tokens, seed=i)
            if i:  # the first call warms up
                rows.append({"seconds": time.perf_counter() - t0, "model_tokens": int(got.response_lengths.sum()),
                             "calls": int(got.tool_calls.sum()) if got.tool_calls is not None else 0,
                             "observation_tokens": int(got.observation_mask.sum()) if got.observation_mask is not None else 0,
                             "waited_s": waited[0]})
        engine.close()
        m = sorted(rows, key=lambda x: x["seconds"])[len(rows) // 2]
        out[name] = {**m, "delay_steps": delay, "model_tokens_per_s": m["model_tokens"] / m["seconds"],
                     "all_tokens_per_s": (m["model_tokens"] + m["observation_tokens"]) / m["seconds"],
                     "rollouts_per_s": batch / m["seconds"]}
        print(f"  {name:18s} {m['seconds']:.2f} s", flush=True)
    Episodes.output = output
    base = out["none"]
    for name, row in out.items():
        if name != "none":
            row["ratio_to_no_tool"] = row["model_tokens_per_s"] / base["model_tokens_per_s"]
            row["all_tokens_ratio_to_no_tool"] = row["all_tokens_per_s"] / base["all_tokens_per_s"]
            row["rollouts_ratio_to_no_tool"] = row["rollouts_per_s"] / base["rollouts_per_s"]
    return out


def latencies(calls: int, workers: int, warm: int) -> dict:
    from mathrl.tools import ToolPool, ToolSpec, sandbox_works

    rng = random.Random(0)
    blocks = [f"{rng.randrange(10**4, 10**6)}+{rng.randrange(10**4, 10**6)}\n" for _ in range(calls)]
    specs = {"calculator": ToolSpec(name="t", fn="calculator")}
    for mode in ("bwrap", "unshare_unsafe", "rlimit_unsafe"):
        for python in dict.fromkeys([sys.executable, "/usr/bin/python3"]):
            if sandbox_works(mode, python=python):  # as root, unshare and rlimit cannot run a python under /root
                for start in ("cold", "warm"):
                    kwargs = {"sandbox": mode, "python": python, **({"warm": warm} if start == "warm" else {})}
                    specs[f"python ({mode}, {start})"] = ToolSpec(name="t", fn="python", kwargs=kwargs, timeout_s=10.0)
                break
    out = {}
    for name, spec in specs.items():
        with ToolPool([spec], workers=workers) as pool:
            pool.call("t", blocks[0])  # warm-up
            one = []
            for b in blocks:  # one call at a time, a pause between (a rollout's calls are spread out)
                time.sleep(0.03)
                one.append(pool.call("t", b))
            time.sleep(0.3)
            t0 = time.perf_counter()
            burst = [f.result() for f in [pool.submit("t", b) for b in blocks]]
            wall = time.perf_counter() - t0
        assert all(r.status == "ok" for r in one + burst), [r for r in one + burst if r.status != "ok"][:1]
        seconds = sorted(r.seconds for r in one)
        out[name] = {"p50_ms": 1000 * seconds[len(seconds) // 2], "p95_ms": 1000 * seconds[int(0.95 * (len(seconds) - 1))],
                     "calls_per_s_in_pool": calls / wall, "workers": workers, "python": spec.kwargs.get("python")}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=128, help="rows per rollout call (default 128: the recipe's 16 x 8)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--delays", default="0,1,16", help="rollout.tool_delay_steps values to run (comma-separated)")
    p.add_argument("--warm", type=int, default=8, help="sandboxes started ahead in the warm settings")
    p.add_argument("--calls", type=int, default=60, help="python tool calls for the latency table")
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    cfg, model, tokenizer = tool_model(a.threads)
    from mathrl.tools import sandbox_mode

    delays = [int(d) for d in a.delays.split(",")]
    print(f"rollout of {a.batch} rows, max {cfg.rollout.max_new_tokens} tokens, {a.threads} threads (median of {a.repeats}):")
    result = {
        "machine": {"cpu": platform.processor() or platform.machine(), "threads": a.threads, "torch": torch.__version__,
                    "sandbox_auto": sandbox_mode(), "load_average": os.getloadavg(),
                    "affinity": sorted(os.sched_getaffinity(0))},
        "rollout": rollout_rates(cfg, model, tokenizer, batch=a.batch, repeats=a.repeats, delays=delays, warm=a.warm),
        "latency": latencies(a.calls, cfg.rollout.tool_workers, a.warm),
    }
    print("setting              model tok/s  x no-tool (model / all tokens / rollouts)   calls  obs tokens  waited")
    for name, r in result["rollout"].items():
        ratio = (f"{r['ratio_to_no_tool']:5.2f} / {r['all_tokens_ratio_to_no_tool']:4.2f} / {r['rollouts_ratio_to_no_tool']:4.2f}"
                 if "ratio_to_no_tool" in r else "    1 /    1 /    1")
        print(f"  {name:18s} {r['model_tokens_per_s']:8.0f}     {ratio:30s}   {r['calls']:5d}  {r['observation_tokens']:10d}"
              f"  {r['waited_s']:.2f} s  ({r['seconds']:.2f} s)")
    print(f"tool latency per call ({a.calls} calls, one at a time; then all at once, {cfg.rollout.tool_workers} workers):")
    for name, r in result["latency"].items():
        print(f"  {name:28s} p50 {r['p50_ms']:7.2f} ms  p95 {r['p95_ms']:7.2f} ms  {r['calls_per_s_in_pool']:7.1f} calls/s")
    result["machine"]["load_average_after"] = os.getloadavg()
    if a.out:
        a.out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
