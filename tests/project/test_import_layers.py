"""The package's rooms import one way only (docs/architecture.md): every `import mathrl.X` in
src/mathrl, read from the source with `ast` (function-level imports included), must point to the
module's own room or a room in a lower layer. Inside a room, modules import each other without
circles: the module graph, every import statement an edge (deferred ones inside functions and
`if TYPE_CHECKING:` ones included, since a circle hides behind them), has no cycle."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "mathrl"

# Lowest first. A room may import its own modules and any room of a lower layer; within the
# middle layer the rooms are peers, except for the pairs in PEER_BANS.
LAYERS = [
    {"cache", "workers", "machine"},
    {"seeds"},
    {"shards"},
    {"registry"},
    {"config", "run_dir"},
    {"tasks", "reward", "rollout", "algo", "model", "track", "tools"},
    {"train", "evaluation", "plan"},
    {"analysis"},
    {"cli"},
]
PEER_BANS = {("algo", "model"), ("algo", "rollout"), ("algo", "tasks"), ("reward", "model"), ("reward", "rollout"),
             ("model", "rollout"), ("evaluation", "train"), ("plan", "train"), ("plan", "evaluation")}
# engines use models, a model never needs an engine; an evaluation sweep reads checkpoints and never
# needs the trainer; the memory plan is arithmetic over the config, read by train/ and the CLI
# Known exceptions (file, room), each with its reason; none today.
KNOWN: set[tuple[str, str]] = set()
ENTRY_POINTS = {"__main__.py"}  # `python -m mathrl.train` starts the command line


def layer_of(room: str) -> int:
    return next(i for i, rooms in enumerate(LAYERS) if room in rooms)


def room_of(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0].removesuffix(".py")


def imported_rooms(path: Path) -> list[tuple[int, str]]:
    """(line, room) of every mathrl import in the file."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        out += [(node.lineno, n.split(".")[1]) for n in names if n.startswith("mathrl.")]
    return out


def violation(src: str, dst: str) -> bool:
    if src == dst:
        return False
    if layer_of(dst) > layer_of(src):
        return True
    return layer_of(dst) == layer_of(src) and ((src, dst) in PEER_BANS or len(LAYERS[layer_of(src)]) == 1 or src in ("config", "run_dir"))


def test_every_room_has_a_layer():
    rooms = {room_of(p) for p in PACKAGE.rglob("*.py")} - {"__init__"}
    assert sorted(r for r in rooms if not any(r in layer for layer in LAYERS)) == []


def test_no_module_imports_a_higher_layer():
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        src = room_of(path)
        if src == "__init__" or path.name in ENTRY_POINTS:
            continue
        rel = str(path.relative_to(PACKAGE))
        for line, dst in imported_rooms(path):
            if violation(src, dst) and (rel, dst) not in KNOWN:
                bad.append(f"{rel}:{line} imports mathrl.{dst}")
    assert bad == [], "\n".join(bad)


def test_the_check_sees_an_upward_import(tmp_path):
    # the walk reads function-level imports too: a lazily imported higher room still counts
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from mathrl.train.loop import train\n")
    assert imported_rooms(module) == [(2, "train")]
    assert violation("algo", "train") and violation("config", "tasks") and violation("model", "evaluation")
    assert not violation("train", "algo") and not violation("tasks", "config")


def test_no_function_is_over_80_lines():
    """The package is read top to bottom: a step, a build, a check, an update each fit on a screen. A
    function that outgrows that is split into named pieces, not let grow."""
    import ast

    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 80:
                long.append(f"{path.relative_to(PACKAGE)}:{node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert not long, long


def test_no_module_docstring_is_over_15_lines():
    """A module opens with what it does and what it may touch, in at most 15 lines (STYLE.md,
    "Docstrings"); history, measurements and reference material live in docs/. Lines are those of the
    docstring as Python reads it (`ast.get_docstring`: indentation and the blank edges removed)."""
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text()))
        if doc and (n := len(doc.splitlines())) > 15:
            long.append(f"{path.relative_to(PACKAGE)} ({n} lines)")
    assert not long, long


def test_no_file_is_over_500_lines():
    """A file holds one responsibility; one that outgrows 500 lines is split by what it holds, into a
    folder where its pieces form a family."""
    long = [f"{p.relative_to(PACKAGE)} ({n} lines)" for p in sorted(PACKAGE.rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > 500]
    assert not long, long


def test_modules_import_their_siblings_by_full_path():
    """`from mathrl.tools.sandbox import command` inside tools/sandbox/ goes through the package's __init__, which
    imports the module back: a circle at the file level. Siblings are named by their full path."""
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if path.name == "__init__.py" or path.name in ENTRY_POINTS or len(rel.parts) == 1:
            continue
        own = ".".join(("mathrl", *rel.parts[:-1]))
        bad += [f"{rel}:{node.lineno} imports from {own}" for node in ast.walk(ast.parse(path.read_text()))
                if isinstance(node, ast.ImportFrom) and (node.level > 0 or node.module == own)]
    assert not bad, bad


# ---- circles between modules --------------------------------------------------------------------------
# Each entry: the modules of one circle, with why it stays. A new circle is broken (a name moved to the
# lower module, or to a leaf module both import), not added here.
KNOWN_CYCLES: dict[frozenset[str], str] = {}


def module_name(path: Path, root: Path) -> str:
    """mathrl.train.step for <root>/mathrl/train/step.py; a package's __init__.py is the package."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_graph(root: Path, package: str = "mathrl") -> dict[str, dict[str, int]]:
    """{module: {imported module: line}} over the package under `root`: every import statement, wherever
    it stands. `from a.b import c` is an edge to a.b (the package face, when a.b is a package) and to
    a.b.c when that is a module; a name that is not one of the package's modules goes to the longest
    module prefix it has."""
    files = {module_name(p, root): p for p in sorted((root / package).rglob("*.py"))}

    def resolve(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, path in files.items():
        edges: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the module's package, one level up per extra dot
                    here = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                    base = ".".join(here[: len(here) - node.level + 1] + ([base] if base else []))
                # `from a.b import c` runs a/b/__init__.py: an edge to the package face a.b as well as
                # to the module a.b.c, so a circle through a package's __init__ is seen
                targets = [base] + [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in files]
            else:
                continue
            for target in targets:
                dst = resolve(target) if target.split(".")[0] == package else None
                if dst is not None and dst != module:
                    edges.setdefault(dst, node.lineno)
        graph[module] = edges
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[frozenset[str]]:
    """The circles of `graph`: its strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph)))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return found


def describe(component: frozenset[str], graph: dict[str, dict[str, int]]) -> str:
    return "; ".join(f"{a}:{graph[a][b]} imports {b}" for a in sorted(component) for b in sorted(graph[a]) if b in component)


def test_no_module_imports_itself_in_a_circle():
    graph = module_graph(PACKAGE.parent)
    found = cycles(graph)
    new = [describe(c, graph) for c in found if c not in KNOWN_CYCLES]
    assert new == [], "import circles (move the shared name to the lower module or to a leaf module):\n" + "\n".join(new)
    assert sorted(map(sorted, set(KNOWN_CYCLES) - set(found))) == [], "KNOWN_CYCLES lists circles that are gone"


def test_the_check_sees_a_circle_behind_deferred_and_type_checking_imports(tmp_path):
    # the shape of the circle this check was written for: a trainer that imports a name of the generator
    # inside a method, and a generator that imports a function of the trainer inside a function
    pkg = tmp_path / "mathrl" / "train"
    pkg.mkdir(parents=True)
    (tmp_path / "mathrl" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "trainer.py").write_text("class Trainer:\n    def f(self):\n        from mathrl.train.generator import FILE\n")
    (pkg / "generator.py").write_text("FILE = 'x'\ndef g():\n    from mathrl.train.trainer import Trainer\n")
    (pkg / "step.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import loop\n")
    (pkg / "loop.py").write_text("from mathrl.train import step\n")
    graph = module_graph(tmp_path)
    assert graph["mathrl.train.trainer"] == {"mathrl.train.generator": 3}
    # relative, and under TYPE_CHECKING; `from . import loop` also runs the package's __init__
    assert graph["mathrl.train.step"] == {"mathrl.train": 3, "mathrl.train.loop": 3}
    assert sorted(map(sorted, cycles(graph))) == [["mathrl.train.generator", "mathrl.train.trainer"],
                                                  ["mathrl.train.loop", "mathrl.train.step"]]
    # one way only: no circle
    (pkg / "trainer.py").write_text("class Trainer:\n    pass\n")
    (pkg / "loop.py").write_text("")
    assert cycles(module_graph(tmp_path)) == []
    # through the package face: __init__ imports a module that takes a sibling from the package
    (pkg / "__init__.py").write_text("from mathrl.train.step import X\n")
    (pkg / "step.py").write_text("from mathrl.train import loop\nX = 1\n")
    assert sorted(map(sorted, cycles(module_graph(tmp_path)))) == [["mathrl.train", "mathrl.train.step"]]
    (pkg / "step.py").write_text("import mathrl.train.loop as loop\nX = 1\n")  # by full path: no circle
    assert cycles(module_graph(tmp_path)) == []


# ---- two-way pairs between folders --------------------------------------------------------------------


def room_graph(root: Path, package: str = "mathrl") -> dict[str, dict[str, str]]:
    """{room: {imported room: "module:line" of the first import}} over the package under `root`: the
    module graph with each module replaced by its room (mathrl.train.step -> train). Entry points
    (`python -m mathrl.train` starts the command line) are not a room's own imports."""
    graph: dict[str, dict[str, str]] = {}
    for module, edges in module_graph(root, package).items():
        if module.rpartition(".")[2] + ".py" in ENTRY_POINTS:
            continue
        src = module.split(".")[1] if "." in module else module
        graph.setdefault(src, {})
        for target, line in edges.items():
            dst = target.split(".")[1] if "." in target else target
            if dst != src:
                graph[src].setdefault(dst, f"{module}:{line}")
    return graph


def test_no_two_folders_import_each_other():
    # a circle between rooms (evaluation -> train -> evaluation; model -> rollout -> model) is a layer
    # that runs two ways, even when no module circle closes
    graph = room_graph(PACKAGE.parent)
    found = cycles({room: dict.fromkeys(edges, 0) for room, edges in graph.items()})
    described = ["; ".join(f"{a} imports {b} ({graph[a][b]})" for a in sorted(c) for b in sorted(graph[a]) if b in c)
                 for c in found]
    assert described == [], "folders that import each other:\n" + "\n".join(described)


def test_the_check_sees_a_two_way_pair_of_folders(tmp_path):
    # no module circle here: a.x -> b.y and b.z -> a.w, four modules, one circle between two folders
    for path, text in {"mathrl/__init__.py": "", "mathrl/a/__init__.py": "", "mathrl/b/__init__.py": "",
                       "mathrl/a/x.py": "from mathrl.b.y import f\n", "mathrl/a/w.py": "def g(): pass\n",
                       "mathrl/b/y.py": "def f(): pass\n", "mathrl/b/z.py": "def h():\n    from mathrl.a.w import g\n"}.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    assert cycles(module_graph(tmp_path)) == []
    graph = room_graph(tmp_path)
    assert graph["a"] == {"b": "mathrl.a.x:1"} and graph["b"] == {"a": "mathrl.b.z:2"}
    assert cycles({room: dict.fromkeys(edges, 0) for room, edges in graph.items()}) == [frozenset({"a", "b"})]
