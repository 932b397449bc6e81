"""What the config tree, its loading and its rules share: the error they raise, and the names a field's
value is compared with (the tiny base model, `config:` architectures, data file formats, the default
reward function). A leaf: it imports nothing of mathrl, so each of them, and the rooms above, can use it."""

from __future__ import annotations

DATA_FILE_SUFFIXES = (".jsonl", ".parquet")  # the local data file formats tasks.loading reads
TINY_BASE = "tiny-arith"  # model.path of the tiny model mathrl builds itself (model/tiny.py, model/paths.py)
CONFIG_PREFIX = "config:"  # model.path=config:<name> names an architecture (model/init.py) with random weights
DEFAULT_REWARD_FN = "mathrl.reward:math_reward"  # the default and only reward component: the math checker
CUT_NOTE = "\n...[{cut} tokens cut]...\n"  # said inside a tool observation cut in the middle (rollout/episodes.py)
# the shortest rollout.observation_max_tokens whose cut can say so: the note with a 7-digit count at one
# token per character (the most the usual tokenizers spend on ASCII text), and a token of output each side
MIN_OBSERVATION_TOKENS = len(CUT_NOTE.format(cut=9_999_999)) + 2


class ConfigError(ValueError):
    """A recipe or override that cannot be turned into a valid config; the message says how to fix it."""


def parse_config_path(path: str) -> str | None:
    """The name or .json path after `config:` in a model.path, or None when it is not a `config:` path."""
    if not path.startswith(CONFIG_PREFIX):
        return None
    return path[len(CONFIG_PREFIX) :]
