"""The names a TRL or verl user types (config/peers.py): an unknown key or value that is a peer's name gets
mathrl's spelling and, where the unit differs, the conversion; loss, estimator and choice names match in any
case. docs/tricks.md's table lists every one.

Run: python -m pytest tests/config/test_peer_names.py -q
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mathrl.config import ConfigError, load_config
from mathrl.config.peers import PEER_KEYS, PEER_VALUES
from mathrl.config.schema import reference
from mathrl.config.tree import Config

REPO = Path(__file__).resolve().parents[2]


def _error(*overrides: str) -> str:
    with pytest.raises(ConfigError) as e:
        load_config(None, list(overrides), check_paths=False, note=lambda line: None)
    return str(e.value)


@pytest.mark.parametrize("override, expected", [
    # TRL's beta habit: difflib would say algo.dro.beta, a penalty of another loss
    ("algo.beta=0.04", "did you mean 'algo.kl.coef'? (with algo.kl.use=loss"),
    ("loss_type=dr_grpo", "did you mean 'algo.loss_agg'?"),
    ("algo.epsilon=0.2", "did you mean 'algo.clip.eps_low'?"),
    ("epsilon_high=0.28", "did you mean 'algo.clip.eps_high'?"),
    ("num_generations=8", "did you mean 'rollout.n'? (samples per prompt in both)"),
    ("importance_sampling_level=sequence", "did you mean 'algo.policy_loss'? (token -> ppo_clip, sequence -> gspo"),
    ("vllm_importance_sampling_correction=true", "did you mean 'algo.rollout_correction.mode'? (true -> tis"),
    # verl nests its keys: the leaf is found under the unknown section
    ("actor_rollout_ref.actor.policy_loss.loss_mode=vanilla", "did you mean 'algo.policy_loss'? (vanilla -> ppo_clip"),
    ("algorithm.adv_estimator=grpo", "did you mean 'algo.adv.estimator'?"),
    ("actor_rollout_ref.actor.ppo_mini_batch_size=32",
     "did you mean 'train.mini_batch_size'? (counted in prompts there, in sequences here: multiply by rollout.n)"),
    ("actor_rollout_ref.actor.clip_ratio_c=10", "did you mean 'algo.clip.dual_clip_c'?"),
    ("actor_rollout_ref.actor.kl_loss_type=low_var_kl", "did you mean 'algo.kl.estimator'? (low_var_kl -> k3"),
])
def test_a_peers_key_gets_mathrls_with_the_conversion(override, expected):
    error = _error(override)
    assert expected in error and error.startswith("unknown config key"), error


@pytest.mark.parametrize("override, expected", [
    ("algo.policy_loss=vanilla", "did you mean 'ppo_clip'? (verl's loss_mode vanilla)"),  # verl's name for PPO
    ("algo.policy_loss=GSPO", "did you mean 'gspo'?"),  # the case of a paper's name
    ("algo.policy_loss=Dppo-TV", "did you mean 'dppo_tv'?"),  # case and - for _
    ("algo.adv.estimator=GRPO", "did you mean 'grpo'?"),
    ("algo.adv.estimator=reinforce_plus_plus", "did you mean 'reinforce_pp'? (verl's name)"),
    ("algo.adv.estimator=dr_grpo", "did you mean 'grpo'? (with algo.adv.std_normalize=false (Dr. GRPO))"),
    ("algo.kl.estimator=low_var_kl", "did you mean 'k3'? (verl's name)"),
    ("algo.loss_agg=seq-mean-token-sum-norm", "did you mean 'seq_mean_token_sum_norm'?"),  # verl's loss_agg_mode
    ("algo.loss_agg=dr_grpo", "did you mean 'seq_mean_token_sum_norm'? (TRL's loss_type=dr_grpo"),
    ("algo.rollout_correction.mode=sequence_mask", "did you mean 'mis'? (with algo.rollout_correction.level=sequence)"),
    ("algo.rollout_correction.mode=TIS", "did you mean 'tis'?"),
])
def test_a_peers_value_gets_mathrls(override, expected):
    error = _error(override)
    assert expected in error, error


def test_every_peer_key_and_value_maps_to_a_real_key_or_name():
    keys = {e.key for e in reference(Config)}
    for name, peer in PEER_KEYS.items():
        assert peer.mathrl in keys, name
    for key, values in PEER_VALUES.items():
        assert key in keys, key
        for value, peer in values.items():
            with pytest.raises(ConfigError) as e:  # the peer's value is not mathrl's, and the hint names mathrl's
                load_config(None, [f"{key}={value}"], check_paths=False, note=lambda line: None)
            assert f"did you mean {peer.mathrl!r}?" in str(e.value), (key, value)


def test_a_mathrl_key_of_the_same_last_name_is_never_hinted():
    # the hint answers unknown keys only: algo.dro.beta is DRO's own and loads
    cfg = load_config(None, ["algo.policy_loss=dro", "algo.dro.beta=0.1"], check_paths=False, note=lambda line: None)
    assert cfg.algo.dro.beta == 0.1


def test_docs_table_lists_every_peer_key():
    text = (REPO / "docs" / "tricks.md").read_text()
    table = text[text.index("## Names from TRL and verl"):]
    for name, peer in PEER_KEYS.items():
        row = next((line for line in table.splitlines() if re.search(rf"`{name}`", line)), None)
        assert row is not None and f"`{peer.mathrl}`" in row, name
