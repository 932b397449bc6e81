"""Load math problems from JSON Lines or Parquet files, or Hugging Face datasets, whose field names differ by source.

A source is a path ending in .jsonl or .parquet, or "hf:<name>[:<config>][@<split>]" for a dataset that
`datasets.load_dataset` can open: a Hub name (needs network or a cached copy) or a local folder of data
files. A `FieldMap` says which field holds the question and how to get the gold answer out of a row;
`PRESETS` holds one for each file in shared/data/math (see its README.md), keyed by file stem, and
`HF_PRESETS` one for well-known Hub datasets:

    result = load_problems("shared/data/math/math_train.jsonl", on_error="skip")
    result.skipped, result.skipped_reasons   # -> 4, {"field 'answer' is null": 2, "field 'answer' is empty": 2}
    load_problems("hf:HuggingFaceH4/MATH-500@test"), load_problems("hf:openai/gsm8k:main@train")  # preset, config "main"

Bad rows raise `DataError` naming source, row and problem ("math_train.jsonl:887: field 'answer' is
null"; for Parquet and Hugging Face sources the row is the 1-based row number) instead of reaching
training as an empty gold answer that no completion can ever match.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from mathrl.config import DATA_FILE_SUFFIXES  # the local file formats load_problems reads
from mathrl.tasks.base import Problem
from mathrl.tasks.rows import DataError, FieldMap, row_to_problem

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
            result.problems.append(row_to_problem(row, fields, where, stem, row_no))
        except DataError as e:
            if on_error == "raise":
                raise
            reasons[e.reason] += 1
    result.skipped = sum(reasons.values())
    result.skipped_reasons = dict(reasons)
    return result
