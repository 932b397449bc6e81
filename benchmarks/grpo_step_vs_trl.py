"""Benchmark: one GRPO step in mathrl against TRL's `GRPOTrainer`, same model, same workload.

Run from the repository root (needs `pip install trl`; the tiny base model is built if missing):

    python benchmarks/grpo_step_vs_trl.py                       # defaults below
    python benchmarks/grpo_step_vs_trl.py --steps 6 --repeats 2 --threads 2 --out benchmarks/grpo_step_vs_trl.json

Workload (the embedded default's RL step, matched field by field):

| | mathrl | TRL |
| --- | --- | --- |
| model | the cached tiny base model | the same directory |
| problems | generated 1-3 digit additions, `arith` template | the same prompt strings |
| batch | `rollout.prompts_per_step=16`, `rollout.n=8` | `num_generations=8`, `generation_batch_size=128` |
| sampling | temperature 1, top-p 1, 48 new tokens | temperature 1, top-p 1, `top_k=0`, `max_completion_length=48` |
| updates | mini-batch 64 -> 2 optimizer steps per RL step, 1 epoch | `per_device_train_batch_size=64`, `steps_per_generation=2`, `num_iterations=1` |
| loss | clip 0.2 / 0.28, `token_mean`, no KL | `epsilon=0.2`, `epsilon_high=0.28`, `loss_type="dapo"`, `beta=0` |
| reward | `verify_one` in-process (`reward.num_workers=0`) | the same function as a TRL reward function |
| optimizer | AdamW, lr 2e-4 | AdamW, lr 2e-4 (constant schedule) |
| precision | float32, no gradient checkpointing | `bf16=False`, `gradient_checkpointing=False` |

TRL's own defaults differ in the last row (`bf16=True`, `gradient_checkpointing=True`): bf16 autocast is
slow on CPUs without bf16 matrix units and checkpointing recomputes the forward, so the matched
setting is the headline; `trl-defaults` is reported beside it for whoever runs TRL as shipped.

Each side runs `--steps` RL steps in a fresh subprocess (this script re-invoked with `--child`), with
`--threads` torch threads; the sides alternate for `--repeats` rounds so drift of a shared machine hits
both. The time of an RL step is: mathrl, `perf/step_seconds` (rollout, reward, scoring passes, both
optimizer steps, logging; evaluations and checkpoints are outside it); TRL, the wall time from the
start of the optimizer step that generates to the end of the second one (a `TrainerCallback`). The
first RL step of every run is warm-up and dropped. ratio = TRL seconds / mathrl seconds per RL step
(medians over all timed steps): above 1 means mathrl is faster. Both sides also report their mean reward, to show they ran the same task.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPTS, N, MAX_NEW, MINI, LR = 16, 8, 48, 64, 2e-4
SIDES = ("mathrl", "trl", "trl-defaults")  # trl: matched precision; trl-defaults: TRL as shipped


def run_mathrl(steps: int, model_dir: str, out_dir: Path) -> dict:
    from rich.console import Console

    from mathrl.config import load_config
    from mathrl.track.sinks import read_metrics
    from mathrl.train.loop import train

    cfg = load_config(None, [
        f"model.path={model_dir}", f"train.steps={steps}", f"rollout.prompts_per_step={PROMPTS}", f"rollout.n={N}",
        f"rollout.max_new_tokens={MAX_NEW}", f"train.mini_batch_size={MINI}", f"train.lr={LR}", "train.save_every=0",
        "reward.num_workers=0", "data.eval_size=8", "eval.n=1", f"eval.every={steps + 1}", "log.rollouts_per_step=0",
        f"run_dir={out_dir / 'mathrl'}",
    ])
    train(cfg, console=Console(quiet=True))
    rows = [r for r in read_metrics(out_dir / "mathrl" / "metrics.jsonl") if "perf/step_seconds" in r]
    return {"step_seconds": [r["perf/step_seconds"] for r in rows], "reward": [r["reward/mean"] for r in rows]}


def run_trl(steps: int, model_dir: str, out_dir: Path, *, matched: bool = True) -> dict:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from mathrl.reward.verify import verify_one
    from mathrl.tasks.arithmetic import ArithmeticTask
    from mathrl.tasks.prompts import render_prompt

    problems = ArithmeticTask(min_digits=1, max_digits=3).train_problems(PROMPTS * steps * 2, seed=0)
    data = Dataset.from_list([{"prompt": render_prompt(p.question, template="arith"), "answer": p.answer} for p in problems])

    def reward(completions, answer, **_):
        return [verify_one(c, a).score for c, a in zip(completions, answer)]

    class Clock(TrainerCallback):
        def __init__(self):
            self.begins, self.ends = [], []

        def on_step_begin(self, args, state, control, **kwargs):
            self.begins.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kwargs):
            self.ends.append(time.perf_counter())

    clock = Clock()
    args = GRPOConfig(
        output_dir=str(out_dir / "trl"), num_generations=N, max_completion_length=MAX_NEW,
        per_device_train_batch_size=MINI, steps_per_generation=PROMPTS * N // MINI, num_iterations=1,
        epsilon=0.2, epsilon_high=0.28, loss_type="dapo", beta=0.0, temperature=1.0, top_p=1.0, top_k=0,
        learning_rate=LR, lr_scheduler_type="constant", max_steps=steps * PROMPTS * N // MINI, logging_steps=1,
        report_to=[], use_cpu=True, save_strategy="no", seed=0, disable_dropout=True,
        **({"bf16": False, "gradient_checkpointing": False} if matched else {}),
    )
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir), reward_funcs=reward, args=args,
                          train_dataset=data, processing_class=AutoTokenizer.from_pretrained(model_dir),
                          callbacks=[clock])
    trainer.train()
    per_rl = PROMPTS * N // MINI  # optimizer steps per RL step
    seconds = [clock.ends[i + per_rl - 1] - clock.begins[i] for i in range(0, len(clock.ends), per_rl)]
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    return {"step_seconds": seconds, "reward": rewards}


def child(side: str, steps: int, threads: int, model_dir: str) -> None:
    import torch

    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as tmp:
        if side == "mathrl":
            result = run_mathrl(steps, model_dir, Path(tmp))
        else:
            result = run_trl(steps, model_dir, Path(tmp), matched=side == "trl")
    print("RESULT " + json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6, help="RL steps per run (the first is warm-up)")
    parser.add_argument("--repeats", type=int, default=2, help="alternating rounds of both sides")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, help="write the results as JSON")
    parser.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.steps, args.threads, args.model)
        return

    import trl
    import transformers

    from mathrl.config import BaseModelConfig
    from mathrl.model.tiny import ensure_base_model

    model_dir = str(ensure_base_model(BaseModelConfig()))
    runs: dict[str, list[dict]] = {side: [] for side in SIDES}
    for round_ in range(args.repeats):
        for side in SIDES:
            started = time.perf_counter()
            proc = subprocess.run(
                [sys.executable, __file__, "--child", side, "--steps", str(args.steps), "--threads", str(args.threads),
                 "--model", model_dir], capture_output=True, text=True,
            )
            lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
            if proc.returncode != 0 or not lines:
                sys.exit(f"{side} run failed:\n{proc.stderr[-3000:]}")
            result = json.loads(lines[-1][len("RESULT "):])
            runs[side].append(result)
            timed = result["step_seconds"][1:]
            print(f"round {round_ + 1} {side:12s}: {len(timed)} timed RL steps, median {statistics.median(timed):.2f} s, "
                  f"mean reward {statistics.mean(result['reward']):.3f} ({time.perf_counter() - started:.0f} s with start-up)")
    median = {side: statistics.median(s for r in rs for s in r["step_seconds"][1:]) for side, rs in runs.items()}
    ratio = {side: median[side] / median["mathrl"] for side in SIDES[1:]}
    print(f"\nseconds per GRPO step (median): mathrl {median['mathrl']:.2f}, TRL matched {median['trl']:.2f} "
          f"(ratio {ratio['trl']:.2f}), TRL defaults {median['trl-defaults']:.2f} (ratio {ratio['trl-defaults']:.2f})")
    if args.out:
        args.out.write_text(json.dumps({
            "median_step_seconds": median, "ratio_over_mathrl": ratio, "runs": runs,
            "settings": {"prompts": PROMPTS, "n": N, "max_new_tokens": MAX_NEW, "mini_batch": MINI, "lr": LR,
                         "steps": args.steps, "repeats": args.repeats, "threads": args.threads},
            "versions": {"trl": trl.__version__, "transformers": transformers.__version__, "python": platform.python_version()},
        }, indent=2))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
