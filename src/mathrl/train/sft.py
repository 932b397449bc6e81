"""Supervised fine-tuning on (prompt, response) rows: the first half of the R1 path (distil worked
traces with SFT, then RL from the result).

    python -m mathrl.train.sft arith_sft.jsonl --rows 4000        # clean worked arithmetic solutions
    mathrl sft data.train=arith_sft.jsonl --run-dir runs/sft      # then RL from its final/:
    mathrl train model.path=runs/sft/final --run-dir runs/rl

The rows come from data.train exactly as `train` loads problems (jsonl / parquet / hf:, the same field
map), each with its response in the field `sft.response_field`; the prompt is rendered with
data.template, so the model learns to answer the very prompts RL will sample from. The loss is the
negative log-likelihood of the response tokens (EOS included) only, token-mean over the whole
mini-batch: every micro-batch is normalised by the mini-batch's token count (`algo.losses.aggregate`
with `global_counts`), so the gradient does not depend on train.micro_batch_tokens. The run directory,
checkpoints, exact resume and trackers are train's (run_dir.py, train/checkpoint.py, track/); metrics are
`sft/*` (docs/metrics.md) plus `eval/<set>/*`.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from rich.console import Console

from mathrl.algo.losses import aggregate, dp_scale, global_counts, sft_loss
from mathrl.cache import umask_modes
from mathrl.config import Config, ConfigError, dump_yaml
from mathrl.machine import describe_machine, machine_comment
from mathrl.model.io import load_model_and_tokenizer
from mathrl.model.paths import resolve_model_path
from mathrl.model.scoring import response_logprobs
from mathrl.reward.verify import Verifier
from mathrl.rollout.episodes import call_format
from mathrl.rollout.factory import build_engine
from mathrl.run_dir import RunDir, open_run_dir, release_run_dir
from mathrl.tasks.arithmetic import base_pretraining_text
from mathrl.tasks.loading import load_problems
from mathrl.tasks.sources import build_eval_sets, field_map, prompt_encoder
from mathrl.track.console import end_startup
from mathrl.train.batching import Rows, micro_batches
from mathrl.train.checkpoint import load_trainer_state, save_checkpoint
from mathrl.train.passes import per_token_pass
from mathrl.train.preempt import Preempted, StopSignal, time_save_due
from mathrl.train.shared import (
    SkipCount,
    build_optimizer,
    build_tracker,
    eval_due,
    evals_from_log,
    log_evals,
    resume_from,
    run_evals,
    save_due,
    seed_everything,
    summary,
)
from mathrl.train.update import step_if_finite


@dataclass
class Example:
    prompt_ids: list[int]
    response_ids: list[int]  # EOS last
    observation: list[int] | None = None  # 1 on tool-observation tokens (context, not learnt); None: none


# ----------------------------------------------------------------------------------------- data
def check_sft_config(cfg: Config) -> None:
    """The sft rules that `Config.validate` cannot know (they hold only for `mathrl sft`); one line each."""
    errors = []
    if cfg.data.train == "arith":
        errors.append("data.train=arith has no responses to learn: give a .jsonl / .parquet file or hf: dataset whose "
                      f"rows hold a {cfg.sft.response_field!r} field (sft.response_field); "
                      "python -m mathrl.train.sft FILE.jsonl writes worked arithmetic solutions")
    if cfg.model.dtype == "float16":  # no loss scaler here: AdamW on float16 weights underflows
        errors.append("model.dtype=float16 trains with a loss scaler in `mathrl train` only; mathrl sft would step "
                      "float16 weights unscaled: use model.dtype=float32 or bfloat16")
    if errors:
        raise ConfigError("\n".join(errors))


def load_examples(cfg: Config, tokenizer) -> tuple[list[Example], dict[str, int]]:
    """data.train's rows as token ids (prompt rendered with data.template; response + EOS) and the
    counts of rows dropped: prompt too long (as in train), response over sft.max_response_tokens."""
    source = cfg.data.train
    fields = field_map(cfg, source)
    key = cfg.sft.response_field
    if key in (fields.question, fields.answer, fields.answer_from_solution, fields.id):
        raise ConfigError(f"sft.response_field={key!r} is also the question, answer or id field of {source}; "
                          "name the field that holds the response (the loader keeps it only when it is not one of those)")
    loaded = load_problems(source, fields, on_error=cfg.data.on_error)
    limit = cfg.sft.max_response_tokens or cfg.rollout.max_new_tokens
    encoder = prompt_encoder(cfg, tokenizer, max_new_tokens=limit)
    examples, dropped = [], {"response_missing": 0, "response_too_long": 0}
    fmt = call_format(cfg.rollout.tool_format, cfg.rollout.tool_tags) if cfg.rollout.tools else None
    for problem in loaded.problems:
        response = problem.meta.get(key)
        if not isinstance(response, str) or not response.strip():
            if cfg.data.on_error == "raise":
                raise ValueError(f"{source}: row {problem.id} has no string field {key!r} (sft.response_field); "
                                 "fix the row or use data.on_error=skip")
            dropped["response_missing"] += 1
            continue
        kept, ids, _ = encoder.encode([problem])
        if not kept:
            continue  # counted in encoder.dropped
        response_ids, observation = encode_trace(response, tokenizer, fmt)
        response_ids.append(tokenizer.eos_token_id)
        if len(response_ids) > limit:
            dropped["response_too_long"] += 1
            continue
        examples.append(Example(ids[0], response_ids, observation + [0] if fmt is not None else None))
    dropped["prompt_too_long"] = encoder.dropped
    return examples, dropped


def encode_trace(response: str, tokenizer, fmt) -> tuple[list[int], list[int]]:
    """A response's token ids and its observation mask. With a tool format (`fmt`, rollout.tools set),
    the text between the format's observation tags is a tool's output: it is tokenized on its own, as
    an episode appends it (the tags, then the output as plain text), and masked (1) so that SFT learns
    the calls and the answers, not the outputs.
    Without one, the whole response is one model segment."""
    if fmt is None:
        return tokenizer(response, add_special_tokens=False)["input_ids"], []
    ids, mask, rest = [], [], response
    while True:
        start = rest.find(fmt.observation_open)
        end = rest.find(fmt.observation_close, start + len(fmt.observation_open)) if start >= 0 else -1
        if start < 0 or end < 0:
            break
        model = tokenizer(rest[:start], add_special_tokens=False)["input_ids"]
        # as an episode appends it (rollout/episodes.py): the tags' own ids around the output as plain
        # text, so a special token the output printed stays characters here too
        inner = rest[start + len(fmt.observation_open) : end]
        seen = (tokenizer(fmt.observation_open, add_special_tokens=False)["input_ids"]
                + tokenizer(inner, add_special_tokens=False, split_special_tokens=True)["input_ids"]
                + tokenizer(fmt.observation_close, add_special_tokens=False)["input_ids"])
        ids, mask = ids + model + seen, mask + [0] * len(model) + [1] * len(seen)
        rest = rest[end + len(fmt.observation_close) :]
    tail = tokenizer(rest, add_special_tokens=False)["input_ids"]
    return ids + tail, mask + [0] * len(tail)


def split_heldout(examples: list[Example], count: int, *, seed: int) -> tuple[list[Example], list[Example]]:
    """(training rows, `count` held-out rows), the held-out ones a draw seeded by `seed`."""
    if count >= len(examples):
        raise ValueError(f"sft.eval_rows={count} leaves no training rows out of {len(examples)}; lower sft.eval_rows")
    order = list(range(len(examples)))
    random.Random(f"sft-heldout:{seed}").shuffle(order)
    held = set(order[:count])
    return [e for i, e in enumerate(examples) if i not in held], [examples[i] for i in sorted(held)]


def collate(examples: list[Example], *, pad_id: int) -> Rows:
    """Rows [left-padded prompt | right-padded response] whose loss mask is the response (EOS included)."""
    n, p, t = len(examples), max(len(e.prompt_ids) for e in examples), max(len(e.response_ids) for e in examples)
    prompt_ids, prompt_mask = torch.full((n, p), pad_id, dtype=torch.long), torch.zeros(n, p)
    response_ids, response_mask = torch.full((n, t), pad_id, dtype=torch.long), torch.zeros(n, t)
    for i, e in enumerate(examples):
        prompt_ids[i, p - len(e.prompt_ids):] = torch.tensor(e.prompt_ids)
        prompt_mask[i, p - len(e.prompt_ids):] = 1
        response_ids[i, : len(e.response_ids)] = torch.tensor(e.response_ids)
        response_mask[i, : len(e.response_ids)] = 1
    observation = None
    if any(e.observation is not None for e in examples):  # tool traces: observation tokens are context, not loss
        observation = torch.zeros(n, t)
        for i, e in enumerate(examples):
            if e.observation is not None:
                observation[i, : len(e.observation)] = torch.tensor(e.observation, dtype=torch.float32)
        response_mask = response_mask - observation
    return Rows(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids, response_mask=response_mask,
                loss_mask=response_mask.clone(), correct=torch.zeros(n), observation_mask=observation)


class ExampleStream:
    """Training rows in shuffled epochs (seeded by `seed` and the epoch); its position is checkpointed."""

    def __init__(self, examples: list[Example], *, seed: int):
        self.examples, self.seed, self.epoch, self.order = examples, seed, 0, []

    def next_batch(self, count: int) -> list[Example]:
        out = []
        while len(out) < count:
            if not self.order:
                self.order = list(range(len(self.examples)))
                random.Random(f"sft:{self.seed}:{self.epoch}").shuffle(self.order)
                self.epoch += 1
            out.append(self.examples[self.order.pop()])
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "order": list(self.order)}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.order = state["epoch"], list(state["order"])


# ----------------------------------------------------------------------------------------- loss
def sft_backward(model, batch: Rows, *, micro_batch_tokens: int, chunk_size: int = 1024) -> tuple[float, float]:
    """Accumulate the gradient of the token-mean response NLL of `batch` (one mini-batch) over micro-batches
    of at most `micro_batch_tokens` tokens; returns (loss, response tokens). Each micro-batch's loss is
    divided by the whole mini-batch's token count (all ranks), so the sum of the micro-batch gradients
    is the full-batch gradient whatever the split (tests/train/test_sft.py)."""
    num_tokens, num_seqs = global_counts(batch.loss_mask)
    total = 0.0
    for micro in micro_batches(batch, micro_batch_tokens):
        logprobs, _ = response_logprobs(model, micro.prompt_ids, micro.prompt_mask, micro.response_ids,
                                        micro.context_mask, chunk_size=chunk_size, with_entropy=False)
        mask = micro.loss_mask.to(logprobs.device)
        loss = aggregate(sft_loss(logprobs, mask), mask, mode="token_mean", num_tokens=num_tokens, num_seqs=num_seqs)
        (loss * dp_scale()).backward()
        total += loss.item()
    return total, num_tokens


def heldout_loss(model, batch: Rows, cfg: Config) -> float:
    """Token-mean response NLL of `batch` under `model`, no grad."""

    def forward(model, mb: Rows) -> list[torch.Tensor]:
        lp, _ = response_logprobs(model, mb.prompt_ids, mb.prompt_mask, mb.response_ids, mb.context_mask,
                                  chunk_size=cfg.model.logprob_chunk_size, with_entropy=False)
        return [lp]

    (logprobs,) = per_token_pass(model, batch, cfg, forward)
    return float(sft_loss(logprobs, batch.loss_mask).sum() / batch.loss_mask.sum().clamp(min=1))


# ----------------------------------------------------------------------------------------- the run
@dataclass
class SFTRun:
    """What an SFT run holds between steps (built by `build_sft`)."""

    cfg: Config
    console: Console
    run: RunDir
    checkpoint: Path | None  # the checkpoint this run resumed from
    model: torch.nn.Module
    tokenizer: object
    stream: ExampleStream
    eval_batch: Rows | None  # the held-out rows (sft.eval_rows)
    eval_sets: list  # the data.eval sets (sft.eval_pass1)
    engine: object | None  # samples the eval sets
    optimizer: torch.optim.Optimizer
    scheduler: object
    tracker: object = None  # built once a resumed run's log is truncated
    start_step: int = 1
    skips: SkipCount = field(default_factory=SkipCount)

    def evaluate(self, step: int, verifier: Verifier) -> dict:
        """Held-out loss and (sft.eval_pass1) the data.eval sets; logged at `step`, returns the EvalResults."""
        metrics, results = {}, {}
        if self.eval_batch is not None:
            metrics["sft/eval_loss"] = heldout_loss(self.model, self.eval_batch, self.cfg)
            self.tracker.log(step, metrics)
        if self.eval_sets:
            self.engine.update_weights(self.model.state_dict().items())
            results = run_evals(self.eval_sets, engine=self.engine, tokenizer=self.tokenizer, verifier=verifier, cfg=self.cfg)
            metrics.update(log_evals(step, results, self.tracker, self.run))
        shown = ", ".join(f"{k} {v:.4f}" for k, v in metrics.items() if k.endswith(("eval_loss", "pass@1")))
        self.console.print(f"step {step}/{self.cfg.sft.steps}: {shown}", highlight=False)
        return results


def build_sft(cfg: Config, console: Console, *, resume: bool) -> SFTRun:
    """The run directory, model, data, optimizer and tracker of an SFT run, resumed from the run
    directory's last checkpoint when it holds one."""
    run, checkpoint = open_run_dir(cfg.run_dir, config_text=machine_comment(describe_machine()) + dump_yaml(cfg), resume=resume, console=console,
                                   steps_key="sft.steps")
    console.print(f"[bold]run directory[/bold] {run.path}")
    seed_everything(cfg.seed)
    model_path = resolve_model_path(cfg, console, pretraining_text=base_pretraining_text(cfg.base))
    model, tokenizer = load_model_and_tokenizer(checkpoint or model_path, dtype=cfg.model.dtype)
    model.train()
    examples, dropped = load_examples(cfg, tokenizer)
    train_rows, eval_rows = split_heldout(examples, cfg.sft.eval_rows, seed=cfg.seed) if cfg.sft.eval_rows else (examples, [])
    console.print(f"{len(train_rows)} training rows, {len(eval_rows)} held out from {cfg.data.train}"
                  + "".join(f"; {v} dropped ({k.replace('_', ' ')})" for k, v in dropped.items() if v))
    eval_sets = build_eval_sets(cfg, tokenizer, limit=cfg.data.eval_size) if cfg.sft.eval_pass1 else []
    optimizer, scheduler = build_optimizer(model.parameters(), cfg, lr=cfg.sft.lr, warmup_steps=cfg.sft.warmup_steps)
    s = SFTRun(cfg, console, run, checkpoint, model, tokenizer, ExampleStream(train_rows, seed=cfg.seed),
               collate(eval_rows, pad_id=tokenizer.pad_token_id) if eval_rows else None, eval_sets,
               build_engine(cfg, model=model, tokenizer=tokenizer, model_path=checkpoint or model_path) if eval_sets else None,
               optimizer, scheduler)
    if checkpoint is not None:  # exact resume: weights (loaded above), optimizer, schedule, data order, RNG
        state = load_trainer_state(checkpoint, optimizers={"optimizer": optimizer, "scheduler": scheduler}, controllers={})
        s.start_step = resume_from(checkpoint, state, stream=s.stream, run=run, console=console, steps=cfg.sft.steps)
    s.tracker = build_tracker(cfg, run)
    end_startup()  # the lines mathrl logged while setting up, as one block (track/console.py)
    return s


def sft_step(s: SFTRun, step: int) -> None:
    """One optimizer step on the next batch (skipped when the loss or gradient is not finite), logged."""
    cfg, t0 = s.cfg, time.time()
    batch = collate(s.stream.next_batch(cfg.sft.batch_size), pad_id=s.tokenizer.pad_token_id)
    loss, tokens = sft_backward(s.model, batch, micro_batch_tokens=cfg.train.micro_batch_tokens,
                                chunk_size=cfg.model.logprob_chunk_size)
    grad_norm = torch.nn.utils.clip_grad_norm_(s.model.parameters(), cfg.train.max_grad_norm)
    lr = s.optimizer.param_groups[0]["lr"]
    skipped = not step_if_finite(s.optimizer, s.scheduler, grad_norm, [loss])  # as in train
    s.skips.record(step, int(skipped), s.console)
    s.tracker.log(step, {"sft/loss": loss, "sft/grad_norm": float(grad_norm), "sft/lr": lr,
                         "sft/response_tokens": tokens, "perf/skipped_updates": float(skipped),
                         "perf/step_seconds": time.time() - t0})


def sft(cfg: Config, *, console: Console | None = None, resume: bool = True) -> Path:
    """Fine-tune model.path on data.train's responses for sft.steps optimizer steps; returns the run
    directory, whose final/ is a Hugging Face model `mathrl train model.path=<run>/final` starts from."""
    console = console or Console()
    check_sft_config(cfg)
    t_start = time.time()
    s = build_sft(cfg, console, resume=resume)
    with Verifier(num_workers=cfg.reward.num_workers, timeout_s=cfg.reward.timeout_s, boxed=cfg.reward.boxed, checker=cfg.reward.checker) as verifier:
        base = last = {}
        if s.checkpoint is None:
            base = s.evaluate(0, verifier)
        elif s.eval_sets:  # a resumed run's evaluations so far are in its log
            base, last, _ = evals_from_log(s.run)
        with StopSignal() as stop:  # SIGTERM: stop after the step in progress, saved (train/preempt.py)
            last_save = time.monotonic()
            for step in range(s.start_step, cfg.sft.steps + 1):
                sft_step(s, step)
                if eval_due(cfg, step, last=cfg.sft.steps):
                    last = s.evaluate(step, verifier)
                late = time_save_due(cfg.train.save_every_minutes, last_save=last_save, now=time.monotonic())
                checkpoints_on = bool(cfg.train.save_every or cfg.train.save_every_minutes)
                # no checkpoint while updates are being skipped: the last one stays the last good one
                due = save_due(cfg, step, last=cfg.sft.steps) or late or (stop.requested and checkpoints_on)
                if due and not s.skips.in_a_row:
                    save_checkpoint(s.run.checkpoints, step, model=s.model, tokenizer=s.tokenizer, optimizer=s.optimizer,
                                    scheduler=s.scheduler, state={"controllers": {}, "data": s.stream.state_dict()},
                                    keep_last=cfg.train.keep_last, keep_every=cfg.keep_every_steps)
                    last_save = time.monotonic()
                s.skips.stop_if_over(cfg.train.max_skipped_steps, s.run.checkpoints)
                if stop.requested and step < cfg.sft.steps:
                    if s.engine is not None:
                        s.engine.close()
                    s.tracker.close()
                    raise Preempted(step)
    finish_sft(s, base=base, last=last, wall_seconds=time.time() - t_start)
    release_run_dir(s.run.path)  # finished: the writer's lock goes before the process does
    return s.run.path


def finish_sft(s: SFTRun, *, base: dict, last: dict, wall_seconds: float) -> None:
    """Save final/ (a plain Hugging Face directory), close the engine and tracker, write the summary."""
    cfg, run = s.cfg, s.run
    if s.engine is not None:
        s.engine.close()
    s.model.save_pretrained(run.final, safe_serialization=True)
    s.tokenizer.save_pretrained(run.final)
    umask_modes(run.final)
    (run.final / "trainer_state.json").write_text(json.dumps({"step": cfg.sft.steps, "data": s.stream.state_dict()}))
    s.tracker.close()
    losses = [r for r in run.metrics() if "sft/eval_loss" in r]
    run.write_summary({  # train's summary, plus the held-out loss before and after
        **summary(wall_seconds=wall_seconds, steps=cfg.sft.steps, base=base, final=last),
        "machine": describe_machine(),
        "sft_eval_loss": {"base": losses[0]["sft/eval_loss"], "final": losses[-1]["sft/eval_loss"]} if losses else None,
    })
    s.console.print(f"[bold]run directory[/bold] {run.path}; continue with RL: mathrl train model.path={run.final}")


# ----------------------------------------------------------------------------------------- example data
def write_arith_sft_jsonl(path: str | Path, *, rows: int, min_digits: int = 1, max_digits: int = 3, seed: int = 0,
                          slip_prob: float = 0.0, check_prob: float = 0.0, tool_share: float = 0.0,
                          mul_share: float = 0.0, mul_digits: int = 2) -> Path:
    """`rows` training-split arithmetic problems (never held out) with worked solutions, one JSON object
    per line: {"problem", "answer", "response"}; slip_prob > 0 adds the base model's deliberate slips,
    check_prob > 0 its self-checks (each repairs its column); tool_share > 0 writes that share of the
    rows as tool traces (a python block computing the sum, its output, the boxed answer: what
    `mathrl sft` with rollout.tools learns, the output masked); mul_share > 0 makes that share of the
    problems products with a `mul_digits`-digit second factor (long multiplication, or a tool trace)."""
    from mathrl.tasks.arithmetic import ArithmeticTask

    task = ArithmeticTask(min_digits=min_digits, max_digits=max_digits, mul_share=mul_share, mul_digits=mul_digits)
    rng = random.Random(f"sft-data:{seed}")
    path = Path(path)
    with path.open("w") as f:
        for problem in task.train_problems(rows, seed=seed):
            if tool_share > 0 and rng.random() < tool_share:
                response = task.tool_solution(problem)
            else:
                response = task.solution(problem, rng=rng, slip_prob=slip_prob, check_prob=check_prob)
            f.write(json.dumps({"problem": problem.question, "answer": problem.answer, "response": response}) + "\n")
    return path


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Write worked arithmetic solutions as (prompt, response) jsonl for mathrl sft.")
    parser.add_argument("out", help="the .jsonl file to write")
    parser.add_argument("--rows", type=int, default=4000)
    parser.add_argument("--min-digits", type=int, default=1)
    parser.add_argument("--max-digits", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--slip-prob", type=float, default=0.0, help="per-column chance of a slip (0: clean solutions)")
    parser.add_argument("--check-prob", type=float, default=0.0, help="per-column chance of a self-check (1: check every column)")
    parser.add_argument("--tool-share", type=float, default=0.0, help="share of rows written as python-tool traces (1: all)")
    parser.add_argument("--mul-share", type=float, default=0.0, help="share of problems that are products (1: all)")
    parser.add_argument("--mul-digits", type=int, default=2, help="digits of a product's second factor")
    a = parser.parse_args()
    print(write_arith_sft_jsonl(a.out, rows=a.rows, min_digits=a.min_digits, max_digits=a.max_digits, seed=a.seed,
                                slip_prob=a.slip_prob, check_prob=a.check_prob, tool_share=a.tool_share,
                                mul_share=a.mul_share, mul_digits=a.mul_digits))
