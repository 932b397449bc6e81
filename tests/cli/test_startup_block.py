"""The start-up block: a run says what it decided (engine, threads and OpenMP's wait, the policy loss and
the loss terms in force, the python tool's sandbox) once, as one block, and `-q` leaves it out. The
lines docs/guide.md quotes are read from the guide and looked for in a real run's output.

Run: python -m pytest tests/cli/test_startup_block.py -q
"""

from __future__ import annotations

import io
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from mathrl.track.console import end_startup, install_startup_log

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide.md"
TINY = ["base.steps=200", "base.max_digits=1", "data.arith.max_digits=1", "base.hidden_size=32", "base.intermediate_size=64",
        "base.num_layers=2", "base.num_heads=2", "base.num_kv_heads=1", "rollout.prompts_per_step=2", "rollout.n=2",
        "data.eval_size=2", "eval.n=1", "reward.num_workers=0", "train.steps=1"]


def documented_lines() -> list[str]:
    """The lines of the guide's fenced block after its `startup-block` marker."""
    text = GUIDE.read_text()
    block = text[text.index("<!-- startup-block"):].split("```")[1]
    return [line.strip() for line in block.splitlines() if line.strip()]


def pattern(line: str) -> re.Pattern:
    """`line` with each number free: the thread count and the loss's values are the machine's and the recipe's."""
    return re.compile(re.sub(r"\d+(?:\\\.\d+)?", r"\\d+(?:\\.\\d+)?", re.escape(line)))


def test_the_guide_quotes_a_block():
    lines = documented_lines()
    assert [line.split(":")[0] for line in lines] == ["engine", "threads", "policy loss", "loss terms"]
    assert pattern("threads: 1 (x)").fullmatch("threads: 16 (x)") and not pattern("threads: 1").fullmatch("threads: x")


@pytest.mark.slow
@pytest.mark.parametrize("quiet", [False, True])
def test_a_real_run_prints_each_documented_line_once_and_q_leaves_them_out(tmp_path, quiet):
    # Bug story: docs/tools.md promised `python tool sandbox: bwrap; memory per call bounded by ...`, but it was a
    # log.info and the command line set up no logging: no run ever printed it, nor any other decision.
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "MATHRL_DEBUG")}
    env.update(MATHRL_CACHE=str(tmp_path / "cache"), OMP_NUM_THREADS="1")
    argv = [sys.executable, "-m", "mathrl.cli", "train", *TINY, "--run-dir", str(tmp_path / "run"), *(["-q"] if quiet else [])]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout.splitlines()
    for line in documented_lines():
        found = [o for o in out if pattern(line).fullmatch(o.strip())]
        assert len(found) == (0 if quiet else 1), (line, found)
    if not quiet:  # one block: the four lines one after the other
        starts = [i for i, o in enumerate(out) if o.startswith("engine: ")]
        assert [o.split(":")[0] for o in out[starts[0]:starts[0] + 4]] == ["engine", "threads", "policy loss", "loss terms"]


def test_the_python_tools_sandbox_line_joins_the_block_once():
    from mathrl.tools.sandbox import tool as sandbox

    if sandbox.sandbox_problem("bwrap", python=os.path.realpath(sys.executable)) is not None:
        pytest.skip("bwrap does not work here")
    out = io.StringIO()
    handler = install_startup_log(Console(file=out, width=2000), quiet=False)  # the sandbox line is long: no wrap
    try:
        sandbox._auto_mode.cache_clear()  # logged once per process: as a run's first tool pool does
        sandbox.sandbox_mode()
        sandbox._auto_mode.cache_clear()
        sandbox.sandbox_mode()  # a second pool (an evaluation's): the line is not repeated
        logging.getLogger("mathrl.train.startup").info("engine: torch (lean decoding)")
        assert out.getvalue() == ""  # held until the block is printed
        end_startup()
    finally:
        logging.getLogger("mathrl").removeHandler(handler)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and lines[1] == "engine: torch (lean decoding)"
    # the bound, then what it covers (tools/sandbox/memory.py:memory_covers)
    assert re.fullmatch(r"python tool sandbox: bwrap; memory per call bounded by (cgroup v1|cgroup v2|watchdog): .+", lines[0])
    assert "python tool sandbox: bwrap; memory per call bounded by" in (GUIDE.parent / "tools.md").read_text().replace("\n", " ")


DEFAULT_BLOCK = ["engine: torch (lean decoding)", "threads: {threads} (torch intra-op); OpenMP wait: GOMP_SPINCOUNT=10000",
                 "policy loss: ppo_clip (eps_low=0.2, eps_high=0.28); aggregation token_mean",
                 "loss terms: none (the policy gradient alone)"]


@pytest.mark.parametrize("quiet, twice, expected, why", [
    (False, False, [*DEFAULT_BLOCK, "warning: a warning"],
     "the four decisions of the default recipe as one block, then the warning as it comes"),
    (False, True, [*DEFAULT_BLOCK, "warning: a warning"],
     "logged a second time (a second trainer in the process): each line still once"),
    (True, False, ["warning: a warning"], "-q: the warnings only"),
])
def test_the_decisions_are_one_block_each_line_once_and_q_keeps_warnings_only(monkeypatch, quiet, twice, expected, why):
    # The same, without a run: train/startup.py's log_decisions on the default recipe's config
    from types import SimpleNamespace

    import torch

    from mathrl.config import load_config
    from mathrl.train.startup import log_decisions

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setenv("GOMP_SPINCOUNT", "10000")
    trainer = SimpleNamespace(cfg=load_config(None), engine=SimpleNamespace(lean=object()), controllers={},
                              ranks=SimpleNamespace(main=True))
    out = io.StringIO()
    handler = install_startup_log(Console(file=out, width=2000), quiet=quiet)
    try:
        log_decisions(trainer)
        if twice:
            log_decisions(trainer)
        logging.getLogger("mathrl.train").warning("a warning")
    finally:
        logging.getLogger("mathrl").removeHandler(handler)
    assert out.getvalue().splitlines() == [line.format(threads=torch.get_num_threads()) for line in expected], why
