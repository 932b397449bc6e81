"""A config field is declared once: its type and domain in its annotation, its default and help in
`knob(default, "help")` (mathrl/config/tree.py); the checks, `mathrl config`'s listing and the tests
read them from there.

Run: python -m pytest tests/config/test_config_fields.py -q
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import typing
from pathlib import Path
from typing import Annotated

import pytest

from mathrl.config import Config, ConfigError, load_config
from mathrl.config.schema import (
    Count,
    Finite,
    Positive,
    Range,
    check_domains,
    domain_of,
    domains,
    field_docs,
    knob,
    reference,
    section,
)

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "mathrl"


@dataclasses.dataclass
class Entry:
    name: str = knob("a", "the entry's name")
    weight: Finite = knob(1.0, "its weight")


@dataclasses.dataclass
class Section:
    steps: Count = knob(2, "a count")
    cap: Annotated[float, Range(1, open_low=True, why="1 is no cap")] | None = knob(None, "an optional with its own domain")
    lr: Positive[float] = knob(0.1,
        "a generic domain, given its type; "
        "a help wrapped over lines")
    label: str = knob("x", "no domain: only the type constrains it")
    entries: list[Entry] = knob([Entry()], "a list of sections")


@dataclasses.dataclass
class Tree:
    """The tree."""

    section: Section = section(Section, "a section")


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


def test_help_is_the_fields_metadata_and_a_list_default_is_copied():
    assert field_docs(Section)["lr"] == "a generic domain, given its type; a help wrapped over lines"
    assert {e.key: e.doc for e in reference(Tree)}["section.entries"] == "a list of sections"
    assert [i.doc for e in reference(Tree) for i in e.items] == ["the entry's name", "its weight"]
    first, second = Section(), Section()
    assert first.entries == second.entries == [Entry()]
    first.entries[0].weight = 2.0
    assert second.entries[0].weight == 1.0  # each config gets its own copy of the default


def _fields(cls: type, prefix: str = ""):
    """(dotted key, field, its type) of every field of the config dataclass `cls`, sections and the
    entries of a list of sections (`rollout.tools[].name`) descended."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        yield prefix + f.name, f, tp
        item = typing.get_args(tp)[0] if typing.get_origin(tp) is list else None
        if dataclasses.is_dataclass(tp):
            yield from _fields(tp, f"{prefix}{f.name}.")
        elif dataclasses.is_dataclass(item):
            yield from _fields(item, f"{prefix}{f.name}[].")


def test_every_field_of_the_tree_has_help_metadata():
    # a field's help is its metadata (knob / section), never a comment read from the source; a section
    # may go without, its docstring is its doc
    fields = list(_fields(Config))
    assert len(fields) > 200
    bare = [key for key, f, tp in fields if not dataclasses.is_dataclass(tp) and not f.metadata.get("help", "").strip()]
    assert bare == [], f"config fields without help: {bare}"
    undocumented = [key for key, f, tp in fields if dataclasses.is_dataclass(tp) and not f.metadata.get("help")
                    and not inspect.getdoc(tp)]
    assert undocumented == [], f"sections with neither help nor a docstring: {undocumented}"


def test_mathrl_config_lists_help_without_reading_the_source(monkeypatch, capsys):
    # an install where mathrl's source cannot be read (a zip) still lists every field's help: with the
    # help read from `#` comments, this listing had the sections' docstrings and no field's help
    from mathrl.cli import main

    getsource = inspect.getsource

    def no_mathrl_source(obj, *args, **kwargs):
        if (getattr(obj, "__module__", None) or getattr(obj, "__name__", "")).startswith("mathrl"):
            raise OSError("could not get source code")
        return getsource(obj, *args, **kwargs)  # other libraries (torch reads its own at import) keep theirs

    monkeypatch.setattr(inspect, "getsource", no_mathrl_source)
    assert main(["config"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "train.steps: int = 50  [>= 1]  # RL steps (one rollout batch each)" in lines
    assert "algo.kl:  # KL to the reference model" in lines
    keys = [k for e in reference(Config) if not e.section for k in [e.key, *(f"  {i.key}" for i in e.items)]]
    assert [ln.split(":", 1)[0] for ln in lines if " = " in ln and "  # " in ln] == keys


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


@pytest.mark.parametrize("older, now", [(True, "token"), (False, "none")])
def test_an_earlier_runs_value_of_a_changed_field_loads_as_what_it_meant(tmp_path, older, now):
    # why: algo.adv.gdpo_whiten was a bool before token | sequence | none; an earlier run's config.yaml (resumed,
    # or read by an analysis) must still load, as the choice its value meant
    from mathrl.config.load import OLDER_VALUES

    recipe = tmp_path / "config.yaml"
    recipe.write_text(f"algo:\n  adv:\n    estimator: gdpo\n    gdpo_whiten: {str(older).lower()}\n")
    assert load_config(recipe, check_paths=False).algo.adv.gdpo_whiten == now == OLDER_VALUES["algo.adv.gdpo_whiten"][older]
    with pytest.raises(ConfigError, match="gdpo_whiten: 'yes' is not one of"):  # other values are checked as ever
        load_config(None, ["algo.adv.estimator=gdpo", "algo.adv.gdpo_whiten=yes"])


def test_an_earlier_runs_rule_name_loads_as_the_rule_it_named(tmp_path):
    # why: k2_rs became k2_mean_rs when k2_max_rs joined it; an earlier run's config.yaml names k2_rs and must
    # load as the mean rule (not be refused with a hint at k3_rs), the other rules of the list untouched
    recipe = tmp_path / "config.yaml"
    recipe.write_text("algo:\n  rollout_correction:\n    masks: [geo_rs, k2_rs]\n    k2_rs_threshold: 0.02\n")
    assert load_config(recipe, check_paths=False).algo.rollout_correction.masks == ["geo_rs", "k2_mean_rs"]
    assert load_config(None, ["algo.rollout_correction.masks=[k2_rs]"]).algo.rollout_correction.masks == ["k2_mean_rs"]
    with pytest.raises(ConfigError, match="'k2_rx' is not one of"):  # other names are checked as ever
        load_config(None, ["algo.rollout_correction.masks=[k2_rx]"])
