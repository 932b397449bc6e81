"""Which config fields a piece of code reads: every attribute read of a config field, recorded by its
dotted key while `recording_reads` is open. It finds the settings that have no effect under the chosen
ones (a field the run never reads), the check behind the "counts only when" rules (schema.When).

    with recording_reads() as read:
        train(cfg)
    "algo.kl.coef" in read      # False under algo.kl.use=none

Reads made by the config's own checking and writing (config/rules.py, schema.py, load.py: `validate`,
`dump_yaml`) are not the run's use of a field and are left out; so are reads inside `dataclasses` and
`copy` called from there; `vars(section)` reads all its fields. A list of sections (reward.functions) records its entries' fields as
`reward.functions[].fn`. Only this process's reads: generator processes are not seen.
"""

from __future__ import annotations

import dataclasses
import sys
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_CONFIG_DIR = Path(__file__).resolve().parent
_CHECKING = {str(_CONFIG_DIR / name) for name in ("rules.py", "schema.py", "load.py")}


def section_classes(cls: type, prefix: str = "") -> dict[type, str]:
    """{section dataclass: its dotted prefix} of the tree under `cls`, lists of sections as `key[].`."""
    out = {cls: prefix}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        item = typing.get_args(tp)[0] if typing.get_origin(tp) is list else None
        for sub, tail in ((tp, "."), (item, "[].")):
            if dataclasses.is_dataclass(sub):
                found = section_classes(sub, prefix + f.name + tail)
                clash = {c for c in found if c in out and out[c] != found[c]}
                if clash:
                    raise ValueError(f"section class {clash.pop().__name__} is used at two places: cannot name its reads")
                out.update(found)
    return out


def _from_checking() -> bool:
    """Whether the read comes from the config's own checking or writing (anywhere up the stack)."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename in _CHECKING:
            return True
        frame = frame.f_back
    return False


@contextmanager
def recording_reads(root: type | None = None) -> Iterator[set[str]]:
    """The set of dotted keys read while open (filled in place); `root` defaults to mathrl's Config."""
    if root is None:
        from mathrl.config.tree import Config as root
    prefixes = section_classes(root)
    names = {cls: {f.name for f in dataclasses.fields(cls)} for cls in prefixes}
    read: set[str] = set()

    def getattribute(self, name):
        value = object.__getattribute__(self, name)
        cls = type(self)
        if name in names.get(cls, ()) and not dataclasses.is_dataclass(value) and not _from_checking():
            read.add(prefixes[cls] + name)
        elif name == "__dict__" and cls in names and not _from_checking():  # vars(section): every field of it
            read.update(prefixes[cls] + field for field in names[cls])
        return value

    saved = {cls: cls.__dict__.get("__getattribute__") for cls in prefixes}
    for cls in prefixes:
        cls.__getattribute__ = getattribute
    try:
        yield read
    finally:
        for cls, old in saved.items():
            if old is None:
                del cls.__getattribute__
            else:
                cls.__getattribute__ = old
