"""reward.functions: the built-in components (format, choice), the user's functions in the verifier's
worker processes (errors and timeouts counted per component, never raised), the weighted total, and
the config-time checks that name the entry.

Run: python -m pytest tests/reward/test_reward_functions.py -q
"""

from __future__ import annotations

import math
import threading
from pathlib import Path

import pytest

from mathrl.config import ConfigError, RewardFunctionConfig, load_config
from mathrl.reward.functions import (
    Rewarder,
    choice_letter,
    choice_reward,
    component_metrics,
    components,
    failure_counts,
    format_reward,
    math_reward,
    math_scores,
)
from mathrl.reward.verify import Verifier

PLUGINS = Path(__file__).resolve().parents[1] / "reward_plugins.py"


def entry(name: str, fn: str, **kw) -> dict:
    return {"name": name, "fn": fn if ":" not in fn or fn.startswith("mathrl") else f"{PLUGINS}:{fn.split(':')[1]}", **kw}


def rewarder(verifier: Verifier, *entries: dict, timeout_s: float = 60.0) -> Rewarder:
    """A Rewarder over the shared workers with the given reward.functions entries."""
    overrides = [f"reward.functions={entries_yaml(entries)}", f"reward.timeout_s={timeout_s}"]
    return Rewarder(components(load_config(None, overrides).reward), verifier)


def entries_yaml(entries) -> str:
    import json

    return json.dumps(list(entries))  # JSON is YAML


@pytest.fixture(scope="module")
def verifier():
    with Verifier(num_workers=2, timeout_s=60.0) as v:  # slow worker start on a busy machine is no timeout
        yield v


def rows(responses: list[str], answers: list[str] | None = None):
    answers = answers or ["4"] * len(responses)
    return dict(prompts=[f"prompt {i}" for i in range(len(responses))], responses=responses,
                fields=[{"answer": a, "id": str(i)} for i, a in enumerate(answers)],
                tokens=[[1] * (i + 1) for i in range(len(responses))])


# --------------------------------------------------------------------------------------------------
# built-in components
# --------------------------------------------------------------------------------------------------
FORMAT = [  # (why, response, pattern, score)
    ("a closed box is the default format", r"so \boxed{4}", None, 1.0),
    ("no box at all", "the answer is 4", None, 0.0),
    ("an unterminated box is no answer", r"\boxed{4", None, 0.0),
    ("an empty box is no answer", r"\boxed{}", None, 0.0),
    ("a pattern replaces the box rule", "<answer>4</answer>", r"<answer>.*</answer>", 1.0),
    ("the pattern is searched, not matched at the start", "think first <answer>4</answer>", r"<answer>", 1.0),
    ("anchors make it a whole-response rule", "x <answer>4</answer> y", r"^<answer>.*</answer>$", 0.0),
    ("DOTALL: the pattern spans lines", "<a>\n4\n</a>", r"^<a>.*</a>$", 1.0),
]


@pytest.mark.parametrize(("why", "response", "pattern", "score"), FORMAT, ids=[c[0] for c in FORMAT])
def test_format_reward(why, response, pattern, score):
    kwargs = {} if pattern is None else {"pattern": pattern}
    assert format_reward([""], [response], [{"answer": "4"}], [[]], **kwargs) == [score]


CHOICE = [  # (why, response, gold, score)
    ("a boxed letter", r"so \boxed{B}", "B", 1.0),
    ("a boxed letter in parentheses, gold in parentheses", r"\boxed{(c)}", "(C)", 1.0),
    ("a boxed \\text{} letter", r"\boxed{\text{D}}", "D", 1.0),
    ("the wrong letter", r"\boxed{A}", "B", 0.0),
    ("'the answer is' without a box", "I think the answer is (E).", "E", 1.0),
    ("'Answer:' without a box", "Answer: b", "B", 1.0),
    ("the last box wins over an earlier one", r"\boxed{A} no wait \boxed{B}", "B", 1.0),
    ("a box beats prose", r"the answer is A, \boxed{C}", "C", 1.0),
    ("a letter outside the options is no choice", r"\boxed{Z}", "A", 0.0),
    ("nothing chosen", "no idea", "A", 0.0),
    ("a word that starts with a letter is not a choice", "the answer is because", "B", 0.0),
]


@pytest.mark.parametrize(("why", "response", "gold", "score"), CHOICE, ids=[c[0] for c in CHOICE])
def test_choice_reward(why, response, gold, score):
    assert choice_reward([""], [response], [{"answer": gold}], [[]]) == [score]


def test_choice_reward_raises_on_a_gold_that_is_no_letter_so_the_sample_is_counted():
    with pytest.raises(ValueError, match="not one of the letters"):
        choice_reward([""], [r"\boxed{A}"], [{"answer": "42"}], [[]])
    assert choice_letter(r"\boxed{F}", "ABCDEF") == "F"  # letters widen the options


def test_math_reward_is_the_checker():
    assert math_reward(["", ""], [r"\boxed{4}", r"\boxed{5}"], [{"answer": "4"}, {"answer": "4"}], [[], []]) == [1.0, 0.0]


# --------------------------------------------------------------------------------------------------
# scoring in the workers
# --------------------------------------------------------------------------------------------------
def test_components_are_weighted_and_logged(verifier):
    r = rewarder(verifier, entry("math", "mathrl.reward:math_reward"), entry("fmt", "format", weight=0.5),
                 entry("len", "x:length", weight=-0.1, kwargs={"per": 2}))
    responses = [r"\boxed{4}", r"\boxed{5}", "4"]
    s = r.score_rows(**rows(responses))
    assert s.values == {"math": [1.0, 0.0, 0.0], "fmt": [1.0, 1.0, 0.0], "len": [4.5, 4.5, 0.5]}
    # hand-computed: 1 + 0.5 - 0.45; 0 + 0.5 - 0.45; 0 + 0 - 0.05
    assert s.total == pytest.approx([1.05, 0.05, -0.05])
    assert s.correct == [True, False, False]  # the math checker's verdict, not total > 0
    assert [x.reason for x in s.results] == ["correct", "wrong", "no_answer"]
    m = component_metrics(s)
    assert m["reward/fmt/mean"] == pytest.approx(2 / 3) and m["reward/len/mean"] == pytest.approx(9.5 / 3)
    assert failure_counts(s) == {f"reward/{n}/{k}": 0.0 for n in ("math", "fmt", "len") for k in ("errors", "timeouts")}


def test_a_raising_function_scores_zero_and_is_counted(verifier):
    r = rewarder(verifier, entry("boom", "x:raises_on_boom"))
    s = r.score_rows(**rows(["fine", "boom!", "fine too"]))
    # batch_size 1 (the default): only the sample that raised scores 0
    assert s.values["boom"] == [1.0, 0.0, 1.0] and s.failures["boom"] == ["", "error", ""]
    assert failure_counts(s)["reward/boom/errors"] == 1.0
    # without a math component a sample is correct when its total is > 0
    assert s.correct == [True, False, True]


def test_a_batch_that_raises_zeroes_the_whole_batch(verifier):
    r = rewarder(verifier, entry("boom", "x:raises_on_boom", batch_size=2))
    s = r.score_rows(**rows(["fine", "boom!", "fine too"]))
    assert s.values["boom"] == [0.0, 0.0, 1.0] and s.failures["boom"] == ["error", "error", ""]


@pytest.mark.slow
def test_a_hanging_function_times_out_off_the_main_thread(verifier):
    # the worker is killed after timeout_s (no SIGALRM), so this works from any thread
    r = rewarder(verifier, entry("slow", "x:hangs_on_hang", timeout_s=3))
    out = {}
    thread = threading.Thread(target=lambda: out.setdefault("s", r.score_rows(**rows(["ok", "hang", "ok"]))))
    thread.start()
    thread.join(120)
    s = out["s"]
    assert s.values["slow"] == [1.0, 0.0, 1.0] and s.failures["slow"] == ["", "timeout", ""]
    assert failure_counts(s)["reward/slow/timeouts"] == 1.0
    assert r.score_rows(**rows(["ok"])).values["slow"] == [1.0]  # the replaced worker serves the next call


def test_dict_values_and_the_row_fields_reach_the_function(verifier):
    r = rewarder(verifier, entry("named", "x:named"), entry("toks", "x:token_count", weight=0.0))
    s = r.score_rows(**rows([r"\boxed{4}", "7"], answers=["4", "8"]))
    assert s.values["named"] == [1.0, 0.0]
    assert s.logs == {"named/prompt_chars": [8.0, 8.0]}  # "prompt 0", "prompt 1"
    assert s.values["toks"] == [1.0, 2.0]  # the token lists, row by row
    assert component_metrics(s)["reward/named/prompt_chars"] == 8.0


@pytest.mark.parametrize(("fn", "failures"), [
    ("x:bad_values", ["error", "error", ""]),  # NaN and a string are no reward; the sample beside them is
    ("x:too_few", ["error", "error", "error"]),  # one value for a batch of one is right, so use batch_size 3
])
def test_values_that_are_no_reward_are_errors(verifier, fn, failures):
    r = rewarder(verifier, entry("bad", fn, batch_size=3))
    s = r.score_rows(**rows(["nan", "str", "fine"]))
    assert s.failures["bad"] == failures and all(math.isfinite(v) for v in s.values["bad"])


def test_the_default_is_the_math_checker_alone(verifier):
    r = Rewarder(components(load_config(None, []).reward), verifier)
    data = rows([r"\boxed{4}", r"\boxed{5}", "none"])
    s = r.score_rows(**data)
    plain = math_scores(verifier.score(data["responses"], ["4"] * 3))
    assert s.total == plain.total == [1.0, 0.0, 0.0] and s.results == plain.results


# --------------------------------------------------------------------------------------------------
# config-time checks: one line naming the entry
# --------------------------------------------------------------------------------------------------
BAD_ENTRIES = [  # (why, entries, text of the error)
    ("a module that does not import", [{"name": "mine", "fn": "no_such_module:f"}],
     "reward.functions[0] (mine): fn='no_such_module:f' module 'no_such_module' does not import"),
    ("a function that does not exist", [{"name": "mine", "fn": f"{PLUGINS}:nope"}], "has no 'nope'"),
    ("the wrong signature", [{"name": "mine", "fn": f"{PLUGINS}:no_kwargs"}],
     "reward.functions[0] (mine): fn=", ),
    ("a kwarg the function does not take", [{"name": "f", "fn": "format", "kwargs": {"patern": "x"}}],
     "has the wrong signature (got an unexpected keyword argument 'patern')"),
    ("an unknown built-in", [{"name": "f", "fn": "formt"}], "is neither a built-in reward (math, format, choice"),
    ("a missing file", [{"name": "f", "fn": "nope/rewards.py:f"}], "no such file 'nope/rewards.py'"),
    ("two components with one name", [{"name": "a", "fn": "format"}, {"name": "a", "fn": "choice"}], "the name 'a' is used twice"),
    ("both fn and url", [{"name": "a", "fn": "format", "url": "http://127.0.0.1:1/x"}], "give exactly one of fn"),
    ("neither fn nor url", [{"name": "a"}], "give exactly one of fn"),
    ("not an http url", [{"name": "a", "url": "ftp://host/x"}], "must look like http://host:port/path"),
    ("a name that cannot be a metric key", [{"name": "a/b", "fn": "format"}], "must be letters, digits"),
    ("an infinite weight", [{"name": "a", "fn": "format", "weight": ".inf"}], "weight=inf must be a finite number"),
    ("math takes the reward.* settings", [{"name": "m", "fn": "math", "kwargs": {"boxed": "last"}}], "the math checker takes no kwargs"),
    ("no component at all", [], "reward.functions is empty"),
    ("an unknown key in an entry", [{"name": "a", "fn": "format", "wieght": 2}], "unknown config key 'reward.functions[0].wieght'"),
]


@pytest.mark.parametrize(("why", "entries", "expect"), BAD_ENTRIES, ids=[c[0] for c in BAD_ENTRIES])
def test_bad_entries_are_config_errors_naming_the_entry(why, entries, expect):
    with pytest.raises(ConfigError) as info:
        load_config(None, [f"reward.functions={entries_yaml(entries)}".replace('".inf"', ".inf")])
    assert expect in str(info.value)
    assert "\n" not in str(info.value)  # one line


def test_entries_read_from_yaml_and_back(tmp_path):
    from mathrl.config import dump_yaml

    cfg = load_config(None, ['reward.functions=[{name: math, fn: math}, {name: fmt, fn: format, weight: 0.2, '
                             'kwargs: {pattern: "^x"}}]'])
    assert cfg.reward.functions[1] == RewardFunctionConfig(name="fmt", fn="format", weight=0.2, kwargs={"pattern": "^x"})
    (tmp_path / "c.yaml").write_text(dump_yaml(cfg))
    assert load_config(tmp_path / "c.yaml") == cfg
