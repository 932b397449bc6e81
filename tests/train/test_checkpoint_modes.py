"""Checkpoints and final/ are written with the modes of the process umask (0o644 files under umask
022), as torch.save and plain open() write them, and stay atomic.

Run: python -m pytest tests/train/test_checkpoint_modes.py -q
"""

from __future__ import annotations

import os

import torch

from mathrl.train import checkpoint


def modes(root) -> dict[str, int]:
    return {p.relative_to(root).as_posix(): p.stat().st_mode & 0o777 for p in [root, *root.rglob("*")]}


def test_checkpoints_and_final_are_readable_by_others_under_umask_022(tmp_path, make_tiny_qwen2, char_tokenizer):
    # Bug story: model.safetensors in final/ and in every checkpoint was 0600 and each checkpoint
    # directory 0700 (safetensors writes through a private temporary file, mkdtemp makes a private
    # directory), so another user or a container with another uid could not read the weights.
    model = make_tiny_qwen2()
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    old = os.umask(0o022)
    try:
        saved = checkpoint.save_checkpoint(tmp_path / "checkpoints", 2, model=model, tokenizer=char_tokenizer,
                                           optimizer=optimizer, scheduler=scheduler, state={})
        checkpoint.save_final_model(model, char_tokenizer, tmp_path / "final")
    finally:
        os.umask(old)
    for root in (saved, tmp_path / "final"):
        found = modes(root)
        assert "model.safetensors" in found and "config.json" in found
        expected = {name: 0o755 if (root / name).is_dir() else 0o644 for name in found}
        assert found == expected, root
    assert "trainer_state.pt" in modes(saved)
    # atomic still: the checkpoint's temporary directory was renamed away, nothing else is left beside it
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_000002"]


def test_a_checkpoint_is_not_there_until_all_its_files_are(tmp_path, monkeypatch, make_tiny_qwen2, char_tokenizer):
    # Atomic: a SIGKILL at any moment of the write leaves either no step_000002 or a whole one. Looked at the last
    # moment before the rename (every file written, being fsynced), the step's directory must not be there yet:
    # a resume then would pick a checkpoint whose files may be half written.
    from mathrl.run_dir import complete_checkpoints

    model = make_tiny_qwen2()
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    seen = []
    real_fsync_tree = checkpoint._fsync_tree

    def fsync_and_look(path):
        seen.append((path.name.startswith("step_000002.tmp-"), sorted(p.name for p in path.parent.iterdir()),
                     complete_checkpoints(path.parent)))
        real_fsync_tree(path)

    monkeypatch.setattr(checkpoint, "_fsync_tree", fsync_and_look)
    saved = checkpoint.save_checkpoint(tmp_path / "checkpoints", 2, model=model, tokenizer=char_tokenizer,
                                       optimizer=optimizer, scheduler=scheduler, state={})
    ((in_tmp, names, complete),) = seen
    assert in_tmp, "written into a temporary directory"  # why: not into step_000002 itself
    assert "step_000002" not in names and complete == []  # why: nothing a resume could pick before the rename
    assert complete_checkpoints(tmp_path / "checkpoints") == [(2, saved)]  # why: after the rename, the whole checkpoint
