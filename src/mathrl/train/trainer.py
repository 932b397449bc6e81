"""`build_trainer`: everything an RL run holds, built in one place, in a fixed order.

    trainer = build_trainer(cfg, ranks, console=console, resume=True)
    with trainer.rewarder:
        result = rl_step(trainer, trainer.start_step)      # train/step.py: a StepResult

The order of the builds below is part of the run's reproducibility: the tiny base model, a fresh
value head and the data streams draw from the seeded generators, so they are built in the same order
every time. A resumed run (a checkpoint in the run directory) gets its weights, optimizer, controllers,
data position and RNG state back; a `train.init_from` run starts from another run's checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

import mathrl.train.dist as tdist
from mathrl.algo.controllers import (
    AdaptiveEntropyController,
    AdaptiveKLController,
    CoefController,
    FixedCoef,
    SkyworkEntropyController,
)
from mathrl.config import Config, dump_yaml
from mathrl.evaluation.evaluate import EvalResult
from mathrl.machine import describe_machine, machine_comment
from mathrl.model.dtypes import trainer_dtype
from mathrl.model.io import load_model_and_tokenizer, model_overrides
from mathrl.model.lora import adapter_params, add_adapters, has_adapter, is_lora, load_adapter_weights, stream_plain_weights
from mathrl.model.paths import resolve_model_path
from mathrl.model.value import load_critic
from mathrl.registry import ADVANTAGE_ESTIMATORS
from mathrl.reward.functions import Rewarder, build_rewarder
from mathrl.rollout.factory import build_engine, engine_samples_from_module
from mathrl.rollout.on_demand import OnDemandEngine
from mathrl.run_dir import RunDir, open_run_dir
from mathrl.tasks.arithmetic import base_pretraining_text
from mathrl.tasks.sources import EvalSet, PretrainText, ProblemStream, build_eval_sets, build_train_stream
from mathrl.train.checkpoint import VERSIONS_FILE, load_trainer_state, save_checkpoint
from mathrl.train.dist import Ranks, broadcast_object, shard_model
from mathrl.train.monitors import CollapseWatch, SignalWatch
from mathrl.train.preempt import StopSignal, agree, time_save_due
from mathrl.train.shared import SkipCount, build_optimizer, build_tracker, resume_from, save_due, seed_everything
from mathrl.train.startup import log_decisions
from mathrl.train.teacher import load_teacher
from mathrl.train.update import loss_scaler


@dataclass
class Trainer:
    """What an RL run holds between steps. `rl_step` reads it and updates the models, optimizers,
    controllers, data position and counters in place."""

    cfg: Config
    ranks: Ranks
    console: Console
    run: RunDir
    checkpoint: Path | None  # the checkpoint this run resumes from
    parent: Path | None  # train.init_from: another run's checkpoint this new run continues
    model_path: str
    model: Any  # the policy (FSDP2-sharded under torchrun)
    tokenizer: Any
    engine: Any  # rollout.base.Engine
    optimizer: Any
    scheduler: Any
    controllers: dict[str, CoefController]
    train_stream: ProblemStream
    eval_sets: list[EvalSet]
    ptx: PretrainText | None = None
    ref_model: Any = None  # loaded when a KL term or ref_gain_clip needs it
    teacher_model: Any = None  # algo.distill.mode's frozen teacher (train/teacher.py); None: none, or teacher.self_update
    critic: Any = None  # algo.adv.estimator=gae
    critic_optimizer: Any = None
    critic_scheduler: Any = None
    scaler: Any = None  # model.dtype=float16: the policy's dynamic loss scaler (train/update.py:loss_scaler)
    critic_scaler: Any = None  # ... and the critic's
    tracker: Any = None
    rewarder: Rewarder | None = None  # the reward components (reward.functions), scoring in its Verifier's workers
    generator: Any = None  # train/generators/host.py:Generator, on rank 0, when generator processes sample (rollout.max_staleness)
    start_step: int = 1
    skips: SkipCount = field(default_factory=SkipCount)
    collapse: CollapseWatch = field(default_factory=CollapseWatch)
    signal: SignalWatch = field(default_factory=SignalWatch)
    base_results: dict[str, EvalResult] = field(default_factory=dict)  # the evaluation before training
    latest: dict[str, EvalResult] = field(default_factory=dict)  # the latest evaluation
    last_eval: dict[str, float] = field(default_factory=dict)  # ... and its logged metrics
    t_start: float = field(default_factory=time.time)
    stop: StopSignal = field(default_factory=StopSignal)  # SIGTERM's request to stop between steps (train/preempt.py)
    last_save: float = field(default_factory=time.monotonic)  # when the last checkpoint was written (train.save_every_minutes)
    saved_step: int | None = None  # the step of the last checkpoint this process wrote
    # a resumed run's earlier processes, from its checkpoint: {"first_step", "last_step", "wall_seconds"} each, their
    # seconds counted up to the checkpoint they saved (a kill's lost work is not counted: it is redone, and counted, here)
    processes: list[dict] = field(default_factory=list)
    machine: dict = field(default_factory=describe_machine)  # this process's CPU, threads and torch (mathrl/machine.py)

    @property
    def optimizers(self) -> dict[str, Any]:
        """The optimizers and schedulers a checkpoint holds, by the name it stores them under."""
        out = {"optimizer": self.optimizer, "scheduler": self.scheduler}
        if self.critic is not None:
            out.update(critic_optimizer=self.critic_optimizer, critic_scheduler=self.critic_scheduler)
        return out

    def state(self) -> dict:
        """The trainer state a checkpoint (and final/trainer_state.json) records besides the weights."""
        return {
            "controllers": {k: c.state_dict() for k, c in self.controllers.items()},
            "data": self.train_stream.state_dict(),
            "ptx": self.ptx.state_dict() if self.ptx is not None else None,
            "skipped_steps": self.skips.total,
            **({"loss_scalers": self.scaler_states()} if self.scaler is not None else {}),
        }

    def scaler_states(self) -> dict[str, dict]:
        """The loss scalers' states (scale, growth tracker) by name, for the checkpoint."""
        scalers = {"policy": self.scaler, "critic": self.critic_scaler}
        return {name: s.state_dict() for name, s in scalers.items() if s is not None}

    def wall_processes(self, step: int) -> list[dict]:
        """Every process that has run this run, up to step `step`: the earlier ones and this one so far
        (from `build_trainer`'s start). Checkpoints record it, so the run's wall time sums over resumes."""
        return [*self.processes, {"first_step": self.start_step, "last_step": step,
                                  "wall_seconds": round(time.time() - self.t_start, 3), "machine": self.machine}]

    @contextlib.contextmanager
    def reference(self) -> Iterator[Any]:
        """The KL reference model to score with: the loaded copy, or with LoRA the policy itself with its
        adapters disabled (peft's `disable_adapter`), which is the base model without a second copy."""
        if self.ref_model is not None:
            yield self.ref_model
            return
        with self.model.disable_adapter():
            yield self.model

    def sync_weights(self, step: int, *, updated: bool = True) -> dict[str, float]:
        """After step `step`: the engine samples the updated policy from now on (`updated`: loaded in
        memory), and the generator processes receive version `step` (rollout.max_staleness; a skipped
        update still sends it, since they count versions by sends). Every rank calls it (a sharded
        policy is gathered); returns the send's metrics (rank 0, with generators) or {}."""
        if updated:
            self.engine.update_weights(self.engine_weights())
        if not self.cfg.generator_workers:
            return {}
        named = tdist.full_weights(self.model)
        return self.generator.push(step, [t for _, t in named]) if self.ranks.main else {}

    @contextlib.contextmanager
    def teacher(self) -> Iterator[Any]:
        """The distillation teacher to score with: the frozen one, or with teacher.self_update the policy itself
        (scored without gradient, as the old logprobs are)."""
        yield self.teacher_model if self.teacher_model is not None else self.model

    def engine_weights(self) -> Iterable[tuple[str, torch.Tensor]]:
        """The tensors the engine loads after an update: the policy's state dict, which an engine
        sampling from the policy module (or its copy, adapters and all) takes as it is; with LoRA and an
        engine that holds plain weights (vLLM), the merged weights under the base model's names."""
        if not is_lora(self.model) or engine_samples_from_module(self.cfg.rollout.engine):
            return self.model.state_dict().items()
        return stream_plain_weights(self.model)  # gathered and merged one tensor at a time, as the engine reads them

    def save_if_due(self, step: int, *, force: bool = False) -> None:
        """Checkpoint step `step` when train.save_every asks for it, or `force` (time or SIGTERM) does."""
        # no checkpoint while updates are being skipped: the last one stays the last good one
        due = force or save_due(self.cfg, step, last=self.cfg.train.steps)
        if due and not self.skips.in_a_row and self.saved_step != step:
            save_checkpoint(self.run.checkpoints, step, model=self.model, tokenizer=self.tokenizer,
                            state={**self.state(), "processes": self.wall_processes(step)},
                            keep_last=self.cfg.train.keep_last, keep_every=self.cfg.keep_every_steps,
                            critic=self.critic, ranks=self.ranks, **self.optimizers,
                            extra_tensors=self.generator_versions(step))
            self.saved_step, self.last_save = step, time.monotonic()

    def end_step(self, step: int) -> bool:
        """Step `step`'s checkpoint when train.save_every, train.save_every_minutes (rank 0's clock) or a
        SIGTERM asks for one, agreed across ranks; returns whether SIGTERM asks the run to stop now
        (not after the last step, which finishes the run). Every rank calls it after every step."""
        train = self.cfg.train
        late = time_save_due(train.save_every_minutes, last_save=self.last_save, now=time.monotonic())
        stop, late = agree(self.stop.requested, late, self.ranks)
        checkpoints_on = bool(train.save_every or train.save_every_minutes)
        self.save_if_due(step, force=late or (stop and checkpoints_on))
        return stop and step < train.steps

    def generator_versions(self, step: int) -> dict[str, dict]:
        """The older policy versions the generators' next steps sample from, for checkpoint `step`."""
        if self.generator is None:
            return {}
        tensors = self.generator.checkpoint_tensors(step)
        return {VERSIONS_FILE: tensors} if tensors else {}


def build_trainer(cfg: Config, ranks: Ranks, *, console: Console, resume: bool = True) -> Trainer:
    """Open (or resume) the run directory and build the models, engine, optimizers, controllers, data,
    tracker and rewarder of an RL run. Enter `trainer.rewarder` before the first step."""
    t_start = time.time()
    # reward.functions in the rewarder's worker processes (started on first use): a dead reward server stops
    # the run here, in one line, before the run directory or a model is touched
    rewarder = build_rewarder(cfg.reward)
    run, checkpoint = _open_run(cfg, ranks, console=console, resume=resume)
    console.print(f"[bold]run directory[/bold] {run.path}" + (f" ({ranks.world_size} ranks)" if ranks.distributed else ""))
    seed_everything(cfg.seed)
    # rank 0 builds the tiny base
    model_path = broadcast_object(
        resolve_model_path(cfg, console, pretraining_text=base_pretraining_text(cfg.base)) if ranks.main else None)
    console.print(f"loading model from {model_path}")
    parent = Path(cfg.train.init_from) if cfg.train.init_from and checkpoint is None else None
    source, overrides = checkpoint or parent or model_path, model_overrides(cfg)
    # model.lora: the base weights come from model_path when `source` is a LoRA run's checkpoint (its adapter only)
    weights_source = model_path if cfg.model.lora.r > 0 and has_adapter(source) else source
    model, tokenizer = load_policy(cfg, source, model_path=model_path, overrides=overrides)
    model.train()
    train_stream = build_train_stream(cfg, tokenizer)
    eval_sets = build_eval_sets(cfg, tokenizer, limit=cfg.data.eval_size)
    # rollout.engine: torch samples from `model` itself; vllm loads the weights `model` was loaded from.
    # Several ranks with the torch engine: it gets its own unsharded copy (ranks stop generating at
    # different lengths, which a sharded model's collectives cannot follow), refreshed by update_weights
    # after each update. vLLM holds its own weights: no copy is loaded for it.
    # model.dtype=float16: the trainer holds float32 master weights, the engine a float16 copy of its own
    # (the rollout samples in float16, as a vLLM engine with rollout.vllm.dtype=auto does)
    engine_model = model
    if (ranks.distributed or cfg.model.dtype == "float16") and engine_samples_from_module(cfg.rollout.engine):
        engine_model = load_policy(cfg, source, model_path=model_path, overrides=overrides, dtype=cfg.model.dtype)[0]
        engine_model.to(ranks.device).eval()
    model = shard(model, cfg, ranks)  # one process: moved to train.device
    def new_engine():
        return build_engine(cfg, model=engine_model, tokenizer=tokenizer, model_path=weights_source)

    if cfg.generator_workers and not engine_samples_from_module(cfg.rollout.engine):
        # generator processes do the sampling: this engine only evaluates, and exists only while it does
        engine = OnDemandEngine(new_engine, weights=lambda: trainer.engine_weights(), release=evaluation_engine_release(cfg, ranks))
    else:
        engine = new_engine()
    # model.lora: only the adapters train (adapter_params is every parameter without them)
    optimizer, scheduler = build_optimizer(adapter_params(model), cfg, lr=cfg.train.lr, warmup_steps=cfg.train.warmup_steps)
    trainer = Trainer(cfg=cfg, ranks=ranks, console=console, run=run, checkpoint=checkpoint, parent=parent,
                      model_path=model_path, model=model, tokenizer=tokenizer, engine=engine, optimizer=optimizer,
                      scheduler=scheduler, controllers=build_controllers(cfg), train_stream=train_stream,
                      eval_sets=eval_sets, t_start=t_start)
    trainer.ptx = PretrainText(cfg, tokenizer) if cfg.algo.ptx.coef > 0 else None
    trainer.scaler = loss_scaler(cfg, ranks.device, distributed=ranks.distributed)
    if cfg.needs_reference and is_lora(model):
        console.print("the reference model is the base model with the adapters disabled (no copy is loaded)")
    elif cfg.needs_reference:  # loaded only when a KL term or ref_gain_clip needs it
        console.print("loading the reference model (a frozen copy of the starting model)")
        # restart (train.init_from_mode): the parent checkpoint is the new starting model, and its reference
        ref_source = parent if parent is not None and cfg.train.init_from_mode == "restart" else model_path
        ref_model, _ = load_model_and_tokenizer(ref_source, dtype=trainer_dtype(cfg.model.dtype), overrides=overrides)
        trainer.ref_model = shard(ref_model.eval().requires_grad_(False), cfg, ranks)
    if cfg.needs_teacher:  # frozen; it has no state of its own: a resumed run loads it again from its source
        ref_source = parent if parent is not None and cfg.train.init_from_mode == "restart" else model_path
        teacher = load_teacher(cfg, model_path=model_path, ref_source=ref_source, overrides=overrides,
                               student_vocab=tokenizer.get_vocab())
        trainer.teacher_model = shard(teacher, cfg, ranks) if isinstance(teacher, torch.nn.Module) else teacher
    if ADVANTAGE_ESTIMATORS.get(cfg.algo.adv.estimator).needs_critic:  # PPO; the critic resumes like the policy
        _add_critic(trainer)
    if checkpoint is not None or parent is not None:
        _restore(trainer)
    if is_lora(model):  # an engine holding its own weights loaded the base (or its own adapters' copy): sync them
        engine.update_weights(trainer.engine_weights())
    trainer.tracker = build_tracker(cfg, run, ranks)
    _print_data_notes(trainer)
    log_decisions(trainer)  # the start-up block: engine, threads, losses (and what the tools logged)
    trainer.rewarder = rewarder
    return trainer


def evaluation_engine_release(cfg: Config, ranks: Ranks) -> str:
    """How the trainer's evaluation-only engine (generators sample) gives its memory back between
    evaluations: on a GPU vLLM's sleep mode when it is on (rollout.vllm.enable_sleep_mode), else closed
    and rebuilt at the next evaluation; on a CPU kept (host memory, and a start costs more than it frees)."""
    if ranks.device.type != "cuda":
        return "keep"
    return "sleep" if cfg.rollout.vllm.enable_sleep_mode else "close"


def _open_run(cfg: Config, ranks: Ranks, *, console: Console, resume: bool) -> tuple[RunDir, Path | None]:
    """Rank 0 creates or resumes the run directory; the others learn what it found."""
    opened = None
    if ranks.main:
        try:
            opened = (open_run_dir(cfg.run_dir, config_text=machine_comment(describe_machine()) + dump_yaml(cfg), resume=resume, console=console), None)
        except Exception as e:  # every rank raises it, none waits for the others in vain
            opened = (None, e)
    found, error = broadcast_object(opened)
    if error is not None:  # e.g. a run directory that holds a run it cannot resume: one line, no traceback
        if not ranks.main:
            error.reported_by_rank_0 = True  # the same error, which rank 0 reports: one message per job, not per rank
        raise error
    return found


def _add_critic(t: Trainer) -> None:
    cfg = t.cfg
    source = critic_path(cfg, checkpoint=t.checkpoint, parent=t.parent, model_path=t.model_path)
    t.console.print(f"loading the critic from {source}")
    t.critic = shard(load_critic(source, dtype=trainer_dtype(cfg.model.dtype)), cfg, t.ranks)
    t.critic.train()
    t.critic_scaler = loss_scaler(cfg, t.ranks.device, distributed=t.ranks.distributed)
    t.critic_optimizer, t.critic_scheduler = build_optimizer(t.critic.parameters(), cfg, lr=cfg.algo.critic.lr or cfg.train.lr,
                                                             warmup_steps=cfg.train.warmup_steps)


def _restore(t: Trainer) -> None:
    """Resume (same run), continue or restart (train.init_from: a new run from another run's checkpoint)."""
    cfg, checkpoint, parent = t.cfg, t.checkpoint, t.parent
    if checkpoint is None and cfg.train.init_from_mode == "restart":  # its weights only: all else starts fresh
        if t.ranks.main:
            t.run.write_parent(parent, int(json.loads((parent / "trainer_state.json").read_text())["step"]))
        t.console.print(f"[bold]restarting[/bold] from the weights of {parent_label(parent)} as a new starting model (fresh "
                        "optimizer and schedule; it is also the KL reference); recorded in parent.json")
        return
    origin = checkpoint or parent
    if is_lora(t.model) != has_adapter(origin):  # the optimizer states of adapters and of a whole model do not mix
        kind = "a LoRA adapter" if has_adapter(origin) else "a whole model"
        raise ValueError(f"{origin} holds {kind} but this run has model.lora.r={cfg.model.lora.r}; resume or continue "
                         "with the setting it was saved with, or start from its weights with train.init_from_mode=restart")
    state = load_trainer_state(checkpoint or parent, optimizers=t.optimizers, controllers=t.controllers,
                               models={"optimizer": t.model, "critic_optimizer": t.critic})
    for name, saved in state.get("loss_scalers", {}).items():  # float16: the scale goes on where it was
        scaler = {"policy": t.scaler, "critic": t.critic_scaler}[name]
        if scaler is not None:
            scaler.load_state_dict(saved)
    if checkpoint is not None:  # everything the next step depends on comes back from the checkpoint
        t.start_step = resume_from(checkpoint, state, stream=t.train_stream, run=t.run, console=t.console,
                                   steps=cfg.train.steps, main=t.ranks.main)
        if t.ptx is not None:
            t.ptx.load_state_dict(state["ptx"])
        t.skips.total = int(state.get("skipped_steps", 0))
        t.processes = list(state.get("processes", []))  # absent in checkpoints of earlier versions: not counted
    else:  # staged growth (e.g. a longer rollout.max_new_tokens): optimizer, schedule, controllers kept
        if t.ranks.main:
            t.run.write_parent(parent, state["step"])
        t.console.print(f"[bold]continuing[/bold] from {parent_label(parent)} (its optimizer, schedule and controllers; "
                        f"train.steps={cfg.train.steps} counts this run's steps, from 1); recorded in parent.json")


def parent_label(parent: Path) -> str:
    """`<run> step N` for a `train.init_from` checkpoint (`<checkpoint>` when it is not in a run's
    checkpoints/ or final/, or its step is not recorded)."""
    state = parent / "trainer_state.json"
    step = json.loads(state.read_text()).get("step") if state.is_file() else None
    run = parent.parent.parent if parent.parent.name == "checkpoints" else parent.parent if parent.name == "final" else None
    return f"{run} step {step}" if run is not None and step is not None else str(parent)


def _print_data_notes(t: Trainer) -> None:
    for note in t.train_stream.notes:
        t.console.print(note)
    for es in t.eval_sets:
        if es.dropped_too_long:
            t.console.print(f"eval set {es.name}: {es.dropped_too_long} problems dropped, their prompts exceed "
                            f"data.max_prompt_tokens={t.cfg.data.max_prompt_tokens}")


def load_policy(cfg: Config, source: Path | str, *, model_path: str, overrides: dict | None, dtype: str | None = None):
    """(policy, tokenizer) from `source` (the base model, a checkpoint, or another run's checkpoint), in
    `dtype` (default: the trainer's, `model.dtypes.trainer_dtype`).
    With model.lora.r > 0 the policy is a peft PeftModel: its base from `source`, or from `model_path`
    when `source` holds an adapter (a LoRA run's checkpoint), whose weights it then gets; else fresh
    adapters. Gradient checkpointing is switched on first (model.gradient_checkpointing)."""
    adapter = cfg.model.lora.r > 0 and has_adapter(source)
    model, tokenizer = load_model_and_tokenizer(model_path if adapter else source, dtype=dtype or trainer_dtype(cfg.model.dtype),
                                                overrides=overrides)
    if cfg.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    if cfg.model.lora.r == 0:
        return model, tokenizer
    if cfg.model.gradient_checkpointing:
        model.enable_input_require_grads()  # the frozen embeddings' output must carry a grad through checkpointed layers
    model = add_adapters(model, cfg.model.lora, seed=cfg.seed)
    if adapter:
        load_adapter_weights(model, source)
    return model, tokenizer


def shard(model, cfg: Config, ranks: Ranks):
    """FSDP2-shard `model` over the ranks (train.dist.*); in one process the model itself, on ranks.device."""
    if not ranks.distributed:
        return model.to(ranks.device)
    return shard_model(model, ranks, mixed_precision=cfg.train.dist.mixed_precision, cpu_offload=cfg.train.dist.cpu_offload,
                       float16=cfg.model.dtype == "float16")


def build_controllers(cfg: Config) -> dict[str, CoefController]:
    """The entropy and KL coefficient controllers (their state goes into checkpoints)."""
    ent = cfg.algo.entropy
    if ent.mode == "adaptive":
        entropy = AdaptiveEntropyController(ent.coef, ent.target, kp=ent.kp, min_coef=ent.min_coef, max_coef=ent.max_coef)
    elif ent.mode == "skywork":
        entropy = SkyworkEntropyController(ent.coef, ent.target, step=ent.step, min_coef=ent.min_coef, max_coef=ent.max_coef)
    else:
        entropy = FixedCoef(ent.coef if ent.mode == "fixed" else 0.0)
    kl = cfg.algo.kl
    if kl.use != "none" and kl.target is not None:
        kl_ctl: CoefController = AdaptiveKLController(kl.coef, kl.target, kl.horizon)
    else:
        kl_ctl = FixedCoef(kl.coef if kl.use != "none" else 0.0)
    return {"entropy": entropy, "kl": kl_ctl}


def critic_path(cfg: Config, *, checkpoint: Path | None, parent: Path | None, model_path: str) -> Path | str:
    """Where the critic comes from: the checkpoint's critic/ (resume), the parent's (init_from), else
    algo.critic.path, else a fresh value head on the policy (a GRPO parent continued with PPO included)."""
    origin = checkpoint or parent
    saved = origin / "critic" if origin is not None and (origin / "critic").is_dir() else None
    if checkpoint is not None and saved is None:
        raise ValueError(f"checkpoint {checkpoint} has no critic/: its run did not use algo.adv.estimator=gae; "
                         "start a new run (--no-resume, or train.init_from to continue its policy with PPO)")
    return saved or cfg.algo.critic.path or parent or model_path

