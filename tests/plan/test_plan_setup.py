"""`mathrl plan`'s setup and launch lines, the cases tests/plan/test_plan.py leaves out: a hub model that is
in the local cache, and the launch line the command prints for --gpus and --trainer-gpus.

Run: python -m pytest tests/plan/test_plan_setup.py -q
"""

from __future__ import annotations

import pytest

from mathrl.cli import main
from mathrl.config import load_config


def test_plan_says_cached_for_a_hub_model_in_the_local_cache(tmp_path, monkeypatch, capsys):
    # The other side of "not cached": a hub model whose files are in the Hugging Face cache downloads nothing,
    # and under HF_HUB_OFFLINE=1 the run goes on (exit 0), so the plan must not say the run will stop.
    import huggingface_hub.constants

    from mathrl.plan.setup_time import setup_time

    snapshot = tmp_path / "hub" / "models--SomeOrg--some-model" / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (tmp_path / "hub" / "models--SomeOrg--some-model" / "refs").mkdir()
    (tmp_path / "hub" / "models--SomeOrg--some-model" / "refs" / "main").write_text("0123abcd")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    cfg = load_config(None, ["model.path=SomeOrg/some-model"], check_paths=False)
    for offline in ("", "1"):  # why: a cached model needs no hub, whether or not it can be reached
        monkeypatch.setenv("HF_HUB_OFFLINE", offline) if offline else monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
        assert setup_time(cfg) == "setup: SomeOrg/some-model is cached (the local Hugging Face cache): nothing to download"
    other = load_config(None, ["model.path=SomeOrg/other-model"], check_paths=False)  # why: the cache holds one model only
    assert setup_time(other).startswith("setup: SomeOrg/other-model is not cached, and HF_HUB_OFFLINE is set: the run will stop")


@pytest.mark.parametrize("gpus, trainer_gpus, expected, why", [
    ("8", None, "launch: mathrl train --nproc 8 model.path=config:qwen2.5-0.5b model.init=random rollout.max_staleness=1",
     "8 GPUs, no generator of its own: a rank per GPU"),
    ("8", "7", "launch: mathrl train --nproc 7 model.path=config:qwen2.5-0.5b model.init=random rollout.max_staleness=1",
     "--trainer-gpus 7: 7 trainer ranks, the generator takes GPU 7"),
    ("0", "7", "launch: mathrl train model.path=config:qwen2.5-0.5b model.init=random rollout.max_staleness=1",
     "a CPU plan: one process, --trainer-gpus has no GPUs to split"),
])
def test_the_cli_plans_launch_line_follows_gpus_and_trainer_gpus(capsys, gpus, trainer_gpus, expected, why):
    argv = ["plan", "model.path=config:qwen2.5-0.5b", "model.init=random", "rollout.max_staleness=1", "--gpus", gpus]
    main([*argv, *(["--trainer-gpus", trainer_gpus] if trainer_gpus else [])])
    assert capsys.readouterr().out.splitlines()[-1] == expected, why
