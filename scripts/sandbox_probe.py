"""Run the python tool's hostile-code classes against the sandbox installed on this machine and print,
for each class and mode, whether it held.

The classes are the sandbox tests' own (tests/tools/test_tools_sandbox_classes.py,
tests/tools/test_tools_sandbox_kernel.py and the hostile cases of tests/tools/test_tools_sandbox.py):
each runs hostile code in the sandbox, started for the call and ahead of it, and checks from outside
it (the host's files, sockets, processes, IPC objects, the next call's output). They run against the
mathrl that Python imports here (the installed one, or PYTHONPATH's), on this kernel, with this
bubblewrap: on a new host (a cloud VM, a container) this shows what holds there before a run trains.

    python scripts/sandbox_probe.py                 # every mode that works here
    python scripts/sandbox_probe.py --mode bwrap    # the one `auto` picks

A class is "held" when every check of it passed, "NOT HELD" when one failed (the failing check is
printed), "skipped" with the reason when it could not run here (a mode that does not work, no vsock
transport, a class a mode does not claim). The exit status is 1 when a class is not held, 2 when none
ran, else 0.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FILES = ["tests/tools/test_tools_sandbox_classes.py", "tests/tools/test_tools_sandbox_kernel.py",
         "tests/tools/test_tools_sandbox.py::test_hostile"]


class Outcomes:
    """A pytest plugin: each test's class (its function, and the hostile case) and mode, and its outcome."""

    def __init__(self, mode: str | None):
        self.mode = mode
        self.where: dict[str, tuple[str, str]] = {}
        self.results: dict[tuple[str, str], list[tuple[str, str]]] = defaultdict(list)

    def pytest_collection_modifyitems(self, config, items):
        keep = []
        for item in items:
            params = getattr(getattr(item, "callspec", None), "params", {})
            mode = params.get("mode", "bwrap")
            if self.mode is not None and mode != self.mode:
                continue
            name = item.originalname.removeprefix("test_").replace("_", " ")
            case = params.get("case")
            self.where[item.nodeid] = (f"{name}: {getattr(case, 'name', case)}" if case is not None else name, mode)
            keep.append(item)
        items[:] = keep

    def pytest_runtest_logreport(self, report):
        if report.nodeid not in self.where or (report.when != "call" and report.outcome == "passed"):
            return
        why = ""
        if report.skipped:
            why = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        elif report.failed:  # the failing check: pytest's "assert ..." line, not the end of its diff
            crash = getattr(report.longrepr, "reprcrash", None)
            lines = (crash.message if crash is not None else report.longreprtext).strip().splitlines()
            why = next((line.strip() for line in lines if line.lstrip().startswith("assert ")), lines[0] if lines else "failed")
        self.results[self.where[report.nodeid]].append((report.outcome, why))


def verdict(outcomes: list[tuple[str, str]]) -> str:
    failed = [why for outcome, why in outcomes if outcome == "failed"]
    if failed:
        return f"NOT HELD ({failed[0][:150]})"
    if any(outcome == "passed" for outcome, _ in outcomes):
        return "held"
    return f"skipped ({outcomes[0][1].removeprefix('Skipped: ')[:150]})"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=["bwrap", "unshare_unsafe", "rlimit_unsafe"], help="only this mode")
    p.add_argument("-v", "--verbose", action="store_true", help="pytest's own report too")
    args = p.parse_args()
    import pytest

    import mathrl

    os.chdir(REPO)
    plugin = Outcomes(args.mode)
    print(f"mathrl: {Path(mathrl.__file__).parent}; python: {sys.executable}; uid {os.geteuid()}; "
          f"kernel {os.uname().release}", flush=True)
    code = pytest.main([*FILES, "-p", "no:cacheprovider", "-q" if args.verbose else "-qq", "--no-header",
                        *([] if args.verbose else ["--tb=no", "--no-summary"])], plugins=[plugin])
    if not plugin.results:
        print(f"no class ran (pytest's exit status {code}); run with -v to see why")
        return 2
    not_held = 0
    for mode in ("bwrap", "unshare_unsafe", "rlimit_unsafe"):
        rows = {name: verdict(outcomes) for (name, m), outcomes in plugin.results.items() if m == mode}
        if not rows:
            continue
        print(f"\n{mode}:")
        for name, text in rows.items():
            print(f"  {name:<72} {text}")
            not_held += text.startswith("NOT HELD")
    print(f"\n{not_held} class(es) not held" if not_held else "\nevery class that ran held")
    return 1 if not_held else 0


if __name__ == "__main__":
    sys.exit(main())
