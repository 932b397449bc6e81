"""Benchmark: the answer checker of this checkout against the checker of git revisions, side by side.

Run from the repository root (about 2-4 minutes on 2 busy cores):

    python benchmarks/verifier_versions.py --refs acaac3f 0dac981 --same-as HEAD --repeats 5

Each checker (``worktree``: this checkout's `src/`; each ``--refs``/``--same-as`` revision: its `src/`
exported with `git archive`) runs ``mathrl.reward.verify.verify_one`` in-process in a child Python of
its own, so that revisions never share a module or a cache.

* Verdicts: every pair of the development set, the held-out set and the MATH-500 workload is scored by
  every checker; a verdict is ``(score, reason, extracted)``. The table counts the pairs where a
  revision's verdict differs from the worktree's; with ``--same-as REF`` the exit status is 1 if any
  verdict differs from REF's (a speed change must not change what is equal).
* Throughput: pairs/second of ``verify_one`` over the MATH-500 workload of
  `benchmarks/verifier_throughput.py` (``--pairs`` pairs, half right, 40% perturbed, 10% no box; the
  same workload as `benchmarks/verifier_agreement.py`). One untimed call per checker first (imports,
  caches), then ``--repeats`` rounds in which every checker scores the workload once, one child at a
  time so that checkers never compete for cores, and load drift hits them alike. Reported: the median
  pairs/s of each checker and the worktree's median ratio to each revision (ratios are taken within
  a round, then the median over rounds).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
CASES_FILE = REPO / "tests" / "data" / "verifier_cases.jsonl"
HELDOUT_FILE = REPO / "tests" / "data" / "verifier_heldout.jsonl"

# The child: reads one JSON request per line, answers one JSON line. stdout carries only answers.
CHILD = r"""
import json, logging, sys, time
logging.getLogger("math_verify").setLevel(logging.CRITICAL)  # timeouts log whole inputs
from mathrl.reward.verify import verify_one
out = sys.stdout
sys.stdout = sys.stderr  # stray prints must not corrupt the answers
workloads = {}
for line in sys.stdin:
    request = json.loads(line)
    pairs = request.get("pairs") or workloads[request["name"]]
    if request["op"] == "load":
        workloads[request["name"]] = pairs
        answer = len(pairs)
    elif request["op"] == "verdicts":
        answer = [[r.score, r.reason, r.extracted] for r in (verify_one(c, g) for c, g in pairs)]
    else:  # "time"
        started = time.perf_counter()
        for completion, gold in pairs:
            verify_one(completion, gold)
        answer = time.perf_counter() - started
    out.write(json.dumps(answer) + "\n")
    out.flush()
"""


class Checker:
    """One child Python with ``src`` first on its path."""

    def __init__(self, label: str, src: Path) -> None:
        self.label = label
        env = dict(os.environ, PYTHONPATH=str(src))
        self.process = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True, encoding="utf-8", env=env,
                                        cwd=src)
        self.src = src

    def ask(self, request: dict):
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the checker of {self.label} ({self.src}) exited; see its stderr above")
        return json.loads(line)

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=30)


def export_src(ref: str, root: Path) -> Path:
    """``src/`` of git ``ref`` under ``root/<ref>``."""
    target = root / ref.replace("/", "_")
    target.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref, "src"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target / "src"


def load_pairs(path: Path) -> list[list[str]]:
    cases = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [[case["response"], case["gold"]] for case in cases]


def math500_pairs(n: int, seed: int) -> list[list[str]] | None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import verifier_throughput  # the workload builder of the throughput benchmark

    path = verifier_throughput.default_math_file()
    if not path.is_file():
        return None
    workload = verifier_throughput.math500_workload(n, random.Random(seed), path)
    return [list(pair) for pair in zip(workload.completions, workload.references)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--refs", nargs="*", default=["acaac3f", "0dac981"],
                        help="git revisions to compare with (verdicts and throughput)")
    parser.add_argument("--same-as", default=None,
                        help="git revision whose verdicts the worktree must reproduce exactly (exit 1 if not)")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds")
    parser.add_argument("--pairs", type=int, default=400, help="MATH-500 workload size")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-throughput", action="store_true", help="verdicts only")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    console = Console()

    sets = {"dev": load_pairs(CASES_FILE), "held-out": load_pairs(HELDOUT_FILE)}
    math500 = math500_pairs(args.pairs, args.seed)
    if math500 is not None:
        sets["MATH-500 workload"] = math500
    else:
        console.print("[yellow]no MATH-500 file: verdicts on the labelled sets only, no throughput[/yellow]")
    refs = list(dict.fromkeys(args.refs + ([args.same_as] if args.same_as else [])))

    with tempfile.TemporaryDirectory(prefix="mathrl-versions-") as tmp:
        checkers = [Checker("worktree", REPO / "src")]
        checkers += [Checker(ref, export_src(ref, Path(tmp))) for ref in refs]
        try:
            verdicts = {checker.label: {name: checker.ask({"op": "verdicts", "pairs": pairs})
                                        for name, pairs in sets.items()} for checker in checkers}
            seconds: dict[str, list[float]] = {checker.label: [] for checker in checkers}
            if math500 is not None and not args.no_throughput:
                for checker in checkers:
                    checker.ask({"op": "load", "name": "math500", "pairs": math500})
                    checker.ask({"op": "time", "name": "math500"})  # untimed: caches as a training run has them
                for repeat in range(args.repeats):
                    for checker in checkers:
                        seconds[checker.label].append(checker.ask({"op": "time", "name": "math500"}))
                    console.print(f"  round {repeat + 1}/{args.repeats}: " + ", ".join(
                        f"{label} {len(math500) / s[-1]:.0f}" for label, s in seconds.items()) + " pairs/s")
        finally:
            for checker in checkers:
                checker.close()

    differ = {ref: {name: [i for i, (a, b) in enumerate(zip(verdicts["worktree"][name], verdicts[ref][name]))
                           if a != b] for name in sets} for ref in refs}
    table = Table(title="Pairs whose verdict (score, reason, extracted) differs from the worktree's")
    table.add_column("revision")
    for name, pairs in sets.items():
        table.add_column(f"{name} ({len(pairs)})", justify="right")
    for ref in refs:
        table.add_row(ref, *(str(len(differ[ref][name])) for name in sets))
    console.print(table)

    rates = {label: [len(math500) / s for s in values] for label, values in seconds.items() if values}
    ratios = {ref: [w / r for w, r in zip(rates["worktree"], rates[ref])] for ref in refs if rates}
    if rates:
        speed = Table(title=f"MATH-500 workload, {len(math500)} pairs, in-process verify_one "
                            f"(median of {args.repeats} interleaved rounds)")
        speed.add_column("checker")
        speed.add_column("pairs/s", justify="right")
        speed.add_column("worktree / this", justify="right")
        for label, values in rates.items():
            ratio = "" if label == "worktree" else f"{statistics.median(ratios[label]):.2f}"
            speed.add_row(label, f"{statistics.median(values):.0f}", ratio)
        console.print(speed)

    if args.out:
        args.out.write_text(json.dumps({
            "command": " ".join(sys.argv),
            "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                        "load_average": os.getloadavg()},
            "verdicts_differ": {ref: {name: len(ids) for name, ids in d.items()} for ref, d in differ.items()},
            "pairs_per_s": {label: statistics.median(values) for label, values in rates.items()},
            "all_pairs_per_s": rates,
            "ratio_worktree_to": {ref: statistics.median(values) for ref, values in ratios.items()},
        }, indent=2) + "\n", encoding="utf-8")
        console.print(f"wrote {args.out}")

    if args.same_as and any(differ[args.same_as].values()):
        for name, ids in differ[args.same_as].items():
            for i in ids[:10]:
                console.print(f"{name} #{i}: worktree {verdicts['worktree'][name][i]} vs "
                              f"{args.same_as} {verdicts[args.same_as][name][i]}  gold={sets[name][i][1][:60]!r}")
        sys.exit(1)


if __name__ == "__main__":
    main()
