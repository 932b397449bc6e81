"""The generator process of asynchronous training (train/generators/host.py is the trainer's side): what the
trainer sends it (`WorkerSpec`), what it sends back (`Generated`, `WorkerFailure`), and its loop,
`worker_main`: receive the policy versions a step needs, run `collect_rollouts` for the step exactly as
the synchronous loop does, put the step's batch on the queue; at the end a barrier with the trainer.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import time
import traceback
from dataclasses import dataclass

import torch

import mathrl.train.dist as tdist
from mathrl.config import Config
from mathrl.rollout import weight_sync as ws
from mathrl.train.collect import Collected

POLL_S = 0.5  # how often the trainer looks at its generators while it waits for a batch


class GeneratorError(RuntimeError):
    """A generator process failed, died or stopped answering."""


def needed_version(step: int, lag: int) -> int:
    """The policy version fixed-lag step `step` (from 1) trains on: max(0, step-1-lag)."""
    return max(0, step - 1 - lag)


# ---- what crosses the queue ----------------------------------------------------------------------------
@dataclass
class WorkerSpec:
    """Everything a generator process needs (pickled to it when it is spawned)."""

    index: int
    workers: int
    cfg: Config
    source: str  # the model directory or id the architecture and tokenizer load from (weights come by broadcast)
    start_step: int
    first_version: int  # the first version the trainer sends
    stream_state: dict | None  # the problem stream's position before start_step
    host: str
    port: int
    backend: str
    threads: int
    cores: list[int] | None
    device: str  # as the child sees it: "cpu", or "cuda:0" with CUDA_VISIBLE_DEVICES naming its one GPU
    specs: list[ws.TensorSpec]
    bucket_bytes: int
    timeout_s: float


@dataclass
class Generated:
    """One step's batch from a generator."""

    step: int
    worker: int
    version: int  # the policy version that sampled every row of it
    collected: Collected
    stream_state: dict  # the problem stream's position after this step's draws


@dataclass
class WorkerFailure:
    worker: int
    message: str  # one line
    details: str  # the traceback


# ---- the generator process ---------------------------------------------------------------------------------
def worker_main(spec: WorkerSpec, out, announced, closed) -> None:
    """A generator process: its steps, then a barrier with the trainer, then `exit_rank`."""
    _die_with_parent()
    # SIGTERM to the whole process group (`timeout`, a scheduler): the trainer finishes its step, which may
    # need this generator's batch, then ends it (Generator.close); a no-op handler, so that the processes
    # this one spawns keep the default action
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    code = 0
    try:
        _generate(spec, out, announced, closed)
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group; the trainer reports it
        code = 130
    except BaseException as e:  # noqa: BLE001 - reported to the trainer, which stops the run
        code = 1
        first = (str(e).splitlines() or [""])[0][:300]
        with contextlib.suppress(Exception):
            out.put(pickle.dumps(WorkerFailure(spec.index, f"{type(e).__name__}: {first}", traceback.format_exc())))
    with contextlib.suppress(Exception):
        out.close()
        out.join_thread()  # the queued batches are flushed to the pipe before the process ends
    tdist.exit_rank(code)


def _die_with_parent() -> None:
    """Linux: the kernel kills this process when the trainer dies, however it dies (SIGKILL included)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _generate(spec: WorkerSpec, out, announced, closed) -> None:
    from mathrl.model.io import load_model_and_tokenizer, model_overrides
    from mathrl.reward.functions import build_rewarder
    from mathrl.rollout.factory import build_engine, engine_samples_from_module
    from mathrl.tasks.sources import build_train_stream
    from mathrl.train.collect import collect_rollouts

    cfg = spec.cfg
    import threading

    import transformers
    from tqdm import tqdm

    # progress bars (model loading) stay quiet here, and tqdm's lock is a thread lock: its default is a
    # multiprocessing semaphore, which a generator that is killed would leave behind
    tqdm.set_lock(threading.RLock())
    transformers.utils.logging.disable_progress_bar()
    if spec.cores:
        os.sched_setaffinity(0, spec.cores)
    torch.set_num_threads(spec.threads)
    device = torch.device(spec.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    group = ws.join_group(spec.host, spec.port, rank=spec.index + 1, world_size=spec.workers + 1,
                          backend=spec.backend, timeout_s=spec.timeout_s, device=device)
    buckets = ws.plan_buckets(spec.specs, bucket_bytes=spec.bucket_bytes)
    # NCCL: each bucket lands in one GPU staging buffer and is copied to host memory, so that a whole version
    # never sits on the generator's GPU beside its engine
    staging = ws.staging_buffer(buckets, device) if spec.backend == "nccl" else None
    model, tokenizer = load_model_and_tokenizer(spec.source, dtype=cfg.model.dtype, overrides=model_overrides(cfg))
    # the torch engine samples from this module; vLLM holds its own weights, so the copy stays on the CPU
    # (on the GPU it would take memory that vLLM's start check counts as used)
    model.to(device if engine_samples_from_module(cfg.rollout.engine) else "cpu").eval()
    engine = build_engine(cfg, model=model, tokenizer=tokenizer, model_path=spec.source)
    stream = build_train_stream(cfg, tokenizer)
    if spec.stream_state is not None:
        stream.load_state_dict(spec.stream_state)
    have = spec.first_version - 1

    def receive_through(version: int) -> int:
        got = have
        while got < version:
            flats = ws.receive_buckets(group, buckets, staging=staging, timeout_s=spec.timeout_s)
            engine.update_weights((name, t.to(device)) for name, t in ws.unpack(buckets, spec.specs, flats))
            got += 1
        return got

    lag, free = cfg.rollout.max_staleness, cfg.rollout.async_mode == "free"
    want = cfg.rollout.prompts_per_step
    rewarder = build_rewarder(cfg.reward, check_servers=False)  # the trainer checked the reward servers at start
    with rewarder:
        for step in range(spec.start_step, cfg.train.steps + 1):
            if (step - spec.start_step) % spec.workers != spec.index:
                stream.next_batch(want)  # another generator's step: its draws, so that this stream stays in step
                continue
            target = needed_version(step, lag)
            if free:  # the freshest version sent so far, never one newer than the step's own (step - 1)
                target = max(target, min(announced.value, step - 1))
            have = receive_through(target)
            got = collect_rollouts(cfg, step, train_stream=stream, engine=engine, tokenizer=tokenizer, verifier=rewarder)
            out.put(pickle.dumps(Generated(step, spec.index, have, got, stream.state_dict())))
    # the trainer may still send versions (free mode, several workers) until it closes: take them (into the
    # engine, which is still open), then meet it at the barrier, then close the engine
    deadline = time.time() + spec.timeout_s
    while not closed.value:
        if announced.value > have:
            have = receive_through(announced.value)
            deadline = time.time() + spec.timeout_s
        if time.time() > deadline:
            raise GeneratorError(f"the trainer sent nothing and did not finish within train.dist.timeout_s={spec.timeout_s:g}s")
        time.sleep(POLL_S)
    have = receive_through(announced.value)
    ws.barrier(group, spec.timeout_s)
    engine.close()
