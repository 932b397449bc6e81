"""The names a TRL or verl user brings: their config keys and values, each with mathrl's spelling and, where
the unit differs, the conversion. An unknown key or a value that is a peer's name gets them in its error
(load.py's unknown keys and choices, schema.Registered); docs/tricks.md, "Names from TRL and verl", is the
table. A leaf: it imports nothing of mathrl.

    peer_key_hint("algo.beta")                       # TRL's `beta`: did you mean 'algo.kl.coef' ...
    peer_value_hint("algo.policy_loss", "vanilla")   # verl's loss_mode `vanilla`: did you mean 'ppo_clip'?
"""

from __future__ import annotations

from typing import NamedTuple


class Peer(NamedTuple):
    peer: str  # whose name it is: "TRL GRPOConfig", "verl"
    mathrl: str  # mathrl's key (or value)
    note: str = ""  # the conversion where the unit or the form differs


TRL, VERL = "TRL GRPOConfig", "verl"

# the last part of a peer's key (verl nests them: actor_rollout_ref.actor.clip_ratio_low) -> mathrl's key
PEER_KEYS: dict[str, Peer] = {
    # TRL GRPOConfig
    "loss_type": Peer(TRL, "algo.loss_agg", "grpo -> seq_mean_token_mean, bnpo and dapo -> token_mean, dr_grpo -> "
                      "seq_mean_token_sum_norm with algo.adv.std_normalize=false; cispo, sapo -> algo.policy_loss"),
    "beta": Peer(TRL, "algo.kl.coef", "with algo.kl.use=loss; TRL's KL term is k3, algo.kl.estimator's default"),
    "epsilon": Peer(TRL, "algo.clip.eps_low", "and algo.clip.eps_high, which TRL's epsilon_high defaults to"),
    "epsilon_high": Peer(TRL, "algo.clip.eps_high"),
    "num_generations": Peer(TRL, "rollout.n", "samples per prompt in both"),
    "importance_sampling_level": Peer(TRL, "algo.policy_loss", "token -> ppo_clip, sequence -> gspo, "
                                      "sequence_token -> gspo_token"),
    "top_entropy_quantile": Peer(TRL, "algo.top_entropy_quantile", "the same share of tokens kept"),
    "vllm_importance_sampling_correction": Peer(TRL, "algo.rollout_correction.mode", "true -> tis, or mis for "
                                                "TRL's *_mask modes; false -> none"),
    "vllm_importance_sampling_mode": Peer(TRL, "algo.rollout_correction.mode", "token_truncate -> tis, token_mask -> "
                                          "mis; sequence_* -> the same with algo.rollout_correction.level=sequence"),
    "vllm_importance_sampling_cap": Peer(TRL, "algo.rollout_correction.cap"),
    "off_policy_mask_threshold": Peer(TRL, "algo.rollout_correction.opsm_delta", "with algo.rollout_correction.masks=[opsm]"),
    "max_completion_length": Peer(TRL, "rollout.max_new_tokens"),
    "max_prompt_length": Peer(TRL, "data.max_prompt_tokens", "longer prompts are dropped here, not truncated"),
    "learning_rate": Peer(TRL, "train.lr"),
    "num_iterations": Peer(TRL, "train.epochs", "passes over each rollout batch"),
    "scale_rewards": Peer(TRL, "algo.adv.std_normalize", "group/true -> true, batch -> true with "
                          "algo.adv.std_scope=batch, none/false -> false"),
    "mask_truncated_completions": Peer(TRL, "reward.overlong.filter"),
    # verl
    "loss_mode": Peer(VERL, "algo.policy_loss", "vanilla -> ppo_clip; the other names are the same"),
    "adv_estimator": Peer(VERL, "algo.adv.estimator", "reinforce_plus_plus -> reinforce_pp, "
                          "reinforce_plus_plus_baseline -> reinforce_pp_baseline"),
    "ppo_mini_batch_size": Peer(VERL, "train.mini_batch_size", "counted in prompts there, in sequences here: "
                                "multiply by rollout.n"),
    "ppo_micro_batch_size_per_gpu": Peer(VERL, "train.micro_batch_tokens", "counted in sequences there, in tokens here"),
    "ppo_max_token_len_per_gpu": Peer(VERL, "train.micro_batch_tokens", "tokens in both"),
    "ppo_epochs": Peer(VERL, "train.epochs"),
    "train_batch_size": Peer(VERL, "rollout.prompts_per_step", "prompts in both"),
    "max_response_length": Peer(VERL, "rollout.max_new_tokens"),
    "clip_ratio": Peer(VERL, "algo.clip.eps_low", "and algo.clip.eps_high"),
    "clip_ratio_low": Peer(VERL, "algo.clip.eps_low"),
    "clip_ratio_high": Peer(VERL, "algo.clip.eps_high"),
    "clip_ratio_c": Peer(VERL, "algo.clip.dual_clip_c"),
    "use_kl_loss": Peer(VERL, "algo.kl.use", "true -> loss"),
    "use_kl_in_reward": Peer(VERL, "algo.kl.use", "true -> reward"),
    "kl_loss_coef": Peer(VERL, "algo.kl.coef", "with algo.kl.use=loss"),
    "kl_loss_type": Peer(VERL, "algo.kl.estimator", "low_var_kl -> k3, kl -> k1, mse -> k2"),
    "target_kl": Peer(VERL, "algo.kl.target"),
    "entropy_coeff": Peer(VERL, "algo.entropy.coef", "with algo.entropy.mode=fixed"),
    "loss_agg_mode": Peer(VERL, "algo.loss_agg", "the same modes, with _ for -: token-mean -> token_mean"),
    "norm_adv_by_std_in_grpo": Peer(VERL, "algo.adv.std_normalize"),
    "cliprange_value": Peer(VERL, "algo.critic.value_clip"),
    "total_training_steps": Peer(VERL, "train.steps"),
    "grad_clip": Peer(VERL, "train.max_grad_norm"),
    "rollout_is_threshold": Peer(VERL, "algo.rollout_correction.cap"),
    "bypass_mode": Peer(VERL, "algo.rollout_correction.bypass"),
}

# mathrl key -> {a peer's value, lower case: mathrl's}
PEER_VALUES: dict[str, dict[str, Peer]] = {
    "algo.policy_loss": {"vanilla": Peer(VERL, "ppo_clip", "verl's loss_mode vanilla"),
                         "gmpo": Peer(VERL, "geo_mean", "GMPO, verl's geo_mean"),
                         "sequence": Peer(TRL, "gspo", "TRL's importance_sampling_level=sequence"),
                         "sequence_token": Peer(TRL, "gspo_token", "TRL's importance_sampling_level=sequence_token")},
    "algo.adv.estimator": {"reinforce_plus_plus": Peer(VERL, "reinforce_pp"),
                           "reinforce_plus_plus_baseline": Peer(VERL, "reinforce_pp_baseline"),
                           "dr_grpo": Peer(TRL, "grpo", "with algo.adv.std_normalize=false (Dr. GRPO)")},
    "algo.kl.estimator": {"low_var_kl": Peer(VERL, "k3"), "kl": Peer(VERL, "k1"), "mse": Peer(VERL, "k2")},
    "algo.loss_agg": {"grpo": Peer(TRL, "seq_mean_token_mean", "TRL's loss_type=grpo"),
                      "bnpo": Peer(TRL, "token_mean", "TRL's loss_type=bnpo"),
                      "dapo": Peer(TRL, "token_mean", "TRL's loss_type=dapo"),
                      "dr_grpo": Peer(TRL, "seq_mean_token_sum_norm", "TRL's loss_type=dr_grpo; with "
                                      "algo.adv.std_normalize=false")},
    "algo.rollout_correction.mode": {"token_truncate": Peer(TRL, "tis"), "token_mask": Peer(TRL, "mis"),
                                     "sequence_truncate": Peer(TRL, "tis", "with algo.rollout_correction.level=sequence"),
                                     "sequence_mask": Peer(TRL, "mis", "with algo.rollout_correction.level=sequence")},
}


def peer_key_hint(key: str) -> str | None:
    """'did you mean ...' for an unknown dotted key whose last part is a TRL or verl key, else None."""
    peer = PEER_KEYS.get(key.rsplit(".", 1)[-1])
    if peer is None:
        return None
    name = key.rsplit(".", 1)[-1]
    return f"{name} is {peer.peer}'s name; did you mean {peer.mathrl!r}?" + (f" ({peer.note})" if peer.note else "")


def peer_value(key: str, value: object) -> Peer | None:
    """mathrl's value for a TRL or verl value of the config key `key` (any case), else None."""
    return PEER_VALUES.get(key, {}).get(str(value).lower().replace("-", "_"))


def close_name(value: object, names: list[str], key: str) -> tuple[str, str] | None:
    """(mathrl's name, why) for a value that is a registered or allowed name in another case ('GSPO') or a
    peer's name ('vanilla'), else None."""
    lowered = {n.lower(): n for n in names}
    word = str(value).lower().replace("-", "_")
    if word in lowered:
        return lowered[word], ""
    peer = peer_value(key, value)
    if peer is not None and peer.mathrl in names:
        return peer.mathrl, " (" + (peer.note or f"{peer.peer}'s name") + ")"
    return None
