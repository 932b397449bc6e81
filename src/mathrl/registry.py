"""Named extension points: the advantage estimators (algo/estimators.py), the policy losses
(algo/policy_losses.py), the loss terms (train/update.py), the reward shaping terms (reward/shaping.py), the rollout engines
(rollout/factory.py), the prompt templates (tasks/prompts.py), the shipped model architectures
(model/init.py), the built-in reward functions (reward/functions.py) and the built-in arithmetic eval
sets (tasks/sources.py). Each implementation registers itself under the name a config field chooses it by;
the config accepts exactly the registered names, and an unknown one is an error that names the field
and the choices.

    from mathrl.registry import ADVANTAGE_ESTIMATORS
    ADVANTAGE_ESTIMATORS.register("mine", Estimator(fn=my_advantages))   # then algo.adv.estimator=mine

This module imports nothing else of mathrl: the config (the bottom layer) can use it. The built-in
implementations register when their module is imported; a registry imports its `home` module the
first time its names are asked for. User code that is not registered is named by import path
(`load_callable("package.module:function")`), e.g. a reward function in `reward.functions`.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import zlib
from pathlib import Path
from typing import Any


class UnknownName(ValueError):
    """A config names an implementation that is not registered."""


class Registry:
    """Implementations of one kind, by name, in registration order."""

    def __init__(self, kind: str, *, field: str, home: str):
        self.kind = kind  # e.g. "advantage estimator"
        self.field = field  # the config key that chooses one, e.g. "algo.adv.estimator"
        self.home = home  # the module whose import registers the built-in ones
        self._entries: dict[str, Any] = {}

    def register(self, name: str, entry: Any, *, replace: bool = False) -> Any:
        """Add `entry` under `name` (an existing name is an error unless `replace`); returns `entry`."""
        if name in self._entries and not replace:
            raise ValueError(f"a {self.kind} named {name!r} is already registered")
        self._entries[name] = entry
        return entry

    def remove(self, name: str) -> None:
        del self._entries[name]

    def names(self) -> list[str]:
        self._load_builtins()
        return list(self._entries)

    def items(self) -> list[tuple[str, Any]]:
        """(name, entry) pairs in registration order (the order the loop applies ordered entries in)."""
        self._load_builtins()
        return list(self._entries.items())

    def get(self, name: str) -> Any:
        self._load_builtins()
        if name not in self._entries:
            raise UnknownName(f"{self.field}={name!r} is not a registered {self.kind}; choose one of "
                              f"{', '.join(self._entries)}")
        return self._entries[name]

    def _load_builtins(self) -> None:
        importlib.import_module(self.home)  # registers the built-ins once (a no-op after the first import)


ADVANTAGE_ESTIMATORS = Registry("advantage estimator", field="algo.adv.estimator", home="mathrl.algo.estimators")
ENGINES = Registry("rollout engine", field="rollout.engine", home="mathrl.rollout.factory")
PROMPT_TEMPLATES = Registry("prompt template", field="data.template", home="mathrl.tasks.prompts")
ARCHITECTURES = Registry("architecture", field="model.path", home="mathrl.model.init")  # model/configs/*.json
REWARD_FUNCTIONS = Registry("reward function", field="reward.functions[].fn", home="mathrl.reward.functions")
TOOL_FORMATS = Registry("tool call format", field="rollout.tool_format", home="mathrl.rollout.episodes")  # python_blocks, chat_tool_call
TOOLS = Registry("built-in tool", field="rollout.tools[].fn", home="mathrl.tools")  # python, calculator
POLICY_LOSSES = Registry("policy loss", field="algo.policy_loss", home="mathrl.algo.policy_losses")  # ppo_clip, gspo, cispo, ...
LOSS_TERMS = Registry("loss term", field="train/update.py", home="mathrl.train.update")  # added to the policy loss in this order
SHAPING_TERMS = Registry("reward shaping term", field="reward/shaping.py", home="mathrl.reward.shaping")  # added to the reward in this order
ARITH_SOURCES = Registry("built-in arithmetic eval set", field="data.eval", home="mathrl.tasks.sources")  # arith, arith_decimal, arith_hard


def load_callable(ref: str) -> Any:
    """The object named by `ref`: "package.module:attribute" (imported like any module) or
    "path/to/file.py:attribute" (loaded from the file, relative to the working directory).

    Raises ValueError with a one-line reason: a malformed reference, a module that does not import
    (with the exception it raised), or a missing attribute.
    """
    module_name, sep, attr = ref.rpartition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{ref!r} is not of the form package.module:function or path/to/file.py:function")
    try:
        if module_name.endswith(".py"):
            path = Path(module_name).expanduser().resolve()
            if not path.is_file():
                raise ValueError(f"no such file {module_name!r}")
            name = f"mathrl_user_{path.stem}_{zlib.crc32(str(path).encode()):08x}"  # one module per file, loaded once
            module = sys.modules.get(name)
            if module is None:
                spec = importlib.util.spec_from_file_location(name, path)
                module = importlib.util.module_from_spec(spec)
                sys.modules[name] = module
                try:
                    spec.loader.exec_module(module)
                except BaseException:
                    del sys.modules[name]
                    raise
        else:
            module = importlib.import_module(module_name)
    except ValueError:
        raise
    except Exception as e:
        local = Path(module_name.replace(".", "/") + ".py")
        if isinstance(e, ModuleNotFoundError) and e.name == module_name.split(".")[0] and local.is_file():
            # the working directory is not on the import path of the `mathrl` command (nor of its workers)
            raise ValueError(f"module {module_name!r} does not import ({type(e).__name__}: {e}); {local} is in the "
                             f"working directory: give it as a file, '{local}:{attr}'") from None
        raise ValueError(f"module {module_name!r} does not import ({type(e).__name__}: {e})") from None
    if not hasattr(module, attr):
        raise ValueError(f"module {module_name!r} has no {attr!r}")
    return getattr(module, attr)
