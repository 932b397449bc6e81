"""Tests for mathrl.tasks.loading (loading the shared math files) and mathrl.tasks.prompts.

The data files live in <repo>/../shared/data/math (see its README.md); set MATHRL_SHARED_DATA to
that folder (or to the shared/ folder above it) to use another copy. Tests that need the files are
skipped with the path they looked in when it is absent.

Run: python -m pytest tests/tasks/test_tasks_loading.py -q
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import shared_math_dir  # tests/ is on sys.path (pytest's default rootdir-relative import)
from mathrl.tasks.loading import (
    HF_PRESETS,
    PRESETS,
    DataError,
    FieldMap,
    HfSource,
    load_jsonl,
    load_problems,
    preset_for,
    source_name,
)
from mathrl.tasks.prompts import BOXED_INSTRUCTION, TEMPLATES, render_chat, render_prompt
from mathrl.tasks.rows import _last_boxed

DATA = shared_math_dir()


def _data_file(stem: str) -> Path:
    path = DATA / f"{stem}.jsonl"
    if not path.is_file():
        pytest.skip(f"{path} not found; set MATHRL_SHARED_DATA to the folder holding the files")
    return path


# Row counts from shared/data/math/README.md. math_train has 7474 rows of which 4 have no answer.
EXPECTED_ROWS = {
    "aime24": 30,
    "aime25": 30,
    "amc23": 40,
    "minerva_math": 272,
    "olympiadbench": 675,
    "math500": 500,
    "math_train": 7474 - 4,
    "gsm8k_train": 7473,
    "gsm8k_test": 1319,
}


def test_every_preset_has_an_expected_row_count() -> None:
    assert set(PRESETS) == set(EXPECTED_ROWS)


# ----------------------------------------------------------------------------- shared files


@pytest.mark.parametrize("stem", sorted(EXPECTED_ROWS))
def test_shared_file_loads_with_its_preset(stem: str) -> None:
    path = _data_file(stem)
    result = load_problems(path, on_error="skip" if stem == "math_train" else "raise")
    assert len(result.problems) == EXPECTED_ROWS[stem]
    assert all(p.question.strip() and p.answer.strip() for p in result.problems)
    ids = [p.id for p in result.problems]
    assert len(set(ids)) == len(ids), "ids must be unique within a file"
    assert all(i.startswith(f"{stem}:") for i in ids)


def _bad_answer_lines(path: Path) -> tuple[list[int], list[int]]:
    """Independent scan: 1-based lines whose answer is null, and whose answer is ''."""
    null, empty = [], []
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            answer = json.loads(line)["answer"]
            if answer is None:
                null.append(line_no)
            elif answer == "":
                empty.append(line_no)
    return null, empty


def test_math_train_raise_names_file_and_first_null_line() -> None:
    path = _data_file("math_train")
    null, _ = _bad_answer_lines(path)
    with pytest.raises(DataError) as info:
        load_problems(path)
    assert str(info.value) == f"{path}:{null[0]}: field 'answer' is null (use data.on_error=skip to skip and count such rows)"
    assert (info.value.line, info.value.reason) == (null[0], "field 'answer' is null")


def test_math_train_skip_counts_null_and_empty_answers() -> None:
    path = _data_file("math_train")
    null, empty = _bad_answer_lines(path)
    assert (len(null), len(empty)) == (2, 2)  # as the README says
    result = load_problems(path, on_error="skip")
    assert result.skipped == 4
    assert result.skipped_reasons == {"field 'answer' is null": 2, "field 'answer' is empty": 2}
    loaded_lines = {int(p.id.split(":")[1]) for p in result.problems}
    assert loaded_lines.isdisjoint(null + empty)
    # Other scalar fields are kept for curricula.
    assert set(result.problems[0].meta) == {"difficulty", "type"}


def test_gsm8k_answer_is_text_after_last_marker_without_thousands_commas() -> None:
    test = load_problems(_data_file("gsm8k_test")).problems
    assert test[0].answer == "18"  # "... every day at the farmer's market.\n#### 18"
    assert test[0].question.startswith("Janet\u2019s ducks lay 16 eggs per day.")
    train = {p.id: p for p in load_problems(_data_file("gsm8k_train")).problems}
    assert train["gsm8k_train:645"].answer == "109200000"  # "#### 109,200,000"


def test_minerva_gold_is_last_boxed_in_solution() -> None:
    problems = load_problems(_data_file("minerva_math")).problems
    assert problems[0].answer == "1.6"  # "...=\boxed{1.6} \mathrm{~cm}"
    assert problems[1].answer == "4.5e33"  # "L & \simeq \boxed{4.5e33} \mathrm{ergs}..."
    assert "solution" not in problems[0].meta  # consumed as the answer source


def test_olympiadbench_list_answer_is_kept_whole() -> None:
    problems = {p.id: p for p in load_problems(_data_file("olympiadbench")).problems}
    # final_answer == ["$(1,8,19), (2,7,13), (4,5,7)$"]: one element, its commas untouched.
    assert problems["olympiadbench:1618"].answer == "$(1,8,19), (2,7,13), (4,5,7)$"
    assert problems["olympiadbench:1618"].meta["is_multiple_answer"] is True


def test_amc23_integral_float_answers_become_integers() -> None:
    problems = load_problems(_data_file("amc23")).problems
    assert problems[0].answer == "27"  # stored as JSON 27.0


# ----------------------------------------------------------------------------- synthetic files


def _write(tmp_path: Path, name: str, lines: list[str]) -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_list_answers_are_joined_with_answer_sep(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "olympiadbench.jsonl",
        [json.dumps({"id": 7, "question": "x, y?", "final_answer": ["3", "$\\frac{1}{2}$"]})],
    )
    assert load_problems(path).problems[0].answer == "3, $\\frac{1}{2}$"
    custom = FieldMap(question="question", answer="final_answer", answer_sep=" ; ")
    assert load_jsonl(path, custom).problems[0].answer == "3 ; $\\frac{1}{2}$"


def test_malformed_json_names_file_and_line(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "broken.jsonl",
        [
            json.dumps({"problem": "1+1", "answer": "2"}),
            "",  # blank lines are ignored but still counted in line numbers
            '{"problem": "2+2", "answer": ',
            "[1, 2]",
            json.dumps({"problem": "3+3", "answer": 6}),
        ],
    )
    with pytest.raises(DataError, match=r"broken\.jsonl:3: invalid JSON \(Expecting value"):
        load_jsonl(path, FieldMap())
    result = load_jsonl(path, FieldMap(), on_error="skip")
    assert [(p.id, p.answer) for p in result.problems] == [("broken:1", "2"), ("broken:5", "6")]
    assert result.skipped_reasons == {"invalid JSON": 1, "row is a JSON list, not an object": 1}


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ({"answer": "2"}, "missing field 'problem'"),
        ({"problem": "", "answer": "2"}, "field 'problem' is empty"),
        ({"problem": "1+1", "answer": "   "}, "field 'answer' is empty"),
        ({"problem": "1+1", "answer": None}, "field 'answer' is null"),
        ({"problem": "1+1", "answer": []}, "field 'answer' is empty"),
        ({"problem": "1+1", "answer": {"v": 2}}, "field 'answer' is of type dict"),
        ({"problem": 11, "answer": "2"}, "field 'problem' is of type int, not a string"),
    ],
)
def test_bad_rows_raise_with_reason(tmp_path: Path, row: dict, reason: str) -> None:
    path = _write(tmp_path, "rows.jsonl", [json.dumps(row)])
    with pytest.raises(DataError, match=rf"rows\.jsonl:1: {reason}"):
        load_jsonl(path, FieldMap())


def test_answer_after_and_boxed_failures_are_data_errors(tmp_path: Path) -> None:
    gsm = _write(tmp_path, "g.jsonl", [json.dumps({"question": "q", "answer": "no marker"})])
    with pytest.raises(DataError, match="g.jsonl:1: field 'answer' has no '####' marker"):
        load_jsonl(gsm, FieldMap(question="question", answer_after="####"))
    minerva = FieldMap(answer=None, answer_from_solution="solution")
    sol = _write(tmp_path, "m.jsonl", [json.dumps({"problem": "q", "solution": "x = 3"})])
    with pytest.raises(DataError, match=r"m.jsonl:1: field 'solution' has no \\boxed\{\.\.\.\}"):
        load_jsonl(sol, minerva)


def test_limit_counts_loaded_problems_and_meta_keeps_scalars(tmp_path: Path) -> None:
    rows = [{"problem": f"{i}+0", "answer": str(i), "level": i, "tags": ["a"]} for i in range(5)]
    path = _write(tmp_path, "small.jsonl", [json.dumps(r) for r in rows])
    problems = load_jsonl(path, FieldMap(), limit=2).problems
    assert [p.id for p in problems] == ["small:1", "small:2"]
    assert problems[1].meta == {"level": 1}  # the list-valued "tags" is not a scalar


def test_fieldmap_needs_exactly_one_answer_source() -> None:
    with pytest.raises(ValueError, match="exactly one gold-answer source"):
        FieldMap(answer_from_solution="solution")  # answer still defaults to "answer"
    with pytest.raises(ValueError, match="exactly one gold-answer source"):
        FieldMap(answer=None)


def test_bare_preset_name_says_which_file_to_pass(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # so that no ./math500 exists
    with pytest.raises(FileNotFoundError, match="preset name, not a file.*math500.jsonl"):
        load_problems("math500")


# ----------------------------------------------------------------------------- parquet and hf:


def _write_parquet(rows: list[dict], path: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.mark.parametrize("stem", ["math500", "olympiadbench", "minerva_math", "gsm8k_test", "amc23"])
def test_parquet_copy_of_a_shared_file_loads_like_the_jsonl(stem: str, tmp_path: Path) -> None:
    # List answers (olympiadbench), boxed solutions (minerva), "####" (gsm8k) and float answers (amc23)
    # must survive the Parquet round trip: same questions, answers, ids and metadata.
    path = _data_file(stem)
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    parquet = _write_parquet(rows, tmp_path / f"{stem}.parquet")
    from_jsonl = load_problems(path).problems
    from_parquet = load_problems(parquet).problems
    assert len(from_parquet) == EXPECTED_ROWS[stem]
    assert [(p.id, p.question, p.answer, p.meta) for p in from_parquet] == [
        (p.id, p.question, p.answer, p.meta) for p in from_jsonl
    ]


def test_parquet_bad_row_names_file_and_row_or_is_skipped(tmp_path: Path) -> None:
    rows = [{"problem": "1+1", "answer": "2"}, {"problem": "2+2", "answer": "4"}, {"problem": "3+3", "answer": None}]
    parquet = _write_parquet(rows, tmp_path / "small.parquet")
    with pytest.raises(DataError) as info:
        load_problems(parquet)
    assert str(info.value) == f"{parquet}:3: field 'answer' is null (use data.on_error=skip to skip and count such rows)"
    result = load_problems(parquet, on_error="skip")
    assert [p.id for p in result.problems] == ["small:1", "small:2"]
    assert result.skipped_reasons == {"field 'answer' is null": 1}


def test_unreadable_parquet_and_unknown_files_are_clear_errors(tmp_path: Path) -> None:
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"not parquet at all")
    with pytest.raises(ValueError, match="not a readable Parquet file"):
        load_problems(broken)
    with pytest.raises(FileNotFoundError, match="no such data file"):
        load_problems(tmp_path / "missing.parquet")
    csv = tmp_path / "problems.csv"
    csv.write_text("problem,answer\n1+1,2\n")
    with pytest.raises(ValueError, match="unknown data format '.csv'"):
        load_problems(csv)


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("hf:openai/gsm8k:main@test", HfSource("openai/gsm8k", "main", "test")),
        ("hf:HuggingFaceH4/MATH-500@test", HfSource("HuggingFaceH4/MATH-500", None, "test")),
        ("hf:/data/folder", HfSource("/data/folder", None, None)),
        ("math500.jsonl", None),
    ],
)
def test_hf_source_syntax(text: str, parsed: HfSource | None) -> None:
    assert HfSource.parse(text) == parsed


def test_hf_source_without_a_name_is_an_error() -> None:
    with pytest.raises(ValueError, match="hf:<name>"):
        HfSource.parse("hf:@test")


def test_hf_presets_and_names() -> None:
    assert preset_for("hf:HuggingFaceH4/MATH-500@test") == PRESETS["math500"]
    assert preset_for("hf:openai/gsm8k:main") == PRESETS["gsm8k_test"] == HF_PRESETS["openai/gsm8k"]
    assert preset_for("hf:someone/else") == FieldMap()
    assert source_name("hf:openai/gsm8k:main@test") == "gsm8k_test"
    assert source_name("hf:openai/gsm8k:main", default_split="test") == "gsm8k_test"
    assert source_name("data/math500.parquet") == "math500"


def test_hf_local_folder_loads_each_split_with_row_numbers(tmp_path: Path) -> None:
    # datasets.load_dataset on a folder of data files (what a Hub snapshot looks like), offline.
    folder = tmp_path / "tiny_math"
    _write_parquet([{"problem": "1+1", "answer": "2", "level": 1}], folder / "data" / "train-00000-of-00001.parquet")
    _write_parquet(
        [{"problem": "2+2", "answer": "4", "level": 2}, {"problem": "3+3", "answer": "", "level": 3}],
        folder / "data" / "test-00000-of-00001.parquet",
    )
    train = load_problems(f"hf:{folder}").problems  # default split: train
    assert [(p.id, p.answer, p.meta) for p in train] == [("tiny_math_train:1", "2", {"level": 1})]
    with pytest.raises(DataError) as info:
        load_problems(f"hf:{folder}", default_split="test")
    assert str(info.value) == f"hf:{folder}@test:2: field 'answer' is empty (use data.on_error=skip to skip and count such rows)"
    with pytest.raises(ValueError, match=r"could not load hf:.*@validation"):
        load_problems(f"hf:{folder}@validation")


def test_hf_network_failure_says_what_to_do(monkeypatch) -> None:
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(ValueError) as info:
        load_problems("hf:openai/gsm8k:main@test")
    message = str(info.value)
    assert message.startswith("could not load hf:openai/gsm8k:main@test: ConnectionError")
    assert "HF_DATASETS_OFFLINE=1" in message and "hf:/path/to/folder" in message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so \\boxed{42}.", "42"),
        # Nested braces: the scanner must find the matching close, not the first '}'.
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        # The LAST box wins (an intermediate result was boxed first).
        ("\\boxed{1} then \\boxed{2}", "2"),
        # Several boxes of one final answer are read as the reward reads a model's answer.
        ("\\boxed{1} and \\boxed{2}", "1 and 2"),
        ("\\boxed{1}\\boxed{2}", "1, 2"),
        # Escaped braces are literal set braces and do not close the group.
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
        # Space before the brace is allowed by LaTeX.
        ("\\boxed {7}", "7"),
        # An unclosed last box falls back to the previous well-formed one.
        ("\\boxed{3} and \\boxed{4", "3"),
        ("no box here", None),
        ("\\boxed 5", None),  # brace-less form is not a gold-answer format in these files
    ],
)
def test_last_boxed(text: str, expected: str | None) -> None:
    assert _last_boxed(text) == expected


# ----------------------------------------------------------------------------- prompts

LATEX_QUESTION = "Compute $\\frac{1}{2} + \\sqrt{x_{0}}$ where {question} is literal."


def test_arith_template_appends_equals() -> None:
    assert render_prompt("347+589", template="arith") == "347+589="


def test_plain_template_exact_text() -> None:
    expected = (
        "What is 2+2?\nPlease reason step by step, and put your final answer within \\boxed{}.\n"
    )
    assert render_prompt("What is 2+2?", template="plain") == expected


def test_builtin_templates_keep_latex_braces_and_substitute_once() -> None:
    for name in TEMPLATES:
        text = render_prompt(LATEX_QUESTION, template=name)
        # The question appears verbatim, including its own literal "{question}".
        assert LATEX_QUESTION in text, name
    zero = render_prompt(LATEX_QUESTION, template="zero")
    assert zero.endswith(f"User: {LATEX_QUESTION}\nAssistant:")
    assert "\\boxed{}" in zero


def test_custom_template_with_latex_braces() -> None:
    template = "Solve {question} and box it: \\boxed{}"
    assert render_prompt("$\\frac{a}{b}$", template=template) == (
        "Solve $\\frac{a}{b}$ and box it: \\boxed{}"
    )


def test_unknown_template_lists_builtins() -> None:
    with pytest.raises(ValueError, match=r"unknown prompt template 'r1'.*'arith'.*'plain'.*'zero'"):
        render_prompt("1+1", template="r1")


class _FakeChatTokenizer:
    """Stands in for a Hugging Face tokenizer: records the call, renders a ChatML-like string."""

    chat_template = "{% for m in messages %}...{% endfor %}"

    def apply_chat_template(self, messages, *, add_generation_prompt, tokenize):
        self.call = (messages, add_generation_prompt, tokenize)
        turns = "".join(f"<|{m['role']}|>{m['content']}\n" for m in messages)
        return turns + ("<|assistant|>" if add_generation_prompt else "")


def test_render_chat_uses_tokenizer_template() -> None:
    tok = _FakeChatTokenizer()
    text = render_chat(LATEX_QUESTION, tok, system=BOXED_INSTRUCTION)
    messages, add_generation_prompt, tokenize = tok.call
    assert messages == [
        {"role": "system", "content": BOXED_INSTRUCTION},
        {"role": "user", "content": LATEX_QUESTION},
    ]
    assert (add_generation_prompt, tokenize) == (True, False)
    assert text.endswith("<|assistant|>")
    render_chat("1+1", tok)
    assert tok.call[0] == [{"role": "user", "content": "1+1"}]  # no system turn by default


def test_render_chat_without_template_says_what_to_use() -> None:
    class BaseTokenizer:
        chat_template = None
        name_or_path = "tiny-base"

    # the command-line spellings, not a library call a command-line user cannot make
    with pytest.raises(ValueError, match="'tiny-base' has no chat template.*data.template=zero .*--template zero"):
        render_chat("1+1", BaseTokenizer())


# ----------------------------------------------------------------------------- prompt length limit


def test_long_prompts_are_dropped_and_counted_never_truncated(tmp_path: Path, char_tokenizer) -> None:
    from mathrl.config import load_config
    from mathrl.tasks.sources import ProblemStream, build_eval_sets

    rows = [{"problem": "1+1" if i % 2 else "9" * 80, "answer": "2"} for i in range(10)]  # every other one is long
    path = _write(tmp_path, "mixed.jsonl", [json.dumps(r) for r in rows])
    cfg = load_config(None, [f"data.train={path}", f"data.eval=[{path}]", "data.template=plain",
                             "data.max_prompt_tokens=100"])  # rendered: 75 and 152 tokens
    (es,) = build_eval_sets(cfg, char_tokenizer, limit=cfg.data.eval_size)
    assert (len(es.problems), es.dropped_too_long) == (5, 5)
    assert all(len(ids) <= 100 for ids in es.prompt_ids)
    assert all(p.question == "1+1" for p in es.problems)  # whole problems, not shortened ones

    stream = ProblemStream(cfg, char_tokenizer)
    problems, ids, _ = stream.next_batch(4)  # long draws are replaced by further draws
    assert len(problems) == 4 and all(p.question == "1+1" for p in problems)
    assert stream.encoder.dropped > 0 and stream.state_dict()["dropped"] == stream.encoder.dropped

    cfg.data.max_prompt_tokens = 5  # shorter than any rendered prompt
    with pytest.raises(ValueError, match="has no problems left"):
        build_eval_sets(cfg, char_tokenizer, limit=cfg.data.eval_size)


# --------------------------------------------------------------------------------------------------
# messages that say what to set
# --------------------------------------------------------------------------------------------------
def test_non_utf8_row_names_file_and_line_and_is_skippable(tmp_path):
    # Bug story: one Latin-1 byte in a row raised a bare UnicodeDecodeError from the file iterator,
    # naming neither file nor line, and data.on_error=skip could not skip it.
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b'{"problem": "1+1", "answer": "2"}\n{"problem": "caf\xe9", "answer": "3"}\n{"problem": "2+2", "answer": "4"}\n')
    with pytest.raises(DataError, match=r"mixed.jsonl:2: not UTF-8 text \(byte 16 .*data.on_error=skip"):
        load_problems(path)
    result = load_problems(path, on_error="skip")
    assert [p.answer for p in result.problems] == ["2", "4"]
    assert result.skipped_reasons == {"not UTF-8 text": 1}


def test_field_map_miss_suggests_the_config_keys(tmp_path):
    # A GSM8K-shaped file under another name misses the default 'problem' field: the message lists the
    # row's fields and the settings that map them.
    path = tmp_path / "word_problems.jsonl"
    path.write_text(json.dumps({"question": "Tom has 3 apples...", "answer": "3 + 4 = 7 #### 7"}) + "\n")
    with pytest.raises(DataError) as info:
        load_problems(path)
    assert str(info.value) == (f"{path}:1: missing field 'problem' (the row has fields question, answer; try "
                               "data.question_field=question data.answer_after='####')")
    assert info.value.reason == "missing field 'problem'"  # the skip counter's key does not vary by row


@pytest.mark.parametrize(
    ("row", "fields", "hint"),
    [
        # Bug story: a multiplication file mapped with data.question_field=question had a row with no
        # answer, and the hint said "try data.question_field=question", the setting already in use.
        ({"question": "6*7=?"}, FieldMap(question="question"),
         "set data.answer_field to the field that holds the gold answer, or data.on_error=skip"),
        # the answer lives under another name: the key that maps it is data.answer_field
        ({"question": "6*7=?", "target": "42"}, FieldMap(question="question"), "try data.answer_field=target"),
        # a worked solution whose last box is the answer: data.answer_from_solution, not answer_field
        ({"problem": "6*7=?", "solution": "6*7=\\boxed{42}"}, FieldMap(),
         "try data.answer_from_solution=solution data.answer_field=null"),
        # a Minerva-style map whose solution field is missing names data.answer_from_solution
        ({"problem": "q", "output": "42"}, FieldMap(answer=None, answer_from_solution="solution"),
         "try data.answer_from_solution=output"),
    ],
)
def test_missing_answer_names_the_answer_key(tmp_path, row, fields, hint) -> None:
    path = _write(tmp_path, "rows.jsonl", [json.dumps(row)])
    with pytest.raises(DataError) as info:
        load_jsonl(path, fields)
    assert hint in str(info.value)
    assert "data.question_field" not in str(info.value)


@pytest.mark.parametrize(
    ("row", "fields", "message"),
    [
        # Bug story: a file whose question and answer were both under other names named only
        # data.question_field; fixing it met the missing answer on the next try.
        ({"question": "Tom has 3", "target": "3 #### 3"}, FieldMap(),
         "missing fields 'problem' and 'answer' (the row has fields question, target; try "
         "data.question_field=question data.answer_field=target data.answer_after='####')"),
        ({"text": "6*7=?"}, FieldMap(id="id"),
         "missing fields 'problem', 'answer' and 'id' (the row has fields text; set data.question_field to the "
         "field that holds the problem and data.answer_field to the field that holds the gold answer; this "
         "source's preset takes the row id from 'id')"),
    ],
)
def test_every_missing_field_is_named_at_once(tmp_path, row, fields, message) -> None:
    path = _write(tmp_path, "rows.jsonl", [json.dumps(row)])
    with pytest.raises(DataError) as info:
        load_jsonl(path, fields)
    assert str(info.value) == f"{path}:1: {message}"
    assert info.value.reason == message.split(" (")[0]  # the skip counter's key: the fields, not the row


def test_missing_question_without_a_likely_field_says_which_key(tmp_path) -> None:
    path = _write(tmp_path, "rows.jsonl", [json.dumps({"text": "6*7=?", "answer": "42"})])
    with pytest.raises(DataError, match="the row has fields text, answer; set data.question_field to the field "
                                        "that holds the problem"):
        load_jsonl(path, FieldMap())


def test_unencodable_characters_are_counted_and_warned_once(char_tokenizer) -> None:
    # Bug story: the character tokenizer drops what it does not know, so a CJK question "三加四=?"
    # reached the model as the prompt "=" with no word of warning.
    from mathrl.tasks.base import Problem
    from mathrl.tasks.prompts import PromptEncoder

    warnings = []
    enc = PromptEncoder(char_tokenizer, template="arith", max_prompt_tokens=100, max_new_tokens=8,
                        context_length=1000, warn=warnings.append)
    problems = [Problem(id="a", question="12+3", answer="15"), Problem(id="b", question="三加四", answer="7"),
                Problem(id="c", question="四加四", answer="8")]
    kept, ids, _ = enc.encode(problems)
    assert [p.id for p in kept] == ["a", "b", "c"]  # kept (a dataset is not emptied), but counted
    assert enc.unencodable == 6  # 三 加 四, 四 加 四
    assert len(warnings) == 1 and "'三加四'" in warnings[0] and "data/unencodable_chars" in warnings[0]
    assert enc.lost_chars("12+3=") == []


def test_prompts_that_leave_no_room_for_the_response_are_dropped(char_tokenizer, tmp_path: Path) -> None:
    # prompt + max_new_tokens must fit the model's context (max_position_embeddings): a 400-character
    # prompt on a 128-position model passed before, and the model then read positions it never had.
    from mathrl.tasks.base import Problem
    from mathrl.tasks.prompts import PromptEncoder, model_context_length

    short, long = Problem(id="s", question="1+1", answer="2"), Problem(id="l", question="9" * 60, answer="9")
    enc = PromptEncoder(char_tokenizer, template="arith", max_prompt_tokens=512, max_new_tokens=48, context_length=100)
    kept, ids, _ = enc.encode([short, long])
    assert [p.id for p in kept] == ["s"] and enc.dropped == 1 and enc.max_tokens == 52
    assert "context of 100 positions" in enc.limit
    with pytest.raises(ValueError, match="max_new_tokens=100 leaves no room for a prompt"):
        PromptEncoder(char_tokenizer, template="arith", max_prompt_tokens=512, max_new_tokens=100, context_length=100)

    model_dir = tmp_path / "model"
    char_tokenizer.save_pretrained(model_dir)
    (model_dir / "config.json").write_text(json.dumps({"max_position_embeddings": 128}))
    from transformers import AutoTokenizer

    assert model_context_length(AutoTokenizer.from_pretrained(model_dir)) == 128
    assert model_context_length(char_tokenizer) is None or isinstance(model_context_length(char_tokenizer), int)


def test_arith_template_on_word_problems_gives_a_hint() -> None:
    from mathrl.tasks.prompts import template_hint

    hint = template_hint("arith", "gsm8k_like.jsonl", ["Natalia sold clips to 48 of her friends."])
    assert "data.template=zero" in hint and "gsm8k_like.jsonl" in hint
    assert template_hint("arith", "sums.jsonl", ["12+34", "5+6"]) is None
    assert template_hint("zero", "gsm8k_like.jsonl", ["Natalia sold clips"]) is None
