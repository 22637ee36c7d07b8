"""Build the localization benchmark: hand-written tasks, each reference response with ONE edit.

    python bench/localization/build_cases.py           # rebuild databases/, tasks.jsonl, cases.jsonl; check
    python bench/localization/build_cases.py --check   # only check the files on disk

A case is a task record (the native JSONL format of `schemas/records.py`), the record's correct
`reference_response` with exactly one edit (`response`), the edit's character span in `response`
(`edit_span`) and the reward the edit should be blamed on (`reward`). The benchmark asks whether
MRTPO's replay puts that reward's largest weight on the edited token(s). The format of
`cases.jsonl` is in README.md beside this script.

The data, written by hand, is `source.json` beside this script: four SQLite databases (hospital,
airline, university, football league: DDL and rows), the tools (JSON schemas), then the SQL, tool-calling
and instruction tasks, each with its one edit (`{"old", "new", "anchor"}`: replace `old` inside
`anchor`, a piece of the reference found once; an insertion has `old` "" and goes right after `anchor`). Every task is used by exactly one case. A case's dev/test split alternates within its
kind (the n-th case of the k-th kind is dev when n + k is even), so every kind is split about
half and half. Every task record has the loader's `"split": "test"`: no shipped model trains on it.

`check` (run after every build and by tests/test_localization_cases.py) verifies that every record
loads, every reference passes all its rewards, every case's response is its reference with the one
edit and fails exactly the rewards in `fails`, the counts and splits, and that the files on disk are
what this script writes (a hand edit of the JSONL or a database is caught).
"""
from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
if str(ROOT) not in sys.path:  # `python bench/localization/build_cases.py` puts only this folder on the path
    sys.path.insert(0, str(ROOT))

from tokencredit import verifiers  # noqa: E402
from tokencredit.schemas.records import TaskRecord, ToolCall  # noqa: E402
from tokencredit.verifiers import instructions, tools as tool_verifier  # noqa: E402

TASKS_FILE, CASES_FILE, DB_FOLDER, SOURCE = "tasks.jsonl", "cases.jsonl", "databases", "source.json"
CASE_FIELDS = ("id", "record_id", "family", "kind", "split", "reference_span", "replacement", "response", "edit_span",
               "reward", "fails")
MIN_CASES, MIN_PER_KIND = 150, 10
KINDS = {  # kind -> (family, the constraint kinds an instruction case may target)
    "sql_operator": ("sql", ()), "sql_join_column": ("sql", ()), "sql_aggregate": ("sql", ()),
    "sql_table": ("sql", ()), "sql_literal": ("sql", ()), "sql_missing_condition": ("sql", ()),
    "tool_function_name": ("tools", ()), "tool_enum_value": ("tools", ()), "tool_number": ("tools", ()),
    "tool_missing_argument": ("tools", ()),
    "inst_ends_with": ("instructions", ("ends_with",)), "inst_no_commas": ("instructions", ("no_commas",)),
    "inst_forbidden_keyword": ("instructions", ("keyword_exclude",)),
    "inst_case": ("instructions", ("lowercase", "uppercase")), "inst_word_count": ("instructions", ("word_count",)),
}


# ================================================================ code: edits


@dataclass(frozen=True)
class Edit:
    """Replace `old` with `new` where `old` sits inside `anchor`, a piece of the reference found once.

    An insertion has `old == ""` and goes right after `anchor`.
    """

    old: str
    new: str
    anchor: str

    def locate(self, reference: str) -> tuple[int, int]:
        """[a, b): the characters of `reference` that the edit replaces."""
        if reference.count(self.anchor) != 1:
            raise ValueError(f"anchor {self.anchor!r} occurs {reference.count(self.anchor)} times in {reference!r}")
        start = reference.index(self.anchor)
        if not self.old:
            return start + len(self.anchor), start + len(self.anchor)
        if self.anchor.count(self.old) != 1:
            raise ValueError(f"{self.old!r} occurs {self.anchor.count(self.old)} times in anchor {self.anchor!r}")
        a = start + self.anchor.index(self.old)
        return a, a + len(self.old)


def edit_span(a: int, replacement: str) -> list[int]:
    """The edited characters of the response; for a deletion, the first character after it (where
    the response departs from the reference)."""
    return [a, a + (len(replacement) or 1)]


# ================================================================ code: tasks


@dataclass(frozen=True)
class SqlTask:
    kind: str
    db: str  # a key of DATABASES
    question: str
    sql: str
    edit: Edit


@dataclass(frozen=True)
class ToolTask:
    kind: str
    tools: tuple[str, ...]  # keys of TOOLS, in the order the prompt lists them
    request: str
    calls: tuple[tuple[str, dict], ...]  # the reference calls (name, arguments)
    edit: Edit


@dataclass(frozen=True)
class InstructionTask:
    kind: str
    task: str  # the writing task, one sentence
    constraints: tuple[tuple[str, dict], ...]  # (checker kind, args), in prompt order
    response: str  # the reference response
    edit: Edit


SQL_INSTRUCTION = "Write one SQLite query that answers it, between <sql> and </sql>."
TOOL_INSTRUCTION = 'Reply only with the call(s), each as <tool_call>{"name": ..., "arguments": {...}}</tool_call>.'


def sql_record(record_id: str, task: SqlTask, schema: str) -> dict:
    prompt = f"Database schema:\n{schema}\nQuestion: {task.question}\n{SQL_INSTRUCTION}"
    return {"id": record_id, "task": "sql", "prompt": prompt, "reference_response": f"<sql>{task.sql}</sql>",
            "db": f"{task.db}.sqlite", "reference_sql": task.sql, "split": "test"}


def tool_signature(tool: dict) -> str:
    """set_lights(room: string, state: "on"|"off", brightness?: integer): `?` marks an optional parameter."""
    params = tool["parameters"]
    args = []
    for name, prop in params["properties"].items():
        kind = "|".join(json.dumps(v) for v in prop["enum"]) if "enum" in prop else prop["type"]
        args.append(f"{name}{'' if name in params['required'] else '?'}: {kind}")
    return f"{tool['name']}({', '.join(args)})"


def tool_record(record_id: str, task: ToolTask) -> dict:
    listed = [TOOLS[name] for name in task.tools]
    prompt = "Tools:\n" + "".join(f"{tool_signature(t)}\n" for t in listed) + f"Request: {task.request}\n{TOOL_INSTRUCTION}"
    calls = [ToolCall(name, args) for name, args in task.calls]
    return {"id": record_id, "task": "tools", "prompt": prompt, "reference_response": tool_verifier.render_calls(calls),
            "tools": listed, "reference_calls": [{"name": c.name, "arguments": c.arguments} for c in calls],
            "split": "test"}


def instruction_record(record_id: str, task: InstructionTask) -> dict:
    sentences = [instructions.describe(kind, args) for kind, args in task.constraints]
    return {"id": record_id, "task": "instructions", "prompt": " ".join([task.task, *sentences]),
            "reference_response": task.response,
            "constraints": [{"kind": kind, "args": args} for kind, args in task.constraints], "split": "test"}


# ================================================================ code: databases


def build_database(name: str) -> sqlite3.Connection:
    """The database `name` of DATABASES, in memory."""
    ddl, rows = DATABASES[name]
    conn = sqlite3.connect(":memory:")
    conn.executescript(ddl)
    for table, table_rows in rows.items():
        marks = ", ".join("?" * len(table_rows[0]))
        conn.executemany(f"INSERT INTO {table} VALUES ({marks})", table_rows)
    conn.commit()
    return conn


def schema_text(conn: sqlite3.Connection) -> str:
    """One line per table, `name(col, col, ...)`, in creation order."""
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY rowid")]
    return "\n".join(f"{t}({', '.join(c[1] for c in conn.execute(f'PRAGMA table_info({t})'))})" for t in tables)


def dump(conn: sqlite3.Connection) -> list[str]:
    return list(conn.iterdump())


def write_database(name: str, folder: Path) -> None:
    """Write databases/<name>.sqlite; an existing file with the same content is kept as it is (the
    bytes of a SQLite file depend on the library version, its content does not)."""
    target = folder / DB_FOLDER / f"{name}.sqlite"
    target.parent.mkdir(parents=True, exist_ok=True)
    conn = build_database(name)
    if target.exists() and read_dump(target) == dump(conn):
        return
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".sqlite.tmp")
    os.close(fd)
    os.unlink(tmp)  # VACUUM INTO wants a path that does not exist
    conn.execute("VACUUM INTO ?", (tmp,))
    os.replace(tmp, target)


def read_dump(path: Path) -> list[str]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return dump(conn)
    finally:
        conn.close()


# ================================================================ code: building the cases


def build(folder: Path = HERE) -> tuple[list[dict], list[dict]]:
    """(task records, cases) as the JSONL files hold them; reads the databases under `folder`."""
    schemas = {name: schema_text(build_database(name)) for name in DATABASES}
    records, cases = [], []
    for kind_index, kind in enumerate(KINDS):
        tasks = [t for t in SQL_TASKS + TOOL_TASKS + INSTRUCTION_TASKS if t.kind == kind]
        for n, task in enumerate(tasks, start=1):
            case_id = f"{kind}-{n:02d}"
            record_id = f"loc-{case_id}"
            if isinstance(task, SqlTask):
                record = sql_record(record_id, task, schemas[task.db])
            elif isinstance(task, ToolTask):
                record = tool_record(record_id, task)
            else:
                record = instruction_record(record_id, task)
            records.append(record)
            split = "dev" if (n + kind_index) % 2 == 0 else "test"
            cases.append(make_case(case_id, kind, split, record, task.edit, folder))
    return records, cases


def make_case(case_id: str, kind: str, split: str, record: dict, edit: Edit, folder: Path) -> dict:
    reference = record["reference_response"]
    try:
        a, b = edit.locate(reference)
    except ValueError as e:
        raise ValueError(f"case {case_id}: {e}") from None
    reward, fails = blamed(kind, verifiers.parse_record(record, 0, folder))
    return {"id": case_id, "record_id": record["id"], "family": KINDS[kind][0], "kind": kind, "split": split,
            "reference_span": [a, b], "replacement": edit.new, "response": reference[:a] + edit.new + reference[b:],
            "edit_span": edit_span(a, edit.new), "reward": reward, "fails": fails}


def blamed(kind: str, record: TaskRecord) -> tuple[str, list[str]]:
    """(the reward the edit of `kind` is blamed on, the rewards it should fail, in verifier order)."""
    family, targets = KINDS[kind]
    if kind == "sql_table":
        return "executable", ["executable", "execution"]
    if family == "sql":
        return "execution", ["execution"]
    if family == "tools":
        return "correctness", ["correctness"]
    names = verifiers.reward_names(record)
    hits = [name for name, c in zip(names, record.spec.constraints) if c.kind in targets]
    if len(hits) != 1:
        raise ValueError(f"record {record.id}: needs exactly one {' or '.join(targets)} constraint, has {len(hits)}")
    return hits[0], hits


def jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def write_text(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_all(folder: Path = HERE) -> None:
    for name in DATABASES:
        write_database(name, folder)
    records, cases = build(folder)
    write_text(folder / TASKS_FILE, jsonl(records))
    write_text(folder / CASES_FILE, jsonl(cases))


# ================================================================ code: the checker


def check(folder: Path = HERE) -> list[str]:
    """Every problem with the benchmark files under `folder` (an empty list when all is well)."""
    problems = check_files(folder)
    records, rejected = verifiers.load_tasks(folder / TASKS_FILE)
    problems += [f"{TASKS_FILE} line {r.line_no}: rejected: {r.reason}" for r in rejected]
    cases = []
    for line_no, line in enumerate((folder / CASES_FILE).read_text(encoding="utf-8").splitlines(), start=1):
        try:
            case = json.loads(line)
        except ValueError as e:
            problems.append(f"{CASES_FILE} line {line_no}: invalid JSON ({e})")
            continue
        missing = [k for k in CASE_FIELDS if k not in case] if isinstance(case, dict) else list(CASE_FIELDS)
        if missing:
            problems.append(f"{CASES_FILE} line {line_no}: missing {', '.join(missing)}")
        else:
            cases.append(case)
    return problems + check_cases(records, cases)


def check_files(folder: Path) -> list[str]:
    """The databases hold what DATABASES says and the JSONL files are what `build` writes."""
    problems = []
    for name in DATABASES:
        path = folder / DB_FOLDER / f"{name}.sqlite"
        if not path.is_file():
            problems.append(f"{path}: missing")
        elif read_dump(path) != dump(build_database(name)):
            problems.append(f"{path}: content differs from DATABASES['{name}']")
    if problems:
        return problems
    records, cases = build(folder)
    for file, rows in ((TASKS_FILE, records), (CASES_FILE, cases)):
        path = folder / file
        if not path.is_file() or path.read_text(encoding="utf-8") != jsonl(rows):
            problems.append(f"{path}: differs from what build_cases.py writes (edit source.json, not the file)")
    return problems


def check_cases(records: list[TaskRecord], cases: list[dict]) -> list[str]:
    """The benchmark's promises about records and cases, checked with the verifiers themselves."""
    problems = []
    by_id = {r.id: r for r in records}
    for record in records:
        scores = verifiers.verify(record, record.reference_response)
        problems += [f"record {record.id}: reference scores {s.score} on {s.name}: {s.feedback}"
                     for s in scores if s.score != 1.0]
        if record.split != "test":
            problems.append(f"record {record.id}: split {record.split!r}, expected 'test'")
    for case in cases:
        record = by_id.get(case["record_id"])
        if record is None:
            problems.append(f"case {case['id']}: no record {case['record_id']!r}")
            continue
        problems += [f"case {case['id']}: {p}" for p in check_case(case, record)]
    unused = sorted(by_id.keys() - {c["record_id"] for c in cases})
    problems += [f"record {r}: no case uses it" for r in unused]
    return problems + check_counts(cases)


def check_case(case: dict, record: TaskRecord) -> list[str]:
    problems = []
    family, targets = KINDS.get(case["kind"], (None, ()))
    if family is None or family != case["family"] or record.task != family:
        return [f"kind {case['kind']!r}, family {case['family']!r} and task {record.task!r} do not fit"]
    ref, (a, b), new = record.reference_response, case["reference_span"], case["replacement"]
    if not 0 <= a <= b <= len(ref) or case["response"] != ref[:a] + new + ref[b:]:
        problems.append("response is not the reference with the replacement at reference_span")
    if ref[a:b] == new:
        problems.append("the replacement equals the replaced text (no edit)")
    if case["edit_span"] != edit_span(a, new):
        problems.append(f"edit_span {case['edit_span']} should be {edit_span(a, new)}")
    scores = {s.name: s.score for s in verifiers.verify(record, case["response"])}
    failing = [name for name, score in scores.items() if score < 1.0]
    if failing != case["fails"]:
        problems.append(f"fails {failing}, the case says {case['fails']}")
    if case["reward"] not in case["fails"]:
        problems.append(f"reward {case['reward']!r} is not in fails")
    if targets:  # an instruction kind: the blamed reward is the constraint the kind names
        kind_of = dict(zip(verifiers.reward_names(record), (c.kind for c in record.spec.constraints)))
        if kind_of.get(case["reward"]) not in targets:
            problems.append(f"reward {case['reward']!r} is not a {' or '.join(targets)} constraint")
    if family == "tools":
        problems += check_tool_edit(case["kind"], record, case["response"])
    return problems


def check_tool_edit(kind: str, record: TaskRecord, response: str) -> list[str]:
    """The edit of a tool case changes one call in the way its kind says, and nothing else."""
    got, problem = tool_verifier.parse_calls(response)
    want = list(record.spec.reference_calls)
    if problem or len(got) != len(want):
        return [f"the edited response does not parse into {len(want)} calls ({problem})"]
    diffs = [(ref, call) for ref, call in zip(want, got) if ref != call]
    if len(diffs) != 1:
        return [f"{len(diffs)} calls differ from the reference, expected 1"]
    (ref, call), = diffs
    params = {t["name"]: t["parameters"] for t in record.spec.tools}
    missing = object()
    changed = sorted(k for k in ref.arguments.keys() | call.arguments.keys()
                     if ref.arguments.get(k, missing) != call.arguments.get(k, missing))
    if kind == "tool_function_name":
        ok = call.name != ref.name and call.name in params and not changed
    elif call.name != ref.name or len(changed) != 1:
        ok = False
    else:
        key = changed[0]
        prop, value = params[ref.name]["properties"].get(key, {}), call.arguments.get(key)
        ok = {"tool_missing_argument": key not in call.arguments and key in params[ref.name].get("required", []),
              "tool_enum_value": value in prop.get("enum", []),
              "tool_number": prop.get("type") in ("number", "integer") and type(value) in (int, float)}[kind]
    return [] if ok else [f"the edit is not a {kind} edit (call {ref.name} -> {call.name}, changed {changed})"]


def check_counts(cases: list[dict]) -> list[str]:
    problems = []
    if len(cases) < MIN_CASES:
        problems.append(f"{len(cases)} cases, need at least {MIN_CASES}")
    if len({c["id"] for c in cases}) != len(cases):
        problems.append("duplicate case ids")
    splits = Counter((c["kind"], c["split"]) for c in cases)
    for kind in KINDS:
        dev, test = splits[kind, "dev"], splits[kind, "test"]
        if dev + test < MIN_PER_KIND:
            problems.append(f"{kind}: {dev + test} cases, need at least {MIN_PER_KIND}")
        if abs(dev - test) > 1:
            problems.append(f"{kind}: {dev} dev and {test} test cases, expected about half and half")
    bad = {c["split"] for c in cases} - {"dev", "test"}
    if bad:
        problems.append(f"unknown splits {sorted(bad)}")
    record_splits: dict[str, set[str]] = {}
    for c in cases:
        record_splits.setdefault(c["record_id"], set()).add(c["split"])
    problems += [f"record {r} is used by both splits" for r, s in sorted(record_splits.items()) if len(s) > 1]
    return problems


def summary(cases: list[dict]) -> str:
    counts = Counter((c["kind"], c["split"]) for c in cases)
    lines = [f"{'kind':<24}{'dev':>5}{'test':>6}"]
    lines += [f"{kind:<24}{counts[kind, 'dev']:>5}{counts[kind, 'test']:>6}" for kind in KINDS]
    dev, test = sum(c["split"] == "dev" for c in cases), sum(c["split"] == "test" for c in cases)
    return "\n".join(lines + [f"{'all':<24}{dev:>5}{test:>6}"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="only check the files on disk")
    args = parser.parse_args()
    if not args.check:
        write_all()
    problems = check()
    if problems:
        print("\n".join(problems), file=sys.stderr)
        sys.exit(f"{len(problems)} problem(s) in {HERE}")
    print(summary([json.loads(line) for line in (HERE / CASES_FILE).read_text(encoding="utf-8").splitlines()]))


# ================================================================ code: the hand-written data


def load_source(path: Path = HERE / SOURCE) -> tuple[dict, dict, list[SqlTask], list[ToolTask], list[InstructionTask]]:
    """(DATABASES: name -> (DDL, {table: rows}), TOOLS: name -> JSON schema, SQL_TASKS, TOOL_TASKS,
    INSTRUCTION_TASKS) from source.json."""
    data = json.loads(path.read_text(encoding="utf-8"))
    databases = {name: (db["ddl"], {table: [tuple(row) for row in rows] for table, rows in db["rows"].items()})
                 for name, db in data["databases"].items()}
    sql = [SqlTask(t["kind"], t["db"], t["question"], t["sql"], Edit(**t["edit"])) for t in data["sql_tasks"]]
    tool_tasks = [ToolTask(t["kind"], tuple(t["tools"]), t["request"],
                           tuple((c["name"], c["arguments"]) for c in t["calls"]), Edit(**t["edit"]))
                  for t in data["tool_tasks"]]
    instruction = [InstructionTask(t["kind"], t["task"], tuple((c["kind"], c["args"]) for c in t["constraints"]),
                                   t["response"], Edit(**t["edit"])) for t in data["instruction_tasks"]]
    return databases, {t["name"]: t for t in data["tools"]}, sql, tool_tasks, instruction


DATABASES, TOOLS, SQL_TASKS, TOOL_TASKS, INSTRUCTION_TASKS = load_source()


if __name__ == "__main__":
    main()
