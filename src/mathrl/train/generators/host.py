"""Generate while training: generator processes sample the next steps' batches while the trainer trains.

    mathrl train rollout.max_staleness=1                    # one generator beside the trainer (docs/async.md)

With `rollout.max_staleness` k, step t trains on samples of policy version max(0, t-1-k) (fixed_lag,
`needed_version`) or newer (free). Each generator (`worker_main` in worker.py, a process of its own)
runs `collect_rollouts` for its steps as the synchronous loop does and puts each step's `Collected`
on a bounded queue; the trainer takes them in step order (`Generator.get`) and, after each optimizer
step, broadcasts the new weights (`Generator.push`, rollout/weight_sync.py). It starts, feeds and ends
those processes; a dead or silent one raises `GeneratorError`. Versions, placement, resume, failures
and teardown: docs/async.md ("Versions and staleness", "How it runs", "Robustness").
"""

from __future__ import annotations

import contextlib
import os
import pickle
import queue as queue_lib
import signal
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

import mathrl.train.dist as tdist
from mathrl.config import Config
from mathrl.rollout import weight_sync as ws
from mathrl.rollout.placement import child_cuda_env, generator_gpus, weight_backend
from mathrl.train.checkpoint import VERSIONS_FILE
from mathrl.train.collect import Collected
from mathrl.train.generators.worker import POLL_S, Generated, GeneratorError, WorkerFailure, WorkerSpec, needed_version, worker_main

if TYPE_CHECKING:  # for annotations only: the trainer imports nothing of this module
    from mathrl.train.trainer import Trainer

# ---- placement ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Placement:
    """Where the trainer and each generator run."""

    trainer_threads: int
    trainer_cores: list[int] | None  # None: not pinned
    worker_threads: int
    worker_cores: list[list[int] | None]
    worker_devices: list[str]  # "cpu", or "cuda:<index>" (the machine's numbering)
    backend: str  # of the weight group: nccl when every generator has a GPU of its own, else gloo


def plan_placement(cfg: Config, *, cpus: list[int], gpus: int, trainer_gpus: list[int]) -> Placement:
    """The trainer's and generators' threads, cores and devices.

    CPU: the cores this process may use are split evenly: each of the W generators gets
    rollout.generator.threads (0: cores // (W + 1), at least 1), the trainer the rest (2 cores, one
    generator: one core each); with rollout.generator.pin_cores each process is bound to its own cores
    when there are enough for all. GPU: worker i takes rollout.generator.devices[i % len], by default
    the GPUs after those the trainer's ranks use (`trainer_gpus`), else the trainer's own GPU (shared:
    the weights then go through gloo, since NCCL refuses two ranks on one device).
    """
    g, workers = cfg.rollout.generator, cfg.generator_workers
    threads = g.threads or max(1, len(cpus) // (workers + 1))
    trainer_threads = max(1, len(cpus) - workers * threads)
    pin = g.pin_cores and trainer_threads + workers * threads <= len(cpus)
    trainer_cores = cpus[:trainer_threads] if pin else None
    worker_cores = [cpus[trainer_threads + i * threads: trainer_threads + (i + 1) * threads] if pin else None
                    for i in range(workers)]
    if not trainer_gpus:
        return Placement(trainer_threads, trainer_cores, threads, worker_cores, ["cpu"] * workers, "gloo")
    chosen = generator_gpus(list(g.devices), workers=workers, gpus=gpus, trainer_gpus=trainer_gpus)
    return Placement(trainer_threads, None, threads, [None] * workers, [f"cuda:{d}" for d in chosen],
                     weight_backend(chosen, trainer_gpus))


# ---- the trainer's side ------------------------------------------------------------------------------------
@dataclass
class Generator:
    """The trainer's handle on its generator processes (rank 0 of the trainer holds it)."""

    cfg: Config
    processes: list[Any]
    queue: Any
    announced: Any  # the newest version sent (a shared integer)
    closed: Any  # set when the trainer has sent its last version
    group: ws.WeightGroup
    specs: list[ws.TensorSpec]
    buckets: list[ws.Bucket]
    last_step: int
    sender: ws.StagedSender | None = None  # NCCL: sends through one GPU staging bucket; gloo: None (host buffers)
    kept: dict[int, list[torch.Tensor]] = field(default_factory=dict)  # version -> its packed buckets, in host memory
    pending: list[tuple[int, list]] = field(default_factory=list)  # (version, works) not yet received by all
    waiting: dict[int, Generated] = field(default_factory=dict)  # batches that arrived before their turn
    restore: tuple[int, set[int]] | None = None  # the trainer's threads and cores before the placement

    @property
    def lag(self) -> int:
        return self.cfg.rollout.max_staleness

    def describe(self, worker: int) -> str:
        p = self.processes[worker]
        return f"rollout generator {worker} (pid {p.pid})"

    # -- batches ------------------------------------------------------------------------------------------
    def get(self, step: int) -> Generated:
        """Step `step`'s batch; raises GeneratorError when a generator failed, died, or sent nothing
        for train.dist.timeout_s."""
        timeout = self.cfg.train.dist.timeout_s
        deadline = time.time() + timeout
        while step not in self.waiting:
            try:
                item = pickle.loads(self.queue.get(timeout=POLL_S))
            except queue_lib.Empty:
                for i, p in enumerate(self.processes):
                    if not p.is_alive():
                        raise GeneratorError(f"{self.describe(i)} died ({_exit_text(p.exitcode)}) before sending step "
                                             f"{step}'s batch; rerun the same command to resume from the last checkpoint")
                if time.time() > deadline:
                    raise GeneratorError(f"no rollout generator sent step {step}'s batch within train.dist.timeout_s="
                                         f"{timeout:g}s (workers: {', '.join(self.describe(i) for i in range(len(self.processes)))})")
                continue
            if isinstance(item, WorkerFailure):
                raise GeneratorError(f"{self.describe(item.worker)} failed: {item.message}")
            self.waiting[item.step] = item
        return self.waiting.pop(step)

    # -- weights --------------------------------------------------------------------------------------------
    def push(self, version: int, tensors: list[torch.Tensor]) -> dict[str, float]:
        """Send policy `version` to the generators if a later step may sample from it; returns the
        perf/ metrics of the send. Does not wait for the generators to take it."""
        t0 = time.time()
        flats = ws.pack(self.buckets, tensors)  # host memory (pinned on a CUDA machine)
        self.kept[version] = flats
        for old in [v for v in self.kept if v < version - self.lag]:  # a checkpoint needs the last k only
            del self.kept[old]
        sent = 0
        if self.useful(version):
            self.send(version, flats)
            sent = sum(b.nbytes for b in self.buckets)
        return {"perf/weight_sync_seconds": time.time() - t0, "perf/weight_sync_bytes": float(sent)}

    def send_restored(self, version: int, tensors: list[torch.Tensor]) -> None:
        """Send `version`, an older policy version a resumed run's first steps sample from (read from its
        checkpoint, in `specs` order), and keep it for the next checkpoint. Sent whether or not `useful`:
        a generator receives the versions in order, from the first one the trainer sends."""
        self.kept[version] = ws.pack(self.buckets, tensors)
        self.send(version, self.kept[version])

    def useful(self, version: int) -> bool:
        """Whether a step still to be generated may sample from `version`."""
        if self.cfg.rollout.async_mode == "free":
            return version <= self.last_step - 1
        return version <= needed_version(self.last_step, self.lag)

    def send(self, version: int, flats: list[torch.Tensor]) -> None:
        """Broadcast `version` (its packed host buckets, unchanged until received) without waiting for it."""
        while len(self.pending) > self.lag:  # at most k + 1 versions in flight
            self._wait_oldest()
        self.announced.value = version
        works = [self.sender.send(flats)] if self.sender is not None else ws.broadcast_buckets(self.group, flats)
        self.pending.append((version, works))

    def _wait_oldest(self) -> None:
        version, works = self.pending.pop(0)
        try:
            ws.wait_all(works, self.cfg.train.dist.timeout_s)
        except Exception as e:
            dead = [self.describe(i) + f" ({_exit_text(p.exitcode)})" for i, p in enumerate(self.processes) if not p.is_alive()]
            who = ", ".join(dead) if dead else "a rollout generator"
            raise GeneratorError(f"sending policy version {version} failed: {who} did not receive it within "
                                 f"train.dist.timeout_s={self.cfg.train.dist.timeout_s:g}s "
                                 f"({(str(e).splitlines() or [''])[0][:200]})") from e

    def checkpoint_tensors(self, step: int) -> dict[str, torch.Tensor]:
        """The versions steps step+1 .. step+k sample from (fixed lag), besides version `step` itself:
        {"<version>:<name>": tensor}, for the checkpoint of step `step`; the last step's checkpoint too,
        from which a longer train.steps extends the finished run step for step (run_dir.open_run_dir)."""
        if self.cfg.rollout.async_mode != "fixed_lag":
            return {}
        out = {}
        for v in range(needed_version(step + 1, self.lag), step):
            for name, t in ws.unpack(self.buckets, self.specs, self.kept[v]):
                out[f"{v}:{name}"] = t.detach().to("cpu", copy=True).contiguous()
        return out

    # -- teardown -----------------------------------------------------------------------------------------------
    def close(self, *, finished: bool) -> None:
        """A finished run: every send received, the barrier with the generators, their processes joined.
        A failed run: the generators are terminated (each by its own process handle)."""
        try:
            if finished:
                self.closed.value = 1  # nothing more will be sent: the generators take what is in flight
                while self.pending:
                    self._wait_oldest()
                ws.barrier(self.group, self.cfg.train.dist.timeout_s)
                for p in self.processes:
                    p.join(timeout=self.cfg.train.dist.timeout_s)
        finally:
            if self.sender is not None:
                self.sender.close()
            for p in self.processes:  # SIGKILL: a generator leaves SIGTERM to the trainer (worker_main)
                if p.is_alive():
                    p.kill()
                    p.join(timeout=10)
            with contextlib.suppress(Exception):
                self.queue.cancel_join_thread()
                self.queue.close()
            if self.restore is not None:
                threads, cores = self.restore
                torch.set_num_threads(threads)
                with contextlib.suppress(Exception):
                    os.sched_setaffinity(0, cores)
                self.restore = None


def _exit_text(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- the loop's calls ----------------------------------------------------------------------------------------
def start_generator(trainer: Trainer) -> Generator | None:
    """Spawn the generator processes of trainer.cfg (none: rollout.generator.workers is 0) and send them
    the versions their first steps sample from. Every trainer rank calls it; rank 0 holds the result."""
    cfg, ranks = trainer.cfg, trainer.ranks
    workers = cfg.generator_workers
    if not workers or trainer.start_step > cfg.train.steps:
        return None
    named = tdist.full_weights(trainer.model)
    if not ranks.main:
        return None
    import torch.multiprocessing as mp

    lag, start = cfg.rollout.max_staleness, trainer.start_step
    first = start - 1 if cfg.rollout.async_mode == "free" else needed_version(start, lag)
    older = load_versions(trainer.checkpoint, named, range(first, start - 1), trainer.console) if first < start - 1 else {}
    trainer_gpus = [ranks.device.index or 0] if ranks.device.type == "cuda" else []
    if ranks.device.type == "cuda" and ranks.distributed:
        trainer_gpus = list(range(int(os.environ.get("LOCAL_WORLD_SIZE", ranks.world_size))))
    gpus = torch.cuda.device_count() if trainer_gpus else 0
    check_layout(cfg, trainer_gpus=trainer_gpus, gpus=gpus)
    placement = plan_placement(cfg, cpus=sorted(os.sched_getaffinity(0)), gpus=gpus, trainer_gpus=trainer_gpus)
    specs = ws.tensor_specs(named)
    bucket_bytes = int(cfg.rollout.generator.bucket_mb * 2**20)
    host, port = "127.0.0.1", _free_port()
    ctx = mp.get_context("spawn")
    out = ctx.Queue(maxsize=lag + workers + 1)  # the staleness bound keeps at most k + 1 steps ahead of the trainer
    announced, closed = ctx.Value("q", first - 1, lock=False), ctx.Value("b", 0, lock=False)
    stream_state = trainer.train_stream.state_dict()
    processes = []
    try:  # SIGTERM may end the start anywhere (train/loop.py: stop.at_once): no generator outlives it
        for i in range(workers):
            visible, device = child_cuda_env(placement.worker_devices[i], os.environ.get("CUDA_VISIBLE_DEVICES"))
            spec = WorkerSpec(index=i, workers=workers, cfg=cfg, source=str(trainer.checkpoint or trainer.parent or trainer.model_path),
                              start_step=start, first_version=first, stream_state=stream_state, host=host, port=port,
                              backend=placement.backend, threads=placement.worker_threads, cores=placement.worker_cores[i],
                              device=device, specs=specs, bucket_bytes=bucket_bytes, timeout_s=cfg.train.dist.timeout_s)
            # not a daemon: a generator starts processes of its own (the verifier's worker pool), which a daemon
            # may not; it still dies with the trainer (PR_SET_PDEATHSIG) and is joined or ended by Generator.close
            p = ctx.Process(target=worker_main, args=(spec, out, announced, closed), name=f"mathrl-generator-{i}", daemon=False)
            spawn_with_env(p, {"CUDA_VISIBLE_DEVICES": visible})
            processes.append(p)
        restore = (torch.get_num_threads(), os.sched_getaffinity(0)) if not ranks.distributed else None
        if restore is not None:
            torch.set_num_threads(placement.trainer_threads)
            if placement.trainer_cores:
                os.sched_setaffinity(0, placement.trainer_cores)
        nccl_device = ranks.device if placement.backend == "nccl" else None
        group = _join_watching(processes, host, port, world_size=workers + 1, backend=placement.backend,
                               timeout_s=cfg.train.dist.timeout_s, device=nccl_device)
        buckets = ws.plan_buckets(specs, bucket_bytes=bucket_bytes)
        sender = (ws.StagedSender(group, buckets, staging_device=nccl_device, timeout_s=cfg.train.dist.timeout_s)
                  if nccl_device is not None else None)
        gen = Generator(cfg=cfg, processes=processes, queue=out, announced=announced, closed=closed, group=group,
                        specs=specs, buckets=buckets, last_step=cfg.train.steps, sender=sender, restore=restore)
        where = ", ".join(f"{d}" + (f" cores {c}" if c else "") for d, c in zip(placement.worker_devices, placement.worker_cores))
        trainer.console.print(f"generating while training: {workers} generator(s) ({where}; {placement.worker_threads} "
                              f"thread(s) each), trainer {placement.trainer_threads} thread(s); rollout.max_staleness={lag} "
                              f"{cfg.rollout.async_mode}")
        for v in range(first, start - 1):
            gen.send_restored(v, [older[f"{v}:{s.name}"] for s in specs])
        gen.push(start - 1, [t for _, t in named])
        return gen
    except BaseException:
        for p in processes:
            p.kill()
            p.join(timeout=10)
        raise


def check_layout(cfg: Config, *, trainer_gpus: list[int], gpus: int) -> None:
    """On GPUs: a layout whose generators cannot fit beside the trainer (plan/memory.py's estimate, vLLM's
    shares of one GPU) stops here, in one line naming the GPUs, before any generator starts."""
    if not trainer_gpus:
        return
    from mathrl.config import ConfigError
    from mathrl.plan.memory import generator_layout_error

    gib = torch.cuda.get_device_properties(trainer_gpus[0]).total_memory / 2**30
    try:
        error = generator_layout_error(cfg, trainer_gpus=trainer_gpus, gpus=gpus, gpu_mem_gib=gib)
    except ValueError:  # an architecture the plan cannot read without a download: vLLM's own start check decides
        return
    if error:
        raise ConfigError(error)


def spawn_with_env(process, env: dict[str, str | None]) -> None:
    """Start `process` (a spawn-context Process) with `env` in its environment: spawn copies this process's
    environment when it starts the child, so each variable is set for the start only, then restored
    (None: unset). How a generator gets its one GPU (`placement.child_cuda_env`)."""
    saved = _set_env(env)
    try:
        process.start()
    finally:
        _set_env(saved)


def _set_env(env: dict[str, str | None]) -> dict[str, str | None]:
    """Set (None: unset) each variable of `env`; returns what they were, in the same form."""
    before = {k: os.environ.get(k) for k in env}
    for k, v in env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    return before


def _join_watching(processes, host: str, port: int, *, world_size: int, backend: str, timeout_s: float,
                   device: torch.device | None) -> ws.WeightGroup:
    """The trainer's side of the weight group, formed while the generators load: a generator that dies
    first (a failed import, a script without an `if __name__ == "__main__":` guard) is reported at once
    instead of after the timeout."""
    import threading

    box: dict[str, Any] = {}

    def join() -> None:
        try:
            if device is not None and device.type == "cuda":  # this thread's current device is cuda:0 otherwise
                torch.cuda.set_device(device)
            box["group"] = ws.join_group(host, port, rank=0, world_size=world_size, backend=backend, timeout_s=timeout_s,
                                         device=device)
        except BaseException as e:  # noqa: BLE001 - raised in the caller's thread below
            box["error"] = e

    # a daemon thread: one left waiting for a generator that died does not hold the process at its exit
    thread = threading.Thread(target=join, name="mathrl-weight-group", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(timeout=POLL_S)
        for i, p in enumerate(processes):
            if thread.is_alive() and not p.is_alive():
                raise GeneratorError(f"rollout generator {i} (pid {p.pid}) ended ({_exit_text(p.exitcode)}) "
                                     "before joining the trainer; its error is printed above")
    if "error" in box:
        raise box["error"]
    return box["group"]


def load_versions(checkpoint: Path | None, named, versions: range, console) -> dict[str, torch.Tensor]:
    """The policy versions a resumed fixed-lag run's first steps sample from, read from the checkpoint;
    a version it lacks (a checkpoint of another lag or mode, a run that had none) is replaced by the
    checkpoint's own weights, with a warning: the run then continues, but not step for step."""
    from safetensors.torch import load_file

    path = checkpoint / VERSIONS_FILE if checkpoint is not None else None
    saved = load_file(str(path)) if path is not None and path.is_file() else {}
    out = {}
    missing = [v for v in versions if any(f"{v}:{name}" not in saved for name, _ in named)]
    if missing:
        console.print(f"[yellow]warning:[/yellow] the checkpoint lacks policy versions {missing} that the next steps "
                      "sample from (another rollout.max_staleness or async_mode); they sample its own weights instead")
    for v in versions:
        for name, t in named:
            out[f"{v}:{name}"] = saved.get(f"{v}:{name}", t) if v not in missing else t
    return out


def next_batch(trainer: Trainer, step: int) -> Collected:
    """Step `step`'s batch from the generators (on every trainer rank), with each row's policy version in
    `Collected.versions`; the trainer's problem stream moves to where the generator's is."""
    t0 = time.time()
    got = trainer.generator.get(step) if trainer.ranks.main else None
    got = tdist.broadcast_object(got)
    got.collected.metrics["perf/wait_seconds"] = time.time() - t0  # the trainer idle, waiting for the generators
    got.collected.versions = torch.full((len(got.collected.texts),), got.version, dtype=torch.long)
    trainer.train_stream.load_state_dict(got.stream_state)
    return got.collected
