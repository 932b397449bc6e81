"""Are two runs the same run? metrics.jsonl (bar the perf/* and tool/seconds timings), evals.jsonl, rollouts.jsonl and the
final weights, compared exactly.

    python scripts/compare_runs.py runs/before runs/after [--ignore perf/ --ignore run_dir]

Prints one line per file and exits 0 only when every compared file matches: the check behind a change
that must not move any number (a refactor run before and after on the same machine and threads).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import torch
from safetensors import safe_open

JSONL = ("metrics.jsonl", "evals.jsonl", "rollouts.jsonl")


def _drop(row: dict, ignore: tuple[str, ...]) -> dict:
    """`row` without the keys that contain one of `ignore` (`tool/seconds` is also
    `eval/<set>/tool/seconds`), in nested dicts too (evals.jsonl's `tools`)."""
    return {k: _drop(v, ignore) if isinstance(v, dict) else v for k, v in row.items() if not any(i in k for i in ignore)}


def _rows(path: Path, ignore: tuple[str, ...]) -> list[dict]:
    return [_drop(json.loads(line), ignore) for line in path.read_text().splitlines() if line.strip()]


def _first_difference(a: list[dict], b: list[dict]) -> str:
    if len(a) != len(b):
        return f"{len(a)} rows against {len(b)}"
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            keys = sorted(k for k in x.keys() | y.keys() if x.get(k) != y.get(k))
            k = keys[0]
            return f"row {i} (step {x.get('step')}): {len(keys)} keys differ, first {k}: {x.get(k)!r} against {y.get(k)!r}"
    return ""


def _weights_digest(model_dir: Path) -> dict[str, str]:
    """name -> sha256 of each tensor's bytes over the directory's safetensors files."""
    out = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        with safe_open(f, framework="pt") as st:
            for name in st.keys():
                t = st.get_tensor(name).contiguous()
                out[name] = hashlib.sha256(t.view(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
    return out


def compare(a: Path, b: Path, ignore: tuple[str, ...]) -> list[tuple[str, str]]:
    """(what, "" when equal or the first difference) for each file both runs have."""
    results = []
    for name in JSONL:
        if (a / name).exists() or (b / name).exists():
            if not ((a / name).exists() and (b / name).exists()):
                results.append((name, "present in one run only"))
                continue
            results.append((name, _first_difference(_rows(a / name, ignore), _rows(b / name, ignore))))
    for sub in ("final", "final/critic"):
        if (a / sub).is_dir() and any((a / sub).glob("*.safetensors")):
            da, db = _weights_digest(a / sub), _weights_digest(b / sub) if (b / sub).is_dir() else {}
            diff = sorted(k for k in da.keys() | db.keys() if da.get(k) != db.get(k))
            results.append((f"{sub} weights", f"{len(diff)} tensors differ, first {diff[0]}" if diff else ""))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--ignore", action="append", default=None,
                        help="keys containing this are left out of the JSONL rows (default: perf/, tool/seconds and run_dir)")
    args = parser.parse_args(argv)
    ignore = tuple(args.ignore or ("perf/", "tool/seconds", "run_dir"))
    results = compare(args.a, args.b, ignore)
    for what, diff in results:
        print(f"{what:16s} {'identical' if not diff else 'DIFFERENT: ' + diff}")
    return 0 if results and all(not d for _, d in results) else 1


if __name__ == "__main__":
    sys.exit(main())
