"""Public formats from local files: small fixtures written in each benchmark's own layout load into
verifiable records, and their bad rows are rejected with line, field and reason."""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tokencredit import verifiers
from tokencredit.schemas.records import Constraint, RecordError, ToolCall
from tokencredit.verifiers import tools
from tokencredit.verifiers.tasks import load_tasks


def write_jsonl(path: Path, rows: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def null_kwargs(**given) -> dict:
    """IFEval's Hugging Face rows carry every kwarg name, null where unused."""
    names = ["num_highlights", "relation", "num_words", "num_placeholders", "prompt_to_repeat", "num_paragraphs",
             "nth_paragraph", "first_word", "keywords", "forbidden_words", "language", "end_phrase", "letter",
             "let_frequency", "let_relation", "postscript_marker", "section_spliter", "num_sections"]
    return {**{n: None for n in names}, **given}


IFEVAL_ROWS = [
    {"key": 1000, "prompt": "Write a 300+ word summary. Do not use any commas. Highlight at least 3 sections.",
     "instruction_id_list": ["punctuation:no_comma", "detectable_format:number_highlighted_sections",
                             "length_constraints:number_words"],
     "kwargs": [null_kwargs(), null_kwargs(num_highlights=3), null_kwargs(relation="at least", num_words=300)]},
    {"key": 1001, "prompt": "Write a letter in German and end it with a P.S.",
     "instruction_id_list": ["language:response_language", "detectable_content:postscript"],
     "kwargs": [null_kwargs(language="de"), null_kwargs(postscript_marker="P.S.")]},
    {"key": 1002, "prompt": "Rhyme.", "instruction_id_list": ["poetry:rhyme"], "kwargs": [{}]},
    {"key": 1003, "prompt": "Count.", "instruction_id_list": ["length_constraints:number_words"], "kwargs": [{}]},
]


def test_ifeval_rows_load_with_ifeval_semantics_and_bad_ones_are_rejected(tmp_path):
    records, rejected = load_tasks(write_jsonl(tmp_path / "input_data.jsonl", IFEVAL_ROWS), "ifeval")
    assert [r.id for r in records] == ["1000", "1001"]
    first = records[0]
    assert first.task == "instructions" and first.spec.semantics == "ifeval" and first.reference_response is None
    assert first.spec.constraints == (Constraint("no_commas", {}), Constraint("highlighted_sections", {"n": 3}),
                                      Constraint("word_count", {"min": 300}))
    assert records[1].spec.constraints[1] == Constraint("postscript", {"marker": "P.S."})
    assert [(r.line_no, r.record_id, r.field) for r in rejected] == [
        (3, "1002", "instruction_id_list[0]"), (4, "1003", "instruction_id_list[0]")]
    assert "unknown constraint kind 'poetry:rhyme'" in rejected[0].reason and "num_words" in rejected[1].reason
    letter = "Liebe Anna, wir sehen uns morgen im Garten und trinken Tee.\n\nP.S. Bring bitte Kuchen mit."
    scores = verifiers.verify(records[1], letter)
    assert [s.score for s in scores] == [1.0, 1.0]
    tokencredit = load_tasks(tmp_path / "input_data.jsonl", "ifeval", semantics="tokencredit")[0]
    assert tokencredit[0].spec.semantics == "tokencredit"  # the project's own semantics, by name


def test_ifbench_rows_load_known_ids_and_name_unknown_ones(tmp_path):
    rows = [{"key": "ifb-1", "prompt": "Answer in lowercase.", "instruction_id_list": ["change_case:english_lowercase"],
             "kwargs": [{}]},
            {"key": "ifb-2", "prompt": "Use 3 emojis.", "instruction_id_list": ["count:emoji"], "kwargs": [{"n": 3}]}]
    records, rejected = load_tasks(write_jsonl(tmp_path / "ifbench.jsonl", rows), "ifbench")
    assert [r.id for r in records] == ["ifb-1"] and records[0].spec.constraints == (Constraint("lowercase", {}),)
    assert rejected[0].record_id == "ifb-2" and "'count:emoji'" in rejected[0].reason


def test_ifeval_from_parquet_with_renamed_columns(tmp_path):
    rows = [{"idx": r["key"], "text": r["prompt"], "instruction_id_list": r["instruction_id_list"], "kwargs": r["kwargs"]}
            for r in IFEVAL_ROWS[:2]]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "ifeval.parquet")
    records, rejected = load_tasks(tmp_path / "ifeval.parquet", "ifeval", columns={"key": "idx", "prompt": "text"})
    assert rejected == [] and [r.prompt for r in records] == [r["prompt"] for r in IFEVAL_ROWS[:2]]


def make_db(path: Path, rows: list[tuple[int, str, int]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE singer (singer_id INTEGER, name TEXT, age INTEGER)")
    conn.executemany("INSERT INTO singer VALUES (?, ?, ?)", rows)
    conn.commit()
    conn.close()


def test_spider_json_list_with_its_database_folder(tmp_path):
    make_db(tmp_path / "database" / "concert_singer" / "concert_singer.sqlite", [(1, "Ann", 30), (2, "Bo", 41)])
    items = [{"db_id": "concert_singer", "question": "How many singers are there?",
              "query": "SELECT count(*) FROM singer", "query_toks": ["SELECT"], "sql": {}},
             {"db_id": "concert_singer", "question": "Oldest?", "query": "SELECT name FROM singers"},
             {"db_id": "../../etc", "question": "Escape?", "query": "SELECT 1"},
             {"db_id": "missing_db", "question": "Where?", "query": "SELECT 1"}]
    (tmp_path / "dev.json").write_text(json.dumps(items, indent=1))
    records, rejected = load_tasks(tmp_path / "dev.json", "spider")
    assert [r.id for r in records] == ["item-1"]
    assert records[0].prompt.startswith("Schema: singer(singer_id, name, age).\nQuestion: How many singers are there?")
    assert [s.score for s in verifiers.verify(records[0], "<sql>SELECT COUNT(singer_id) FROM singer</sql>")] == [1, 1, 1]
    assert [(r.line_no, r.field) for r in rejected] == [(2, "reference_sql"), (3, "db"), (4, "db")]
    assert "outside the databases folder" in rejected[1].reason


def test_bird_json_list_uses_sql_and_evidence(tmp_path):
    make_db(tmp_path / "dev_databases" / "music" / "music.sqlite", [(1, "Ann", 30), (2, "Bo", 41)])
    items = [{"question_id": 7, "db_id": "music", "question": "Who is older than forty?",
              "evidence": "older than forty refers to age > 40", "SQL": "SELECT name FROM singer WHERE age > 40",
              "difficulty": "simple"}]
    (tmp_path / "dev.json").write_text(json.dumps(items))
    records, rejected = load_tasks(tmp_path / "dev.json", "bird", databases=tmp_path / "dev_databases")
    assert rejected == [] and records[0].id == "7"
    assert "Hint: older than forty refers to age > 40\n" in records[0].prompt
    assert records[0].spec.reference_sql == items[0]["SQL"]


BFCL_FUNCTION = {"name": "calculate_triangle_area", "description": "Area of a triangle.", "parameters": {
    "type": "dict", "properties": {"base": {"type": "integer"}, "height": {"type": "integer"},
                                   "unit": {"type": "string"}, "dims": {"type": "dict"},
                                   "sides": {"type": "array", "items": {"type": "float"}}},
    "required": ["base", "height"]}}


def test_bfcl_question_and_possible_answer_files(tmp_path):
    questions = [
        {"id": "simple_0", "question": [[{"role": "user", "content": "Area with base 10 and height 5?"}]],
         "function": [BFCL_FUNCTION]},
        {"id": "simple_1", "question": [[{"role": "user", "content": "Again."}]], "function": [BFCL_FUNCTION]},
        {"id": "simple_2", "question": [[{"role": "user", "content": "No answer."}]], "function": [BFCL_FUNCTION]},
    ]
    answers = [
        {"id": "simple_0", "ground_truth": [{"calculate_triangle_area": {
            "base": [10], "height": [5], "unit": ["units", "cm", ""], "sides": [[1.0, 2.5], ""],
            "dims": [{"w": [1, 2], "h": ["", 3]}, ""]}}]},
        {"id": "simple_1", "ground_truth": [{"calculate_triangle_area": {"base": [], "height": [5]}}]},
    ]
    write_jsonl(tmp_path / "BFCL_v4_simple_python.json", questions)
    write_jsonl(tmp_path / "possible_answer" / "BFCL_v4_simple_python.json", answers)
    records, rejected = load_tasks(tmp_path / "BFCL_v4_simple_python.json", "bfcl")
    assert [r.id for r in records] == ["simple_0"] and records[0].spec.semantics == "bfcl"
    (ref,) = records[0].spec.reference_calls
    assert ref == ToolCall("calculate_triangle_area", {"base": 10, "height": 5},
                           defaults={"unit": "units", "sides": [1.0, 2.5], "dims": {"w": 1}},
                           alternatives={"unit": ("cm",), "dims": ({"w": 1, "h": 3}, {"w": 2}, {"w": 2, "h": 3})},
                           possible_answer=answers[0]["ground_truth"][0]["calculate_triangle_area"])
    assert [(r.record_id, r.field) for r in rejected] == [("simple_1", "ground_truth[0].base"), ("simple_2", "id")]
    good = tools.render_calls([ToolCall("calculate_triangle_area", {"base": 10, "height": 5, "unit": "CM",
                                                                   "dims": {"w": 2, "h": 3}})])
    assert [s.score for s in verifiers.verify(records[0], good)] == [1.0, 1.0]
    # BFCL's answer decides under its semantics: "" passed for the optional unit, True for a dict's 1
    odd = tools.render_calls([ToolCall("calculate_triangle_area", {"base": 10, "height": 5, "unit": "",
                                                                  "dims": {"w": True}})])
    assert verifiers.verify(records[0], odd)[1].score == 1.0
    # the folder form finds every question file that has answers
    assert [r.id for r in load_tasks(tmp_path, "bfcl")[0]] == ["simple_0"]


def test_native_possible_answer_is_read_and_checked():
    tool = {"name": "f", "parameters": {"type": "dict", "properties": {"u": {"type": "string"}}, "required": []}}
    line = {"id": "n", "task": "tools", "prompt": "Call f.", "tools": [tool],
            "reference_calls": [{"name": "f", "arguments": {}, "possible_answer": {"u": ["cm", ""]}}]}
    record = verifiers.parse_record(line, 1, Path("."), semantics={"instructions": "tokencredit", "tools": "bfcl"})
    assert record.spec.reference_calls[0].possible_answer == {"u": ["cm", ""]}
    assert verifiers.verify(record, tools.render_calls([ToolCall("f", {"u": "CM"})]))[1].score == 1.0
    line["reference_calls"][0]["possible_answer"] = {"u": "cm"}
    with pytest.raises(RecordError, match="expected a list"):
        verifiers.parse_record(line, 1, Path("."))



def test_non_finite_possible_answer_is_rejected_under_bfcl_semantics(tmp_path):
    """NaN or Infinity is rejected as it is in `arguments` (no response can equal it), in BFCL's files too."""
    tool = {"name": "f", "parameters": {"type": "dict", "properties": {"u": {"type": "float"}}, "required": []}}
    lines = [{"id": name, "task": "tools", "prompt": "Call f.", "tools": [tool],
              "reference_calls": [{"name": "f", "arguments": {}, "possible_answer": {"u": [1.5, value]}}]}
             for name, value in [("fine", 2.5), ("nan", float("nan")), ("inf", float("-inf"))]]
    records, rejected = load_tasks(write_jsonl(tmp_path / "native.jsonl", lines), semantics="bfcl")
    assert [r.id for r in records] == ["fine"]
    assert [(r.record_id, r.field) for r in rejected] == [("nan", "reference_calls[0].possible_answer.u"),
                                                         ("inf", "reference_calls[0].possible_answer.u")]
    assert all("NaN or Infinity" in r.reason for r in rejected)
    question = {"id": "q", "question": [[{"role": "user", "content": "Area?"}]], "function": [BFCL_FUNCTION]}
    answer = {"id": "q", "ground_truth": [{"calculate_triangle_area": {
        "base": [10], "height": [5], "dims": [{"w": [1, float("nan")]}, ""]}}]}
    write_jsonl(tmp_path / "BFCL_v4_simple.json", [question])
    write_jsonl(tmp_path / "possible_answer" / "BFCL_v4_simple.json", [answer])
    records, rejected = load_tasks(tmp_path / "BFCL_v4_simple.json", "bfcl")
    assert records == [] and "NaN or Infinity" in rejected[0].reason


def test_an_integer_past_pythons_digit_limit_rejects_its_line_only(tmp_path):
    """json.loads stops at a 5001-digit integer with no line; the line is rejected naming the field."""
    line = {"id": "a", "task": "instructions", "prompt": "p",
            "constraints": [{"kind": "word_count", "args": {"max": 5}}]}
    long_line = json.dumps({**line, "id": "b"}).replace('"max": 5', '"max": ' + "7" * 5001)
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join([json.dumps(line), long_line, "[-" + "1" * 5001 + "]", json.dumps({**line, "id": "c"})]))
    records, rejected = load_tasks(path)
    assert [r.id for r in records] == ["a", "c"]
    assert [(r.line_no, r.record_id, r.field) for r in rejected] == [(2, "b", "constraints[0].args.max"),
                                                                     (3, None, "[0]")]
    assert "an integer of 5001 digits, more than the 4300" in rejected[0].reason
    as_list = tmp_path / "spider.json"  # a JSON list file: the item is rejected, the others load
    as_list.write_text("[" + ", ".join([json.dumps(line), long_line, json.dumps({**line, "id": "c"})]) + "]")
    records, rejected = load_tasks(as_list)
    assert [r.id for r in records] == ["a", "c"]
    assert [(r.line_no, r.field) for r in rejected] == [(2, "constraints[0].args.max")]

def test_hf_datasets_folder_and_parquet_of_native_rows(tmp_path):
    import datasets

    rows = {"qid": ["a", "b"], "question": ["Write a title.", "Write two paragraphs."],
            "constraints": [[{"kind": "title", "args": {}}], [{"kind": "paragraph_count", "args": {"n": 2}}]]}
    both = datasets.Dataset.from_dict(rows)  # one struct type for `args`: {"n": null} in the title row
    dataset = datasets.DatasetDict({"train": both.select([0]), "test": both.select([1])})
    dataset.save_to_disk(str(tmp_path / "ds"))
    columns = {"id": "qid", "prompt": "question", "task": "'instructions'"}
    records, rejected = load_tasks(tmp_path / "ds", "hf", columns=columns)
    assert rejected == [] and [(r.id, r.split, r.task) for r in records] == [("a", "train", "instructions"),
                                                                             ("b", "test", "instructions")]
    pq.write_table(pa.Table.from_pydict({"id": ["p"], "task": ["poem"], "prompt": ["Write."], "meter": [5]}),
                   tmp_path / "poems.parquet")
    records, rejected = load_tasks(tmp_path / "poems.parquet", "hf", plugin_tasks=("poem",))
    assert rejected == [] and records[0].spec.fields == {"id": "p", "task": "poem", "prompt": "Write.", "meter": 5}
    _, rejected = load_tasks(tmp_path / "poems.parquet", "hf", columns={"prompt": "question"}, plugin_tasks=("poem",))
    assert rejected[0].field == "question" and "no column" in rejected[0].reason


def test_unknown_format_and_semantics_are_named():
    with pytest.raises(ValueError, match="unknown format 'csv'"):
        load_tasks("demo", "csv")
    with pytest.raises(ValueError, match="unknown semantics 'strictest'"):
        load_tasks("demo", semantics="strictest")
