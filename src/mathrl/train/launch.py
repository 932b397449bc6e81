"""`mathrl train --nproc N`: start N ranks of the same run on this machine with torchrun.

    mathrl train --nproc 2 train.steps=20 --run-dir runs/dp2
    # is: torchrun --standalone --nproc_per_node 2 -m mathrl.train train.steps=20 --run-dir runs/dp2
"""

from __future__ import annotations

import subprocess
import sys


def torchrun_command(nproc: int, args: list[str]) -> list[str]:
    """The torchrun command line of `nproc` local ranks running `python -m mathrl.train ARGS`."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
            "-m", "mathrl.train", *args]


def launch(nproc: int, args: list[str]) -> int:
    """Run the job and return its exit status (torchrun stops every rank when one fails)."""
    return subprocess.call(torchrun_command(nproc, args))
