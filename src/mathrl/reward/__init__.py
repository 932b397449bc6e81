"""Rewards: extract the final boxed answer and check it against the reference, never raising.

`extract.py` finds the boxes (linear-time brace scan) and applies the box policy (`reward.boxed`);
`normalize.py` holds the small rewriting rules (units, prose, names, lists, inequalities, ...) and
`numeric.py` the exact values of numbers (thousands and decimal-comma conventions, fractions);
`equivalence.py` compares by the reference's form (tuples in order, solution sets as multisets) with
exact decimals, else math-verify, whose LaTeX parser `latex_parse.py` makes two-stage (the same
trees, faster); `verify.py` runs it in-process (`verify_one`) or in timed worker processes (`Verifier`).
`functions.py` holds the reward components of `reward.functions` (math, format, choice, the user's
`module:function`, a `url`: `remote.py`) and the `Rewarder` that sums them.
"""

from mathrl.reward.extract import extract_boxed, extract_boxes, final_answers
from mathrl.reward.functions import Rewarder, Scores, build_rewarder, choice_reward, format_reward, math_reward
from mathrl.reward.verify import RewardResult, Verifier, verify_one

__all__ = ["RewardResult", "Rewarder", "Scores", "Verifier", "build_rewarder", "choice_reward", "extract_boxed",
           "extract_boxes", "final_answers", "format_reward", "math_reward", "verify_one"]
