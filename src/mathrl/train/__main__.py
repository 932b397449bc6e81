"""`python -m mathrl.train [RECIPE] [key=value ...] [--run-dir DIR] [--no-resume]`: `mathrl train` as a
module, so that torchrun can start one rank per process:

    torchrun --nproc_per_node 2 -m mathrl.train train.steps=20 --run-dir runs/dp2
    torchrun --nnodes 2 --nproc_per_node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 --rdzv-id run1 \\
        -m mathrl.train recipes/real/dapo_qwen2.5_math_7b.yaml --run-dir /shared/runs/dapo7b
"""

import sys

from mathrl.cli import main

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
