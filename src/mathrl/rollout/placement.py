"""Which GPU each generator process samples on: one rule, read by the generator's placement
(train/generators/host.py) and by the memory plan (plan/memory.py).

    generator_gpus([], workers=1, gpus=8, trainer_gpus=[0, 1, 2, 3])   # [4]
    generator_gpus([], workers=1, gpus=1, trainer_gpus=[0])            # [0]: shared with the trainer
    child_cuda_env("cuda:3", "2,3,5,7")                                  # ("7", "cuda:0")
"""

from __future__ import annotations


def generator_gpus(devices: list[int], *, workers: int, gpus: int, trainer_gpus: list[int]) -> list[int]:
    """The GPU (the machine's numbering, as the trainer sees it) of each of `workers` generators: worker i
    takes devices[i % len] (rollout.generator.devices), by default the GPUs after those the trainer's ranks
    use, else the trainer's first GPU (shared)."""
    pool = list(devices) or [d for d in range(gpus) if d not in trainer_gpus] or [trainer_gpus[0]]
    return [pool[i % len(pool)] for i in range(workers)]


def weight_backend(chosen: list[int], trainer_gpus: list[int]) -> str:
    """The weight group's backend: NCCL when every generator has a GPU of its own (NCCL refuses two ranks on
    one device), else gloo through host memory."""
    own = len(set(chosen)) == len(chosen) and not set(chosen) & set(trainer_gpus)
    return "nccl" if own else "gloo"


def child_cuda_env(device: str, visible: str | None) -> tuple[str | None, str]:
    """(CUDA_VISIBLE_DEVICES for a generator child, the device it then uses) for a generator placed on
    `device` ("cpu" or "cuda:<i>", i in the trainer's numbering) by a trainer that sees `visible` (its own
    CUDA_VISIBLE_DEVICES, None when unset). A child on a GPU sees only that GPU, as `cuda:0`: vLLM's
    single-process executor always takes local device 0, whatever device the process set before.
    A CPU child gets "" (no GPU at all), so nothing it loads can land on a GPU."""
    if device == "cpu":
        return "", "cpu"
    index = int(device.split(":", 1)[1])
    if visible is None or not visible.strip():
        return str(index), "cuda:0"
    names = [v.strip() for v in visible.split(",") if v.strip()]
    if index >= len(names):
        raise ValueError(f"generator device {device} is not among the {len(names)} GPU(s) of CUDA_VISIBLE_DEVICES={visible}")
    return names[index], "cuda:0"
