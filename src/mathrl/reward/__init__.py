"""Rewards: extract the last boxed answer and check it against the reference, never raising.

`extract.py` finds the answer (linear-time brace scan); `verify.py` compares it (exact decimals,
else math-verify) in-process (`verify_one`) or in timed worker processes (`Verifier`).
"""

from mathrl.reward.extract import extract_boxed
from mathrl.reward.verify import RewardResult, Verifier, verify_one

__all__ = ["RewardResult", "Verifier", "extract_boxed", "verify_one"]
