"""Rewards: extract the final boxed answer and check it against the reference, never raising.

`extract.py` finds the boxes (linear-time brace scan) and applies the box policy (`reward.boxed`);
`normalize.py` holds the small rewriting rules (units, prose, names, lists, inequalities, ...) and
`numeric.py` the exact values of numbers (thousands and decimal-comma conventions, fractions);
`equivalence.py` compares by the reference's form (tuples in order, solution sets as multisets) with
exact decimals, else math-verify, whose LaTeX parser `latex_parse.py` makes two-stage (the same
trees, faster); `verify.py` runs it in-process (`verify_one`) or in timed worker processes (`Verifier`).
"""

from mathrl.reward.extract import extract_boxed, extract_boxes, final_answers
from mathrl.reward.verify import RewardResult, Verifier, verify_one

__all__ = ["RewardResult", "Verifier", "extract_boxed", "extract_boxes", "final_answers", "verify_one"]
