"""`python -m mathrl.train [RECIPE] [key=value ...] [--run-dir DIR] [--no-resume]`: `mathrl train` as a
module, so that torchrun can start one rank per process:

    torchrun --nproc_per_node 2 -m mathrl.train train.steps=20 --run-dir runs/dp2
    torchrun --nnodes 2 --nproc_per_node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 --rdzv-id run1 \\
        -m mathrl.train recipes/real/dapo_qwen2.5_math_7b.yaml --run-dir /shared/runs/dapo7b

A torchrun rank ends with `exit_rank` once `train` has torn everything down, without the interpreter's
shutdown (why: train/dist.py); an error the command line does not report itself prints its traceback
and exits 1, as Python would.
"""

import sys
import traceback

from mathrl.cli import main
from mathrl.train.dist import exit_rank, joined_job

if __name__ == "__main__":
    if not joined_job():
        sys.exit(main(["train", *sys.argv[1:]]))
    try:
        code = main(["train", *sys.argv[1:]])
    except SystemExit as e:  # sys.exit's meaning: None is success, a message is failure
        code = 0 if e.code is None else e.code if isinstance(e.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    exit_rank(code)
