"""train/startup.py: the start-up block's tools and teacher lines, from the config alone."""

from __future__ import annotations

from mathrl.config import load_config
from mathrl.train.startup import teacher_line, tools_line


def test_no_teacher_no_line() -> None:
    assert teacher_line(load_config(None)) == []


def test_the_teacher_and_the_mode_in_force() -> None:
    cfg = load_config(None, ["algo.distill.mode=reverse_kl", "teacher.self=true"])
    assert teacher_line(cfg) == ["teacher: the starting model, frozen, the answer in its prompt only "
                                 "('{answer}:{question}'); distillation reverse_kl (student logprob sampler), "
                                 "task reward weight 0"]
    cfg = load_config(None, ["algo.distill.mode=jsd", "algo.distill.beta=0.5", "algo.distill.topk=8",
                             "algo.distill.reward_weight=1", "teacher.self=true", "teacher.self_update=true"])
    (line,) = teacher_line(cfg)
    assert line.startswith("teacher: the current policy, without gradient")
    assert line.endswith("distillation jsd (beta 0.5, top-8), task reward weight 1")


def test_a_teacher_server_is_named_by_its_address() -> None:
    cfg = load_config(None, ["algo.distill.mode=forward_kl_topk", "algo.distill.topk=16",
                             "teacher.url=http://10.0.0.2:8100"], check_paths=False)
    assert teacher_line(cfg) == ["teacher: the server at http://10.0.0.2:8100 (teacher.url); distillation "
                                 "forward_kl_topk (top-16), task reward weight 0"]


def test_no_tools_no_line() -> None:
    assert tools_line(load_config(None)) == []


def test_the_tools_recipe_names_its_tool_its_function_and_its_limits() -> None:
    # recipes/arith_tools.yaml: the tool the model calls `python` answers with the calculator; D = 0
    cfg = load_config("recipes/arith_tools.yaml")
    assert tools_line(cfg) == ["tools: python (calculator); format python_blocks; at most 2 calls in 3 turns; "
                               "observations of at most 32 tokens, fed 0 decode steps after the call"]


def test_a_tool_named_as_its_function_is_named_once_and_vllm_has_no_decode_delay() -> None:
    cfg = load_config(None, ["rollout.tools=[{name: python, fn: python}, {name: calc, fn: calculator}]",
                             "rollout.engine=vllm", "rollout.max_tool_calls=4"], check_paths=False)
    assert tools_line(cfg) == ["tools: python, calc (calculator); format python_blocks; at most 4 calls in 4 turns; "
                               "observations of at most 32 tokens"]
