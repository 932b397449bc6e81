"""Benchmark: one GRPO step in mathrl against TRL's `GRPOTrainer`, same model, same workload.

Run from the repository root (needs `pip install trl`; the tiny base model is built if missing):

    python benchmarks/grpo_step_vs_trl.py                       # --workload tiny, defaults below
    python benchmarks/grpo_step_vs_trl.py --workload small --steps 3 --repeats 1 --out small.json

Two workloads (`--workload`), each matched field by field between the two sides:

- tiny: the embedded default's RL step. Python and framework overhead weigh a lot at this size.
- small: a Qwen2-architecture model with random weights (hidden 512, 4 layers, 8 query / 2 key-value
  heads, MLP 1536, a 32,000-token vocabulary as Llama/Mistral tokenizers have: 28M parameters, tied
  embeddings) and 256-token responses, so the matrix products, the vocabulary-wide softmax and the
  sampling dominate. The random model never emits EOS, so every response has all 256 tokens and
  the reward is 0 on both sides (the work per step is the same as with learning signal). A 151,936
  vocabulary (Qwen's) makes one step of this size take minutes on 2 cores; 32k keeps it at tens of
  seconds. The model is built once with `mathrl.model.init.build_random_model` and saved into a
  temporary directory that both sides load.

| | mathrl | TRL |
| --- | --- | --- |
| model | the cached tiny base model / the small model's directory | the same directory |
| problems | generated 1-3 digit additions, `arith` template | the same prompt strings |
| batch (tiny / small) | `rollout.prompts_per_step=16 / 4`, `rollout.n=8 / 4` | `num_generations=8 / 4`, `generation_batch_size=128 / 16` |
| sampling | temperature 1, top-p 1, 48 / 256 new tokens | temperature 1, top-p 1, `top_k=0`, `max_completion_length=48 / 256` |
| updates | mini-batch 64 / 8 -> 2 optimizer steps per RL step, 1 epoch | `per_device_train_batch_size=64 / 8`, `steps_per_generation=2`, `num_iterations=1` |
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
(medians over all timed steps): above 1 means mathrl is faster. The side `mathrl-async` is mathrl with
`rollout.max_staleness=1`: a generator process samples the next step while the trainer updates, each on
half of `--threads` cores (docs/async.md); its time per RL step is the trainer's whole cycle,
perf/step_seconds + perf/wait_seconds (the wait for its batch). The side `mathrl-hf` is mathrl with
`rollout.decode=hf`: the torch engine's forward at every token through the Hugging Face modules
instead of the lean decode loop (the default), the same samples up to float rounding. Each side also prints where its step
goes (medians over the timed steps): mathrl its perf/rollout_seconds, perf/reward_seconds and
perf/train_seconds (everything after the rewards); TRL the time inside its generation call, inside its
no-grad logprob passes (the old-policy logprobs: TRL computes them whenever one generation feeds
several optimizer steps) and the rest (rewards, advantages, both optimizer steps). Both sides also report their mean
reward, to show they ran the same task, and the peak resident memory of their process (ru_maxrss:
model loading, evaluation and every step included).

The header names the CPU (model, and whether it has AVX-512 BF16 / AMX units, which decide how fast
TRL's default bf16 autocast runs), the torch threads and the versions of torch, transformers, TRL and
mathrl. Run it on an otherwise idle machine (nothing else running on the cores).
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LR = 2e-4
WORKLOADS = {  # prompts per step, samples per prompt, new tokens, mini-batch rows
    "tiny": {"prompts": 16, "n": 8, "max_new": 48, "mini": 64},
    "small": {"prompts": 4, "n": 4, "max_new": 256, "mini": 8},
}
SMALL_MODEL = {  # a shrunk Qwen2: the architecture of qwen2.5-0.5b with these sizes
    "hidden_size": 512, "num_hidden_layers": 4, "max_window_layers": 4, "num_attention_heads": 8,
    "num_key_value_heads": 2, "intermediate_size": 1536, "vocab_size": 32000, "max_position_embeddings": 1024,
}
SIDES = ("mathrl", "mathrl-hf", "mathrl-async", "trl", "trl-defaults")  # trl: matched precision; trl-defaults: TRL as shipped
# mathrl-hf: the Hugging Face forward at every token (rollout.decode=hf), to rule the lean decode loop out;
# mathrl-async: one step off-policy, a generator process beside the trainer, each on half the threads
EXTRA = {"mathrl": (), "mathrl-hf": ("rollout.decode=hf",), "mathrl-async": ("rollout.max_staleness=1",)}


def build_small_model(out_dir: Path) -> str:
    """Save the small workload's random-init model (and its tokenizer) into out_dir."""
    from transformers import AutoConfig

    from mathrl.model.init import architecture_config, build_random_model

    raw = architecture_config("qwen2.5-0.5b").to_dict()
    raw.pop("layer_types", None)  # one entry per layer: rebuilt for the new layer count
    raw.update(SMALL_MODEL)
    model, tokenizer = build_random_model(AutoConfig.for_model(raw.pop("model_type"), **raw), seed=0)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return str(out_dir)


def cpu_description() -> str:
    """CPU model name and the matrix-unit flags that decide bf16 speed, from /proc/cpuinfo."""
    name, flags = platform.processor() or "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                name = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    wanted = ["avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"]
    shown = " ".join(f"{f}={'yes' if f in flags else 'no'}" for f in wanted)
    return f"{name} ({shown})"


def run_mathrl(steps: int, model_dir: str, out_dir: Path, w: dict, extra: tuple[str, ...] = ()) -> dict:
    from rich.console import Console

    from mathrl.config import load_config
    from mathrl.track.sinks import read_metrics
    from mathrl.train.loop import train

    cfg = load_config(None, [
        f"model.path={model_dir}", f"train.steps={steps}", f"rollout.prompts_per_step={w['prompts']}",
        f"rollout.n={w['n']}", f"rollout.max_new_tokens={w['max_new']}", f"train.mini_batch_size={w['mini']}",
        f"train.lr={LR}", "train.save_every=0", "reward.num_workers=0", "data.eval_size=2", "eval.n=1",
        f"eval.every={steps + 1}", "log.rollouts_per_step=0", f"run_dir={out_dir / 'mathrl'}",
        "data.dynamic_sampling.mode=none",  # as TRL: one generation round per step, every group trains
        *extra,
    ])
    train(cfg, console=Console(quiet=True))
    rows = [r for r in read_metrics(out_dir / "mathrl" / "metrics.jsonl") if "perf/step_seconds" in r]
    phases = {k: [r[f"perf/{k}_seconds"] for r in rows[1:]] for k in ("rollout", "reward", "train")}
    # the trainer's whole cycle: with a generator beside it, the time it waited for its batch counts too
    cycle = [r["perf/step_seconds"] + r.get("perf/wait_seconds", 0.0) for r in rows]
    return {"step_seconds": cycle, "reward": [r["reward/mean"] for r in rows],
            "phases": {k: statistics.median(v) for k, v in phases.items() if v}}


def run_trl(steps: int, model_dir: str, out_dir: Path, w: dict, *, matched: bool = True) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from mathrl.reward.verify import verify_one
    from mathrl.tasks.arithmetic import ArithmeticTask
    from mathrl.tasks.prompts import render_prompt

    prompts, n, mini = w["prompts"], w["n"], w["mini"]
    problems = ArithmeticTask(min_digits=1, max_digits=3).train_problems(prompts * steps * 2, seed=0)
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
        output_dir=str(out_dir / "trl"), num_generations=n, max_completion_length=w["max_new"],
        per_device_train_batch_size=mini, steps_per_generation=prompts * n // mini, num_iterations=1,
        epsilon=0.2, epsilon_high=0.28, loss_type="dapo", beta=0.0, temperature=1.0, top_p=1.0, top_k=0,
        learning_rate=LR, lr_scheduler_type="constant", max_steps=steps * prompts * n // mini, logging_steps=1,
        report_to=[], use_cpu=True, save_strategy="no", seed=0, disable_dropout=True,
        **({"bf16": False, "gradient_checkpointing": False} if matched else {}),
    )
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir), reward_funcs=reward, args=args,
                          train_dataset=data, processing_class=AutoTokenizer.from_pretrained(model_dir),
                          callbacks=[clock])
    # phase clocks: TRL's generation call (one per RL step) and its no-grad logprob passes (the old-policy
    # logprobs, computed because 2 optimizer steps share one generation); the rest of the step is
    # rewards, advantages and the two optimizer steps
    generate_s: list[float] = []
    scoring_s: list[float] = []

    def timed(method):
        def wrapper(*a, **k):
            t = time.perf_counter()
            out = method(*a, **k)
            if method.__name__ == "_generate":
                generate_s.append(time.perf_counter() - t)
                scoring_s.append(0.0)
            elif not torch.is_grad_enabled() and scoring_s:
                scoring_s[-1] += time.perf_counter() - t
            return out
        return wrapper

    trainer._generate = timed(trainer._generate)
    trainer._get_per_token_logps_and_entropies = timed(trainer._get_per_token_logps_and_entropies)
    trainer.train()
    per_rl = prompts * n // mini  # optimizer steps per RL step
    seconds = [clock.ends[i + per_rl - 1] - clock.begins[i] for i in range(0, len(clock.ends), per_rl)]
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    rest = [step - g - sc for step, g, sc in zip(seconds, generate_s, scoring_s)]
    phases = {"generate": generate_s[1:], "scoring": scoring_s[1:], "train": rest[1:]}
    return {"step_seconds": seconds, "reward": rewards,
            "phases": {k: statistics.median(v) for k, v in phases.items() if v}}


def child(side: str, steps: int, threads: int, model_dir: str, workload: str) -> None:
    import torch

    torch.set_num_threads(threads)
    w = WORKLOADS[workload]
    with tempfile.TemporaryDirectory() as tmp:
        if side.startswith("mathrl"):
            result = run_mathrl(steps, model_dir, Path(tmp), w, EXTRA[side])
        else:
            result = run_trl(steps, model_dir, Path(tmp), w, matched=side == "trl")
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    print("RESULT " + json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="tiny", help="see the module docstring")
    parser.add_argument("--steps", type=int, default=None, help="RL steps per run, the first is warm-up (tiny 6, small 3)")
    parser.add_argument("--repeats", type=int, default=2, help="alternating rounds of all sides")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES), help="mathrl and at least one TRL side")
    parser.add_argument("--out", type=Path, help="write the results as JSON")
    parser.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    steps = args.steps or (6 if args.workload == "tiny" else 3)
    if steps < 2:
        parser.error("--steps must be at least 2: the first RL step of each run is warm-up")
    if args.child:
        child(args.child, steps, args.threads, args.model, args.workload)
        return
    if "mathrl" not in args.sides or not any(side.startswith("trl") for side in args.sides):
        parser.error("--sides needs mathrl and at least one of trl, trl-defaults")

    import torch
    import transformers
    import trl

    import mathrl
    from mathrl.config import BaseModelConfig
    from mathrl.model.tiny import ensure_base_model
    from mathrl.tasks.arithmetic import base_pretraining_text

    versions = {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__,
                "mathrl": getattr(mathrl, "__version__", "?"), "python": platform.python_version()}
    cpu = cpu_description()
    w = WORKLOADS[args.workload]
    print(f"workload {args.workload}: {w['prompts']} prompts x {w['n']} samples, {w['max_new']} new tokens, "
          f"mini-batch {w['mini']}; {steps} RL steps per run (first dropped), {args.repeats} round(s)")
    print(f"cpu: {cpu}; torch threads {args.threads}")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    with tempfile.TemporaryDirectory() as tmp:
        if args.workload == "tiny":
            model_dir = str(ensure_base_model(BaseModelConfig(), pretraining_text=base_pretraining_text(BaseModelConfig())))
        else:
            model_dir = build_small_model(Path(tmp) / "small-model")
        runs: dict[str, list[dict]] = {side: [] for side in args.sides}
        for round_ in range(args.repeats):
            for side in args.sides:
                started = time.perf_counter()
                proc = subprocess.run(
                    [sys.executable, __file__, "--child", side, "--workload", args.workload, "--steps", str(steps),
                     "--threads", str(args.threads), "--model", model_dir], capture_output=True, text=True,
                )
                lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
                if proc.returncode != 0 or not lines:
                    sys.exit(f"{side} run failed:\n{proc.stderr[-3000:]}")
                result = json.loads(lines[-1][len("RESULT "):])
                runs[side].append(result)
                timed = result["step_seconds"][1:]
                print(f"round {round_ + 1} {side:12s}: {len(timed)} timed RL steps, median {statistics.median(timed):.2f} s, "
                      f"mean reward {statistics.mean(result['reward']):.3f}, peak RSS {result['peak_rss_mb']:.0f} MB "
                      f"({time.perf_counter() - started:.0f} s with start-up)", flush=True)
                if result.get("phases"):
                    print(f"    {side} phases (median s): " + ", ".join(f"{k} {v:.2f}" for k, v in result["phases"].items()))
    median = {side: statistics.median(s for r in rs for s in r["step_seconds"][1:]) for side, rs in runs.items()}
    rss = {side: max(r["peak_rss_mb"] for r in rs) for side, rs in runs.items()}
    ratio = {side: median[side] / median["mathrl"] for side in args.sides if side != "mathrl"}
    trl = next(side for side in ("trl", "trl-defaults") if side in args.sides)
    print(f"\n| workload {args.workload} | seconds per GRPO step (median) | / mathrl | {trl} / this | peak RSS (MB) |")
    print("| --- | --- | --- | --- | --- |")
    names = {"mathrl": "mathrl", "mathrl-hf": "mathrl, HF forward per token (rollout.decode=hf)",
             "mathrl-async": "mathrl async (generator + trainer, 1 step off-policy)",
             "trl": "TRL matched (fp32, no checkpointing)", "trl-defaults": "TRL as shipped (bf16, checkpointing)"}
    for side in args.sides:
        print(f"| {names[side]} | {median[side]:.2f} | {median[side] / median['mathrl']:.2f} "
              f"| {median[trl] / median[side]:.2f} | {rss[side]:.0f} |")
    if args.out:
        args.out.write_text(json.dumps({
            "workload": args.workload, "median_step_seconds": median, "ratio_over_mathrl": ratio, "peak_rss_mb": rss,
            "runs": runs, "cpu": cpu, "threads": args.threads, "versions": versions,
            "settings": {**w, "lr": LR, "steps": steps, "repeats": args.repeats,
                         **({"model": SMALL_MODEL} if args.workload == "small" else {})},
        }, indent=2))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
