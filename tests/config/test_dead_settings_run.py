"""The `when` declarations checked against the code: tiny trainings in several modes record which config
fields they read (config/reads.py). A field that counts in a mode (no `when`, or its `when` holds) is read
by that mode's run, or is listed below with the reason a tiny run does not reach it; a field whose `when`
does not hold is not read, or is listed with the reason its read has no effect.

Run: python -m pytest tests/config/test_dead_settings_run.py -q -m slow
"""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from test_dead_settings import FIELDS

from mathrl.config import load_config
from mathrl.config.reads import recording_reads

pytestmark = pytest.mark.slow

TINY = ["base.steps=200", "base.max_digits=1", "data.arith.max_digits=1", "base.hidden_size=32",
        "base.intermediate_size=64", "base.num_layers=2", "base.num_heads=2", "base.num_kv_heads=1",
        "train.steps=2", "rollout.prompts_per_step=4", "rollout.n=8", "train.mini_batch_size=16", "data.eval_size=4",
        "eval.n=2", "eval.every=1", "reward.num_workers=0", "train.save_every=1", "train.keep_last=1"]
MODES = {
    "grpo": [],
    # a fixed bonus: a controller's coefficient can fall to 0 in a tiny run, and the bonus's guard then goes unread
    "ppo": ["algo.adv.estimator=gae", "algo.critic.pretrain_steps=1", "algo.kl.use=loss", "algo.entropy.mode=fixed",
            "algo.entropy.coef=0.01", "algo.entropy.ref_gain_clip.max_gain=0.5"],
    "tools": ["rollout.tools=[{name: python, fn: python}]"],
    "lora": ["model.lora.r=4"],
}
# fields that count, but that no tiny run of these modes reads, and why
NOT_REACHED = {
    "model.init": "random is refused with model.path=tiny-arith; read when loading a config: architecture",
    "data.curriculum.mode": "refused with data.train=arith; read with a dataset",
    "data.dynamic_sampling.on_exhausted": "read when max_rounds cannot fill the batch",
    "rollout.async_mode": "read with generator processes; free is refused with max_staleness=0",
    "algo.kl.target": "refused with algo.kl.use=none (rules: the adaptive controller of a KL term)",
    "train.dist.mixed_precision": "read under torchrun only (a single process ignores train.dist)",
    "train.dist.cpu_offload": "read under torchrun only",
    **{f"sft.{k}": "read by mathrl sft" for k in ("steps", "batch_size", "lr", "warmup_steps", "response_field",
                                                     "max_response_tokens", "eval_rows", "eval_pass1")},
}
# fields read where their `when` does not hold, with no effect there, and why
READ_WITHOUT_EFFECT = {
    "data.dynamic_sampling.band_low": "passed to the group filter, which compares with it in band mode only",
    "data.dynamic_sampling.band_high": "the same",
    "data.arith.mul_digits": "passed to the task, which draws products only with mul_share > 0",
    "rollout.tool_delay_steps": "passed to the torch engine, which waits for tool calls only with tools",
    "reward.length_schedule": "read to tell whether the schedule term is on; it weighs 0 without its coefficient",
    "log.wandb_project": "written to the run's summary; a tracker reads it only when on",
    "log.mlflow_experiment": "the same",
}


@pytest.fixture(scope="module", params=list(MODES))
def mode_run(request, tmp_path_factory):
    from mathrl.train.loop import train

    root = tmp_path_factory.mktemp(request.param)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MATHRL_CACHE", str(root / "cache"))
        cfg = load_config(None, [*TINY, *MODES[request.param], f"run_dir={root / 'run'}"], note=lambda line: None)
        with recording_reads() as read:
            train(cfg, console=Console(file=io.StringIO()))
    return request.param, cfg, read


def test_a_field_that_counts_is_read_and_one_that_does_not_is_not(mode_run):
    mode, cfg, read = mode_run
    counts = {key: when is None or when.ok(cfg) for key, _, _, when in FIELDS}
    unread = sorted(k for k, on in counts.items() if on and k not in read and k not in NOT_REACHED)
    assert unread == [], f"{mode}: these fields count (no `when` says otherwise) but the run never read them"
    dead_read = sorted(k for k, on in counts.items() if not on and k in read and k not in READ_WITHOUT_EFFECT)
    assert dead_read == [], f"{mode}: these fields' `when` does not hold, yet the run read them"


def test_the_modes_read_their_own_fields(mode_run):
    # each mode's own switch made fields count that the default run leaves alone
    mode, cfg, read = mode_run
    own = {"grpo": "algo.adv.std_normalize", "ppo": "algo.critic.lam_actor", "tools": "rollout.max_turns",
           "lora": "model.lora.alpha"}[mode]
    assert own in read
