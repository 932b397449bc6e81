"""The package's rooms import one way only (docs/architecture.md): every `import mathrl.X` in
src/mathrl, read from the source with `ast` (function-level imports included), must point to the
module's own room or a room in a lower layer."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "mathrl"

# Lowest first. A room may import its own modules and any room of a lower layer; within the
# middle layer the rooms are peers, except for the pairs in PEER_BANS.
LAYERS = [
    {"cache"},
    {"seeds"},
    {"registry"},
    {"config_schema"},
    {"config", "run_dir"},
    {"tasks", "reward", "rollout", "algo", "model", "track", "tools"},
    {"train", "evaluation"},
    {"analysis"},
    {"cli"},
]
PEER_BANS = {("algo", "model"), ("algo", "rollout"), ("algo", "tasks"), ("reward", "model"), ("reward", "rollout")}
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


def test_no_function_in_train_is_over_80_lines():
    """train/ is read top to bottom: a step, a build, an update each fit on a screen. A function that
    outgrows that is split into named pieces, not let grow."""
    import ast

    long = []
    for path in sorted((PACKAGE / "train").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 80:
                long.append(f"{path.name}:{node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert not long, long
