"""Where a GRPO step's time goes: the profiles behind docs/performance.md ("Where the time goes").

    python benchmarks/profile_step.py

Prints, on this machine:
  1. `torch.profiler` over one `TorchEngine.generate` of 16 rows x 64 new tokens on the small workload's
     architecture (benchmarks/grpo_step_vs_trl.py, 32k vocabulary), 1 thread: the ops' shares of time;
  2. the output projection of one decode step there (16 x 512 @ 512 x 32000), 1 thread: ms and GFLOP/s;
  3. cProfile of one `TorchEngine.generate` of the tiny step (16 problems x 8 samples, 48 new tokens,
     the tiny base model), 2 threads: the shares of linear, attention and the attention's copies;
  4. `torch.profiler` over one forward and backward of a 64-row mini-batch of the tiny step, 1 thread;
  5. one large float32 matrix product (4096 x 512 @ 512 x 4096, and 2048^3), 2 threads: GFLOP/s.
Run it on an otherwise idle machine; shares are steadier than times.
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import profile

from mathrl.config import BaseModelConfig
from mathrl.model.scoring import response_logprobs
from mathrl.model.tiny import ensure_base_model
from mathrl.rollout.engine import TorchEngine
from mathrl.tasks.arithmetic import ArithmeticTask, base_pretraining_text
from mathrl.tasks.prompts import render_prompt

sys.path.insert(0, str(Path(__file__).parent))
from grpo_step_vs_trl import build_small_model  # noqa: E402


def load(path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def op_shares(prof, ops: list[str]) -> str:
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    return ", ".join(f"{op} {sum(e.self_cpu_time_total for e in events if e.key == op) / total:.0%}" for op in ops)


def tiny_prompts(tokenizer, problems: int) -> list[list[int]]:
    rows = ArithmeticTask(min_digits=1, max_digits=3).train_problems(problems, seed=0)
    return [tokenizer(render_prompt(p.question, template="arith"))["input_ids"] for p in rows for _ in range(8)]


def main() -> None:
    # 1-2: the small architecture's generation
    torch.set_num_threads(1)
    model, tok = load(build_small_model(Path(tempfile.mkdtemp()) / "small"))
    engine = TorchEngine(model, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id or 0)
    prompts = [tok(render_prompt("12+345", template="arith"))["input_ids"]] * 16
    engine.generate(prompts, max_new_tokens=8, seed=0)
    with profile() as prof:
        engine.generate(prompts, max_new_tokens=64, seed=0)
    print("1. small, generate 16 x 64 tokens, 1 thread:", op_shares(prof, ["aten::mm", "aten::addmm", "aten::cumsum"]))
    x, head = torch.randn(16, 512), model.get_output_embeddings().weight.detach()
    torch.nn.functional.linear(x, head)
    t = time.perf_counter()
    for _ in range(20):
        torch.nn.functional.linear(x, head)
    ms = (time.perf_counter() - t) / 20 * 1e3
    print(f"2. small, output projection of one decode step (16 x 512 @ 512 x {head.shape[0]}), 1 thread: "
          f"{ms:.1f} ms, {2 * 16 * 512 * head.shape[0] / ms / 1e6:.0f} GFLOP/s")

    # 3-4: the tiny step
    torch.set_num_threads(2)
    model, tok = load(ensure_base_model(BaseModelConfig(), pretraining_text=base_pretraining_text(BaseModelConfig())))
    engine = TorchEngine(model, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    prompts = tiny_prompts(tok, 16)
    engine.generate(prompts, max_new_tokens=48, seed=0)
    cp = cProfile.Profile()
    cp.enable()
    engine.generate(prompts, max_new_tokens=48, seed=0)
    cp.disable()
    stats = pstats.Stats(cp).stats  # {(file, line, name): (cc, nc, tottime, cumtime, callers)}
    total = max(v[3] for k, v in stats.items() if k[2] == "generate")
    own = {name: sum(v[2] for k, v in stats.items() if name in k[2]) for name in
           ("<built-in method torch._C._nn.linear>", "<built-in method torch._C._nn.scaled_dot_product_attention>",
            "<method 'reshape' of 'torch._C.TensorBase' objects>", "<built-in method torch.cat>")}
    print("3. tiny, generate 128 rows x 48 tokens, 2 threads: "
          + ", ".join(f"{label} {v / total:.0%}" for label, v in zip(("linear", "attention", "reshape", "cat"), own.values())))
    torch.set_num_threads(1)
    out = engine.generate(prompts[:64], max_new_tokens=48, seed=0)
    model.train()

    def forward_backward():
        lp, _ = response_logprobs(model, out.prompt_ids, out.prompt_mask, out.response_ids, out.response_mask)
        (lp * out.response_mask).sum().backward()

    forward_backward()
    with profile() as prof:
        forward_backward()
    print(f"4. tiny, forward + backward of {out.response_ids.shape[0]} rows, 1 thread:",
          op_shares(prof, ["aten::mm", "aten::addmm"]))

    # 5: a large matrix product
    torch.set_num_threads(2)
    for a, b in ((torch.randn(4096, 512), torch.randn(512, 4096)), (torch.randn(2048, 2048), torch.randn(2048, 2048))):
        a @ b
        best = min(_timed(lambda: a @ b) for _ in range(5))
        print(f"5. {a.shape[0]}x{a.shape[1]} @ {b.shape[0]}x{b.shape[1]}, 2 threads: "
              f"{2 * a.shape[0] * a.shape[1] * b.shape[1] / best / 1e9:.0f} GFLOP/s")


def _timed(f) -> float:
    t = time.perf_counter()
    f()
    return time.perf_counter() - t


if __name__ == "__main__":
    main()
