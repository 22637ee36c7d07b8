"""Task loading: good records load, every kind of bad line is rejected with its line and field."""
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from schemas.records import Constraint, RecordError, SqlSpec, ToolCall
from verifiers.tasks import load_tasks, parse_record

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def task_dir(tmp_path: Path) -> Path:
    (tmp_path / "databases").mkdir()
    conn = sqlite3.connect(tmp_path / "databases" / "tiny.sqlite")
    conn.execute("CREATE TABLE t (x INTEGER)")
    conn.commit()
    conn.close()
    return tmp_path


def sql_record(record_id: str, **changes) -> dict:
    record = {"id": record_id, "task": "sql", "prompt": "Count rows.", "reference_response": "<sql>SELECT 1</sql>",
              "db": "tiny.sqlite", "reference_sql": "SELECT 1"}
    record.update(changes)
    return {k: v for k, v in record.items() if v is not None}


def instruction_record(record_id: str, constraints) -> dict:
    return {"id": record_id, "task": "instructions", "prompt": "Write.", "reference_response": "Done.",
            "constraints": constraints}


def tool_record(record_id: str, tools, calls) -> dict:
    return {"id": record_id, "task": "tools", "prompt": "Call.", "reference_response": "{}",
            "tools": tools, "reference_calls": calls}


def write_lines(path: Path, lines: list) -> Path:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def test_good_records_of_every_task_load(task_dir):
    lines = [
        sql_record("a", split="test"),
        instruction_record("b", [{"kind": "keyword_include", "args": {"words": ["sun"]}}]),
        tool_record("c", [{"name": "get_weather", "parameters": {}}], [{"name": "get_weather", "arguments": {"city": "Oslo"}}]),
    ]
    records, rejected = load_tasks(write_lines(task_dir / "tasks.jsonl", lines))
    assert rejected == []
    assert [r.id for r in records] == ["a", "b", "c"]
    sql, instr, tool = records
    assert sql.spec == SqlSpec(str(task_dir / "databases" / "tiny.sqlite"), "SELECT 1")
    assert (sql.split, instr.split) == ("test", "train")
    assert instr.spec.constraints == (Constraint("keyword_include", {"words": ["sun"]}),)
    assert tool.spec.reference_calls == (ToolCall("get_weather", {"city": "Oslo"}),)


BAD_LINES = [
    ('{"id": "x", "task": ', "invalid JSON", None),
    ('[1, 2, 3]', "expected a JSON object, got a list", None),
    (sql_record("no-prompt", prompt=None), "field 'prompt': missing", "no-prompt"),
    (sql_record("int-prompt", prompt=7), "field 'prompt': expected a non-empty string, got a number", "int-prompt"),
    (sql_record("blank-sql", reference_sql="  "), "field 'reference_sql': empty", "blank-sql"),
    (sql_record("weird-task", task="poetry"), "field 'task': unknown task 'poetry'", "weird-task"),
    (sql_record("no-db", db="missing.sqlite"), "field 'db': database file not found", "no-db"),
    (sql_record("bad-split", split="dev"), "field 'split'", "bad-split"),
    ({"task": "sql", "prompt": "p"}, "field 'id': missing", None),
    (sql_record("a"), "field 'id': duplicate id (first on line 1)", "a"),
    (instruction_record("no-constraints", []), "field 'constraints': empty", "no-constraints"),
    (instruction_record("no-kind", [{"args": {}}]), "field 'constraints[0].kind': missing", "no-kind"),
    (instruction_record("bad-args", [{"kind": "k", "args": []}]), "field 'constraints[0].args': expected an object", "bad-args"),
    (tool_record("nameless-tool", [{"description": "d"}], []), "field 'tools[0].name': missing", "nameless-tool"),
    (tool_record("bad-call", [{"name": "f"}], [{"name": "f", "arguments": "x"}]),
     "field 'reference_calls[0].arguments': expected an object, got a string", "bad-call"),
    (tool_record("unknown-call", [{"name": "f"}], [{"name": "g", "arguments": {}}]),
     "field 'reference_calls[0].name': 'g' is not one of the tools", "unknown-call"),
]


@pytest.mark.parametrize("bad, reason, bad_id", BAD_LINES, ids=[r for _, r, _ in BAD_LINES])
def test_each_bad_line_is_rejected_with_line_and_field_while_neighbours_load(task_dir, bad, reason, bad_id):
    path = write_lines(task_dir / "tasks.jsonl", [sql_record("a"), "", bad, sql_record("z")])
    records, rejected = load_tasks(path)
    assert [r.id for r in records] == ["a", "z"]
    assert len(rejected) == 1
    assert rejected[0].line_no == 3
    assert reason in rejected[0].reason
    assert rejected[0].record_id == bad_id
    assert rejected[0].raw == (bad if isinstance(bad, str) else json.dumps(bad))


def test_invalid_utf8_line_is_rejected(task_dir):
    path = task_dir / "tasks.jsonl"
    path.write_bytes(json.dumps(sql_record("a")).encode() + b"\n\xff\xfe{}\n")
    records, rejected = load_tasks(path)
    assert [r.id for r in records] == ["a"]
    assert rejected[0].line_no == 2 and "not UTF-8" in rejected[0].reason


def test_parse_record_error_names_record_and_field(task_dir):
    with pytest.raises(RecordError) as err:
        parse_record(sql_record("q-17", db="nope.sqlite"), 4, task_dir)
    assert (err.value.record_id, err.value.field) == ("q-17", "db")
    assert "'q-17'" in str(err.value) and "'db'" in str(err.value) and "nope.sqlite" in str(err.value)


def test_absolute_db_path_is_used_as_is(task_dir, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("other") / "x.sqlite"
    sqlite3.connect(elsewhere).close()
    record = parse_record(sql_record("abs", db=str(elsewhere)), 1, task_dir)
    assert record.spec.db_path == str(elsewhere)


def test_directory_loads_every_jsonl_sorted_and_catches_cross_file_duplicates(task_dir):
    write_lines(task_dir / "b.jsonl", [sql_record("two"), sql_record("one")])
    write_lines(task_dir / "a.jsonl", [sql_record("one")])
    (task_dir / "notes.txt").write_text("not a task file")
    records, rejected = load_tasks(task_dir)
    assert [r.id for r in records] == ["one", "two"]
    assert len(rejected) == 1
    assert rejected[0].path.endswith("b.jsonl") and rejected[0].line_no == 2
    assert "a.jsonl line 1" in rejected[0].reason


def test_missing_path_raises(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_tasks(tmp_path / "absent.jsonl")
    with pytest.raises(FileNotFoundError):
        load_tasks(tmp_path)  # a folder without *.jsonl


def test_demo_sql_set_loads_whole_with_a_fifth_held_out():
    records, rejected = load_tasks("demo")
    sql = [r for r in records if r.task == "sql"]
    assert rejected == []
    assert len(sql) >= 200
    assert [r.id for r in sql] == [f"sql-{i:04d}" for i in range(len(sql))]
    assert {Path(r.spec.db_path).name for r in sql} >= {"concerts.sqlite", "library.sqlite", "shop.sqlite"}
    assert sum(r.split == "test" for r in sql) == len(sql) // 5
    assert max(len(r.prompt) for r in sql) <= 350
    assert all(r.prompt.endswith("Answer with the SQL query between <sql> and </sql>.") for r in sql)
    assert all(r.reference_response == f"<sql>{r.spec.reference_sql}</sql>" for r in sql)


def test_demo_builder_is_byte_identical(tmp_path):
    """Rebuilding in a scratch copy reproduces the committed JSONL exactly."""
    demo = ROOT / "verifiers" / "demo"
    scratch = tmp_path / "demo"
    scratch.mkdir()
    (scratch / "build_sql.py").write_text((demo / "build_sql.py").read_text())
    subprocess.run([sys.executable, str(scratch / "build_sql.py")], check=True, capture_output=True)
    assert (scratch / "sql.jsonl").read_bytes() == (demo / "sql.jsonl").read_bytes()
