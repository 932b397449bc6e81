"""scripts/ablate.py: grid files validate up front, variants run once, the table is written.

Run: python -m pytest tests/project/test_ablate.py -q
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

from ablate import load_grid  # noqa: E402

from mathrl.config import load_config  # noqa: E402

TINY = ["base.steps=20", "base.hidden_size=32", "base.intermediate_size=64", "base.num_layers=2", "base.num_heads=2",
        "base.num_kv_heads=1", "base.max_digits=1", "data.arith.max_digits=1", "data.eval_size=4", "eval.n=2",
        "rollout.prompts_per_step=2", "rollout.n=2", "train.mini_batch_size=4", "reward.num_workers=0"]


def ablate(*args: str, env_cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "MATHRL_CACHE": str(env_cache)}
    return subprocess.run([sys.executable, str(REPO / "scripts" / "ablate.py"), *args], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=600)


GRIDS = sorted([*(REPO / "recipes" / "ablations").glob("*.yaml"), *(REPO / "recipes" / "findings").glob("*.yaml")])


@pytest.mark.parametrize("grid", GRIDS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_shipped_grids_validate(grid: Path) -> None:
    recipe, variants, columns = load_grid(grid)
    assert variants and columns
    assert len({v.name for v in variants}) == len(variants)
    for v in variants:
        load_config(recipe, v.overrides)


def test_seeds_name_the_variants(tmp_path: Path) -> None:
    grid = tmp_path / "g.yaml"
    grid.write_text("common: [train.steps=3]\nseeds: [0, 2]\nruns:\n  a: [rollout.n=4]\n")
    _, variants, _ = load_grid(grid)
    assert [(v.name, v.overrides) for v in variants] == [
        ("a", ["train.steps=3", "rollout.n=4", "seed=0"]),
        ("a_seed2", ["train.steps=3", "rollout.n=4", "seed=2"]),
    ]


def test_a_typo_in_any_variant_stops_before_anything_runs(tmp_path: Path) -> None:
    grid = tmp_path / "g.yaml"
    grid.write_text("runs:\n  good: []\n  bad: [algo.clip.eps_hihg=0.3]\n")
    done = ablate(str(grid), "--out", str(tmp_path / "out"), env_cache=tmp_path / "cache")
    assert done.returncode == 2
    assert "variant 'bad'" in done.stderr and "algo.clip.eps_high" in done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_grid_runs_each_variant_once_and_writes_the_table(tmp_path: Path) -> None:
    grid = tmp_path / "mini.yaml"
    common = ", ".join([*TINY, "train.steps=1", "eval.every=1"])
    grid.write_text(f"common: [{common}]\ncolumns: [actor/entropy, actor/pg_clipfrac]\n"
                    "runs:\n  sym: [algo.clip.eps_high=0.2]\n  higher: []\n")
    out = tmp_path / "out"
    # two at once: both finish, and the table keeps the grid's order whichever ended first
    first = ablate(str(grid), "--out", str(out), "--jobs", "2", env_cache=tmp_path / "cache")
    assert first.returncode == 0, first.stdout + first.stderr
    assert first.stdout.count(": exit 0 after") == 2
    for name in ("sym", "higher"):
        assert (out / name / "summary.json").is_file()
    table = (out / "mini.md").read_text().splitlines()
    assert table[0] == "| run | pass@1 base | pass@1 final | pass@1 curve | actor/entropy | actor/pg_clipfrac |"
    assert [line.split(" | ")[0] for line in table[2:]] == ["| sym", "| higher"]

    again = ablate(str(grid), "--out", str(out), env_cache=tmp_path / "cache")
    assert again.returncode == 0
    assert again.stdout.count("finished earlier, kept") == 2
