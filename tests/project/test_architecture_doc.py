"""docs/architecture.md's file list names every module of src/mathrl: a new module without a line
there fails here, so the map stays true to the code. Package `__init__.py` files that only mark a
package or re-export (no function or class of their own) need no line.

Run: python -m pytest tests/project/test_architecture_doc.py -q
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
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


def listed_repo_entries() -> list[str]:
    """The first word of every line of the file list: a path from the repository root (src/mathrl's
    modules are relative to it), a folder ending in /, or a glob such as recipes/findings/*.yaml."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text.split("## Files", 1)[1].split("```", 2)[1]
    entries = []
    for line in block.splitlines():
        if line.strip() and not line.startswith(" "):  # "a.md, b.md   what they are": the paths listed first
            for word in line.split():
                entries.append(word.rstrip(","))
                if not word.endswith(","):
                    break
    return entries


def test_every_benchmark_script_recipe_and_doc_has_a_line():
    # the map covers the repository's other folders too: a new benchmark, script, recipe or page
    # without a line fails here
    import fnmatch

    entries = listed_repo_entries()

    def listed(path: str) -> bool:
        return any(path == e or (e.endswith("/") and path.startswith(e)) or fnmatch.fnmatch(path, e) for e in entries)

    files = [*ROOT.glob("benchmarks/*.py"), *ROOT.glob("scripts/*"), *ROOT.glob("recipes/**/*.yaml"),
             *ROOT.glob("docs/*.md")]
    paths = sorted(str(p.relative_to(ROOT)) + ("/" if p.is_dir() else "") for p in files
                   if p.name != "__pycache__" and not p.name.startswith("."))
    assert len(paths) > 40  # the walk found the folders
    assert [p for p in paths if not listed(p)] == []


def test_the_tests_of_a_folder_are_in_one_place():
    # tests/<folder>/ holds the tests of src/mathrl/<folder>/; tests/base/ those of the top-level modules
    # (cache.py, seeds.py, workers.py, ...); tests/project/ those of the docs, scripts, recipes and layers.
    # Shared helpers (conftest.py, *_helpers.py, *_plugins.py) stay at the top of tests/.
    tests = ROOT / "tests"
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    test_dirs = {p.name for p in tests.iterdir() if p.is_dir() and any(p.glob("test_*.py"))}
    assert sorted(tests.glob("test_*.py")) == []  # no test file outside a folder
    assert test_dirs == folders | {"base", "project"}
    names = [p.name for p in tests.glob("*/test_*.py")]
    assert len(names) == len(set(names)) > 90  # one basename each: pytest imports them by basename
