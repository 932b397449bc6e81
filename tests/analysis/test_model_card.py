"""`mathrl export RUN OUT` and `mathrl push RUN --repo ID`: the shared folder (the model files, never
the resume-only state), its model card, a push's two calls to the hub (recorded in place of the network),
and an offline push's one-line error. No model is trained: the
run directory is written by hand, as train writes it.

Run: python -m pytest tests/analysis/test_model_card.py -q
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mathrl.analysis.model_card import ExportError, export_model
from mathrl.cli import main

CONFIG = """# machine: test
seed: 0
run_dir: {run}
model:
  path: Qwen/Qwen2.5-Math-1.5B
algo:
  policy_loss: gspo
  adv:
    estimator: grpo
rollout:
  n: 8
train:
  steps: 20
  lr: 1.0e-06
"""


def eval_row(step: int, name: str, scores: list[float]) -> dict:
    return {"step": step, "set": name, "name": name, "n": 4, "num_problems": len(scores), "pass_at_1": sum(scores) / len(scores),
            "pass_at_k": {"1": sum(scores) / len(scores)}, "maj_at_n": 0.75, "problem_pass_at_1": scores}


def make_run(path: Path) -> Path:
    """A finished 20-step run: final/ (with its critic), a checkpoint with its optimizer state, evaluations."""
    for model in (path / "final", path / "checkpoints" / "step_000010"):
        model.mkdir(parents=True)
        (model / "config.json").write_text("{}")
        (model / "model.safetensors").write_bytes(b"weights")
        (model / "trainer_state.json").write_text(json.dumps({"step": 20 if model.name == "final" else 10}))
    (path / "final" / "critic").mkdir()
    (path / "checkpoints" / "step_000010" / "trainer_state.pt").write_bytes(b"optimizer")
    (path / "config.yaml").write_text(CONFIG.format(run=path))
    (path / "summary.json").write_text(json.dumps({"steps": 20}))
    (path / "metrics.jsonl").write_text('{"step": 1}\n')
    rows = [eval_row(0, "math500", [0.25] * 4), eval_row(20, "math500", [0.5] * 4), eval_row(10, "math500", [0.75] * 4)]
    (path / "evals.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_export_writes_the_model_and_a_card_that_says_how_it_was_made(tmp_path):
    run = make_run(tmp_path / "run")
    old = os.umask(0o022)
    try:
        out = export_model(run, tmp_path / "out", license="apache-2.0")
    finally:
        os.umask(old)
    # the model and the card; no optimizer, RNG or critic: a reader needs none of them
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "mathrl_config.yaml", "model.safetensors"]
    assert {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()} == dict.fromkeys(
        ["README.md", "config.json", "mathrl_config.yaml", "model.safetensors"], 0o644)  # readable by others under umask 022
    card = (out / "README.md").read_text()
    for line, why in [
        ("license: apache-2.0", "the Hub's license field"),
        ("base_model: Qwen/Qwen2.5-Math-1.5B", "a hub id base model links the card to it"),
        ("gspo policy loss, grpo advantages, 20 RL steps from `Qwen/Qwen2.5-Math-1.5B`", "the recipe in one sentence"),
        ("| `rollout.n` | `8` |", "the recipe's settings"),
        ("| `train.lr` | `1e-06` |", "the recipe's settings"),
        ("mathrl train mathrl_config.yaml --run-dir runs/rerun", "the command that reruns it"),
        # every problem scored alike: the bootstrap interval over problems is the point itself
        ("| math500 | 4 × 4 | 0.250 [0.250, 0.250] | 0.500 [0.500, 0.500] | 0.750 |", "base and final with intervals"),
        ("Trained with mathrl ", "the version"),
        ("  policy_loss: gspo", "the whole config"),
    ]:
        assert line in card, why
    assert (out / "mathrl_config.yaml").read_text() == (run / "config.yaml").read_text()


def test_export_of_a_checkpoint_takes_its_weights_and_its_evaluation(tmp_path):
    run = make_run(tmp_path / "run")
    out = export_model(run, tmp_path / "out", checkpoint=10)
    assert "trainer_state.pt" not in {p.name for p in out.iterdir()}
    card = (out / "README.md").read_text()
    assert "| math500 | 4 × 4 | 0.250 [0.250, 0.250] | 0.750 [0.750, 0.750] | 0.750 |" in card  # step 10's row
    assert "license: other" in card and "pass `--license` to name it" in card  # not set: said so, not invented


@pytest.mark.parametrize("args, expected", [
    ({"checkpoint": 7}, "has no checkpoint of step 7 with weights (saved: 10)"),
    ({"out": "taken"}, "exists and is not an empty directory"),
])
def test_export_refuses_in_one_line(tmp_path, args, expected):
    run = make_run(tmp_path / "run")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("")
    with pytest.raises(ExportError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        export_model(run, tmp_path / args.pop("out", "out"), **args)


def test_push_offline_is_one_line_and_never_reaches_the_hub(tmp_path, monkeypatch, capsys):
    import huggingface_hub

    def no_network(*args, **kwargs):
        raise AssertionError("the hub was called")

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", no_network)
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", no_network)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    run = make_run(tmp_path / "run")
    assert main(["push", str(run), "--repo", "me/model", "--private"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"mathrl: error: HF_HUB_OFFLINE is set: nothing was uploaded; unset it where the hub is reachable, "
                   f"or write the folder with `mathrl export {run} OUT` and upload OUT from elsewhere"]


def test_push_creates_the_repository_and_uploads_the_exported_folder(tmp_path, monkeypatch, capsys):
    # The hub's two calls recorded in place of the network: the repository (private as asked, created if
    # missing), then one upload of the folder export writes, the card and the model in it, the resume-only
    # state and the critic left out; the command prints the repository's URL.
    import huggingface_hub

    calls = []

    def create_repo(self, repo_id, **kwargs):
        calls.append(("create_repo", repo_id, kwargs))
        return f"https://huggingface.co/{repo_id}"

    def upload_folder(self, *, folder_path, **kwargs):
        files = sorted(p.name for p in Path(folder_path).iterdir())
        card = (Path(folder_path) / "README.md").read_text()
        calls.append(("upload_folder", files, kwargs, "license: apache-2.0" in card))

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", create_repo)
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", upload_folder)
    run = make_run(tmp_path / "run")
    assert main(["push", str(run), "--repo", "me/model", "--private", "--license", "apache-2.0"]) == 0
    assert calls[0] == ("create_repo", "me/model", {"private": True, "exist_ok": True, "repo_type": "model"})
    name, files, kwargs, licensed = calls[1]
    assert (name, files, licensed) == ("upload_folder", ["README.md", "config.json", "mathrl_config.yaml",
                                                         "model.safetensors"], True)
    assert kwargs["repo_id"] == "me/model" and kwargs["repo_type"] == "model"
    assert kwargs["commit_message"].startswith("mathrl ") and kwargs["commit_message"].endswith(": run")
    assert "https://huggingface.co/me/model" in capsys.readouterr().out


def front_matter(card: str) -> dict:
    import yaml

    assert card.startswith("---\n")
    return yaml.safe_load(card.split("---\n")[1])


@pytest.mark.parametrize("base, expected_base, why", [
    ("Qwen/Qwen2.5-Math-1.5B", "Qwen/Qwen2.5-Math-1.5B", "a hub id: the Hub links the card to its base model"),
    ("{tmp}/local-model", None, "a local directory that exists: a path means nothing on the Hub"),
    ("./models/qwen", None, "a relative path, even one that is not there"),
    ("~/models/qwen", None, "a path under the home directory"),
    ("tiny-arith", None, "mathrl's own tiny base model: not on the Hub"),
    ("models/qwen", None, "reads as org/name but is a directory here: the local model is what was trained"),
])
def test_the_cards_hub_metadata_has_every_field_and_a_hub_id_only_as_base_model(tmp_path, monkeypatch, base, expected_base, why):
    # The Hub reads the front matter: license, library_name (the loading snippet) and tags (search) are always
    # there; base_model only for a hub id, else the Hub shows a broken link to a path on the machine that trained it.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "local-model").mkdir()
    (tmp_path / "models" / "qwen").mkdir(parents=True)
    run = make_run(tmp_path / "run")
    base = base.format(tmp=tmp_path)
    (run / "config.yaml").write_text(CONFIG.format(run=run).replace("Qwen/Qwen2.5-Math-1.5B", base))
    card = (export_model(run, tmp_path / "out", license="apache-2.0") / "README.md").read_text()
    expected = {"license": "apache-2.0", "library_name": "transformers", "tags": ["mathrl", "reinforcement-learning", "rlvr", "math"]}
    if expected_base is not None:
        expected["base_model"] = expected_base
    assert front_matter(card) == expected, why
    assert f"## Base model\n\n`{base}`" in card  # the body names the base model in every case
