"""docs/architecture.md's file list names every module of src/mathrl: a new module without a line
there fails here, so the map stays true to the code. Package `__init__.py` files that only mark a
package or re-export (no function or class of their own) need no line.

Run: python -m pytest tests/test_architecture_doc.py -q
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "mathrl"


def defines_something(path: Path) -> bool:
    tree = ast.parse(path.read_text())
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for n in tree.body)


def listed_paths() -> set[str]:
    """The paths in the file list (the code block under '## Files'), relative to src/mathrl/."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text.split("## Files", 1)[1].split("```", 2)[1]
    paths = set()
    for line in block.splitlines():
        m = re.match(r"\s{2}(\S+\.py)\s", line + " ")
        if m:
            paths.update(p.strip() for p in m.group(1).split(","))
    return paths


def test_every_module_has_a_line_in_the_file_list():
    listed = listed_paths()
    modules = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                     if p.name not in ("__init__.py", "__main__.py") or defines_something(p))
    assert len(modules) > 50  # the walk found the package
    assert [m for m in modules if m not in listed] == []


def test_the_file_list_names_no_module_that_is_gone():
    assert sorted(p for p in listed_paths() if not (PACKAGE / p).exists()) == []
