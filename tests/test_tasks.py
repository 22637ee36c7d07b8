"""Task loading: good records load, every kind of bad line is rejected with its line and field."""
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tokencredit.schemas.records import Constraint, RecordError, SqlSpec, ToolCall
from tokencredit.verifiers.tasks import load_tasks, parse_record

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def task_dir(tmp_path: Path) -> Path:
    (tmp_path / "databases").mkdir()
    conn = sqlite3.connect(tmp_path / "databases" / "tiny.sqlite")
    conn.execute("CREATE TABLE t (x INTEGER)")
    conn.commit()
    conn.close()
    (tmp_path / "databases" / "notes.sqlite").write_text("CREATE TABLE t (x INTEGER);")  # not a database
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


WEATHER = {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "unit": {"type": "string"}}, "required": ["city"]}}


def test_good_records_of_every_task_load(task_dir):
    lines = [
        sql_record("a", split="test"),
        instruction_record("b", [{"kind": "keyword_include", "args": {"keywords": ["sun"]}}]),
        tool_record("c", [WEATHER], [{"name": "get_weather", "arguments": {"city": "Oslo"},
                                      "defaults": {"unit": "celsius"}, "alternatives": {"city": ["OSL"]}}]),
        {"id": "d", "task": "instructions", "prompt": "Write.", "constraints": [{"kind": "title", "args": {}}]},
    ]
    records, rejected = load_tasks(write_lines(task_dir / "tasks.jsonl", lines))
    assert rejected == []
    assert [r.id for r in records] == ["a", "b", "c", "d"]
    sql, instr, tool, no_reference = records
    assert sql.spec == SqlSpec(str((task_dir / "databases" / "tiny.sqlite").resolve()), "SELECT 1")
    assert (sql.split, instr.split) == ("test", "train")
    assert instr.spec.constraints == (Constraint("keyword_include", {"keywords": ["sun"]}),)
    assert tool.spec.reference_calls == (ToolCall("get_weather", {"city": "Oslo"}, {"unit": "celsius"},
                                                  {"city": ("OSL",)}),)
    assert no_reference.reference_response is None  # annotation never reads it: optional


BAD_LINES = [
    ('{"id": "x", "task": ', "invalid JSON", None),
    ('[1, 2, 3]', "expected a JSON object, got a list", None),
    (sql_record("no-prompt", prompt=None), "field 'prompt': missing", "no-prompt"),
    (sql_record("int-prompt", prompt=7), "field 'prompt': expected a non-empty string, got a number", "int-prompt"),
    (sql_record("blank-sql", reference_sql="  "), "field 'reference_sql': empty", "blank-sql"),
    (sql_record("weird-task", task="poetry"), "field 'task': unknown task 'poetry'", "weird-task"),
    (sql_record("no-db", db="missing.sqlite"), "field 'db': database file not found", "no-db"),
    (sql_record("abs-db", db="/etc/passwd"), "field 'db': absolute paths are refused", "abs-db"),
    (sql_record("up-db", db="../tasks.jsonl"), "field 'db': '../tasks.jsonl' resolves outside", "up-db"),
    (sql_record("text-db", db="notes.sqlite"), "field 'db': ", "text-db"),
    (sql_record("bad-ref", reference_sql="SELECT y FROM t"), "field 'reference_sql': the reference query does not run",
     "bad-ref"),
    (sql_record("write-ref", reference_sql="DELETE FROM t"), "field 'reference_sql'", "write-ref"),
    (instruction_record("rhyme", [{"kind": "rhyme", "args": {}}]), "field 'constraints[0].kind': unknown constraint kind",
     "rhyme"),
    (instruction_record("few-args", [{"kind": "word_count", "args": {}}]), "field 'constraints[0].args'", "few-args"),
    (tool_record("bad-type", [{"name": "f", "parameters": {"properties": {"x": {"type": "decimal"}}}}],
                 [{"name": "f", "arguments": {"x": 1}}]), "field 'tools[0].parameters.properties.x.type'", "bad-type"),
    (tool_record("bad-default", [WEATHER], [{"name": "get_weather", "arguments": {"city": "Oslo"}, "defaults": {"unit": 3}}]),
     "field 'reference_calls[0].defaults.unit': expected a string", "bad-default"),
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


def test_a_db_outside_the_databases_folder_is_refused_however_it_is_spelled(task_dir, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("other") / "x.sqlite"
    conn = sqlite3.connect(elsewhere)
    conn.execute("CREATE TABLE secret (s TEXT)")
    conn.close()
    (task_dir / "databases" / "link.sqlite").symlink_to(elsewhere)
    (task_dir / "databases" / "sub").mkdir()
    escapes = [str(elsewhere), f"../../{elsewhere.parent.name}/x.sqlite", "link.sqlite", "sub/../../tasks.jsonl",
               f"sub/{'../' * 12}{str(elsewhere).lstrip('/')}"]
    for db in escapes:
        with pytest.raises(RecordError) as err:
            parse_record(sql_record("esc", db=db), 1, task_dir)
        assert err.value.field == "db" and ("refused" in err.value.reason or "outside" in err.value.reason), db
    inside = parse_record(sql_record("ok", db="sub/../tiny.sqlite"), 1, task_dir)
    assert inside.spec.db_path == str((task_dir / "databases" / "tiny.sqlite").resolve())


def test_databases_folder_can_be_given(task_dir, tmp_path_factory):
    other = tmp_path_factory.mktemp("dbs")
    (other / "tiny.sqlite").write_bytes((task_dir / "databases" / "tiny.sqlite").read_bytes())
    path = write_lines(task_dir / "tasks.jsonl", [sql_record("a")])
    records, rejected = load_tasks(path, databases=other)
    assert rejected == [] and records[0].spec.db_path == str((other / "tiny.sqlite").resolve())


def test_rejected_records_carry_line_field_and_reason(task_dir):
    path = write_lines(task_dir / "tasks.jsonl", [sql_record("a"), instruction_record("b", [{"kind": "rhyme", "args": {}}])])
    _, rejected = load_tasks(path)
    assert [(r.line_no, r.record_id, r.field) for r in rejected] == [(2, "b", "constraints[0].kind")]
    assert "unknown constraint kind 'rhyme'" in rejected[0].reason


def test_plugin_tasks_load_with_only_id_task_and_prompt_and_keep_every_field(task_dir):
    lines = [{"id": "p1", "task": "poem", "prompt": "Write a haiku.", "syllables": [5, 7, 5]},
             {"id": "p2", "task": "limerick", "prompt": "Write one."}]
    path = write_lines(task_dir / "tasks.jsonl", lines)
    records, rejected = load_tasks(path, plugin_tasks=("poem",))
    assert [r.id for r in records] == ["p1"] and rejected[0].record_id == "p2" and rejected[0].field == "task"
    assert records[0].spec.fields == lines[0] and records[0].reference_response is None
    records, rejected = load_tasks(path, plugin_tasks=("*",))  # a plugin without a task verifies every record
    assert [r.id for r in records] == ["p1", "p2"] and rejected == []


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


def hostile_lines() -> list:
    """Three records that each once stopped the whole load (a ValueError, a RecursionError, a
    tokenizer TypeError), between good ones."""
    return [sql_record("good1"),
            json.dumps(sql_record("nul", db="tiny.sqlite\u0000.txt")),
            '{"id": "deep", "task": "sql", "x": ' + "[" * 10_000 + "]" * 10_000 + "}",
            json.dumps(sql_record("surrogate", prompt="Count \ud800 rows.")),
            sql_record("good2")]


def test_a_null_byte_a_deep_nesting_and_a_lone_surrogate_are_rejected_with_line_and_reason(task_dir):
    records, rejected = load_tasks(write_lines(task_dir / "t.jsonl", hostile_lines()))
    assert [r.id for r in records] == ["good1", "good2"]
    assert [(r.line_no, r.record_id, r.field) for r in rejected] == [
        (2, "nul", "db"), (3, None, "<line>"), (4, "surrogate", "prompt")]
    assert "null byte" in rejected[0].reason
    assert "nested more deeply than" in rejected[1].reason
    assert "lone surrogate '\\ud800' at character 6" in rejected[2].reason


@pytest.mark.slow
def test_the_three_hostile_records_are_rejected_through_the_cli_and_the_rest_annotated(task_dir):
    prompts = write_lines(task_dir / "t.jsonl", hostile_lines())
    out = task_dir / "out"
    done = subprocess.run([sys.executable, "-m", "tokencredit.flows.cli", "annotate", "--out", str(out), "--prompts",
                           str(prompts), "--runner", "none", "--n", "2", "--max-new-tokens", "8", "--credit", "gdpo"],
                          cwd=task_dir, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rejected = [json.loads(line) for line in (out / "rejected.jsonl").read_text().splitlines()]
    assert [(r["line_no"], r["field"]) for r in rejected] == [(2, "db"), (3, "<line>"), (4, "prompt")]
    import pyarrow.dataset as ds
    groups = ds.dataset(out / "responses").to_table(columns=["group_id"]).column("group_id").to_pylist()
    assert sorted(set(groups)) == ["good1", "good2"] and len(groups) == 4


@pytest.mark.parametrize("semantics", ["tokencredit", "bfcl"])
@pytest.mark.parametrize("value, where", [("NaN", "arguments.temp"), ("[1.0, -Infinity]", "alternatives.temp"),
                                          ('{"a": [Infinity]}', "arguments.extra")])
def test_a_non_finite_reference_argument_is_rejected_at_load(task_dir, semantics, value, where):
    """NaN equals nothing, so a reward against it could never reach 1."""
    tools = [{"name": "f", "parameters": {"type": "object", "properties": {
        "temp": {"type": "number"}, "extra": {"type": "object"}}, "required": []}}]
    calls = [{"name": "f", "arguments": {"temp": 1.0}, "alternatives": {}}]
    key = where.split(".")[1]
    calls[0][where.split(".")[0]][key] = "@"
    line = json.dumps(tool_record("t1", tools, calls)).replace('"@"', value)
    records, rejected = load_tasks(write_lines(task_dir / "t.jsonl", [line, tool_record("t2", tools, [
        {"name": "f", "arguments": {"temp": 2.5}}])]), semantics=semantics)
    assert [r.id for r in records] == ["t2"]
    assert [(r.line_no, r.field) for r in rejected] == [(1, f"reference_calls[0].{where}")]
    assert "NaN or Infinity" in rejected[0].reason
