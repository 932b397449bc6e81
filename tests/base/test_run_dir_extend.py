"""A finished run whose config differs only by a longer train.steps is extended in place; any other
change to a finished run is refused, naming the keys and the checkpoint to continue from in a new
directory; every change a run takes on is recorded with the step it applies from
(config_history.jsonl). No model is needed: open_run_dir reads the run's files only.

Run: python -m pytest tests/base/test_run_dir_extend.py -q
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from mathrl.run_dir import FinishedRunConfigChanged, RunDir, open_run_dir, release_run_dir


def config(steps: int = 20, n: int = 8) -> str:
    return f"# machine: a comment that differs between machines\ntrain:\n  steps: {steps}\nrollout:\n  n: {n}\n"


def make_run(path: Path, *, steps: int = 20, checkpoints: tuple[int, ...] = (10, 20), finished: bool = True) -> RunDir:
    """A run's files as train writes them (metrics, config, complete checkpoints, final/, summary)."""
    run = RunDir(path)
    path.mkdir()
    run.config_path.write_text(config(steps))
    run.metrics_path.write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, steps + 1)))
    for step in checkpoints:
        ckpt = run.checkpoints / f"step_{step:06d}"
        ckpt.mkdir(parents=True)
        (ckpt / "trainer_state.json").write_text(json.dumps({"step": step}))
        (ckpt / "trainer_state.pt").write_bytes(b"")
    if finished:
        run.final.mkdir()
        run.summary_path.write_text(json.dumps({"steps": steps}))
    return run


def open_(run: RunDir, text: str):
    try:
        return open_run_dir(run.path, config_text=text, resume=True, console=Console(quiet=True))
    finally:
        release_run_dir(run.path)


def test_a_longer_train_steps_extends_a_finished_run_from_its_last_checkpoint(tmp_path):
    # Bug story: `mathrl train --run-dir R train.steps=40` on a finished 20-step run was refused; the only
    # way on was train.init_from into a new directory, whose steps restarted at 1.
    run = make_run(tmp_path / "run")
    _, checkpoint = open_(run, config(40))
    assert checkpoint == run.checkpoints / "step_000020"  # resumed there: step 21 comes next, same numbering
    assert not run.summary_path.exists()  # no longer finished: a kill from here on resumes like any run
    assert run.final.is_dir()  # the 20-step model stays until the extension's own final/ replaces it
    assert run.config_text() == config(40) and (run.path / "config.previous.yaml").read_text() == config(20)
    assert [{k: r[k] for k in ("step", "changes", "extended")} for r in run.history()] == [
        {"step": 21, "changes": {"train.steps": [20, 40]}, "extended": True}]
    # killed during the extension, the same command resumes it (no second history row: nothing changed)
    _, again = open_(run, config(40))
    assert again == checkpoint and len(run.history()) == 1


@pytest.mark.parametrize("steps, n, checkpoints, expected, why", [
    (40, 4, (10, 20), "whose config differs (train.steps: 20 -> 40; rollout.n: 8 -> 4)", "another key changed too"),
    (10, 8, (10, 20), "whose config differs (train.steps: 20 -> 10)", "a shorter run would train nothing"),
    (20, 4, (10, 20), "or train.init_from={run}/checkpoints/step_000020 in a new directory", "the real checkpoint, not a placeholder"),
    (20, 4, (), "or train.init_from={run}/final train.init_from_mode=restart in a new directory", "no checkpoint: final/'s weights"),
    (40, 8, (10,), "cannot be extended to 40: its last complete checkpoint is step 10, not its last step 20",
     "the optimizer state of step 20 is gone"),
    (40, 8, (), "cannot be extended to 40: it kept no resumable checkpoint (save_every=0)", "nothing to resume from"),
])
def test_other_changes_to_a_finished_run_are_refused_and_touch_nothing(tmp_path, steps, n, checkpoints, expected, why):
    run = make_run(tmp_path / "run", checkpoints=checkpoints)
    before = {p: p.read_bytes() for p in run.path.rglob("*") if p.is_file() and p.name != ".lock"}
    with pytest.raises(FinishedRunConfigChanged) as info:
        open_(run, config(steps, n))
    assert expected.format(run=run.path) in str(info.value), why
    assert "<its checkpoint>" not in str(info.value)
    assert {p: p.read_bytes() for p in run.path.rglob("*") if p.is_file() and p.name != ".lock"} == before


def test_a_resumed_run_records_the_change_with_the_step_it_applies_from(tmp_path):
    # killed after its step-10 checkpoint and resumed with rollout.n=4: the change applies from step 11
    run = make_run(tmp_path / "run", checkpoints=(10,), finished=False)
    _, checkpoint = open_(run, config(20, n=4))
    assert checkpoint == run.checkpoints / "step_000010"
    assert [{k: r[k] for k in ("step", "changes", "extended")} for r in run.history()] == [
        {"step": 11, "changes": {"rollout.n": [8, 4]}, "extended": False}]


def test_the_same_config_on_a_finished_run_changes_nothing(tmp_path):
    from mathrl.run_dir import RunComplete

    run = make_run(tmp_path / "run")
    with pytest.raises(RunComplete):
        open_(run, config(20).replace("a comment", "another comment"))  # comments are no change
    assert run.summary_path.exists() and not run.history_path.exists()


def test_an_sft_run_extends_by_sft_steps_and_not_by_train_steps(tmp_path):
    # mathrl sft counts sft.steps: a longer train.steps would extend nothing there, so it is refused
    run = make_run(tmp_path / "run")
    run.config_path.write_text("sft:\n  steps: 20\ntrain:\n  steps: 50\n")

    def sft_open(text: str):
        try:
            return open_run_dir(run.path, config_text=text, resume=True, console=Console(quiet=True), steps_key="sft.steps")
        finally:
            release_run_dir(run.path)

    with pytest.raises(FinishedRunConfigChanged, match="Only a longer sft.steps extends"):
        sft_open("sft:\n  steps: 20\ntrain:\n  steps: 80\n")
    _, checkpoint = sft_open("sft:\n  steps: 40\ntrain:\n  steps: 50\n")
    assert checkpoint == run.checkpoints / "step_000020" and run.history()[0]["changes"] == {"sft.steps": [20, 40]}
