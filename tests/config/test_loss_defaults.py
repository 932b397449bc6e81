"""A policy loss's own clip range applies where the user sets none (config/load.py, `apply_loss_defaults`):
the values, where they came from (`cfg.chosen`, the comments of config.yaml, the note), and what the
user sets winning over them.

Run: python -m pytest tests/config/test_loss_defaults.py -q
"""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest
import yaml

from mathrl.algo import policy_losses
from mathrl.config import Config, dump_yaml, load_config
from mathrl.registry import POLICY_LOSSES

REPO = Path(__file__).resolve().parents[2]


def _load(*overrides: str, recipe: Path | None = None) -> tuple[Config, list[str]]:
    notes: list[str] = []
    return load_config(recipe, list(overrides), check_paths=False, note=notes.append), notes


@pytest.mark.parametrize("loss, eps_low, eps_high, why", [
    ("gspo", 3e-4, 4e-4, "GSPO paper: the sequence ratio is a per-token geometric mean, so its range is tiny"),
    ("gspo_token", 3e-4, 4e-4, "the same ratio's value with each token's gradient"),
    ("cispo", 1.0, 0.2, "CISPO bounds the weight from above only: eps_low 1.0 leaves the lower bound at 0"),
    ("geo_mean", 0.4, 0.4, "GMPO's log-space range (e^-0.4, e^0.4)"),
])
def test_a_loss_gets_its_published_clip_when_none_is_set(loss, eps_low, eps_high, why):
    cfg, notes = _load(f"algo.policy_loss={loss}")
    assert (cfg.algo.clip.eps_low, cfg.algo.clip.eps_high) == (eps_low, eps_high), why
    assert cfg.chosen == {"algo.clip.eps_low": f"{loss}'s default", "algo.clip.eps_high": f"{loss}'s default"}
    assert notes == [f"algo.clip.eps_low={eps_low}, algo.clip.eps_high={eps_high}: {loss}'s defaults "
                     "(set algo.clip.* to choose others)"]
    text = dump_yaml(cfg)  # config.yaml shows the value and where it came from
    assert f"    eps_low: {eps_low}  # {loss}'s default\n" in text and f"    eps_high: {eps_high}  # {loss}'s default\n" in text


def test_a_key_the_user_sets_wins_and_the_other_still_defaults():
    cfg, notes = _load("algo.policy_loss=gspo", "algo.clip.eps_high=0.001")
    assert (cfg.algo.clip.eps_low, cfg.algo.clip.eps_high) == (3e-4, 0.001)
    assert cfg.chosen == {"algo.clip.eps_low": "gspo's default"}
    assert notes == ["algo.clip.eps_low=0.0003: gspo's default (set algo.clip.* to choose others)"]
    assert "    eps_high: 0.001\n" in dump_yaml(cfg)  # no comment: the user's


@pytest.mark.parametrize("loss", ["ppo_clip", "clip_cov", "sapo", "dppo_tv", "kl_cov", "gpg"])
def test_losses_whose_clip_is_ppos_or_none_change_nothing(loss):
    # ppo_clip and clip_cov are published with the tree's 0.2 / 0.28; sapo, dppo_*, kl_cov and gpg read no
    # clip: the config, its YAML and the notes are those of before, byte for byte
    cfg, notes = _load(f"algo.policy_loss={loss}")
    assert (cfg.algo.clip.eps_low, cfg.algo.clip.eps_high) == (0.2, 0.28) and cfg.chosen == {} and notes == []
    assert dump_yaml(cfg) == yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False)


def test_a_recipe_that_spells_out_ppos_clip_keeps_it_and_says_so():
    # recipes/arith_grpo.yaml writes every default, the clip included: what a recipe sets is the user's
    cfg, notes = _load("algo.policy_loss=gspo", recipe=REPO / "recipes" / "arith_grpo.yaml")
    assert (cfg.algo.clip.eps_low, cfg.algo.clip.eps_high) == (0.2, 0.28) and cfg.chosen == {}
    assert notes == ["algo.clip.eps_low=0.2 as set, which is PPO's value; gspo's own default is 0.0003",
                     "algo.clip.eps_high=0.28 as set, which is PPO's value; gspo's own default is 0.0004"]


def test_a_saved_config_loads_back_to_the_same_values(tmp_path):
    # a resumed run reads config.yaml: the comments are ignored and the values are now the user's
    cfg, _ = _load("algo.policy_loss=gspo")
    path = tmp_path / "config.yaml"
    path.write_text(dump_yaml(cfg))
    again, notes = _load(recipe=path)
    assert again == cfg and again.chosen == {} and notes == []


def test_every_registered_loss_that_clips_declares_its_functions_defaults():
    # a registration that forgot `defaults=` would run gspo at PPO's range again: each loss whose function
    # takes eps_low / eps_high declares the values of its signature, the others none
    for name, entry in POLICY_LOSSES.items():
        params = inspect.signature(entry.fn).parameters
        own = {k: params[k].default for k in policy_losses.CLIP_KEYS if k in params}
        assert entry.defaults == own, name
    assert POLICY_LOSSES.get("gspo").defaults == {"eps_low": 3e-4, "eps_high": 4e-4}
