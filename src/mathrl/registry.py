"""Named extension points: the advantage estimators (algo/estimators.py), the rollout engines
(rollout/factory.py), the prompt templates (tasks/prompts.py) and the shipped model architectures
(model/init.py). Each implementation registers itself under the name a config field chooses it by;
the config accepts exactly the registered names, and an unknown one is an error that names the field
and the choices.

    from mathrl.registry import ADVANTAGE_ESTIMATORS
    ADVANTAGE_ESTIMATORS.register("mine", Estimator(fn=my_advantages))   # then algo.adv.estimator=mine

This module imports nothing else of mathrl: the config (the bottom layer) can use it. The built-in
implementations register when their module is imported; a registry imports its `home` module the
first time its names are asked for.
"""

from __future__ import annotations

import importlib
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
