"""OpenMP's wait: every process mathrl starts loads libgomp with GOMP_SPINCOUNT=10000 (waiting threads spin
10000 turns, not libgomp's 300000, before they sleep, so they do not hold cores another run needs),
unless the user set a wait policy or a spin count.

libgomp prints what it read when OMP_DISPLAY_ENV=verbose: its spin count is 0 under PASSIVE, 300000
under its default (the variable unset) and 3e10 under ACTIVE, so each test reads the spin count that
the process's libgomp actually uses, not the environment variable.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

SPIN = re.compile(r"GOMP_SPINCOUNT = '(\d+)'")


def spin_counts(code: str, **env: str) -> list[int]:
    """The spin counts of every libgomp that the Python `code` (and the processes it starts) loaded."""
    # (LD_PRELOAD: vLLM's CPU worker preloads torch's libgomp for the processes started after it, which then
    # loads before any Python runs; a test process that built a vLLM engine earlier carries it)
    environ = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "LD_PRELOAD")}
    environ.update(OMP_DISPLAY_ENV="verbose", **env)
    done = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return [int(n) for n in SPIN.findall(done.stderr)]


def test_the_test_suite_itself_runs_passive():
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"  # tests/conftest.py, before torch: it shares its machine


@pytest.mark.slow
def test_the_command_line_loads_libgomp_passive():
    # `mathrl`, `python -m mathrl.cli` and torchrun's `-m mathrl.train` all import the package (its
    # __init__) before any of its modules imports torch
    assert spin_counts("import mathrl.cli, torch") == [10000]


@pytest.mark.slow
def test_a_spawned_child_of_a_mathrl_process_is_passive_too():
    # generator, reward and tool workers are spawned: a fresh interpreter that inherits the environment
    code = ("import importlib, multiprocessing as mp\n"
            "import mathrl\n"
            "if __name__ == '__main__':\n"
            "    p = mp.get_context('spawn').Process(target=importlib.import_module, args=('torch',))\n"
            "    p.start(); p.join()\n"
            "    assert p.exitcode == 0\n")
    assert spin_counts(code) == [10000]


@pytest.mark.slow
def test_a_policy_the_user_set_is_kept_and_torch_before_mathrl_gets_libgomps_default():
    assert spin_counts("import mathrl, torch", OMP_WAIT_POLICY="ACTIVE") == [30000000000]
    assert spin_counts("import mathrl, torch", OMP_WAIT_POLICY="PASSIVE") == [0]
    assert spin_counts("import mathrl, torch", GOMP_SPINCOUNT="2000") == [2000]
    assert spin_counts("import torch, mathrl") == [300000]  # too late: libgomp read its environment already
