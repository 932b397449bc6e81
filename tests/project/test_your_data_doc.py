"""docs/your_data.md's commands, run as written (with a smaller base model and fewer steps).

Every line of the page's ```sh blocks that starts with `mathrl ` is run through the command line's
entry point from the repository root, in the order of the page. Each gets the same small-model
overrides (a 2-layer base model pretrained for 200 steps in a temporary MATHRL_CACHE, 2 training
steps, 4 evaluation problems); `--run-dir` and `--out` (given or not) land in a temporary directory. A command the
page marks `# exits N` must exit N, any other 0; a run the page says stops for want of signal gets
the stopping rule's count lowered to 2 steps, so it stops within the steps it is given.

Run: python -m pytest tests/project/test_your_data_doc.py -q
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "your_data.md"

SMALL_BASE = ["base.steps=200", "base.max_digits=1", "base.hidden_size=32", "base.intermediate_size=64",
              "base.num_layers=2", "base.num_heads=2", "base.num_kv_heads=1"]
SMALL_TRAIN = ["train.steps=2", "rollout.prompts_per_step=2", "rollout.n=2", "train.mini_batch_size=4",
               "rollout.max_new_tokens=24", "data.eval_size=4", "eval.n=1", "reward.num_workers=0"]
SMALL_EVAL = ["--n", "2", "--limit", "4", "reward.num_workers=0"]


def page_commands() -> list[tuple[list[str], int]]:
    """(argv without `mathrl`, expected exit status) of every `mathrl` line in the page's sh blocks."""
    blocks = re.findall(r"```sh\n(.*?)```", PAGE.read_text(), re.DOTALL)
    out = []
    for line in (ln for block in blocks for ln in block.splitlines()):
        if not line.startswith("mathrl "):
            continue
        command, _, comment = line.partition("#")
        status = re.match(r"\s*exits (\d+)", comment)
        out.append((shlex.split(command)[1:], int(status[1]) if status else 0))
    return out


def test_the_page_has_its_commands() -> None:
    verbs = [argv[0] for argv, _ in page_commands()]
    assert verbs.count("eval") >= 3 and verbs.count("train") >= 2  # check, then train, then the stopping run
    assert {status for _, status in page_commands()} == {0, 1}


@pytest.mark.slow
def test_the_pages_commands_run_as_it_says(tmp_path, monkeypatch, capsys) -> None:
    from mathrl.cli import main

    monkeypatch.chdir(ROOT)  # the page's paths are relative to the repository root
    monkeypatch.setenv("MATHRL_CACHE", str(tmp_path / "cache"))
    for i, (argv, status) in enumerate(page_commands()):
        argv = [str(tmp_path / f"out{i}") if argv[j - 1] in ("--run-dir", "--out") else a for j, a in enumerate(argv)]
        extra = [*SMALL_BASE, *(SMALL_TRAIN if argv[0] == "train" else SMALL_EVAL)]
        if argv[0] == "eval" and "--out" not in argv:  # not eval_<timestamp>/ in the repository
            extra += ["--out", str(tmp_path / f"out{i}")]
        if argv[0] == "train" and status == 1:  # the page's no-signal run: stop within the 2 steps
            extra += ["data.dynamic_sampling.max_empty_steps=2"]
        code = main([*argv, *extra])
        err = capsys.readouterr().err
        assert code == status, (argv, err[-2000:])
        if argv[0] == "train" and status == 1:
            assert "trained nothing: every one of the" in err and "was wrong (reward 0)" in err, err
    assert not any(p.name.startswith("eval_") for p in ROOT.iterdir())  # every eval wrote where it was told
    assert os.environ["MATHRL_CACHE"] == str(tmp_path / "cache")
