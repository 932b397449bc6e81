"""One row of a data file as a Problem: where its question, gold answer and id are (`FieldMap`), and the
one-line `DataError` naming what is wrong with a row, with a hint at the field map when a field is
missing. Which sources and formats are read: tasks/loading.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mathrl.reward.extract import extract_boxes, reference_answer
from mathrl.tasks.base import Problem

__all__ = ["DataError", "FieldMap", "row_to_problem"]


class DataError(ValueError):
    """A malformed row in a data file.

    The message is "<source>:<row>: <reason> (<detail>)" (a JSONL row is its line number, a Parquet or
    Hugging Face row its 1-based row number); `reason` alone is the key under which
    on_error="skip" counts the row, so it must not vary from row to row (detail may).
    """

    def __init__(self, path: str | Path, line: int, reason: str, detail: str | None = None) -> None:
        super().__init__(f"{path}:{line}: {reason}" + (f" ({detail})" if detail else ""))
        self.path = str(path)
        self.line = line
        self.reason = reason


@dataclass(frozen=True)
class FieldMap:
    """Where a row keeps its question, gold answer and id.

    Exactly one of `answer` and `answer_from_solution` names the source of the gold answer.
    """

    question: str = "problem"
    """Field holding the problem text."""
    answer: str | None = "answer"
    """Field holding the gold answer: a string, a number (an integral float such as 27.0 becomes
    "27", as the verifier would otherwise compare against "27.0"), or a list of those joined with
    `answer_sep`. None when the answer comes from `answer_from_solution`."""
    answer_from_solution: str | None = None
    """Field holding a worked solution whose LAST \\boxed{...} is the gold answer (Minerva math)."""
    id: str | None = None
    """Field holding a row id. Problem ids are always "<source name>:<key>" (file stem, or see
    `source_name` for hf: sources), where key is this field's value or, when None, the 1-based line
    (JSONL) or row (Parquet, hf:) number, so ids stay unique when sources are mixed."""
    answer_sep: str = ", "
    """Separator for list-valued answers (OlympiadBench `final_answer`)."""
    answer_after: str | None = None
    """Marker such as "####" (GSM8K): the gold answer is the text after its last occurrence,
    stripped, with thousands separators removed from a plain number ("1,200" -> "1200")."""

    def __post_init__(self) -> None:
        if (self.answer is None) == (self.answer_from_solution is None):
            raise ValueError(
                "FieldMap needs exactly one gold-answer source: set `answer` (a field holding "
                "the answer) or `answer_from_solution` (a field whose last \\boxed{} is the "
                f"answer), and set the other to None; got answer={self.answer!r}, "
                f"answer_from_solution={self.answer_from_solution!r}"
            )


_Fail = Callable[..., DataError]  # (reason, detail=None): a DataError located at the current row


def row_to_problem(row: dict[str, Any], fields: FieldMap, where: str, stem: str, row_no: int) -> Problem:
    """The Problem of one row, its id "<stem>:<key>"; a `DataError` located at `where`:`row_no` names what is wrong
    and, for a missing field, the fields the row has that could hold it."""
    def fail(reason: str, detail: str | None = None) -> DataError:
        return DataError(where, row_no, reason, detail)

    absent = [name for name in _mapped_fields(fields) if name not in row]
    if len(absent) > 1:  # name them all at once, not one per attempt
        raise fail(f"missing fields {_quoted_list(absent)}", _missing_fields_hint(row, absent, fields))
    question = _required_field(row, fields.question, fail, fields)
    if not isinstance(question, str):
        kind = type(question).__name__
        raise fail(f"field {fields.question!r} is of type {kind}, not a string")

    if fields.answer_from_solution is not None:
        source = fields.answer_from_solution
        solution = _required_field(row, source, fail, fields)
        if not isinstance(solution, str):
            raise fail(f"field {source!r} is of type {type(solution).__name__}, not a string")
        answer = _last_boxed(solution)
        if answer is None:
            raise fail(f"field {source!r} has no \\boxed{{...}}")
    else:
        source = fields.answer
        assert source is not None  # FieldMap.__post_init__ guarantees exactly one source
        answer = _answer_to_str(_required_field(row, source, fail, fields), fields.answer_sep, source, fail)

    if fields.answer_after is not None:
        marker = fields.answer_after
        if marker not in answer:
            raise fail(f"field {source!r} has no {marker!r} marker")
        answer = _strip_number_commas(answer.rsplit(marker, 1)[1].strip())
    answer = answer.strip()
    if not answer:  # e.g. \boxed{} or nothing after "####"
        raise fail(f"field {source!r} yields an empty answer")

    if fields.id is None:
        key = str(row_no)
    else:
        key = _answer_to_str(_required_field(row, fields.id, fail, fields), "_", fields.id, fail)
    used = {fields.question, source, fields.id}
    meta = {k: v for k, v in row.items() if k not in used and _is_scalar(v)}
    return Problem(id=f"{stem}:{key}", question=question, answer=answer, meta=meta)


_SKIP_HINT = "use data.on_error=skip to skip and count such rows"


def _required_field(row: dict[str, Any], name: str, fail: _Fail, fields: FieldMap) -> Any:
    if name not in row:
        raise fail(f"missing field {name!r}", _field_map_hint(row, name, fields))
    value = row[name]
    if value is None:
        raise fail(f"field {name!r} is null", _SKIP_HINT)
    if isinstance(value, (str, list)) and not value:
        raise fail(f"field {name!r} is empty", _SKIP_HINT)
    if isinstance(value, str) and not value.strip():
        raise fail(f"field {name!r} is empty", _SKIP_HINT)
    return value


_QUESTION_NAMES = ("problem", "question", "prompt", "input", "query", "instruction")
_ANSWER_NAMES = ("answer", "final_answer", "solution", "output", "target", "response")


def _field_map_hint(row: dict[str, Any], missing: str, fields: FieldMap) -> str:
    """Which config key maps the `missing` field, and the likely setting from the row's own fields.

    The key named is the one that chose `missing`: `data.question_field` for the question,
    `data.answer_field` (or `data.answer_from_solution`) for the gold answer; the id field comes
    from a known source's preset only.
    """
    keys = [str(k) for k in row]
    head = f"the row has fields {', '.join(keys[:12])}"
    question = next((k for k in _QUESTION_NAMES if k in row and k != missing), None)
    answer = next((k for k in _ANSWER_NAMES if k in row and k not in (missing, question, fields.question)), None)
    hint: list[str] = []
    if missing == fields.question:
        if question:
            hint.append(f"data.question_field={question}")
        answer_source = fields.answer if fields.answer is not None else fields.answer_from_solution
        if answer and answer_source not in row:  # the answer is mapped wrong too: say both at once
            hint.append(f"data.answer_field={answer}")
        mapped_answer = answer_source if answer_source in row else answer
        if mapped_answer and isinstance(row[mapped_answer], str) and "####" in row[mapped_answer]:
            hint.append("data.answer_after='####'")  # GSM8K: "... #### 72"
        if question is None:
            head += "; set data.question_field to the field that holds the problem"
            return head + (f"; also try {' '.join(hint)}" if hint else "")
    elif missing == fields.id:
        return head + f"; this source's preset takes the row id from {missing!r}"
    else:  # the gold answer's source
        key = "data.answer_from_solution" if missing == fields.answer_from_solution else "data.answer_field"
        if answer:
            worked = isinstance(row[answer], str) and "\\boxed{" in row[answer]
            if worked and key == "data.answer_field":  # a worked solution: its last box is the answer
                hint.append(f"data.answer_from_solution={answer} data.answer_field=null")
            else:
                hint.append(f"{key}={answer}")
            if isinstance(row[answer], str) and "####" in row[answer]:
                hint.append("data.answer_after='####'")
        else:
            return (head + f"; set {key} to the field that holds the gold answer, "
                    "or data.on_error=skip to skip and count rows without one")
    return head + "; try " + " ".join(hint)


def _mapped_fields(fields: FieldMap) -> list[str]:
    """The fields a row must have under `fields`: question, gold-answer source and id (when mapped)."""
    answer_source = fields.answer if fields.answer is not None else fields.answer_from_solution
    return [name for name in (fields.question, answer_source, fields.id) if name is not None]


def _quoted_list(names: list[str]) -> str:
    """['a', 'b', 'c'] -> "'a', 'b' and 'c'"."""
    quoted = [repr(n) for n in names]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " and " + quoted[-1]


def _missing_fields_hint(row: dict[str, Any], missing: list[str], fields: FieldMap) -> str:
    """The row's fields and, for each of the `missing` ones, the config key that maps it: set to a
    likely field of the row when it has one, else what the key must name."""
    keys = [str(k) for k in row]
    question = next((k for k in _QUESTION_NAMES if k in row), None)
    answer = next((k for k in _ANSWER_NAMES if k in row and k != question), None)
    tries: list[str] = []
    sets: list[str] = []
    notes: list[str] = []
    for name in missing:
        if name == fields.question:
            if question:
                tries.append(f"data.question_field={question}")
            else:
                sets.append("data.question_field to the field that holds the problem")
        elif name == fields.id:
            notes.append(f"this source's preset takes the row id from {name!r}")
        else:
            key = "data.answer_from_solution" if name == fields.answer_from_solution else "data.answer_field"
            if answer is None:
                sets.append(f"{key} to the field that holds the gold answer")
            elif key == "data.answer_field" and isinstance(row[answer], str) and "\\boxed{" in row[answer]:
                tries.append(f"data.answer_from_solution={answer} data.answer_field=null")
            else:
                tries.append(f"{key}={answer}")
            if answer and fields.answer_after is None and isinstance(row[answer], str) and "####" in row[answer]:
                tries.append("data.answer_after='####'")
    hint = f"the row has fields {', '.join(keys[:12])}"
    if tries:
        hint += "; try " + " ".join(tries)
    if sets:
        hint += "; set " + " and ".join(sets)
    return "; ".join([hint, *notes])


def _answer_to_str(value: Any, sep: str, name: str, fail: _Fail) -> str:
    if isinstance(value, list):
        return sep.join(_answer_to_str(v, sep, name, fail) for v in value)
    if isinstance(value, bool):  # before int: bool is an int subclass, and never a math answer
        raise fail(f"field {name!r} is a bool")
    if isinstance(value, float) and value.is_integer():
        # amc23 stores 27 as 27.0; "27.0" would read as a different answer to a string comparison.
        return str(int(value))
    if isinstance(value, (str, int, float)):
        return str(value)
    kind = type(value).__name__
    raise fail(f"field {name!r} is of type {kind}, not a string, number or list")


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


_NUMBER_WITH_COMMAS = re.compile(r"[-+]?\d{1,3}(,\d{3})+(\.\d+)?")


def _strip_number_commas(text: str) -> str:
    # Only a whole-string number like "1,200" is touched: "(1, 2)" or "3,4" are answers in their own
    # right, not thousands separators.
    return text.replace(",", "") if _NUMBER_WITH_COMMAS.fullmatch(text) else text


def _last_boxed(text: str) -> str | None:
    """The gold answer of a worked solution: the boxes of its final answer, read by the reward's own
    extractor (`mathrl.reward.extract.reference_answer`), so that gold and model answers are read
    alike (``\\boxed{1} and \\boxed{2}`` is ``1, 2``). ``None`` when the text has no closed box."""
    if not extract_boxes(text):
        return None
    return reference_answer(text)
