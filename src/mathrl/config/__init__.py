"""One typed config tree: defaults in the tree, YAML recipes on top, dotted command-line overrides last.

The defaults ARE the embedded default experiment (`recipes/arith_grpo.yaml` lists their main knobs): GRPO
with the DAPO clip and token-level loss on the built-in arithmetic task, starting from the tiny base
model. Every field is declared once, in its dataclass: type, domain, default and help side by side.

    cfg = load_config("recipes/arith_grpo.yaml", ["rollout.n=8", "algo.clip.eps_high=0.28"])

This package is the config's public face; its modules, by concern:

    tree.py    the dataclass tree (each field's type, domain, default, help) and the derived sizes
    load.py    recipes, overrides and YAML -> a typed Config (unknown keys and wrong types named)
    rules.py   Config.validate: every field in its domain, then the rules that tie fields together
    shared.py  ConfigError and the names a value is compared with (tiny-arith, config:<name>, ...)
"""

from mathrl.config.load import dump_yaml, fit_mini_batch, from_dict, load_config, note_to_stderr, parse_override, to_dict
from mathrl.config.rules import MODEL_FILES, resolve_reward_function, tool_entry_problems
from mathrl.config.shared import CONFIG_PREFIX, DATA_FILE_SUFFIXES, DEFAULT_REWARD_FN, TINY_BASE, ConfigError, parse_config_path
from mathrl.config.tree import (
    ArithConfig,
    BaseModelConfig,
    Config,
    CurriculumConfig,
    DataConfig,
    DistConfig,
    DynamicSamplingConfig,
    EvalConfig,
    LogConfig,
    LoraConfig,
    ModelConfig,
    OverlongConfig,
    RewardConfig,
    RewardFunctionConfig,
    SFTConfig,
    TrainConfig,
)
from mathrl.config.tree_algo import (
    AdvConfig,
    AlgoConfig,
    ClipConfig,
    Correction,
    CriticConfig,
    EntropyConfig,
    KLConfig,
    PosLMConfig,
    PTXConfig,
    RefGainClipConfig,
    RolloutCorrectionConfig,
)
from mathrl.config.tree_rollout import GeneratorConfig, RolloutConfig, ToolConfig, ToolTagsConfig, VLLMConfig

__all__ = [
    "CONFIG_PREFIX", "DATA_FILE_SUFFIXES", "DEFAULT_REWARD_FN", "MODEL_FILES", "TINY_BASE", "AdvConfig", "AlgoConfig",
    "ArithConfig", "BaseModelConfig", "ClipConfig", "Config", "ConfigError", "Correction", "CriticConfig",
    "CurriculumConfig", "DataConfig", "DistConfig", "DynamicSamplingConfig", "EntropyConfig", "EvalConfig",
    "GeneratorConfig", "KLConfig", "LogConfig", "LoraConfig", "ModelConfig", "OverlongConfig", "PTXConfig",
    "PosLMConfig", "RefGainClipConfig", "RewardConfig", "RewardFunctionConfig", "RolloutConfig",
    "RolloutCorrectionConfig", "SFTConfig", "ToolConfig", "ToolTagsConfig", "TrainConfig", "VLLMConfig", "dump_yaml",
    "fit_mini_batch", "from_dict", "load_config", "note_to_stderr", "parse_config_path", "parse_override",
    "resolve_reward_function", "to_dict", "tool_entry_problems",
]
