"""The built-in tools (`python`, `calculator`) by the name a `ToolSpec.fn` gives them, registered in
`registry.TOOLS` so that `rollout.tools[].fn` names them."""

from __future__ import annotations

from mathrl.registry import TOOLS
from mathrl.tools.base import Builtin
from mathrl.tools.calculator import FUNCTIONS, calculate, calculator
from mathrl.tools.sandbox.tool import check_python_kwargs, python, run_python, warm_sandboxes

BUILTIN_TOOLS: dict[str, Builtin] = {
    "python": Builtin(
        fn=python, run=run_python, parameter="code",
        parameter_description="Python code (standard library only); the value of a final expression is shown.",
        description="Run Python code in a fresh sandbox and read its output (stdout, stderr, the value of "
                    "the last expression, or the last line of an error).",
        check_kwargs=check_python_kwargs, prestart=warm_sandboxes),
    "calculator": Builtin(
        fn=calculator, run=calculate, parameter="expression",
        parameter_description="One arithmetic expression: numbers, + - * / // % **, parentheses and "
                              + ", ".join(FUNCTIONS) + ".",
        description="Evaluate one arithmetic expression exactly (integers of any size, exact fractions).",
        check_kwargs=lambda kwargs: [f"the calculator takes no options; got {', '.join(map(str, kwargs))}"] if kwargs else []),
}
"""The built-in tools by the name a `ToolSpec.fn` gives them."""

for _name, _builtin in BUILTIN_TOOLS.items():
    TOOLS.register(_name, _builtin, replace=True)
