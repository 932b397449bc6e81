"""Benchmark: peak memory of `logprobs_and_entropy` (chunked) against the naive full-logits computation.

Both compute, from random last hidden states [1, P, H] and a random lm-head weight [V, H] (float32,
both requiring grad), the log-prob of a random target at every position and the entropy of the full
next-token distribution, then backpropagate loss = logprobs.sum() + entropy.sum():

* `naive`: logits = hidden @ W^T as one [P, V] tensor, log_softmax, gather, and
  entropy = -sum_v exp(logp) logp (the textbook version; every step keeps a [P, V] tensor alive).
* `chunked`: `mathrl.algo.entropy.logprobs_and_entropy(..., chunk_size=C)`: positions go through the
  lm head C at a time under `torch.utils.checkpoint`, so at most one chunk of [C, V] logits exists
  at any time, in the forward and in the backward.

Run from the repository root (defaults: Qwen2.5-0.5B's vocabulary 151,936 and hidden size 896):

    python benchmarks/entropy_memory.py --positions 512 1024 2048 --out benchmarks/entropy_memory.json
    python benchmarks/entropy_memory.py --positions 64 128 --vocab 4096 --hidden 64 --chunk-size 64  # seconds

Every (mode, positions) measurement runs in a fresh subprocess (this script re-invoked with
`--child`), so one measurement's allocator state and peak cannot leak into the next; each child first
runs its mode once on tiny tensors (lazy imports, thread pool) before allocating the inputs. Peak memory:

* CPU: the increase of the process's peak resident set size (`getrusage(RUSAGE_SELF).ru_maxrss`) over
  its value right after the inputs were allocated, so the inputs (hidden, W, targets) are excluded.
  Tensors this large are mmap-ed by glibc and unmapped when freed, so RSS follows live tensors.
* CUDA (used when available, or `--device cuda`): `torch.cuda.max_memory_allocated` after
  `reset_peak_memory_stats`, minus the memory allocated right after the inputs.

How to read the table: `logits MiB` is the size a single full float32 [P, V] logits tensor would
take (P * V * 4 bytes). `peak extra MiB` is what the forward + backward needed on top of the inputs;
it includes the gradient of W ([V, H], V * H * 4 bytes, in both modes). The naive peak grows
linearly with P, at about 5x `logits MiB` (log_softmax output, its exp, their product, and their
gradients). Every P up to C is a single chunk, so there the chunked peak is about the naive one
(a few [P, V] temporaries, slightly more than naive) and still grows. The second chunk adds one
more [V, H] buffer (its grad W, before it is summed into the accumulated one); from P = 2C on the
peak no longer depends on P: about the one-chunk peak at P = C plus V * H * 4 bytes. Measured on
CPU with the defaults (2026-12): naive 1494 / 2978 / 5945 MiB at P = 512 / 1024 / 2048, chunked
1568 / 3126 / 3652 MiB. Add P = 4096 to see the chunked peak stay flat (naive would need ~12 GiB).
`seconds` is the wall time of forward + backward; chunked runs the lm-head matmul one extra time
(the checkpoint recompute), so expect it to be slower (1.8x on a shared 2-core CPU). Before the
table, a separate child computes both versions on the same inputs at the smallest P and checks
that loss and gradients agree.

The naive run at a P whose estimated peak exceeds `--max-naive-gib` is skipped (estimated from the
previous naive measurement, scaled linearly in P; see `estimate_naive_bytes`).
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table

from mathrl.algo.entropy import logprobs_and_entropy

MODES = ("naive", "chunked")
MIB = 2**20
CHILD_MARK = "ENTROPY_MEMORY_RESULT "  # prefix of the one stdout line a child reports on
# Used only when no naive run has been measured yet: the naive forward + backward keeps about this many
# [P, V] float32 tensors alive at its peak (logp, exp(logp), their product, and gradients of the same size).
NAIVE_LOGITS_COPIES = 6


# ---------------------------------------------------------------- the two computations

def naive_logprobs_and_entropy(hidden: torch.Tensor, weight: torch.Tensor,
                               targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden [B, T, H], weight [V, H], targets [B, T] -> (logprobs [B, T], entropy [B, T]) via full logits."""
    logp = torch.log_softmax(F.linear(hidden, weight), dim=-1)  # [B, T, V]
    logprobs = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [B, T]
    entropy = -(logp.exp() * logp).sum(-1)  # [B, T]
    return logprobs, entropy


def loss_of(mode: str, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
            *, chunk_size: int) -> torch.Tensor:
    """Scalar loss = logprobs.sum() + entropy.sum() computed the `mode` way."""
    if mode == "naive":
        logprobs, entropy = naive_logprobs_and_entropy(hidden, weight, targets)
    else:
        logprobs, entropy = logprobs_and_entropy(hidden, weight, targets, chunk_size=chunk_size)
    return logprobs.sum() + entropy.sum()


def make_inputs(positions: int, *, vocab: int, hidden_size: int, device: torch.device, seed: int):
    """hidden [1, P, H] and weight [V, H] (float32, requiring grad), targets [1, P]; logits come out ~N(0, 1)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    hidden = torch.randn(1, positions, hidden_size, generator=gen, device=device).requires_grad_()
    # Scaled in place: `randn(...) * s` would briefly hold two [V, H] tensors, and that transient would
    # raise ru_maxrss above the resident inputs, hiding up to V * H * 4 bytes of the measured peak.
    weight = torch.randn(vocab, hidden_size, generator=gen, device=device).mul_(hidden_size**-0.5).requires_grad_()
    targets = torch.randint(0, vocab, (1, positions), generator=gen, device=device)
    return hidden, weight, targets


# ---------------------------------------------------------------- child processes

def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def current_rss_bytes() -> int:
    """Resident set size now (Linux /proc/self/statm: pages)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize()


def child_measure(mode: str, positions: int, args: argparse.Namespace, device: torch.device) -> dict:
    """Fresh process: allocate inputs, then one forward + backward; peak memory on top of the inputs."""
    # Warm-up on tiny tensors: the first checkpoint call imports torch._dynamo & co. (~2 s, ~90 MiB RSS on
    # CPU) and the first matmul starts the thread pool; neither belongs to the measured computation.
    tiny = make_inputs(8, vocab=256, hidden_size=args.hidden, device=device, seed=args.seed)
    loss_of(mode, *tiny, chunk_size=4).backward()
    del tiny
    hidden, weight, targets = make_inputs(positions, vocab=args.vocab, hidden_size=args.hidden,
                                          device=device, seed=args.seed)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        baseline = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        baseline_slack = 0
    else:
        # ru_maxrss is monotone, so this baseline is only right if nothing before the inputs used more
        # memory than is resident now; baseline_slack (peak so far - resident now) says by how much not.
        baseline = peak_rss_bytes()
        baseline_slack = baseline - current_rss_bytes()
    t0 = time.perf_counter()
    loss = loss_of(mode, hidden, weight, targets, chunk_size=args.chunk_size)
    loss.backward()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - t0
    peak = (torch.cuda.max_memory_allocated(device) if device.type == "cuda" else peak_rss_bytes()) - baseline
    return {"mode": mode, "positions": positions, "peak_extra_bytes": peak, "baseline_bytes": baseline,
            "baseline_slack_bytes": baseline_slack,
            "seconds": seconds, "loss": loss.item(), "finite_grads": bool(
                torch.isfinite(hidden.grad).all() and torch.isfinite(weight.grad).all())}


def child_check(positions: int, args: argparse.Namespace, device: torch.device) -> dict:
    """Both modes on the same inputs: loss and gradients must agree (float32 reduction-order noise only)."""
    hidden, weight, targets = make_inputs(positions, vocab=args.vocab, hidden_size=args.hidden,
                                          device=device, seed=args.seed)
    out = {"positions": positions}
    grads = {}
    for mode in MODES:
        hidden.grad, weight.grad = None, None
        loss = loss_of(mode, hidden, weight, targets, chunk_size=args.chunk_size)
        loss.backward()
        out[f"loss_{mode}"] = loss.item()
        grads[mode] = (hidden.grad.clone(), weight.grad.clone())
    out["loss_abs_diff"] = abs(out["loss_naive"] - out["loss_chunked"])
    out["hidden_grad_max_abs_diff"] = (grads["naive"][0] - grads["chunked"][0]).abs().max().item()
    out["weight_grad_max_abs_diff"] = (grads["naive"][1] - grads["chunked"][1]).abs().max().item()
    # The loss sums 2P terms of size ~log V: float32 summation order differs between the two versions.
    loss_tol = 1e-5 * abs(out["loss_naive"]) + 1e-3
    try:
        torch.testing.assert_close(grads["chunked"][0], grads["naive"][0], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(grads["chunked"][1], grads["naive"][1], rtol=1e-4, atol=1e-5)
        grads_ok = True
    except AssertionError:
        grads_ok = False
    out["loss_tolerance"] = loss_tol
    out["ok"] = out["loss_abs_diff"] <= loss_tol and grads_ok
    return out


def run_child(job: str, positions: int, args: argparse.Namespace) -> dict:
    """Re-invoke this script with `--child JOB` in a fresh interpreter and parse its one result line."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", job, "--positions", str(positions),
           "--vocab", str(args.vocab), "--hidden", str(args.hidden), "--chunk-size", str(args.chunk_size),
           "--device", args.device, "--seed", str(args.seed)]
    if args.threads is not None:
        cmd += ["--threads", str(args.threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith(CHILD_MARK):
            return json.loads(line[len(CHILD_MARK):])
    # killed by the OOM killer, or an exception: report it instead of a number
    return {"error": f"child exited with {proc.returncode}: {proc.stderr.strip()[-500:]}"}


# ---------------------------------------------------------------- parent

def estimate_naive_bytes(positions: int, *, vocab: int, hidden_size: int, measured: dict[int, int]) -> int:
    """Naive peak extra memory at `positions`: the largest measured P scaled linearly (the [P, V] terms
    dominate), else NAIVE_LOGITS_COPIES full logits plus grad W."""
    if measured:
        p0 = max(measured)
        return measured[p0] * positions // p0
    return NAIVE_LOGITS_COPIES * positions * vocab * 4 + vocab * hidden_size * 4


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--positions", type=int, nargs="+", default=[512, 1024, 2048],
                        help="B*T positions per measurement (hidden is [1, P, H])")
    parser.add_argument("--chunk-size", type=int, default=1024, help="chunk_size of logprobs_and_entropy")
    parser.add_argument("--vocab", type=int, default=151_936, help="vocabulary size V (Qwen2.5's by default)")
    parser.add_argument("--hidden", type=int, default=896, help="hidden size H (Qwen2.5-0.5B's by default)")
    parser.add_argument("--device", default="auto", help="auto (cuda if available, else cpu), cpu or cuda")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-naive-gib", type=float, default=12.0,
                        help="skip a naive run whose estimated peak extra memory exceeds this")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    parser.add_argument("--child", choices=(*MODES, "check"), default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    args.device = device.type  # children must use the same device as the parent reports

    if args.child is not None:
        (positions,) = args.positions
        if args.child == "check":
            result = child_check(positions, args, device)
        else:
            result = child_measure(args.child, positions, args, device)
        print(CHILD_MARK + json.dumps(result), flush=True)
        return

    console = Console()
    positions_list = sorted(set(args.positions))
    weight_mib = args.vocab * args.hidden * 4 / MIB
    console.print(f"torch {torch.__version__}, device {device.type}, threads {torch.get_num_threads()}, "
                  f"V {args.vocab}, H {args.hidden}, chunk size {args.chunk_size}, "
                  f"W (and grad W) {weight_mib:.0f} MiB")

    check = run_child("check", positions_list[0], args)
    if "error" in check:
        console.print(f"[red]equality check failed to run: {check['error']}")
    else:
        verdict = "[green]OK" if check["ok"] else "[red]MISMATCH"
        console.print(f"equality check at P={check['positions']}: loss naive {check['loss_naive']:.4f}, chunked "
                      f"{check['loss_chunked']:.4f}, |diff| {check['loss_abs_diff']:.2e} "
                      f"(tol {check['loss_tolerance']:.2e}); max |grad diff| hidden "
                      f"{check['hidden_grad_max_abs_diff']:.2e}, W {check['weight_grad_max_abs_diff']:.2e} {verdict}")

    results = []
    naive_measured: dict[int, int] = {}  # positions -> peak extra bytes
    limit = args.max_naive_gib * 2**30
    for positions in positions_list:
        logits_bytes = positions * args.vocab * 4
        for mode in MODES:
            row = {"mode": mode, "positions": positions, "logits_bytes": logits_bytes}
            if mode == "naive":
                estimate = estimate_naive_bytes(positions, vocab=args.vocab, hidden_size=args.hidden,
                                                measured=naive_measured)
                if estimate > limit:
                    row["skipped"] = (f"estimated peak {estimate / 2**30:.1f} GiB > --max-naive-gib "
                                      f"{args.max_naive_gib:g}")
                    results.append(row)
                    console.print(f"{mode} P={positions}: skipped ({row['skipped']})")
                    continue
            row.update(run_child(mode, positions, args))
            if mode == "naive" and "peak_extra_bytes" in row:
                naive_measured[positions] = row["peak_extra_bytes"]
            results.append(row)
            console.print(f"{mode} P={positions}: " + (row["error"] if "error" in row else
                          f"peak extra {row['peak_extra_bytes'] / MIB:.0f} MiB, {row['seconds']:.2f} s"))

    peak_what = "peak RSS increase" if device.type == "cpu" else "max_memory_allocated increase"
    table = Table(title=f"Entropy + logprobs forward/backward memory (V {args.vocab}, H {args.hidden}, "
                        f"chunk {args.chunk_size}, {device.type}; {peak_what})")
    for col in ("mode", "positions", "logits MiB", "peak extra MiB", "peak / logits", "seconds"):
        table.add_column(col, justify="left" if col == "mode" else "right")
    for row in results:
        if "peak_extra_bytes" in row:
            peak = row["peak_extra_bytes"]
            cells = (f"{peak / MIB:.0f}", f"{peak / row['logits_bytes']:.2f}", f"{row['seconds']:.2f}")
        else:
            cells = ("skipped" if "skipped" in row else "error", "-", "-")
        table.add_row(row["mode"], str(row["positions"]), f"{row['logits_bytes'] / MIB:.0f}", *cells)
    console.print(table)
    console.print(f"logits MiB = P * V * 4 bytes, one full float32 logits tensor. peak extra = memory needed on "
                  f"top of the inputs, including grad W ({weight_mib:.0f} MiB) in both modes. naive grows "
                  f"~linearly with P; chunked equals naive up to one chunk ({args.chunk_size} positions), "
                  f"adds one grad W buffer at two chunks, and is flat in P from there on.")

    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "vocab": args.vocab, "hidden": args.hidden, "chunk_size": args.chunk_size, "device": device.type,
            "threads": torch.get_num_threads(), "seed": args.seed, "max_naive_gib": args.max_naive_gib,
            "peak_measure": peak_what, "torch": torch.__version__, "machine": platform.platform(),
            "check": check, "results": results,
        }, indent=2))
        console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
