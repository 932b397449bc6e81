"""Benchmark: reward verifier throughput (pairs/second) in-process, on one worker and on a pool.

Run from the repository root:

    python benchmarks/verifier_throughput.py --pairs 400 --workers 0 1 2 --out benchmarks/verifier_throughput.json

Two workloads of realistic (completion, reference) pairs, built from a fixed seed:

* `arithmetic`: short worked solutions (`37 \\times 12 = 444`, then `444 + 15 = 459`) ending in
  `\\boxed{<integer>}`, against integer references: the exact `Decimal` fast path, no SymPy.
* `math500`: MATH-500 reference answers (`\\frac{1}{2}`, `\\sqrt{2}`, intervals, tuples, text; about
  half are plain integers) read from `shared/data/math/math500.jsonl`, each completion a short
  reasoning string ending in `\\boxed{...}`. Skipped, with a message, if the file is absent. The file
  is found as in tests/conftest.py: `--math-file`, else `$MATHRL_SHARED_DATA`, else
  `<repo>/../shared/data/math`.

In both, a completion carries the reference's answer (50%), a perturbed one (40%: a digit changed,
or another problem's answer when there is no digit), or no box at all (10%, a truncated generation).

Each `--workers` value gets one `Verifier(num_workers=N, timeout_s=--timeout-s)`; 0 runs `verify_one`
in this process (no per-item timeout; the reference point for worker overhead). Worker start-up
(spawn + importing SymPy and math-verify) is done by an untimed first call and reported separately as
`startup s`. `seconds` is the median over `--repeats` calls of `score` on all pairs of a workload;
calls of the different settings are interleaved so that drift in a shared machine's load hits all
alike. `exact %` is the share of pairs decided by the exact-number path (the rest had no box or went
to math-verify); `agree` counts results whose reason equals the in-process run's (a timeout under a
pool, or on a slow machine, can make them differ). Each worker process uses one core, so the speed-up
of a pool is capped by the number of idle cores.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import platform
import random
import statistics
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from rich.console import Console
from rich.table import Table

from mathrl.reward import Verifier

REPO = Path(__file__).resolve().parents[1]

FILLER = (
    "Let me set up the problem carefully.",
    "We can rewrite the expression as $x^2 + 2x + 1 = (x+1)^2$.",
    "Substituting back, the constraint becomes $a + b = 10$ with $a, b > 0$.",
    "By the AM-GM inequality, $\\frac{a+b}{2} \\ge \\sqrt{ab}$.",
    "Checking the edge cases, nothing changes.",
    "Now we simplify $\\frac{6}{8} = \\frac{3}{4}$ and continue.",
    "Wait, let me double-check that step. Yes, it holds.",
    "So the number of valid choices is $\\binom{5}{2} = 10$.",
)


@dataclass
class Workload:
    name: str
    completions: list[str]
    references: list[str]


def reasoning(rng: random.Random, body: str, answer: str | None) -> str:
    """A short chain of thought around `body`, ending in a boxed `answer` (None: cut off before it)."""
    sentences = rng.sample(FILLER, k=rng.randint(2, 5))
    text = " ".join(sentences[:1] + [body] + sentences[1:])
    if answer is None:
        return text + " Therefore the final answer is"  # truncated generation: no box
    return text + f" Therefore the final answer is $\\boxed{{{answer}}}$."


def choose_outcome(rng: random.Random) -> str:
    return rng.choices(["correct", "perturbed", "truncated"], weights=[5, 4, 1])[0]


def arithmetic_workload(n: int, rng: random.Random) -> Workload:
    completions, references = [], []
    for _ in range(n):
        a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(1, 999)
        product = a * b
        result = product + c
        body = f"First, ${a} \\times {b} = {product}$. Then ${product} + {c} = {result}$."
        outcome = choose_outcome(rng)
        answer = {"correct": str(result), "perturbed": str(result + rng.choice([-10, -1, 1, 2, 100])),
                  "truncated": None}[outcome]
        completions.append(reasoning(rng, body, answer))
        references.append(str(result))
    return Workload("arithmetic", completions, references)


def perturb(answer: str, rng: random.Random, others: list[str]) -> str:
    """A probably-wrong variant: one digit changed, or (no digit) another problem's answer."""
    digits = [i for i, ch in enumerate(answer) if ch.isdigit()]
    if not digits:
        return rng.choice(others)
    i = rng.choice(digits)
    return answer[:i] + str((int(answer[i]) + rng.randint(1, 9)) % 10) + answer[i + 1:]


def math500_workload(n: int, rng: random.Random, path: Path) -> Workload:
    answers = [json.loads(line)["answer"] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    completions, references = [], []
    for k in range(n):
        reference = answers[k % len(answers)]  # in file order: n <= 500 uses each answer at most once
        outcome = choose_outcome(rng)
        answer = {"correct": reference, "perturbed": perturb(reference, rng, answers),
                  "truncated": None}[outcome]
        completions.append(reasoning(rng, "Working through the algebra gives the result below.", answer))
        references.append(reference)
    return Workload("math500", completions, references)


def default_math_file() -> Path:
    """Same lookup as tests/conftest.py: $MATHRL_SHARED_DATA (data folder or shared/), else repo/../shared."""
    env = os.environ.get("MATHRL_SHARED_DATA")
    if env:
        root = Path(env)
        folder = root / "data" / "math" if (root / "data" / "math").is_dir() else root
    else:
        folder = REPO.parent / "shared" / "data" / "math"
    return folder / "math500.jsonl"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=400, help="pairs per workload")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2],
                        help="num_workers values to measure (0 = in-process)")
    parser.add_argument("--timeout-s", type=float, default=5.0, help="Verifier per-item timeout")
    parser.add_argument("--math-file", type=Path, default=None, help="MATH-500 jsonl (default: shared data)")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per setting and workload")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args()
    if args.pairs < 1:
        parser.error(f"--pairs must be >= 1, got {args.pairs}")
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    if any(w < 0 for w in args.workers):
        parser.error(f"--workers values must be >= 0, got {args.workers}")

    console = Console()
    rng = random.Random(args.seed)
    workloads = [arithmetic_workload(args.pairs, rng)]
    math_file = args.math_file or default_math_file()
    if math_file.is_file():
        workloads.append(math500_workload(args.pairs, rng, math_file))
    else:
        console.print(f"[yellow]skipping the math500 workload: {math_file} not found "
                      "(pass --math-file or set MATHRL_SHARED_DATA)[/yellow]")

    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    console.print(f"python {platform.python_version()}, math-verify {metadata.version('math-verify')}, "
                  f"sympy {metadata.version('sympy')}, {os.cpu_count()} CPUs, load average {load}")

    # All verifiers are started first (untimed: spawn + warm-up, or the math-verify import in-process),
    # then timed calls are interleaved (repeat 1 of every setting, then repeat 2, ...), so slow drift of
    # a shared machine hits every setting alike. The table reports the median call.
    worker_counts = sorted(set(args.workers))  # 0 first: the other settings are compared with it
    seconds: dict[tuple[str, int], list[float]] = collections.defaultdict(list)
    reasons: dict[tuple[str, int], list[str]] = {}
    exact: dict[tuple[str, int], int] = {}
    startup_s: dict[int, float] = {}
    with contextlib.ExitStack() as stack:
        verifiers = {}
        for num_workers in worker_counts:
            verifier = stack.enter_context(Verifier(num_workers=num_workers, timeout_s=args.timeout_s))
            started = time.perf_counter()
            n = max(1, num_workers)  # one item per worker is enough to wait for all of them
            verifier.score(["\\boxed{\\frac{1}{2}}"] * n, ["0.5"] * n)
            startup_s[num_workers] = time.perf_counter() - started
            verifiers[num_workers] = verifier
        for repeat in range(args.repeats):
            for num_workers, verifier in verifiers.items():
                for workload in workloads:
                    started = time.perf_counter()
                    results = verifier.score(workload.completions, workload.references)
                    key = (workload.name, num_workers)
                    seconds[key].append(time.perf_counter() - started)
                    reasons[key] = [r.reason for r in results]  # the last repeat's
                    exact[key] = sum(r.detail == "exact number" for r in results)
                    console.print(f"  repeat {repeat + 1}/{args.repeats} {workload.name:<10} "
                                  f"workers={num_workers}: {seconds[key][-1]:.2f} s")

    rows: list[dict] = []
    for workload in workloads:
        for num_workers in worker_counts:
            key = (workload.name, num_workers)
            median_s = statistics.median(seconds[key])
            baseline = reasons.get((workload.name, 0))
            rows.append({
                "workload": workload.name,
                "workers": num_workers,
                "pairs": len(workload.completions),
                "seconds": median_s,
                "pairs_per_s": len(workload.completions) / median_s,
                "all_seconds": seconds[key],
                "startup_s": startup_s[num_workers],
                "exact_path_fraction": exact[key] / len(workload.completions),
                "reasons": dict(collections.Counter(reasons[key])),
                "agree_with_in_process": (None if baseline is None
                                          else sum(a == b for a, b in zip(reasons[key], baseline))),
            })

    table = Table(title=f"Verifier throughput (median of {args.repeats} calls, timeout {args.timeout_s:g} s)",
                  caption="workers 0 = in-process verify_one; exact % = decided by the exact-number path; "
                          "agree = same reason as in-process")
    for column in ("workload", "workers", "pairs", "seconds", "pairs/s", "startup s", "exact %",
                   "timeouts", "agree"):
        table.add_column(column, justify="left" if column == "workload" else "right")
    for row in rows:
        agree = row["agree_with_in_process"]
        table.add_row(
            row["workload"],
            str(row["workers"]),
            str(row["pairs"]),
            f"{row['seconds']:.2f}",
            f"{row['pairs_per_s']:.0f}",
            f"{row['startup_s']:.2f}",
            f"{100 * row['exact_path_fraction']:.0f}",
            str(row["reasons"].get("timeout", 0)),
            "-" if agree is None else f"{agree}/{row['pairs']}",
        )
    console.print(table)

    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "benchmark": "verifier_throughput",
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "math_file": str(math_file) if math_file.is_file() else None,
            "python": platform.python_version(),
            "math_verify": metadata.version("math-verify"),
            "sympy": metadata.version("sympy"),
            "cpu_count": os.cpu_count(),
            "load_average": load,
            "rows": rows,
        }, indent=2) + "\n")
        console.print(f"wrote {args.out}")


if __name__ == "__main__":  # required: Verifier workers are spawned and re-import this script
    main()
