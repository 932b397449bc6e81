"""Sharing a trained model: `mathrl export RUN OUT` writes a run's final/ (or one checkpoint's weights)
with a model card, and `mathrl push RUN --repo ID` uploads that same folder to the Hugging Face Hub
(huggingface_hub's `create_repo` and `upload_folder`).

    export_model("runs/x", "out/x")                       # final/ + README.md + mathrl_config.yaml
    export_model("runs/x", "out/x", checkpoint=20)        # checkpoints/step_000020's weights instead
    push_model("runs/x", "me/tiny-arith-grpo", private=True)

The folder holds the model's files (config.json, model.safetensors, tokenizer files; a LoRA run's
final/adapter/ too), never the resume-only state (optimizer moments, RNG), plus:
    README.md            the model card: Hub metadata (license, base_model, tags), the base model, the
                         recipe's main settings and how to rerun it, the held-out table (pass@1 with
                         95% bootstrap intervals over problems, from evals.jsonl), the mathrl version
    mathrl_config.yaml   the run's resolved config (config.yaml): `mathrl train mathrl_config.yaml` reruns it
Files get the modes of the process umask (`cache.umask_modes`).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import mathrl
from mathrl.cache import umask_modes
from mathrl.evaluation.metrics import bootstrap_ci95
from mathrl.model.paths import looks_like_hub_id, offline_variable
from mathrl.run_dir import RunDir

CONFIG_NAME = "mathrl_config.yaml"
# the resume-only parts of a checkpoint (train/checkpoint.py): never shared
_SKIPPED = {"trainer_state.pt", "optimizer", "critic_optimizer", "critic", "generator_versions.safetensors"}
# the recipe's settings a reader looks for first (dotted config keys)
RECIPE_KEYS = ("algo.policy_loss", "algo.adv.estimator", "algo.loss_agg", "algo.clip.eps_low", "algo.clip.eps_high",
               "algo.kl.use", "algo.entropy.mode", "rollout.n", "rollout.prompts_per_step", "rollout.max_new_tokens",
               "rollout.temperature", "train.steps", "train.lr", "data.train", "data.eval", "data.template")


class ExportError(ValueError):
    """A run, checkpoint or output folder that cannot be exported or pushed."""


def model_source(run: RunDir, checkpoint: int | None) -> Path:
    """The folder whose model is shared: final/, or checkpoints/step_<checkpoint>/ (any saved one, weights
    kept by train.keep_every included)."""
    if checkpoint is None:
        if not (run.final / "config.json").is_file():
            raise ExportError(f"{run.path} has no final/ model (the run has not finished); "
                              "pass --checkpoint N to share one of its checkpoints")
        return run.final
    path = run.checkpoints / f"step_{checkpoint:06d}"
    if not (path / "config.json").is_file():
        saved = sorted(int(d.name.split("_")[1]) for d in run.checkpoints.glob("step_*")
                       if (d / "config.json").is_file() and d.name.split("_")[1].isdigit())
        raise ExportError(f"{run.path} has no checkpoint of step {checkpoint} with weights (saved: "
                          f"{', '.join(map(str, saved)) or 'none'})")
    return path


def _get(tree: dict, key: str) -> Any:
    for part in key.split("."):
        tree = tree.get(part, {}) if isinstance(tree, dict) else {}
    return None if tree == {} else tree


def _pass1_cell(row: dict | None) -> str:
    if row is None:
        return "–"
    scores = row.get("problem_pass_at_1") or []
    if len(scores) < 2:
        return f"{row['pass_at_1']:.3f}"
    mean, low, high = bootstrap_ci95(scores)
    return f"{mean:.3f} [{low:.3f}, {high:.3f}]"


def heldout_table(run: RunDir, step: int | None) -> list[str]:
    """Markdown rows: each eval set's pass@1 (avg@n) at step 0 and at `step` (None: the last evaluation),
    with the 95% percentile-bootstrap interval over problems, and maj@n."""
    rows = run.evals()
    if not rows:
        return ["No evaluation was logged (evals.jsonl is empty)."]
    last = step if step is not None else max(r["step"] for r in rows)
    base = {r["set"]: r for r in rows if r["step"] == 0}
    final = {r["set"]: r for r in rows if r["step"] == last}
    out = [f"| eval set | problems × samples | pass@1 at step 0 [95% CI] | pass@1 at step {last} [95% CI] | maj@n at step {last} |",
           "| --- | --- | --- | --- | --- |"]
    for name in dict.fromkeys([*base, *final]):
        ref = final.get(name) or base[name]
        maj = f"{final[name]['maj_at_n']:.3f}" if name in final else "–"
        out.append(f"| {name} | {ref['num_problems']} × {ref['n']} | {_pass1_cell(base.get(name))} | "
                   f"{_pass1_cell(final.get(name))} | {maj} |")
    if step is not None and step not in {r["step"] for r in rows}:
        out.append(f"\nStep {step} was not evaluated during training; `mathrl eval` scores it.")
    return out


def model_card(run: RunDir, source: Path, *, license: str | None = None) -> str:
    """The README.md of the shared folder (its content: the module docstring)."""
    import yaml

    config = yaml.safe_load(run.config_text() or "") or {}
    step = None if source == run.final else int(source.name.split("_")[1])
    steps = (run.summary() or {}).get("steps", _get(config, "train.steps"))
    base = _get(config, "model.path") or "?"
    hub_base = looks_like_hub_id(str(base)) and not str(base).startswith((".", "/", "~")) and not Path(str(base)).exists()
    meta = {"license": license or "other", "library_name": "transformers",
            "tags": ["mathrl", "reinforcement-learning", "rlvr", "math"], **({"base_model": base} if hub_base else {})}
    algo = f"{_get(config, 'algo.policy_loss')} policy loss, {_get(config, 'algo.adv.estimator')} advantages"
    lines = ["---", yaml.safe_dump(meta, sort_keys=False).strip(), "---", "",
             f"# {run.path.resolve().name}", "",
             f"Trained with mathrl {mathrl.__version__} (reinforcement learning from verifiable "
             f"rewards): {algo}, {steps if step is None else step} RL steps from `{base}`"
             + (" (the tiny arithmetic model mathrl builds itself)." if base == "tiny-arith" else "."), "",
             "## Base model", "", f"`{base}`", "",
             "## Recipe", "", "| setting | value |", "| --- | --- |"]
    lines += [f"| `{key}` | `{_get(config, key)}` |" for key in RECIPE_KEYS if _get(config, key) is not None]
    lines += ["", f"The whole resolved config is `{CONFIG_NAME}` beside this card; the command that reruns it:", "",
              "```", f"mathrl train {CONFIG_NAME} --run-dir runs/rerun", "```", "",
              "## Held-out results", "", *heldout_table(run, step), "",
              "pass@1 is avg@n (each problem's fraction of its n samples correct, averaged); the interval is the 95% "
              "percentile bootstrap over problems.", "",
              "## License", "",
              f"`{license}`." if license else "Not set (`license: other`): the base model's license applies; "
              "pass `--license` to name it.", "",
              "## Config", "", "```yaml", (run.config_text() or "").strip(), "```", ""]
    return "\n".join(lines)


def export_model(run_dir: str | Path, out: str | Path, *, checkpoint: int | None = None, license: str | None = None) -> Path:
    """Write the shared folder of `run_dir` to `out` (a new or empty directory); returns `out`."""
    run, out = RunDir(run_dir), Path(out)
    if not run.is_run():
        raise ExportError(f"{run.path} is not a run directory (no metrics.jsonl, evals.jsonl or summary.json)")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"{out} exists and is not an empty directory; choose a new OUT")
    source = model_source(run, checkpoint)
    out.mkdir(parents=True, exist_ok=True)
    for item in sorted(source.iterdir()):
        if item.name in _SKIPPED or item.name == "trainer_state.json":
            continue
        (shutil.copytree if item.is_dir() else shutil.copy2)(item, out / item.name)
    (out / CONFIG_NAME).write_text(run.config_text() or "")
    (out / "README.md").write_text(model_card(run, source, license=license))
    umask_modes(out)
    return out


def push_model(run_dir: str | Path, repo_id: str, *, private: bool = False, checkpoint: int | None = None,
               license: str | None = None) -> str:
    """Upload `export_model`'s folder to the Hub repository `repo_id` (created if missing); returns its URL."""
    offline = offline_variable()
    if offline:
        raise ExportError(f"{offline} is set: nothing was uploaded; unset it where the hub is reachable, or write "
                          f"the folder with `mathrl export {run_dir} OUT` and upload OUT from elsewhere")
    from huggingface_hub import HfApi

    with tempfile.TemporaryDirectory(prefix="mathrl-push-") as tmp:
        folder = export_model(run_dir, Path(tmp) / "model", checkpoint=checkpoint, license=license)
        api = HfApi()
        url = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        api.upload_folder(folder_path=str(folder), repo_id=repo_id, repo_type="model",
                          commit_message=f"mathrl {mathrl.__version__}: {RunDir(run_dir).path.resolve().name}")
    return str(url)

