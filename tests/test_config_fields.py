"""A config field is declared once: its type, domain, default and doc on one line of the tree
(mathrl/config/tree.py); the checks, `mathrl config`'s listing and the tests read them from there.

Run: python -m pytest tests/test_config_fields.py -q
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Annotated

import pytest

from mathrl.config import Config, ConfigError, load_config
from mathrl.config.schema import Count, Finite, Positive, Range, check_domains, domain_of, domains, reference

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "mathrl"


@dataclasses.dataclass
class Entry:
    name: str = "a"  # the entry's name
    weight: Finite = 1.0  # its weight


@dataclasses.dataclass
class Section:
    steps: Count = 2  # a count
    cap: Annotated[float, Range(1, open_low=True, why="1 is no cap")] | None = None  # an optional with its own domain
    lr: Positive[float] = 0.1  # a generic domain, given its type
    label: str = "x"  # no domain: only the type constrains it
    entries: list[Entry] = dataclasses.field(default_factory=lambda: [Entry()])  # a list of sections


@dataclasses.dataclass
class Tree:
    section: Section = dataclasses.field(default_factory=Section)  # a section


def test_a_domain_on_the_field_is_what_is_checked_and_listed():
    # one line declares the field; the check, the list of domains and the reference all read it
    assert domains(Tree) == {"section.steps": Range(1), "section.cap": Range(1, open_low=True, why="1 is no cap"),
                             "section.lr": Range(0, open_low=True)}
    assert domain_of(str) is None and domain_of(Count | None) == Range(1)  # also the non-null side of an optional
    listed = {e.key: e.domain for e in reference(Tree)}
    assert listed == {"section": "", "section.steps": ">= 1", "section.cap": "> 1", "section.lr": "> 0",
                      "section.label": "", "section.entries": ""}
    tree = Tree(Section(steps=0, cap=1.0, lr=float("nan"), entries=[Entry("b", float("inf")), Entry("c", 2.0)]))
    assert check_domains(tree) == [
        "section.steps=0: must be >= 1",
        "section.cap=1.0: must be > 1 (1 is no cap)",
        "section.lr=nan: must be > 0",
        "section.entries[0] (b): weight=inf must be a finite number",  # an item is named as its other rules name it
    ]
    assert check_domains(Tree()) == []


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        # the fields of a reward.functions entry carry their domains as every other field does
        ("{name: m, fn: format, weight: .inf}", "reward.functions[0] (m): weight=inf must be a finite number"),
        ("{name: m, fn: format, timeout_s: 0}", "reward.functions[0] (m): timeout_s=0.0 must be > 0 (seconds, or null for the default)"),
        ("{name: m, fn: format, batch_size: 0}", "reward.functions[0] (m): batch_size=0 must be >= 1 (or null for the default)"),
        ("{name: m, fn: format, retries: -1}", "reward.functions[0] (m): retries=-1 must be >= 0"),
        ("{name: 'm/x', fn: format}", "reward.functions[0] (m/x): name='m/x' must be letters, digits, _ or -"),
    ],
)
def test_list_items_are_checked_against_their_fields_domains(entry, message):
    with pytest.raises(ConfigError) as info:
        load_config(None, [f"reward.functions=[{entry}]"])
    assert str(info.value).startswith(message), str(info.value)


def test_the_tiny_base_name_is_one_object():
    # the config (its default and its rules) and the model room (which builds it) name it with one constant
    from mathrl.config import TINY_BASE
    from mathrl.model import paths

    assert paths.TINY_BASE is TINY_BASE and Config().model.path is TINY_BASE


def test_the_model_files_are_read_by_the_model_room():
    # model.path's files (can it load, its context) are read in model/paths.py; the config, a lower layer,
    # asks through its registry, so a shipped architecture's context is known without loading it
    from mathrl.config import MODEL_FILES
    from mathrl.model.paths import context_length, model_path_problem

    assert MODEL_FILES.get("context_length") is context_length and MODEL_FILES.get("path_problem") is model_path_problem
    assert context_length("config:qwen2.5-0.5b") == 32768
    with pytest.raises(ConfigError, match=re.escape("leave no room for a prompt in the model's 32768 positions")):
        load_config(None, ["model.path=config:qwen2.5-0.5b", "model.init=random", "rollout.max_new_tokens=40000"])
