"""The rollout engines in the memory plan (plan/memory.py): the trainer's own engine (vLLM's share of the
GPU, or the torch engine's weights copy and KV cache) and each generator process's engine
(`GeneratorUse`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mathrl.config import Config
from mathrl.plan.arch import BYTES, GIB, RUNTIME_GIB, Architecture
from mathrl.registry import ENGINES

__all__ = ["GeneratorUse"]


@dataclass(frozen=True)
class GeneratorUse:
    """One generator process's engine: where it samples and the bytes it holds there."""

    index: int
    gpu: int | None  # the machine's GPU index; None: on the CPU (host memory)
    engine: str  # "vLLM" or "torch"
    bytes: int
    share: float | None  # vLLM on a GPU: its rollout.vllm.gpu_memory_utilization; else None
    note: str

    @property
    def label(self) -> str:
        return f"generator {self.index} {self.engine}"

    @property
    def where(self) -> str:
        return "host" if self.gpu is None else f"GPU {self.gpu}"


def engine_owns_weights(cfg: Config) -> bool:
    """The rollout engine loads and holds its own copy of the weights in the share of memory rollout.vllm
    gives it (vLLM), rather than sampling from the trainer's module (the torch engine): the registry's
    `samples_from_module` (rollout/factory.py), not the engine's name."""
    return not ENGINES.get(cfg.rollout.engine).samples_from_module


def _kv_bytes_per_token(a: Architecture) -> int:
    """Elements of K and V per token over all layers (multiply by the cache's element size)."""
    return 2 * a.layers * a.kv_heads * a.head_dim


def _torch_cache(cfg: Config, rows: int, seq_len: int) -> tuple[int, int, str]:
    """(rows, tokens per row, how) of the torch engine's KV cache: rollout.decode=lean preallocates it
    for a batch bucket of rows and whole blocks of columns (rollout/lean.py: bucket, cache_columns)."""
    if cfg.rollout.decode != "lean":
        return rows, seq_len, ""
    from mathrl.rollout.lean import bucket, cache_columns

    return bucket(rows), cache_columns(seq_len), " (lean: preallocated, rows in a batch bucket, columns in blocks)"


def _vllm_bytes(cfg: Config) -> int:
    """Bytes per element of vLLM's weights and KV cache (rollout.vllm.dtype; auto: model.dtype)."""
    vdtype = cfg.rollout.vllm.dtype
    return BYTES[cfg.model.dtype if vdtype == "auto" else vdtype]


def trainer_engine(cfg: Config, a: Architecture, *, n: int, pb: int, cb: int, gpu_mem_gib: float | None,
                    warnings: list[str]) -> tuple[dict[str, int], dict[str, str], int, int]:
    """The trainer's own rollout engine: (components, notes, bytes while it samples, bytes during the
    update). `gpu_mem_gib=None`: a CPU run."""
    c: dict[str, int] = {}
    notes: dict[str, str] = {}
    seq_len = cfg.data.max_prompt_tokens + cfg.rollout.max_new_tokens
    kv_per_token = _kv_bytes_per_token(a)
    if engine_owns_weights(cfg):
        v, key = cfg.rollout.vllm, "vLLM (weights + KV cache)"
        vb = _vllm_bytes(cfg)
        weights = a.params * vb
        if gpu_mem_gib is None:  # vLLM on a CPU: a fixed KV cache, not a share of all host memory
            from mathrl.rollout.vllm_engine import CPU_DEFAULT_KV_GB

            kv_gb = v.kv_cache_gb if v.kv_cache_gb is not None else CPU_DEFAULT_KV_GB
            c[key] = weights + int(kv_gb * GIB)
            notes[key] = f"on the CPU: weights {a.params:,} x {vb} B + KV cache {kv_gb:g} GiB (rollout.vllm.kv_cache_gb)"
            return c, notes, c[key], c[key]
        util = v.gpu_memory_utilization
        pool = int(util * gpu_mem_gib * GIB)
        c[key] = pool
        kv_bytes = pool - weights
        notes[key] = f"gpu_memory_utilization {util} x {gpu_mem_gib} GiB"
        if kv_bytes <= 0:
            warnings.append(f"vLLM's share ({util} x {gpu_mem_gib} GiB) does not hold the weights ({weights / GIB:.1f} GiB): "
                            "raise rollout.vllm.gpu_memory_utilization")
        else:
            kv_tokens = kv_bytes // (kv_per_token * vb)
            notes[key] += (f"; weights {weights / GIB:.1f} GiB, KV cache {kv_bytes / GIB:.1f} GiB ~ {kv_tokens:,} tokens "
                           f"= {kv_tokens // seq_len:,} sequences of {seq_len:,} (this GPU's batch: "
                           f"{math.ceil(cfg.rollout_batch_size / n):,})")
        if v.enable_sleep_mode:  # asleep, vLLM holds neither its KV cache nor its weights on the GPU
            notes[key] += f"; asleep during the update (level {v.sleep_level})"
        return c, notes, pool, 0 if v.enable_sleep_mode else pool
    rows = min(cfg.rollout.batch_size, math.ceil(cfg.rollout_batch_size / n))
    if n > 1 or cfg.model.dtype == "float16":  # float16: the engine samples from a float16 copy
        eb = BYTES[cfg.model.dtype]
        c["torch engine weights"] = (a.params + a.lora_params) * eb
        notes["torch engine weights"] = f"an unsharded copy of the policy, {a.params + a.lora_params:,} x {eb} B, on every GPU"
    rows, seq_len, how = _torch_cache(cfg, rows, seq_len)
    c["torch engine KV cache"] = rows * seq_len * kv_per_token * cb
    notes["torch engine KV cache"] = f"{rows:,} sequences x {seq_len:,} tokens x {kv_per_token:,} x {cb} B{how}"
    weights = c.get("torch engine weights", 0)
    return c, notes, weights + c["torch engine KV cache"], weights


def generator_engine(cfg: Config, a: Architecture, index: int, gpu: int | None, *, gpu_mem_gib: float,
                      pb: int) -> GeneratorUse:
    """The engine of generator `index` on GPU `gpu` (None: the CPU). vLLM on a GPU claims its
    gpu_memory_utilization share; on the CPU its weights and a fixed KV cache. The torch engine holds its
    own copy of the policy in model.dtype, a KV cache of rollout.batch_size sequences in the same dtype
    (no autocast in a generator), and on a GPU a CUDA-context allowance of its own process."""
    seq_len = cfg.data.max_prompt_tokens + cfg.rollout.max_new_tokens
    if engine_owns_weights(cfg):
        v = cfg.rollout.vllm
        if gpu is not None:
            util = v.gpu_memory_utilization
            return GeneratorUse(index, gpu, "vLLM", int(util * gpu_mem_gib * GIB), util,
                                f"gpu_memory_utilization {util:g} x {gpu_mem_gib:g} GiB (weights, KV cache, activations)")
        from mathrl.rollout.vllm_engine import CPU_DEFAULT_KV_GB

        kv_gb = v.kv_cache_gb if v.kv_cache_gb is not None else CPU_DEFAULT_KV_GB
        vb = _vllm_bytes(cfg)
        return GeneratorUse(index, None, "vLLM", a.params * vb + int(kv_gb * GIB), None,
                            f"weights {a.params:,} x {vb} B + KV cache {kv_gb:g} GiB (rollout.vllm.kv_cache_gb)")
    rows, seq_len, how = _torch_cache(cfg, min(cfg.rollout.batch_size, cfg.rollout_batch_size), seq_len)
    kv_per_token = _kv_bytes_per_token(a)
    runtime = int(RUNTIME_GIB * GIB) if gpu is not None else 0
    note = (f"its own copy {a.params:,} x {pb} B + KV cache {rows:,} sequences x {seq_len:,} tokens x "
            f"{kv_per_token:,} x {pb} B{how}" + (f" + {RUNTIME_GIB:g} GiB runtime" if runtime else ""))
    return GeneratorUse(index, gpu, "torch", a.params * pb + rows * seq_len * kv_per_token * pb + runtime, None, note)
