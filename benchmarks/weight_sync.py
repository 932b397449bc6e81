"""What one policy version costs to reach a generator process (rollout/weight_sync.py), by path:

    host   gloo through host memory, the buckets broadcast as they are (a generator sharing the trainer's
           GPU, or any CPU run): the path a one-GPU machine takes, since NCCL refuses two ranks on one device
    staged the same transport through one reusable staging bucket on --device (`StagedSender`, the NCCL path's
           memory layout; over gloo here, so that it runs on one GPU or a CPU)

Each repeat packs a version of --mb MiB of float32 tensors from --device into host buffers (the trainer's
`Generator.push`), sends it, and the receiver unpacks it onto --device (the generator's engine load): the
seconds from the pack to the receiver's last copy, and the rate. Ratios are printed against `host`.

    python benchmarks/weight_sync.py                       # CPU, 512 MiB, 5 repeats
    python benchmarks/weight_sync.py --device cuda --mb 1900   # one GPU (a 0.5B model in float32 is ~1.9 GiB)
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import time

import torch


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _specs(mb: float) -> list:
    from mathrl.rollout import weight_sync as ws

    per = 16 * 2**20 // 4  # 16 MiB tensors, like a 0.5B model's matrices
    n = max(1, int(mb * 2**20 // 4 // per))
    return [ws.TensorSpec(f"t{i}", (per,), torch.float32) for i in range(n)]


def _receiver(port: int, mb: float, bucket_mb: float, device: str, repeats: int, staged: bool, out) -> None:
    from mathrl.rollout import weight_sync as ws

    torch.set_num_threads(1)
    specs = _specs(mb)
    buckets = ws.plan_buckets(specs, bucket_bytes=int(bucket_mb * 2**20))
    group = ws.join_group("127.0.0.1", port, rank=1, world_size=2, backend="gloo", timeout_s=600)
    staging = ws.staging_buffer(buckets, "cpu") if staged else None
    for _ in range(repeats):
        flats = ws.receive_buckets(group, buckets, staging=staging, timeout_s=600)
        for _, t in ws.unpack(buckets, specs, flats):
            t.to(device)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        out.put(time.time())
    ws.barrier(group, 600)


def measure(*, mb: float, bucket_mb: float, device: str, repeats: int, staged: bool) -> list[float]:
    import torch.multiprocessing as mp

    from mathrl.rollout import weight_sync as ws

    specs = _specs(mb)
    buckets = ws.plan_buckets(specs, bucket_bytes=int(bucket_mb * 2**20))
    tensors = [torch.randn(s.shape, device=device) for s in specs]
    port = _port()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    p = ctx.Process(target=_receiver, args=(port, mb, bucket_mb, device, repeats, staged, out))
    p.start()
    group = ws.join_group("127.0.0.1", port, rank=0, world_size=2, backend="gloo", timeout_s=600)
    sender = ws.StagedSender(group, buckets, staging_device=torch.device(device), timeout_s=600) if staged else None
    seconds = []
    for _ in range(repeats):
        t0 = time.time()
        flats = ws.pack(buckets, tensors)
        works = [sender.send(flats)] if sender else ws.broadcast_buckets(group, flats)
        ws.wait_all(works, 600)
        seconds.append(out.get(timeout=600) - t0)
    ws.barrier(group, 600)
    p.join(timeout=60)
    if sender:
        sender.close()
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=512.0, help="MiB of float32 weights per version")
    ap.add_argument("--bucket-mb", type=float, default=256.0, help="rollout.generator.bucket_mb")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = {}
    for path in ("host", "staged"):
        s = measure(mb=args.mb, bucket_mb=args.bucket_mb, device=args.device, repeats=args.repeats, staged=path == "staged")
        med = statistics.median(s[1:] if len(s) > 1 else s)  # the first repeat warms the allocator
        rows[path] = {"median_seconds": med, "gib_per_second": args.mb / 1024 / med, "seconds": s}
    for path, r in rows.items():
        print(f"{path:7s} {args.mb:.0f} MiB to a generator process on {args.device}: {r['median_seconds']:.3f} s "
              f"({r['gib_per_second']:.2f} GiB/s), {rows['host']['median_seconds'] / r['median_seconds']:.2f}x host")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": rows}, f, indent=2)


if __name__ == "__main__":
    main()
