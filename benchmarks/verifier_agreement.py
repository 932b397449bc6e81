"""Benchmark: answer checkers against the labelled set — agreement, false positives, pairs/second.

Run from the repository root (about 2-4 minutes on 2 busy cores):

    python benchmarks/verifier_agreement.py --out benchmarks/verifier_agreement.json
    python benchmarks/verifier_agreement.py --baseline-ref a6b53dc~1   # also time an older verify.py

Checkers, each given the full response and the gold answer of every pair in
`tests/data/verifier_cases.jsonl` (500 pairs, sources in `tests/data/README.md`):

* `mathrl (boxed=all)`: `mathrl.reward.verify_one`, the default box policy; also `boxed=last`.
* `math-verify`: math-verify called directly as its README shows,
  `verify(parse("$" + gold + "$"), parse(response))`, default extraction (LaTeX and plain
  expressions) and default precision.
* `REF (last box)` with ``--baseline-ref REF``: ``verify_one`` of ``src/mathrl/reward/verify.py`` at git REF.
* `minerva-normaliser`: the string normaliser of Lewkowycz et al. 2022 (Minerva, appendix: final-answer
  normalisation), as used by DAPO's `math_dapo` reward and DeepScaleR-style checkers: the content of
  the last box after the last `=`, with the published substitutions and removed expressions, compared
  as strings. Re-implemented here from the published rules.

Per category: `agree` is the share of pairs whose verdict equals the label; `FP` the number of pairs
labelled wrong that the checker calls correct (over the wrong-labelled pairs of that category);
`hack` the false positives among pairs marked must-reject.

Throughput: pairs/second of `score` on two workloads, median of `--repeats` calls: the labelled set
without the `hostile` category (exponent towers wait out timeouts and would dominate), and the
MATH-500 workload of `benchmarks/verifier_throughput.py` (400 pairs, half right, 40% perturbed, 10%
no box). mathrl runs in-process (`Verifier(num_workers=0)`) and on a pool (`--workers`); math-verify
in-process, with latex2sympy2's own LL parsing (as in a process of their own; mathrl parses two-stage,
`mathrl.reward.latex_parse`). `--baseline-ref REF` also times `src/mathrl/reward/verify.py` as it was at git REF (loaded
from `git show`), in-process and on the pool, so that a change can be checked for speed on the same
machine and load.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import importlib.util
import json
import logging
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from rich.console import Console
from rich.table import Table

from mathrl.reward import Verifier, extract_boxed, latex_parse, verify_one

REPO = Path(__file__).resolve().parents[1]
CASES_FILE = REPO / "tests" / "data" / "verifier_cases.jsonl"
HELDOUT_FILE = REPO / "tests" / "data" / "verifier_heldout.jsonl"

# ---------------------------------------------------------------------------------------------------
# The Minerva final-answer normaliser (Lewkowycz et al. 2022, appendix), written from its rule list
# ---------------------------------------------------------------------------------------------------

MINERVA_SUBSTITUTIONS = (
    ("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""), ("mbox", "text"),
    (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"),
)
MINERVA_REMOVED = (
    "square", "ways", "integers", "dollars", "mph", "inches", "ft", "hours", "km", "units", "\\ldots",
    "sue", "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters",
    "meals", "edges", "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}",
    "\\text{\ns}", "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", "\\mathrm{th}", "^\\circ",
    "^{\\circ}", "\\;", ",\\!", "{,}", '"', "\\dots",
)
_UNWRAP = [re.compile(r"\\" + name + r"\{(.*?)\}") for name in ("text", "textbf", "overline")]


def minerva_normalise(answer: str) -> str:
    """Normalised final answer: right of the last ``=``, substitutions, removals, ``$...$`` content,
    ``\\text{}``-style wrappers unwrapped, ``\\frac12``/``\\sqrt2`` braced, commas dropped from integers."""
    answer = answer.split("=")[-1]
    for before, after in MINERVA_SUBSTITUTIONS:
        answer = answer.replace(before, after)
    for removed in MINERVA_REMOVED:
        answer = answer.replace(removed, "")
    inline = re.search(r"\$(.*?)\$", answer)
    if inline:
        answer = "$" + inline.group(1) + "$"
    for pattern in _UNWRAP:
        answer = pattern.sub(r"\1", answer)
    answer = re.sub(r"\\boxed\{(.*)\}", r"\1", answer)
    answer = re.sub(r"(frac)([^{])(.)", r"frac{\2}{\3}", answer)
    answer = re.sub(r"(sqrt)([^{])", r"sqrt{\2}", answer)
    answer = answer.replace("$", "")
    if answer.replace(",", "").isdigit():
        answer = answer.replace(",", "")
    return answer.strip()


def minerva_equal(response: str, gold: str) -> bool:
    boxed = extract_boxed(response)
    return boxed is not None and minerva_normalise(boxed) == minerva_normalise(gold)


def math_verify_equal(response: str, gold: str) -> bool:
    import math_verify

    try:
        return bool(math_verify.verify(math_verify.parse("$" + gold + "$"), math_verify.parse(response)))
    except BaseException as e:  # noqa: BLE001 - its TimeoutException derives from BaseException
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        return False


# ---------------------------------------------------------------------------------------------------
# Agreement
# ---------------------------------------------------------------------------------------------------


def load_cases(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def agreement(cases: list[dict], checker: Callable[[str, str], bool]) -> dict[str, dict[str, float]]:
    """Per category or suite (and ``all``): n, agreeing pairs, wrong-labelled pairs, false positives,
    hacks. The development set has categories and batches; the held-out set has suites."""
    stats: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for case in cases:
        verdict = checker(case["response"], case["gold"])
        keys = [case.get("category") or f"suite:{case['suite']}", "all"]
        if "batch" in case:
            keys.append(f"batch:{case['batch']}")
        for key in keys:
            s = stats[key]
            s["n"] += 1
            s["agree"] += verdict == case["expected"]
            s["negatives"] += not case["expected"]
            s["fp"] += verdict and not case["expected"]
            s["hack"] += verdict and case.get("must_reject", False)
    return {key: dict(value) for key, value in stats.items()}


# ---------------------------------------------------------------------------------------------------
# Throughput
# ---------------------------------------------------------------------------------------------------


def load_baseline(ref: str, workdir: Path):
    """``src/mathrl/reward/verify.py`` at git ``ref`` as module ``mathrl_baseline_verify`` (importable
    by spawned workers through PYTHONPATH)."""
    source = subprocess.run(["git", "-C", str(REPO), "show", f"{ref}:src/mathrl/reward/verify.py"],
                            check=True, capture_output=True, text=True).stdout
    (workdir / "mathrl_baseline_verify.py").write_text(source, encoding="utf-8")
    sys.path.insert(0, str(workdir))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(workdir), os.environ.get("PYTHONPATH", "")])
    spec = importlib.util.find_spec("mathrl_baseline_verify")
    module = importlib.util.module_from_spec(spec)
    sys.modules["mathrl_baseline_verify"] = module
    spec.loader.exec_module(module)
    return module


def time_calls(score: Callable[[list[str], list[str]], object], workload: tuple[list[str], list[str]],
               repeats: int) -> float:
    """Median pairs/second over ``repeats`` calls of ``score(completions, references)``."""
    completions, references = workload
    rates = []
    for _ in range(repeats):
        started = time.perf_counter()
        score(completions, references)
        rates.append(len(completions) / (time.perf_counter() - started))
    return statistics.median(rates)


def with_ll_parsing(score: Callable[[list[str], list[str]], object]) -> Callable[[list[str], list[str]], object]:
    """``score`` timed with latex2sympy2's own LL parsing, as it runs in a process of its own: mathrl
    makes the parser two-stage in its process (`mathrl.reward.latex_parse`), which would speed up the
    other in-process checkers too."""
    def timed(completions: list[str], references: list[str]) -> object:
        latex_parse.uninstall_two_stage_parsing()
        try:
            return score(completions, references)
        finally:
            latex_parse.install_two_stage_parsing()
    return timed


def math500_workload(n: int, seed: int) -> tuple[list[str], list[str]] | None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import verifier_throughput  # the workload builder of the throughput benchmark

    path = verifier_throughput.default_math_file()
    if not path.is_file():
        return None
    workload = verifier_throughput.math500_workload(n, random.Random(seed), path)
    return workload.completions, workload.references


# ---------------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=Path, default=CASES_FILE, help="the development set")
    parser.add_argument("--heldout", type=Path, default=HELDOUT_FILE, help="the held-out set")
    parser.add_argument("--workers", type=int, default=2, help="pool size for the pool rows")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per throughput setting")
    parser.add_argument("--pairs", type=int, default=400, help="MATH-500 workload size")
    parser.add_argument("--baseline-ref", default=None, help="also score and time verify.py at this git ref")
    parser.add_argument("--no-throughput", action="store_true", help="agreement tables only")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args()
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)  # timeouts log whole inputs
    console = Console()
    sets = {"dev": load_cases(args.cases), "held-out": load_cases(args.heldout)}
    cases = sets["dev"]

    checkers: dict[str, Callable[[str, str], bool]] = {
        "mathrl (boxed=all)": lambda r, g: verify_one(r, g).score == 1.0,
        "mathrl (boxed=last)": lambda r, g: verify_one(r, g, boxed="last").score == 1.0,
        "math-verify": math_verify_equal,
        "minerva-normaliser": minerva_equal,
    }
    baseline = None
    if args.baseline_ref:
        baseline = load_baseline(args.baseline_ref, Path(tempfile.mkdtemp(prefix="mathrl-baseline-")))
        checkers[f"{args.baseline_ref} (last box)"] = lambda r, g: baseline.verify_one(r, g).score == 1.0
    results: dict[str, dict] = {}
    for set_name, set_cases in sets.items():
        results[set_name] = {}
        for name, checker in checkers.items():
            started = time.perf_counter()
            results[set_name][name] = agreement(set_cases, checker)
            console.print(f"{set_name}, {name}: {results[set_name][name]['all']['agree']}/{len(set_cases)} agree "
                          f"({time.perf_counter() - started:.1f} s)")

        rows = results[set_name]["math-verify"]
        groups = sorted(k for k in rows if k != "all" and not k.startswith("batch:"))
        table = Table(title=f"{set_name}: agreement with the labels on {len(set_cases)} pairs "
                            "(agree % / false positives / hacks)")
        table.add_column("category or suite")
        table.add_column("pairs", justify="right")
        for name in checkers:
            table.add_column(name, justify="right")
        batches = sorted(k for k in rows if k.startswith("batch:"))
        for key in [*groups, *batches, "all"]:
            row = [key, str(rows[key]["n"])]
            for name in checkers:
                s = results[set_name][name][key]
                row.append(f"{100 * s['agree'] / s['n']:.1f}% / {s['fp']} / {s['hack']}")
            table.add_row(*row)
        console.print(table)

    # -- throughput ---------------------------------------------------------------------------------
    throughput: dict[str, dict[str, list[float]]] = {}
    if args.no_throughput:
        write_results(args, results, throughput, console)
        return
    clean = [c for c in cases if c["category"] != "hostile"]
    workloads = {"labelled set (no hostile)": ([c["response"] for c in clean], [c["gold"] for c in clean])}
    math500 = math500_workload(args.pairs, args.seed)
    if math500 is not None:
        workloads["MATH-500 workload"] = math500
    throughput = {name: {} for name in workloads}
    with contextlib.ExitStack() as stack:
        scorers: dict[str, Callable] = {
            "mathrl in-process": stack.enter_context(Verifier(num_workers=0)).score,
            f"mathrl pool ({args.workers} workers)": stack.enter_context(Verifier(num_workers=args.workers)).score,
            "math-verify in-process": with_ll_parsing(
                lambda cs, rs: [math_verify_equal(c, r) for c, r in zip(cs, rs)]),
        }
        if baseline is not None:
            scorers[f"{args.baseline_ref} in-process"] = with_ll_parsing(
                stack.enter_context(baseline.Verifier(num_workers=0)).score)
            scorers[f"{args.baseline_ref} pool ({args.workers} workers)"] = stack.enter_context(
                baseline.Verifier(num_workers=args.workers)).score
        for name, workload in workloads.items():
            for scorer in scorers.values():  # untimed: worker start-up, imports, caches
                scorer(workload[0][:8], workload[1][:8])
            for _ in range(args.repeats):  # interleaved so that load drift hits every scorer alike
                for label, scorer in scorers.items():
                    throughput[name].setdefault(label, [])
                    throughput[name][label].append(time_calls(scorer, workload, 1))
    speed = Table(title=f"Throughput, pairs/s (median of {args.repeats} calls)")
    speed.add_column("scorer")
    for name in workloads:
        speed.add_column(f"{name} ({len(workloads[name][0])} pairs)", justify="right")
    for label in next(iter(throughput.values())):
        speed.add_row(label, *(f"{statistics.median(throughput[name][label]):.0f}" for name in workloads))
    console.print(speed)

    write_results(args, results, throughput, console)


def write_results(args, results: dict, throughput: dict, console: Console) -> None:
    if args.out:
        args.out.write_text(json.dumps({
            "command": " ".join(sys.argv),
            "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                        "math-verify": metadata.version("math-verify"), "sympy": metadata.version("sympy")},
            "agreement": results,
            "throughput_pairs_per_s": {name: {label: statistics.median(v) for label, v in rows.items()}
                                       for name, rows in throughput.items()},
        }, indent=2) + "\n", encoding="utf-8")
        console.print(f"wrote {args.out}")


if __name__ == "__main__":  # required: Verifier workers are spawned and re-import this script
    main()
