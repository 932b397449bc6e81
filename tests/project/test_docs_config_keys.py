"""Every config key the documentation names exists: a backticked dotted name in README.md or
docs/*.md whose first part is a config section (`train.init_from`, `rollout.vllm.sleep_level: 1`,
`mathrl train algo.kl.use=loss`) must be a field, or a section, of mathrl.config.Config. A renamed
or removed field otherwise leaves the docs pointing users at a key that the config rejects.

Names of code (`algo.losses.policy_loss`, `train.batching`: a module of src/mathrl, or a name
defined in one) are not keys.

Run: python -m pytest tests/project/test_docs_config_keys.py -q
"""

from __future__ import annotations

import ast
import dataclasses
import re
import typing
from pathlib import Path

from mathrl.config import Config

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "mathrl"
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]


def config_tree(cls) -> dict:
    """{field: subtree for a section, None for a value} of a config dataclass."""
    hints = typing.get_type_hints(cls)
    return {f.name: config_tree(hints[f.name]) if dataclasses.is_dataclass(hints[f.name]) else None
            for f in dataclasses.fields(cls)}


TREE = config_tree(Config)
SECTIONS = sorted(k for k, v in TREE.items() if v is not None)
# a dotted name that starts with a section, alone or as `key=value` / `key: value`
KEY = re.compile(r"^(?:%s)(?:\.[A-Za-z_][A-Za-z0-9_]*)+(?=$|=|:)" % "|".join(SECTIONS))


def is_code(parts: list[str]) -> bool:
    """The name is a module of mathrl (`train.batching`) or a name defined at the top of one
    (`algo.losses.policy_loss`). `algo.kl.use` is not: algo/kl.py defines no `use`."""
    for k in range(len(parts), 0, -1):
        base = PACKAGE.joinpath(*parts[:k])
        module = base.with_suffix(".py") if base.with_suffix(".py").exists() else base / "__init__.py"
        if module.exists():
            return k == len(parts) or parts[k] in top_level_names(module)
    return False


def top_level_names(module: Path) -> set[str]:
    names = set()
    for node in ast.parse(module.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def in_tree(parts: list[str]) -> bool:
    node = TREE
    for p in parts:
        if not isinstance(node, dict) or p not in node:
            return False
        node = node[p]
    return True


def named_keys(text: str) -> list[tuple[int, str]]:
    """(line, key) of every config key in the backticked spans of a markdown text."""
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        for span in re.findall(r"`([^`\n]+)`", line):
            for word in span.split():
                m = KEY.match(word)
                if m and not is_code(m.group(0).split(".")):
                    out.append((lineno, m.group(0)))
    return out


def test_the_scan_finds_keys_and_skips_code():
    text = ("`train.init_from` and `rollout.vllm.sleep_level: 1`, `mathrl train algo.kl.use=loss`;\n"
            "`algo.losses.policy_loss`, `train.batching`, `model.generate()`, `final/model.safetensors`, "
            "`rollout/response_length`, `seed=3`")
    assert named_keys(text) == [(1, "train.init_from"), (1, "rollout.vllm.sleep_level"), (1, "algo.kl.use")]
    assert in_tree(["rollout", "vllm", "sleep_level"]) and in_tree(["algo", "kl"])
    assert not in_tree(["rollout", "async_steps"]) and not in_tree(["train", "init_from", "x"])


def test_every_documented_config_key_exists():
    stale = [f"{path.relative_to(ROOT)}:{line}: {key}"
             for path in DOCS for line, key in named_keys(path.read_text()) if not in_tree(key.split("."))]
    assert stale == [], "config keys the docs name but Config lacks:\n" + "\n".join(stale)
