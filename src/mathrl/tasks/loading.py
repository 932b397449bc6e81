"""Load math problems from JSON Lines or Parquet files, or Hugging Face datasets, whose field names
differ by source.

A source is a path ending in .jsonl or .parquet, or "hf:<name>[:<config>][@<split>]" for a dataset
that `datasets.load_dataset` can open: a Hub name (needs network or a cached copy) or a local folder
of data files. A `FieldMap` says which field holds the question and how to get the gold answer out of
a row; `PRESETS` holds one for each file in shared/data/math (see its README.md), keyed by file stem,
and `HF_PRESETS` one for well-known Hub datasets. Usage:

    from mathrl.tasks.loading import load_problems
    result = load_problems("shared/data/math/math_train.jsonl", on_error="skip")
    result.problems[0].answer, result.skipped, result.skipped_reasons
    # -> '0', 4, {"field 'answer' is null": 2, "field 'answer' is empty": 2}
    load_problems("hf:HuggingFaceH4/MATH-500@test")      # preset field map, split "test"
    load_problems("hf:openai/gsm8k:main@train")          # config "main"

Bad rows raise `DataError` naming source, row and problem ("math_train.jsonl:887: field 'answer' is
null"; for Parquet and Hugging Face sources the row is the 1-based row number) instead of reaching
training as an empty gold answer that no completion can ever match.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from mathrl.config import DATA_FILE_SUFFIXES  # the local file formats load_problems reads
from mathrl.reward.extract import extract_boxes, reference_answer
from mathrl.tasks.base import Problem

__all__ = [
    "DATA_FILE_SUFFIXES",
    "DataError",
    "FieldMap",
    "HF_PRESETS",
    "HfSource",
    "LoadResult",
    "PRESETS",
    "load_jsonl",
    "load_problems",
    "preset_for",
    "source_name",
]



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


# One FieldMap per file in shared/data/math; the key is the file stem.
PRESETS: dict[str, FieldMap] = {
    "aime24": FieldMap(id="id"),
    "aime25": FieldMap(id="id"),
    "amc23": FieldMap(id="id"),  # answers are JSON floats (27.0), stored as "27"
    "minerva_math": FieldMap(answer=None, answer_from_solution="solution", id="idx"),
    # `context` is null in every row of this copy, so the question field alone is the problem.
    "olympiadbench": FieldMap(question="question", answer="final_answer", id="id"),
    "math500": FieldMap(id="unique_id"),
    "math_train": FieldMap(),  # 2 rows have answer null and 2 answer "": use on_error="skip"
    "gsm8k_train": FieldMap(question="question", answer_after="####"),
    "gsm8k_test": FieldMap(question="question", answer_after="####"),
}


# Well-known Hugging Face Hub datasets whose fields match a file preset.
HF_PRESETS: dict[str, FieldMap] = {
    "HuggingFaceH4/MATH-500": PRESETS["math500"],
    "openai/gsm8k": PRESETS["gsm8k_test"],  # config "main" or "socratic"
}


@dataclass
class LoadResult:
    """Problems loaded from one source and what was skipped (only with on_error="skip")."""

    problems: list[Problem]
    skipped: int = 0
    skipped_reasons: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class HfSource:
    """A Hugging Face dataset named as "hf:<name>[:<config>][@<split>]"."""

    name: str
    config: str | None
    split: str | None

    @classmethod
    def parse(cls, source: str) -> HfSource | None:
        """The parsed source, or None when `source` does not start with "hf:"."""
        if not source.startswith("hf:"):
            return None
        rest, _, split = source[3:].partition("@")
        name, _, config = rest.partition(":")
        if not name:
            raise ValueError(f"{source!r}: expected hf:<name>[:<config>][@<split>], e.g. hf:openai/gsm8k:main@test")
        return cls(name=name, config=config or None, split=split or None)


def source_name(source: str | Path, default_split: str = "train") -> str:
    """Short name of a source, used in problem ids and eval metric keys: the file stem, or for
    "hf:openai/gsm8k:main@test" the last part of the dataset name and the split ("gsm8k_test")."""
    hf = HfSource.parse(str(source))
    if hf is None:
        return Path(source).stem
    return f"{Path(hf.name).name}_{hf.split or default_split}"


def preset_for(source: str | Path) -> FieldMap:
    """The FieldMap of a known source (a shared/data/math file stem, or a Hub dataset in HF_PRESETS),
    else the default FieldMap()."""
    hf = HfSource.parse(str(source))
    if hf is not None:
        return HF_PRESETS.get(hf.name, FieldMap())
    return PRESETS.get(Path(source).stem, FieldMap())


def load_problems(
    source: str | Path,
    fields: FieldMap | None = None,
    *,
    on_error: Literal["raise", "skip"] = "raise",
    limit: int | None = None,
    default_split: str = "train",
) -> LoadResult:
    """Problems from a .jsonl or .parquet file or an "hf:" dataset, with the FieldMap chosen for you:
    `fields` when given, else `preset_for(source)`.

    `default_split` is the split of an "hf:" source that names none. A bare preset name with no such
    file ("math500") raises FileNotFoundError saying which file to pass, rather than guessing a data
    folder. See `load_jsonl` for on_error and limit.
    """
    if fields is None:
        fields = preset_for(source)
    hf = HfSource.parse(str(source))
    if hf is not None:
        split = hf.split or default_split
        label = f"hf:{hf.name}" + (f":{hf.config}" if hf.config else "") + f"@{split}"
        rows = _hf_rows(hf, split, label)
        return _collect(rows, fields, label, source_name(source, default_split), on_error, limit)
    path = Path(source)
    if not path.exists():
        if str(path) in PRESETS:
            raise FileNotFoundError(
                f"{str(path)!r} is a preset name, not a file: pass the path of {path}.jsonl (the "
                f"copy shipped with the project is shared/data/math/{path}.jsonl)"
            )
        raise FileNotFoundError(f"{str(path)!r}: no such data file (give a .jsonl or .parquet file, or hf:<name>)")
    if path.suffix == ".parquet":
        return _collect(_parquet_rows(path), fields, str(path), path.stem, on_error, limit)
    if path.suffix == ".jsonl":
        return load_jsonl(path, fields, on_error=on_error, limit=limit)
    raise ValueError(f"{str(path)!r}: unknown data format {path.suffix!r} (give a .jsonl or .parquet file, or hf:<name>)")


def load_jsonl(
    path: str | Path,
    fields: FieldMap,
    *,
    on_error: Literal["raise", "skip"] = "raise",
    limit: int | None = None,
) -> LoadResult:
    """Read one Problem per non-blank line of a JSON Lines file.

    A malformed row (invalid JSON, not an object, question or answer field missing, null or empty,
    no \\boxed{} or `answer_after` marker where one is needed) raises `DataError` with file and
    line; with on_error="skip" it is skipped and counted under its reason instead.
    `limit` stops after that many problems have been loaded (skipped rows do not count).
    Problem.meta holds every other scalar field of the row (e.g. level, type, difficulty, and the
    solution text when it is not the answer source) so curricula can filter on them.
    """
    path = Path(path)
    return _collect(_jsonl_rows(path), fields, str(path), path.stem, on_error, limit)


# ----------------------------------------------------------------------------- rows of each format


Row = dict[str, Any] | DataError  # a decoded row, or why it could not be decoded


def _jsonl_rows(path: Path) -> Iterator[tuple[int, Row]]:
    with path.open("rb") as f:  # decoded line by line: one bad line is one bad row, named by its line number
        for line_no, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield line_no, DataError(path, line_no, "not UTF-8 text", f"byte {e.start} of the line; re-save the "
                                         "file as UTF-8, or use data.on_error=skip to skip such rows")
                continue
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                yield line_no, DataError(path, line_no, "invalid JSON", f"{e.msg}, column {e.colno}")
                continue
            if not isinstance(row, dict):
                yield line_no, DataError(path, line_no, f"row is a JSON {type(row).__name__}, not an object")
                continue
            yield line_no, row


def _parquet_rows(path: Path) -> Iterator[tuple[int, Row]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise ValueError(f"{path}: not a readable Parquet file ({e})") from e
    row_no = 0
    for batch in table.iter_batches(batch_size=1024):
        for row in batch.to_pylist():  # plain Python values: str, int, float, list, dict, None
            row_no += 1
            yield row_no, row


def _hf_rows(hf: HfSource, split: str, label: str) -> Iterator[tuple[int, Row]]:
    try:
        import datasets
    except ImportError as e:
        raise ImportError(f"{label}: loading Hugging Face datasets needs the `datasets` package "
                          "(pip install datasets)") from e
    try:
        dataset = datasets.load_dataset(hf.name, hf.config, split=split)
    except Exception as e:  # noqa: BLE001 - the library raises many kinds; all mean "cannot load"
        hint = ""
        if isinstance(e, (ConnectionError, OSError)):
            hint = ("; without network, a dataset downloaded before loads from the cache with "
                    "HF_DATASETS_OFFLINE=1, and a local folder of data files loads as hf:/path/to/folder")
        raise ValueError(f"could not load {label}: {type(e).__name__}: {e}{hint}") from e
    for row_no, row in enumerate(dataset, start=1):
        yield row_no, row


def _collect(
    rows: Iterable[tuple[int, Row]],
    fields: FieldMap,
    where: str,
    stem: str,
    on_error: Literal["raise", "skip"],
    limit: int | None,
) -> LoadResult:
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0 or None, got {limit}")
    result = LoadResult(problems=[])
    reasons: Counter[str] = Counter()
    for row_no, row in rows:
        if limit is not None and len(result.problems) >= limit:
            break
        try:
            if isinstance(row, DataError):
                raise row
            result.problems.append(_row_to_problem(row, fields, where, stem, row_no))
        except DataError as e:
            if on_error == "raise":
                raise
            reasons[e.reason] += 1
    result.skipped = sum(reasons.values())
    result.skipped_reasons = dict(reasons)
    return result


# ----------------------------------------------------------------------------- one row


_Fail = Callable[..., DataError]  # (reason, detail=None): a DataError located at the current row


def _row_to_problem(row: dict[str, Any], fields: FieldMap, where: str, stem: str, row_no: int) -> Problem:
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
