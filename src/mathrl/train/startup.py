"""What a run decided, said once at start-up: the rollout engine, the threads and OpenMP's wait policy,
the policy loss with its hyperparameters and the loss terms with their coefficients in force, the
tools and their limits where the model may call any, and the distillation teacher where one is set. Logged on
the "mathrl.train.startup" logger; the command line prints mathrl's info lines as one block
(`track/console.py:StartupLog`, silenced by `-q`), together with the lines other modules log (the
python tool's sandbox and memory bound).

    engine: torch (lean decoding)
    threads: 2 (torch intra-op); OpenMP wait: GOMP_SPINCOUNT=10000
    policy loss: ppo_clip (eps_low=0.2, eps_high=0.28); aggregation token_mean
    loss terms: none (the policy gradient alone)
"""

from __future__ import annotations

import logging
import os

import torch

from mathrl.registry import LOSS_TERMS, POLICY_LOSSES
from mathrl.track.console import end_startup

log = logging.getLogger(__name__)

# the coefficient each built-in loss term is weighted by: its controller's, or a config value
_TERM_COEFS = {"entropy_loss": "entropy", "kl_loss": "kl"}


def _value(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def engine_line(cfg, engine) -> str:
    inner = getattr(engine, "lean", "absent")
    if cfg.rollout.engine == "torch" and inner != "absent":
        return f"engine: torch ({'lean decoding' if inner is not None else 'the Hugging Face forward'})"
    return f"engine: {cfg.rollout.engine}"


def threads_line() -> str:
    """Torch's intra-op threads and the OpenMP wait policy its threads follow (mathrl/__init__.py)."""
    wait = next((f"{k}={os.environ[k]}" for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT") if os.environ.get(k)),
                "libgomp's default")
    return f"threads: {torch.get_num_threads()} (torch intra-op); OpenMP wait: {wait}"


def loss_lines(cfg, controllers: dict) -> list[str]:
    """The policy loss with the hyperparameters the trainer passes it, and every enabled loss term with
    the coefficient in force at the start (a controller's current value)."""
    entry = POLICY_LOSSES.get(cfg.algo.policy_loss)
    params = ", ".join(f"{k}={_value(v)}" for k, v in entry.params(cfg.algo).items() if v is not None)
    lines = [f"policy loss: {cfg.algo.policy_loss}" + (f" ({params})" if params else "")
             + f"; aggregation {entry.agg or cfg.algo.loss_agg}"]
    terms = []
    for name in LOSS_TERMS.names():
        if not LOSS_TERMS.get(name).enabled(cfg.algo):
            continue
        if name in _TERM_COEFS:
            terms.append(f"{name} coef {_value(float(controllers[_TERM_COEFS[name]].coef))}")
        elif name == "pos_lm_loss":
            terms.append(f"{name} coef {_value(float(cfg.algo.pos_lm.coef))}")
        else:
            terms.append(name)
    lines.append("loss terms: " + (", ".join(terms) if terms else "none (the policy gradient alone)"))
    return lines


def tools_line(cfg) -> list[str]:
    """The tools the model may call (name and function), the call format and the episode's limits ([] without tools)."""
    r = cfg.rollout
    if not r.tools:
        return []
    tools = ", ".join(t.name if t.fn == t.name else f"{t.name} ({t.fn})" for t in r.tools)
    fed = f", fed {r.tool_delay_steps} decode steps after the call" if r.engine == "torch" else ""
    return [f"tools: {tools}; format {r.tool_format}; at most {r.max_tool_calls} calls in {r.max_turns} turns; "
            f"observations of at most {r.observation_max_tokens} tokens{fed}"]


def teacher_line(cfg) -> list[str]:
    """The distillation teacher and mode in force ([] when algo.distill.mode is none)."""
    if not cfg.needs_teacher:
        return []
    t, d = cfg.teacher, cfg.algo.distill
    who = (("the current policy, without gradient" if t.self_update else "the starting model, frozen")
           + f", the answer in its prompt only ({t.context!r})") if t.self else (
        f"the server at {t.url} (teacher.url)" if t.url is not None else t.path)
    if t.engine == "vllm":
        who += ", on its own vLLM engine (prompt_logprobs)"
    how = {"reverse_kl": f"student logprob {d.student}", "forward_kl_topk": f"top-{d.topk}",
           "jsd": f"beta {_value(float(d.beta))}, top-{d.topk}"}[d.mode]
    return [f"teacher: {who}; distillation {d.mode} ({how}), task reward weight {_value(float(d.reward_weight))}"]


def log_decisions(trainer) -> None:
    """Log the run's decisions (the module docstring), then let the command line print the block."""
    cfg = trainer.cfg
    for line in [engine_line(cfg, trainer.engine), threads_line(), *loss_lines(cfg, trainer.controllers),
                 *tools_line(cfg), *teacher_line(cfg)]:
        log.info(line)
    if trainer.ranks.main:
        end_startup()
