"""Build the localization benchmark: hand-written tasks, each reference response with ONE edit.

    python bench/localization/build_cases.py           # rebuild databases/, tasks.jsonl, cases.jsonl; check
    python bench/localization/build_cases.py --check   # only check the files on disk

A case is a task record (the native JSONL format of `schemas/records.py`), the record's correct
`reference_response` with exactly one edit (`response`), the edit's character span in `response`
(`edit_span`) and the reward the edit should be blamed on (`reward`). The benchmark asks whether
MRTPO's replay puts that reward's largest weight on the edited token(s). The format of
`cases.jsonl` is in README.md beside this script.

Everything below the code is data, written by hand: four SQLite databases (hospital, airline,
university, football league), then the SQL, tool-calling and instruction tasks, each with its
one edit. Every task is used by exactly one case. A case's dev/test split alternates within its
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

TASKS_FILE, CASES_FILE, DB_FOLDER = "tasks.jsonl", "cases.jsonl", "databases"
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


def replace(old: str, new: str, within: str | None = None) -> Edit:
    return Edit(old, new, within or old)


def delete(old: str, within: str | None = None) -> Edit:
    return Edit(old, "", within or old)


def insert(new: str, after: str) -> Edit:
    return Edit("", new, after)


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
            problems.append(f"{path}: differs from what build_cases.py writes (edit the script, not the file)")
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


# ================================================================ data: databases

HOSPITAL_DDL = """
CREATE TABLE department (id INTEGER PRIMARY KEY, name TEXT NOT NULL, floor INTEGER, budget INTEGER);
CREATE TABLE physician (id INTEGER PRIMARY KEY, name TEXT NOT NULL, specialty TEXT,
    department_id INTEGER REFERENCES department(id), hired_year INTEGER, salary INTEGER);
CREATE TABLE patient (id INTEGER PRIMARY KEY, name TEXT NOT NULL, birth_year INTEGER, sex TEXT, city TEXT,
    insurer TEXT);
CREATE TABLE admission (id INTEGER PRIMARY KEY, patient_id INTEGER REFERENCES patient(id),
    physician_id INTEGER REFERENCES physician(id), department_id INTEGER REFERENCES department(id),
    admitted_on TEXT, nights INTEGER, cost REAL, outcome TEXT);
"""
HOSPITAL_ROWS = {
    "department": [
        (1, "Cardiology", 3, 2400000), (2, "Neurology", 4, 1900000), (3, "Oncology", 5, 3100000),
        (4, "Pediatrics", 2, 1500000), (5, "Orthopedics", 1, 1700000), (6, "Emergency", 0, 2800000),
    ],
    "physician": [
        (1, "Amara Osei", "cardiologist", 1, 2009, 215000),
        (2, "Lukas Brandt", "cardiologist", 1, 2016, 182000),
        (3, "Mei Tanaka", "neurologist", 2, 2012, 198000),
        (4, "Rafael Ortiz", "neurosurgeon", 2, 2005, 260000),
        (5, "Ingrid Solberg", "oncologist", 3, 2018, 176000),
        (6, "Samuel Adeyemi", "oncologist", 3, 2011, 205000),
        (7, "Clara Nguyen", "pediatrician", 4, 2020, 150000),
        (8, "Omar Haddad", "pediatrician", 4, 2014, 162000),
        (9, "Elena Petrova", "orthopedic surgeon", 5, 2008, 240000),
        (10, "James Whitfield", "emergency physician", 6, 2017, 171000),
        (11, "Priya Raman", "emergency physician", 6, 2021, 158000),
        (12, "Tomas Novak", "orthopedic surgeon", 5, 2015, 221000),
    ],
    "patient": [
        (1, "Harold Finch", 1948, "M", "Leeds", "Medicor"),
        (2, "Grace Okafor", 1975, "F", "York", "HealthFirst"),
        (3, "Noah Lindqvist", 2012, "M", "Leeds", "HealthFirst"),
        (4, "Fatima Zahra", 1950, "F", "Hull", "Medicor"),
        (5, "Owen Price", 1962, "M", "Sheffield", None),
        (6, "Isla Morgan", 1988, "F", "Leeds", "CareWell"),
        (7, "Victor Hale", 1941, "M", "York", "Medicor"),
        (8, "Sofia Marino", 1969, "F", "Bradford", "CareWell"),
        (9, "Ethan Cole", 2015, "M", "Hull", "HealthFirst"),
        (10, "Maya Patel", 1993, "F", "Sheffield", "Medicor"),
        (11, "George Banks", 1957, "M", "Leeds", None),
        (12, "Ruth Adler", 1945, "F", "Bradford", "HealthFirst"),
        (13, "Liam Doyle", 1979, "M", "York", "CareWell"),
        (14, "Chloe Evans", 2009, "F", "Leeds", "Medicor"),
        (15, "Arthur Webb", 1950, "M", "Sheffield", "HealthFirst"),
        (16, "Nadia Haddad", 1983, "F", "Hull", None),
        (17, "Peter Quinn", 1966, "M", "Bradford", "Medicor"),
        (18, "Alice Turner", 1971, "F", "Leeds", "HealthFirst"),
        (19, "Ben Carter", 2018, "M", "York", "CareWell"),
        (20, "Zoe Fischer", 1959, "F", "Hull", "Medicor"),
    ],
    "admission": [
        (1, 1, 1, 1, "2023-01-14", 6, 8400.0, "discharged"),
        (2, 2, 3, 2, "2023-02-03", 2, 2300.0, "discharged"),
        (3, 3, 7, 4, "2023-02-20", 1, 900.0, "discharged"),
        (4, 4, 6, 3, "2023-03-11", 9, 12600.0, "transferred"),
        (5, 5, 10, 6, "2023-03-29", 0, 650.0, "discharged"),
        (6, 6, 11, 6, "2023-04-17", 1, 1200.0, "discharged"),
        (7, 7, 2, 1, "2023-05-02", 12, 15800.0, "transferred"),
        (8, 8, 9, 5, "2023-05-23", 4, 5000.0, "discharged"),
        (9, 9, 8, 4, "2023-06-08", 3, 2100.0, "discharged"),
        (10, 10, 5, 3, "2023-06-30", 7, 9800.0, "discharged"),
        (11, 11, 4, 2, "2023-07-19", 10, 21400.0, "transferred"),
        (12, 12, 1, 1, "2023-08-05", 5, 7100.0, "discharged"),
        (13, 13, 12, 5, "2023-08-27", 2, 3900.0, "discharged"),
        (14, 14, 7, 4, "2023-09-14", 2, 1500.0, "discharged"),
        (15, 15, 9, 5, "2023-10-02", 6, 8800.0, "discharged"),
        (16, 1, 2, 1, "2023-10-21", 3, 4200.0, "discharged"),
        (17, 16, 10, 6, "2023-11-09", 1, 950.0, "self-discharged"),
        (18, 17, 6, 3, "2023-11-30", 8, 11200.0, "discharged"),
        (19, 18, 3, 2, "2024-01-06", 4, 5000.0, "discharged"),
        (20, 19, 8, 4, "2024-01-25", 1, 700.0, "discharged"),
        (21, 20, 5, 3, "2024-02-13", 7, 9100.0, "transferred"),
        (22, 7, 1, 1, "2024-03-04", 5, 6900.0, "discharged"),
        (23, 12, 4, 2, "2024-03-22", 6, 13500.0, "discharged"),
        (24, 5, 11, 6, "2024-04-10", 0, 480.0, "self-discharged"),
        (25, 2, 12, 5, "2024-04-28", 3, 4600.0, "discharged"),
        (26, 11, 2, 1, "2024-05-16", 9, 12900.0, "transferred"),
        (27, 15, 9, 5, "2024-06-03", 4, 6100.0, "discharged"),
        (28, 4, 5, 3, "2024-06-21", 5, 7300.0, "discharged"),
        (29, 8, 10, 6, "2024-07-09", 2, 1800.0, "discharged"),
        (30, 13, 3, 2, "2024-07-28", 3, 3300.0, "discharged"),
    ],
}

AIRLINE_DDL = """
CREATE TABLE airport (id INTEGER PRIMARY KEY, code TEXT NOT NULL, city TEXT, country TEXT);
CREATE TABLE aircraft (id INTEGER PRIMARY KEY, model TEXT NOT NULL, manufacturer TEXT, seats INTEGER,
    year_built INTEGER);
CREATE TABLE flight (id INTEGER PRIMARY KEY, flight_no TEXT NOT NULL, origin_id INTEGER REFERENCES airport(id),
    destination_id INTEGER REFERENCES airport(id), aircraft_id INTEGER REFERENCES aircraft(id),
    distance_km INTEGER, departure_hour INTEGER);
CREATE TABLE passenger (id INTEGER PRIMARY KEY, name TEXT NOT NULL, nationality TEXT, birth_year INTEGER,
    loyalty_tier TEXT);
CREATE TABLE booking (id INTEGER PRIMARY KEY, flight_id INTEGER REFERENCES flight(id),
    passenger_id INTEGER REFERENCES passenger(id), cabin TEXT, price REAL, bags INTEGER);
"""
AIRLINE_ROWS = {
    "airport": [
        (1, "LHR", "London", "United Kingdom"), (2, "CDG", "Paris", "France"), (3, "FRA", "Frankfurt", "Germany"),
        (4, "MAD", "Madrid", "Spain"), (5, "JFK", "New York", "United States"),
        (6, "DXB", "Dubai", "United Arab Emirates"), (7, "NRT", "Tokyo", "Japan"),
        (8, "AMS", "Amsterdam", "Netherlands"), (9, "LGW", "London", "United Kingdom"),
        (10, "MUC", "Munich", "Germany"),
    ],
    "aircraft": [
        (1, "A320neo", "Airbus", 180, 2019), (2, "A350-900", "Airbus", 325, 2017),
        (3, "737 MAX 8", "Boeing", 178, 2020), (4, "787-9", "Boeing", 290, 2016), (5, "E190", "Embraer", 100, 2012),
        (6, "A321", "Airbus", 220, 2014), (7, "777-300ER", "Boeing", 396, 2011),
    ],
    "flight": [
        (1, "BA117", 1, 5, 7, 5540, 8), (2, "BA304", 1, 2, 1, 344, 7), (3, "AF1680", 2, 4, 6, 1065, 13),
        (4, "LH402", 3, 5, 4, 6200, 10), (5, "LH2470", 10, 1, 1, 940, 6), (6, "EK29", 6, 1, 7, 5500, 14),
        (7, "EK318", 6, 7, 2, 7930, 2), (8, "JL44", 7, 1, 2, 9600, 11), (9, "KL1001", 8, 9, 5, 370, 12),
        (10, "IB3166", 4, 1, 6, 1260, 16), (11, "AF22", 2, 5, 4, 5840, 10), (12, "LH1114", 3, 4, 3, 1420, 9),
        (13, "KL641", 8, 5, 2, 5860, 12), (14, "BA2490", 9, 4, 3, 1250, 18), (15, "IB6251", 4, 5, 2, 5770, 15),
        (16, "EK73", 6, 2, 7, 5250, 3), (17, "LH980", 3, 8, 5, 365, 21), (18, "AF1140", 2, 8, 1, 400, 12),
    ],
    "passenger": [
        (1, "Hannah Becker", "German", 1985, "gold"), (2, "Kenji Sato", "Japanese", 1979, "platinum"),
        (3, "Lucia Romero", "Spanish", 1992, "none"), (4, "Tom Gallagher", "British", 1968, "silver"),
        (5, "Amelie Durand", "French", 2001, "none"), (6, "Rashid Al Amiri", "Emirati", 1974, "gold"),
        (7, "Emily Clarke", "British", 1990, "gold"), (8, "Marco Bianchi", "Italian", 1983, "silver"),
        (9, "Yuki Mori", "Japanese", 1996, "silver"), (10, "Daniel Weiss", "German", 1972, "platinum"),
        (11, "Sarah Miller", "American", 1988, "none"), (12, "Pieter de Vries", "Dutch", 1965, "gold"),
        (13, "Ines Moreau", "French", 1999, "silver"), (14, "Carlos Ruiz", "Spanish", 1981, "gold"),
        (15, "Olivia Brooks", "American", 1977, "silver"), (16, "Jonas Fischer", "German", 1994, "none"),
    ],
    "booking": [
        (1, 1, 4, "business", 2890.0, 2), (2, 1, 11, "economy", 640.0, 1), (3, 1, 7, "economy", 610.0, 1),
        (4, 2, 13, "economy", 120.0, 0), (5, 2, 4, "business", 380.0, 1), (6, 3, 3, "economy", 150.0, 1),
        (7, 4, 1, "first", 5200.0, 2), (8, 4, 10, "business", 3100.0, 2), (9, 5, 16, "economy", 180.0, 0),
        (10, 6, 6, "first", 6400.0, 3), (11, 6, 12, "business", 2750.0, 2), (12, 7, 2, "business", 3900.0, 2),
        (13, 8, 9, "economy", 980.0, 1), (14, 8, 2, "first", 7800.0, 2), (15, 9, 12, "economy", 95.0, 0),
        (16, 10, 14, "economy", 210.0, 1), (17, 11, 5, "economy", 560.0, 1), (18, 11, 13, "business", 2400.0, 2),
        (19, 12, 1, "economy", 230.0, 1), (20, 13, 15, "economy", 700.0, 2), (21, 14, 3, "economy", 300.0, 1),
        (22, 15, 14, "business", 2650.0, 2), (23, 15, 11, "economy", 720.0, 1), (24, 16, 6, "business", 3000.0, 1),
        (25, 17, 10, "economy", 300.0, 0), (26, 18, 5, "economy", 140.0, 1), (27, 3, 8, "business", 890.0, 1),
        (28, 7, 9, "economy", 1150.0, 2), (29, 12, 16, "economy", 260.0, 1), (30, 2, 7, "economy", 135.0, 0),
        (31, 10, 8, "economy", 300.0, 1), (32, 13, 12, "first", 6900.0, 3),
    ],
}

UNIVERSITY_DDL = """
CREATE TABLE faculty (id INTEGER PRIMARY KEY, name TEXT NOT NULL, building TEXT, founded INTEGER);
CREATE TABLE professor (id INTEGER PRIMARY KEY, name TEXT NOT NULL, rank TEXT,
    faculty_id INTEGER REFERENCES faculty(id), hire_year INTEGER, salary INTEGER);
CREATE TABLE course (id INTEGER PRIMARY KEY, code TEXT NOT NULL, title TEXT, credits INTEGER, level INTEGER,
    professor_id INTEGER REFERENCES professor(id));
CREATE TABLE student (id INTEGER PRIMARY KEY, name TEXT NOT NULL, faculty_id INTEGER REFERENCES faculty(id),
    enrollment_year INTEGER, gpa REAL, country TEXT);
CREATE TABLE enrollment (id INTEGER PRIMARY KEY, student_id INTEGER REFERENCES student(id),
    course_id INTEGER REFERENCES course(id), semester TEXT, grade INTEGER);
"""
UNIVERSITY_ROWS = {
    "faculty": [
        (1, "Engineering", "Turing Hall", 1961), (2, "Natural Sciences", "Curie Building", 1955),
        (3, "Humanities", "Austen House", 1948), (4, "Business", "Keynes Centre", 1972),
        (5, "Medicine", "Harvey Wing", 1950),
    ],
    "professor": [
        (1, "Alan Moss", "full", 1, 1998, 128000), (2, "Beatriz Lima", "associate", 1, 2010, 104000),
        (3, "Chen Wei", "lecturer", 1, 2019, 82000), (4, "Dora Szabo", "full", 2, 2003, 122000),
        (5, "Erik Holm", "associate", 2, 2012, 99000), (6, "Farah Nasser", "lecturer", 3, 2016, 76000),
        (7, "Gavin Reid", "full", 3, 1995, 118000), (8, "Helen Park", "associate", 4, 2010, 110000),
        (9, "Ivan Petrov", "lecturer", 4, 2021, 79000), (10, "Julia Kern", "full", 5, 2001, 140000),
        (11, "Kofi Mensah", "associate", 5, 2014, 112000), (12, "Laura Rossi", "lecturer", 2, 2020, 80000),
    ],
    "course": [
        (1, "ENG101", "Statics", 6, 100, 3), (2, "ENG210", "Circuit Analysis", 6, 200, 2),
        (3, "ENG340", "Control Systems", 5, 300, 1), (4, "SCI101", "General Chemistry", 6, 100, 12),
        (5, "SCI230", "Genetics", 5, 200, 4), (6, "SCI310", "Quantum Mechanics", 8, 300, 5),
        (7, "HUM120", "Medieval History", 4, 100, 7), (8, "HUM250", "Philosophy of Mind", 5, 200, 6),
        (9, "BUS101", "Accounting Basics", 4, 100, 9), (10, "BUS330", "Corporate Finance", 6, 300, 8),
        (11, "MED201", "Human Anatomy", 8, 200, 10), (12, "MED305", "Pharmacology", 6, 300, 11),
        (13, "ENG420", "Robotics Project", 10, 400, 1), (14, "SCI105", "Chemistry Lab", 2, 100, 12),
        (15, "HUM410", "Thesis Seminar", 10, 400, 7),
    ],
    "student": [
        (1, "Aisha Bello", 1, 2021, 3.7, "Nigeria"), (2, "Ben Hughes", 1, 2022, 2.9, "United Kingdom"),
        (3, "Carla Mendes", 2, 2021, 3.5, "Portugal"), (4, "David Kim", 2, 2023, 3.1, "South Korea"),
        (5, "Eva Novak", 3, 2020, 3.9, "Czechia"), (6, "Felix Wagner", 4, 2022, 2.6, "Germany"),
        (7, "Gita Sharma", 5, 2021, 3.8, "India"), (8, "Hugo Laurent", 1, 2023, 3.3, "France"),
        (9, "Iris Jansen", 3, 2022, 3.5, "Netherlands"), (10, "Jack Wilson", 4, 2021, 3.0, "United Kingdom"),
        (11, "Kira Ivanova", 2, 2020, 3.6, "Bulgaria"), (12, "Leo Costa", 5, 2023, 2.8, "Brazil"),
        (13, "Mina Yilmaz", 1, 2021, 3.4, "Turkey"), (14, "Nils Berg", 4, 2023, 3.2, "Sweden"),
        (15, "Olga Sokol", 3, 2021, 2.7, "Ukraine"), (16, "Pablo Ortega", 2, 2022, 3.9, "Spain"),
        (17, "Quinn Murphy", 5, 2020, 3.5, "Ireland"), (18, "Rosa Alvarez", 1, 2022, 3.0, "Mexico"),
    ],
    "enrollment": [
        (1, 1, 1, "2023-autumn", 82), (2, 1, 2, "2024-spring", 74), (3, 2, 1, "2023-autumn", 58),
        (4, 2, 13, "2024-spring", 65), (5, 3, 4, "2023-autumn", 88), (6, 3, 5, "2024-spring", 91),
        (7, 4, 4, "2023-autumn", 67), (8, 4, 14, "2023-autumn", 72), (9, 5, 7, "2023-autumn", 95),
        (10, 5, 15, "2024-spring", 89), (11, 6, 9, "2023-autumn", 55), (12, 6, 10, "2024-spring", 61),
        (13, 7, 11, "2023-autumn", 90), (14, 7, 12, "2024-spring", 84), (15, 8, 1, "2023-autumn", 70),
        (16, 8, 3, "2024-spring", 77), (17, 9, 8, "2023-autumn", 86), (18, 9, 7, "2024-spring", 80),
        (19, 10, 9, "2023-autumn", 73), (20, 10, 10, "2024-spring", 69), (21, 11, 6, "2023-autumn", 93),
        (22, 11, 5, "2024-spring", 87), (23, 12, 11, "2024-spring", 62), (24, 13, 2, "2023-autumn", 79),
        (25, 13, 3, "2024-spring", 83), (26, 14, 9, "2024-spring", 71), (27, 15, 8, "2023-autumn", 64),
        (28, 16, 6, "2024-spring", 97), (29, 16, 4, "2023-autumn", 92), (30, 17, 12, "2023-autumn", 78),
        (31, 17, 11, "2024-spring", 85), (32, 18, 13, "2024-spring", 70), (33, 1, 3, "2024-spring", 88),
        (34, 3, 6, "2024-spring", 76), (35, 9, 15, "2024-spring", 81),
    ],
}

LEAGUE_DDL = """
CREATE TABLE club (id INTEGER PRIMARY KEY, name TEXT NOT NULL, city TEXT, founded INTEGER, stadium_capacity INTEGER);
CREATE TABLE player (id INTEGER PRIMARY KEY, name TEXT NOT NULL, position TEXT, club_id INTEGER REFERENCES club(id),
    birth_year INTEGER, goals INTEGER, weekly_wage INTEGER);
CREATE TABLE fixture (id INTEGER PRIMARY KEY, matchday INTEGER, home_club_id INTEGER REFERENCES club(id),
    away_club_id INTEGER REFERENCES club(id), home_goals INTEGER, away_goals INTEGER, attendance INTEGER);
CREATE TABLE transfer (id INTEGER PRIMARY KEY, player_id INTEGER REFERENCES player(id),
    from_club_id INTEGER REFERENCES club(id), to_club_id INTEGER REFERENCES club(id), fee INTEGER, season TEXT);
"""
LEAGUE_ROWS = {
    "club": [
        (1, "Riverside Rovers", "Northport", 1889, 42000), (2, "Ashford Athletic", "Ashford", 1902, 28500),
        (3, "Kingsbridge United", "Kingsbridge", 1878, 51000), (4, "Harbour City FC", "Harbour City", 1921, 33000),
        (5, "Millbrook Town", "Millbrook", 1897, 18000), (6, "Eastfield Wanderers", "Eastfield", 1910, 24000),
        (7, "Stonegate Albion", "Stonegate", 1885, 36500), (8, "Westholm Rangers", "Westholm", 1933, 20000),
    ],
    "player": [
        (1, "Marcus Reed", "forward", 1, 1996, 14, 52000), (2, "Joao Silva", "midfielder", 1, 1999, 6, 38000),
        (3, "Tom Archer", "goalkeeper", 1, 1992, 0, 30000), (4, "Luca Ferri", "forward", 2, 2000, 9, 27000),
        (5, "Sam Okoye", "defender", 2, 1997, 2, 21000), (6, "Dylan Hart", "midfielder", 2, 1995, 4, 24000),
        (7, "Kai Mueller", "forward", 3, 1994, 18, 75000), (8, "Adam Novak", "defender", 3, 1998, 3, 48000),
        (9, "Rui Pereira", "midfielder", 3, 2001, 7, 41000), (10, "Finn Walsh", "forward", 4, 2002, 10, 33000),
        (11, "Omar Diallo", "defender", 4, 1993, 1, 29000), (12, "Ellis Grant", "goalkeeper", 4, 1990, 0, 26000),
        (13, "Nico Brandt", "midfielder", 5, 1998, 5, 15000), (14, "Ryan Shaw", "forward", 5, 2003, 8, 12000),
        (15, "Ivo Petrak", "defender", 5, 1996, 2, 14000), (16, "Theo Blake", "forward", 6, 1997, 11, 22000),
        (17, "Jonas Lund", "midfielder", 6, 1999, 3, 19000), (18, "Mateo Vidal", "defender", 6, 2001, 4, 17000),
        (19, "Harry Stone", "forward", 7, 1995, 13, 45000), (20, "Aaron Mills", "goalkeeper", 7, 1991, 0, 31000),
        (21, "Leon Kraus", "defender", 7, 2000, 5, 28000), (22, "Owen Clarke", "midfielder", 8, 1998, 6, 18000),
        (23, "Ben Farrow", "forward", 8, 2001, 7, 16000), (24, "Callum Price", "defender", 8, 1994, 1, 15500),
    ],
    "fixture": [
        (1, 1, 1, 2, 2, 1, 39800), (2, 1, 3, 4, 3, 3, 50200), (3, 1, 5, 6, 0, 1, 16400), (4, 1, 7, 8, 2, 0, 33100),
        (5, 2, 2, 3, 1, 2, 27900), (6, 2, 4, 5, 2, 2, 30500), (7, 2, 6, 7, 1, 3, 20000), (8, 2, 8, 1, 0, 0, 19800),
        (9, 3, 1, 3, 1, 1, 41900), (10, 3, 2, 5, 3, 0, 25600), (11, 3, 4, 7, 0, 2, 31800), (12, 3, 6, 8, 2, 1, 21700),
        (13, 4, 3, 5, 4, 1, 49800), (14, 4, 7, 1, 1, 2, 36000), (15, 4, 8, 2, 2, 2, 17500), (16, 4, 5, 4, 1, 0, 17900),
    ],
    "transfer": [
        (1, 7, 2, 3, 32000000, "2022-23"), (2, 10, 5, 4, 6500000, "2023-24"), (3, 19, 1, 7, 18000000, "2021-22"),
        (4, 2, 6, 1, 9000000, "2023-24"), (5, 16, 8, 6, 2500000, "2022-23"), (6, 9, 7, 3, 12000000, "2023-24"),
        (7, 4, 5, 2, 3000000, "2022-23"), (8, 21, 8, 7, 1800000, "2023-24"), (9, 13, 6, 5, 750000, "2021-22"),
        (10, 8, 4, 3, 15000000, "2022-23"),
    ],
}

DATABASES = {
    "hospital": (HOSPITAL_DDL, HOSPITAL_ROWS),
    "airline": (AIRLINE_DDL, AIRLINE_ROWS),
    "university": (UNIVERSITY_DDL, UNIVERSITY_ROWS),
    "league": (LEAGUE_DDL, LEAGUE_ROWS),
}


# ================================================================ data: SQL tasks (11 per kind)

SQL_TASKS = [
    # ---- sql_operator: one comparison operator changed; the query runs, the result differs
    SqlTask("sql_operator", "hospital", "How many physicians were hired in 2015 or later?",
            "SELECT COUNT(*) FROM physician WHERE hired_year >= 2015", replace(">=", ">")),
    SqlTask("sql_operator", "hospital", "List the names of patients born before 1950.",
            "SELECT name FROM patient WHERE birth_year < 1950", replace("<", "<=", within=" < ")),
    SqlTask("sql_operator", "hospital", "Which admissions cost more than 10000? Give their id and cost.",
            "SELECT id, cost FROM admission WHERE cost > 10000 ORDER BY cost DESC", replace(">", "<", within=" > ")),
    SqlTask("sql_operator", "airline", "Which flights are at least 5500 km long? Give the flight numbers.",
            "SELECT flight_no FROM flight WHERE distance_km >= 5500", replace(">=", ">")),
    SqlTask("sql_operator", "airline", "What are the names of passengers whose loyalty tier is not gold?",
            "SELECT name FROM passenger WHERE loyalty_tier != 'gold'", replace("!=", "=")),
    SqlTask("sql_operator", "airline", "How many economy bookings cost at most 300?",
            "SELECT COUNT(*) FROM booking WHERE cabin = 'economy' AND price <= 300", replace("<=", "<")),
    SqlTask("sql_operator", "university", "Give the names of students with a GPA of at least 3.5.",
            "SELECT name FROM student WHERE gpa >= 3.5", replace(">=", ">")),
    SqlTask("sql_operator", "university", "Which courses are worth fewer than 6 credits? Give their titles.",
            "SELECT title FROM course WHERE credits < 6", replace("<", ">", within=" < ")),
    SqlTask("sql_operator", "university", "List the names of professors hired after 2010, newest first.",
            "SELECT name FROM professor WHERE hire_year > 2010 ORDER BY hire_year DESC", replace(">", ">=", within=" > ")),
    SqlTask("sql_operator", "league", "Which players have scored more than 10 goals? Give their names and goals.",
            "SELECT name, goals FROM player WHERE goals > 10", replace(">", ">=", within=" > ")),
    SqlTask("sql_operator", "league", "How many fixtures did the home club win?",
            "SELECT COUNT(*) FROM fixture WHERE home_goals > away_goals", replace(">", ">=", within=" > ")),

    # ---- sql_join_column: a wrong column in a JOIN ... ON; the query runs, the result differs
    SqlTask("sql_join_column", "hospital", "List every physician's name with the name of their department.",
            "SELECT physician.name, department.name FROM physician JOIN department "
            "ON physician.department_id = department.id",
            replace("department_id", "id", within="physician.department_id")),
    SqlTask("sql_join_column", "hospital", "For each admission, give the patient's name and the number of nights.",
            "SELECT patient.name, admission.nights FROM admission JOIN patient ON admission.patient_id = patient.id",
            replace("patient", "physician", within="admission.patient_id")),
    SqlTask("sql_join_column", "hospital", "How many admissions did each physician handle? Give the physician's name "
            "and the count.",
            "SELECT physician.name, COUNT(*) FROM admission JOIN physician ON admission.physician_id = physician.id "
            "GROUP BY physician.name",
            replace("physician", "department", within="admission.physician_id")),
    SqlTask("sql_join_column", "airline", "For each flight number, give the city it departs from.",
            "SELECT flight.flight_no, airport.city FROM flight JOIN airport ON flight.origin_id = airport.id",
            replace("origin", "destination")),
    SqlTask("sql_join_column", "airline", "Which passengers booked flight BA117? Give their names.",
            "SELECT passenger.name FROM booking JOIN passenger ON booking.passenger_id = passenger.id "
            "JOIN flight ON booking.flight_id = flight.id WHERE flight.flight_no = 'BA117'",
            replace("passenger", "flight", within="booking.passenger_id")),
    SqlTask("sql_join_column", "airline", "Give each flight number with the model of its aircraft.",
            "SELECT flight.flight_no, aircraft.model FROM flight JOIN aircraft ON flight.aircraft_id = aircraft.id",
            replace("aircraft_id", "id", within="flight.aircraft_id")),
    SqlTask("sql_join_column", "university", "List the title of each course with the name of the professor who "
            "teaches it.",
            "SELECT course.title, professor.name FROM course JOIN professor ON course.professor_id = professor.id",
            insert("faculty_", after="= professor.")),
    SqlTask("sql_join_column", "university", "Which students are enrolled in ENG101? Give their names.",
            "SELECT student.name FROM enrollment JOIN student ON enrollment.student_id = student.id "
            "JOIN course ON enrollment.course_id = course.id WHERE course.code = 'ENG101'",
            replace("student", "course", within="enrollment.student_id")),
    SqlTask("sql_join_column", "university", "Give the name of each professor and the building of their faculty.",
            "SELECT professor.name, faculty.building FROM professor JOIN faculty ON professor.faculty_id = faculty.id",
            replace("faculty_id", "id", within="professor.faculty_id")),
    SqlTask("sql_join_column", "league", "List each player's name with the city of their club.",
            "SELECT player.name, club.city FROM player JOIN club ON player.club_id = club.id",
            replace("club_id", "id", within="player.club_id")),
    SqlTask("sql_join_column", "league", "On matchday 3, which clubs played away? Give the club names and the away "
            "goals.",
            "SELECT club.name, fixture.away_goals FROM fixture JOIN club ON fixture.away_club_id = club.id "
            "WHERE fixture.matchday = 3",
            replace("away", "home", within="fixture.away_club_id")),

    # ---- sql_aggregate: one aggregate function swapped; the query runs, the result differs
    SqlTask("sql_aggregate", "hospital", "What is the highest salary of a physician in the Cardiology department?",
            "SELECT MAX(physician.salary) FROM physician JOIN department ON physician.department_id = department.id "
            "WHERE department.name = 'Cardiology'",
            replace("MAX", "MIN")),
    SqlTask("sql_aggregate", "hospital", "What is the average number of nights per admission?",
            "SELECT AVG(nights) FROM admission", replace("AVG", "SUM")),
    SqlTask("sql_aggregate", "hospital", "What is the total cost of the admissions of each department? Give the "
            "department name and the total.",
            "SELECT department.name, SUM(admission.cost) FROM admission JOIN department "
            "ON admission.department_id = department.id GROUP BY department.name",
            replace("SUM", "AVG")),
    SqlTask("sql_aggregate", "airline", "What is the cheapest price paid for a first-class booking?",
            "SELECT MIN(price) FROM booking WHERE cabin = 'first'", replace("MIN", "MAX")),
    SqlTask("sql_aggregate", "airline", "How many seats do all Airbus aircraft have together?",
            "SELECT SUM(seats) FROM aircraft WHERE manufacturer = 'Airbus'", replace("SUM", "COUNT")),
    SqlTask("sql_aggregate", "airline", "What is the average distance of the flights leaving each airport? Give the "
            "airport code and the average.",
            "SELECT airport.code, AVG(flight.distance_km) FROM flight JOIN airport ON flight.origin_id = airport.id "
            "GROUP BY airport.code",
            replace("AVG", "MAX")),
    SqlTask("sql_aggregate", "university", "In which year was the oldest faculty founded?",
            "SELECT MIN(founded) FROM faculty", replace("MIN", "MAX")),
    SqlTask("sql_aggregate", "university", "What is the average GPA of the students of each faculty? Give the "
            "faculty name and the average.",
            "SELECT faculty.name, AVG(student.gpa) FROM student JOIN faculty ON student.faculty_id = faculty.id "
            "GROUP BY faculty.name",
            replace("AVG", "MIN")),
    SqlTask("sql_aggregate", "university", "How many credits do the courses taught by Alan Moss add up to?",
            "SELECT SUM(course.credits) FROM course JOIN professor ON course.professor_id = professor.id "
            "WHERE professor.name = 'Alan Moss'",
            replace("SUM", "MAX")),
    SqlTask("sql_aggregate", "league", "How many goals have the players of each club scored in total? Give the club "
            "name and the total.",
            "SELECT club.name, SUM(player.goals) FROM player JOIN club ON player.club_id = club.id GROUP BY club.name",
            replace("SUM", "MAX")),
    SqlTask("sql_aggregate", "league", "What was the highest attendance at a fixture?",
            "SELECT MAX(attendance) FROM fixture", replace("MAX", "AVG")),

    # ---- sql_table: a wrong or misspelled table name; the query does not run
    SqlTask("sql_table", "hospital", "How many physicians earn more than 200000?",
            "SELECT COUNT(*) FROM physician WHERE salary > 200000", replace("physician", "physicians")),
    SqlTask("sql_table", "hospital", "List the names of patients who live in York.",
            "SELECT name FROM patient WHERE city = 'York'", replace("patient", "patients")),
    SqlTask("sql_table", "hospital", "Give each admission's id with the floor of its department.",
            "SELECT admission.id, department.floor FROM admission JOIN department "
            "ON admission.department_id = department.id",
            replace("department", "departments", within="JOIN department")),
    SqlTask("sql_table", "airline", "How many bookings are in business class?",
            "SELECT COUNT(*) FROM booking WHERE cabin = 'business'", replace("booking", "bookings")),
    SqlTask("sql_table", "airline", "Which flights land in New York? Give the flight numbers.",
            "SELECT flight.flight_no FROM flight JOIN airport ON flight.destination_id = airport.id "
            "WHERE airport.city = 'New York'",
            replace("airport", "airports", within="JOIN airport")),
    SqlTask("sql_table", "airline", "List the models of aircraft built before 2015.",
            "SELECT model FROM aircraft WHERE year_built < 2015", replace("aircraft", "aircrafts")),
    SqlTask("sql_table", "university", "How many students enrolled in 2022?",
            "SELECT COUNT(*) FROM student WHERE enrollment_year = 2022", replace("student", "students")),
    SqlTask("sql_table", "university", "List the codes of the courses that Helen Park teaches.",
            "SELECT course.code FROM course JOIN professor ON course.professor_id = professor.id "
            "WHERE professor.name = 'Helen Park'",
            replace("professor", "professors", within="JOIN professor")),
    SqlTask("sql_table", "university", "What is the highest grade recorded in the 2024-spring semester?",
            "SELECT MAX(grade) FROM enrollment WHERE semester = '2024-spring'", replace("enrollment", "enrolment")),
    SqlTask("sql_table", "league", "Which goalkeepers are in the league? Give their names.",
            "SELECT name FROM player WHERE position = 'goalkeeper'", replace("player", "players")),
    SqlTask("sql_table", "league", "Which clubs were founded before 1900? Give their names.",
            "SELECT name FROM club WHERE founded < 1900", replace("club", "team", within="FROM club")),

    # ---- sql_literal: one number or string literal changed; the query runs, the result differs
    SqlTask("sql_literal", "hospital", "How many patients live in Leeds?",
            "SELECT COUNT(*) FROM patient WHERE city = 'Leeds'", replace("Leeds", "York")),
    SqlTask("sql_literal", "hospital", "Which admissions lasted more than 7 nights? Give their ids.",
            "SELECT id FROM admission WHERE nights > 7", replace("7", "5")),
    SqlTask("sql_literal", "hospital", "List the names of the physicians of the Oncology department.",
            "SELECT physician.name FROM physician JOIN department ON physician.department_id = department.id "
            "WHERE department.name = 'Oncology'",
            replace("Oncology", "Neurology")),
    SqlTask("sql_literal", "airline", "Give the codes of the airports in Germany.",
            "SELECT code FROM airport WHERE country = 'Germany'", replace("Germany", "France")),
    SqlTask("sql_literal", "airline", "How many passengers are booked on flight LH402?",
            "SELECT COUNT(*) FROM booking JOIN flight ON booking.flight_id = flight.id WHERE flight.flight_no = 'LH402'",
            replace("02", "20", within="LH402")),
    SqlTask("sql_literal", "airline", "Which flights depart before 10 o'clock? Give the flight number and the hour.",
            "SELECT flight_no, departure_hour FROM flight WHERE departure_hour < 10",
            replace("0", "2", within="< 10")),
    SqlTask("sql_literal", "university", "List the names of the students who enrolled in 2021.",
            "SELECT name FROM student WHERE enrollment_year = 2021", replace("1", "2", within="2021")),
    SqlTask("sql_literal", "university", "What is the average grade in the 2023-autumn semester?",
            "SELECT AVG(grade) FROM enrollment WHERE semester = '2023-autumn'", replace("autumn", "spring")),
    SqlTask("sql_literal", "university", "Give the titles of all level 300 courses.",
            "SELECT title FROM course WHERE level = 300", replace("3", "2", within="300")),
    SqlTask("sql_literal", "league", "List the names of all forwards with their goals.",
            "SELECT name, goals FROM player WHERE position = 'forward'", replace("forward", "midfielder")),
    SqlTask("sql_literal", "league", "How many transfers cost a fee above 10000000?",
            "SELECT COUNT(*) FROM transfer WHERE fee > 10000000", replace("1", "2", within="10000000")),

    # ---- sql_missing_condition: one AND condition deleted; the query runs, the result differs
    SqlTask("sql_missing_condition", "hospital", "How many female patients were born after 1970?",
            "SELECT COUNT(*) FROM patient WHERE sex = 'F' AND birth_year > 1970", delete("sex = 'F' AND ")),
    SqlTask("sql_missing_condition", "hospital", "Which admissions of at least 5 nights ended in a transfer? Give "
            "their ids.",
            "SELECT id FROM admission WHERE nights >= 5 AND outcome = 'transferred'",
            delete(" AND outcome = 'transferred'")),
    SqlTask("sql_missing_condition", "hospital", "Which Cardiology physicians were hired before 2015? Give their "
            "names.",
            "SELECT physician.name FROM physician JOIN department ON physician.department_id = department.id "
            "WHERE department.name = 'Cardiology' AND physician.hired_year < 2015",
            delete("department.name = 'Cardiology' AND ")),
    SqlTask("sql_missing_condition", "airline", "How many business-class bookings have more than one bag?",
            "SELECT COUNT(*) FROM booking WHERE cabin = 'business' AND bags > 1", delete("cabin = 'business' AND ")),
    SqlTask("sql_missing_condition", "airline", "Which flights from LHR are longer than 1000 km? Give the flight "
            "numbers.",
            "SELECT flight.flight_no FROM flight JOIN airport ON flight.origin_id = airport.id "
            "WHERE airport.code = 'LHR' AND flight.distance_km > 1000",
            delete("airport.code = 'LHR' AND ")),
    SqlTask("sql_missing_condition", "airline", "List the names of German passengers with platinum status.",
            "SELECT name FROM passenger WHERE nationality = 'German' AND loyalty_tier = 'platinum'",
            delete(" AND loyalty_tier = 'platinum'")),
    SqlTask("sql_missing_condition", "university", "Which Engineering students (faculty 1) have a GPA above 3.2? "
            "Give their names.",
            "SELECT name FROM student WHERE faculty_id = 1 AND gpa > 3.2", delete("faculty_id = 1 AND ")),
    SqlTask("sql_missing_condition", "university", "Which level 100 courses are worth 6 credits? Give their codes.",
            "SELECT code FROM course WHERE level = 100 AND credits = 6", delete(" AND credits = 6")),
    SqlTask("sql_missing_condition", "university", "How many enrollments in the 2024-spring semester have a grade of "
            "at least 80?",
            "SELECT COUNT(*) FROM enrollment WHERE semester = '2024-spring' AND grade >= 80",
            delete("semester = '2024-spring' AND ")),
    SqlTask("sql_missing_condition", "league", "Which defenders have scored more than 2 goals? Give their names.",
            "SELECT name FROM player WHERE position = 'defender' AND goals > 2", delete(" AND goals > 2")),
    SqlTask("sql_missing_condition", "league", "In the first four matchdays, which home wins drew more than 30000 "
            "spectators? Give the fixture ids.",
            "SELECT id FROM fixture WHERE matchday <= 4 AND attendance > 30000 AND home_goals > away_goals",
            delete(" AND attendance > 30000")),
]



# ================================================================ data: tools


def tool(name: str, description: str, params: dict, required: list[str]) -> dict:
    """A JSON-schema tool; `params` maps a parameter to its type, or to (type, its enum values)."""
    props = {k: {"type": v} if isinstance(v, str) else {"type": v[0], "enum": list(v[1])} for k, v in params.items()}
    return {"name": name, "description": description,
            "parameters": {"type": "object", "properties": props, "required": required}}


TOOLS = {t["name"]: t for t in [
    # smart home
    tool("set_thermostat", "Set the heating or cooling of a room.",
         {"room": "string", "mode": ("string", ["heat", "cool", "auto", "off"]), "target_c": "number"}, ["room", "mode"]),
    tool("set_lights", "Switch or dim the lights of a room.",
         {"room": "string", "state": ("string", ["on", "off"]), "brightness": "integer",
          "color": ("string", ["warm", "neutral", "cool"])}, ["room", "state"]),
    tool("lock_door", "Lock or unlock a door.",
         {"door": ("string", ["front", "back", "garage", "patio"]), "locked": "boolean"}, ["door", "locked"]),
    # calendar
    tool("schedule_meeting", "Put a meeting in the calendar.",
         {"title": "string", "date": "string", "start_time": "string", "duration_min": "integer",
          "visibility": ("string", ["public", "private"])}, ["title", "date", "start_time", "duration_min"]),
    tool("cancel_meeting", "Cancel a meeting by its id.",
         {"meeting_id": "string", "notify_attendees": "boolean"}, ["meeting_id"]),
    tool("find_free_slot", "Find a free slot in the calendar.",
         {"date": "string", "duration_min": "integer", "part_of_day": ("string", ["morning", "afternoon", "evening"])},
         ["date", "duration_min"]),
    # flights
    tool("search_flights", "Search flights between two airports.",
         {"origin": "string", "destination": "string", "date": "string",
          "cabin": ("string", ["economy", "premium", "business", "first"]), "passengers": "integer"},
         ["origin", "destination", "date"]),
    tool("get_flight_status", "Status of a flight on a date.", {"flight_no": "string", "date": "string"},
         ["flight_no", "date"]),
    tool("choose_seat", "Pick the seat and meal of a booking.",
         {"booking_ref": "string", "seat": "string",
          "meal": ("string", ["standard", "vegetarian", "vegan", "halal", "kosher"])}, ["booking_ref", "seat"]),
    # banking
    tool("transfer_money", "Send money from one of your accounts to an IBAN.",
         {"from_account": ("string", ["checking", "savings"]), "to_iban": "string", "amount": "number",
          "currency": ("string", ["EUR", "USD", "GBP", "CHF"]), "reference": "string"},
         ["from_account", "to_iban", "amount", "currency"]),
    tool("get_balance", "Balance of an account.", {"account": ("string", ["checking", "savings", "credit_card"])},
         ["account"]),
    tool("list_transactions", "Recent transactions of an account.",
         {"account": ("string", ["checking", "savings", "credit_card"]), "days": "integer", "min_amount": "number"},
         ["account", "days"]),
    tool("freeze_card", "Block a payment card.",
         {"card_last4": "string", "reason": ("string", ["lost", "stolen", "suspicious_activity"])},
         ["card_last4", "reason"]),
    # file storage
    tool("upload_file", "Upload a local file to cloud storage.",
         {"local_path": "string", "folder": "string", "visibility": ("string", ["private", "team", "public"])},
         ["local_path", "folder", "visibility"]),
    tool("share_file", "Share a stored file with someone.",
         {"path": "string", "email": "string", "permission": ("string", ["view", "comment", "edit"]),
          "expires_in_days": "integer"}, ["path", "email", "permission"]),
    tool("list_files", "List the files of a folder.",
         {"folder": "string", "sort_by": ("string", ["name", "size", "modified"]), "limit": "integer"}, ["folder"]),
    tool("delete_file", "Delete a stored file.", {"path": "string", "permanent": "boolean"}, ["path"]),
    # music
    tool("play_music", "Play music.",
         {"query": "string", "kind": ("string", ["track", "album", "artist", "playlist"]), "shuffle": "boolean"},
         ["query", "kind"]),
    tool("set_volume", "Set the playback volume (0-100).",
         {"level": "integer", "device": ("string", ["speaker", "headphones", "car"])}, ["level"]),
    tool("add_to_playlist", "Add a track to a playlist.", {"playlist": "string", "track": "string", "artist": "string"},
         ["playlist", "track"]),
    # going out
    tool("book_table", "Reserve a restaurant table.",
         {"restaurant": "string", "date": "string", "time": "string", "party_size": "integer",
          "seating": ("string", ["indoor", "outdoor", "bar"])}, ["restaurant", "date", "time", "party_size"]),
    tool("request_ride", "Order a ride.",
         {"pickup": "string", "dropoff": "string", "ride_type": ("string", ["standard", "comfort", "xl", "shared"]),
          "passengers": "integer"}, ["pickup", "dropoff", "ride_type"]),
    # daily life
    tool("log_workout", "Record a workout.",
         {"activity": ("string", ["run", "cycle", "swim", "walk", "row"]), "minutes": "integer", "distance_km": "number"},
         ["activity", "minutes"]),
    tool("set_alarm", "Set an alarm.",
         {"time": "string", "repeat": ("string", ["once", "daily", "weekdays", "weekends"]), "label": "string"},
         ["time", "repeat"]),
]}


# ================================================================ data: tool tasks (11 per kind)

TOOL_TASKS = [
    # ---- tool_function_name: the call names another listed tool
    ToolTask("tool_function_name", ("set_lights", "set_thermostat", "lock_door"),
             "Turn the kitchen heating on to 20 degrees.",
             (("set_thermostat", {"room": "kitchen", "mode": "heat", "target_c": 20}),),
             replace("thermostat", "lights")),
    ToolTask("tool_function_name", ("get_balance", "list_transactions", "transfer_money"),
             "Show me my checking account transactions from the last 30 days.",
             (("list_transactions", {"account": "checking", "days": 30}),),
             replace("list_transactions", "get_balance")),
    ToolTask("tool_function_name", ("upload_file", "share_file", "list_files"),
             "Share /reports/q3-summary.pdf with maria@northwind.io so she can comment on it.",
             (("share_file", {"path": "/reports/q3-summary.pdf", "email": "maria@northwind.io",
                              "permission": "comment"}),),
             replace("share", "upload")),
    ToolTask("tool_function_name", ("search_flights", "get_flight_status", "choose_seat"),
             "Is flight KL1001 on time on 2024-11-02?",
             (("get_flight_status", {"flight_no": "KL1001", "date": "2024-11-02"}),),
             replace("get_flight_status", "search_flights")),
    ToolTask("tool_function_name", ("play_music", "add_to_playlist", "set_volume"),
             "Add 'Blue in Green' by Miles Davis to my Late Night playlist.",
             (("add_to_playlist", {"playlist": "Late Night", "track": "Blue in Green", "artist": "Miles Davis"}),),
             replace("add_to_playlist", "play_music")),
    ToolTask("tool_function_name", ("schedule_meeting", "find_free_slot", "cancel_meeting"),
             "Find me a free 45-minute slot on 2024-10-08 in the afternoon.",
             (("find_free_slot", {"date": "2024-10-08", "duration_min": 45, "part_of_day": "afternoon"}),),
             replace("find_free_slot", "schedule_meeting")),
    ToolTask("tool_function_name", ("set_lights", "lock_door", "set_thermostat"),
             "Lock the garage door and switch off the porch lights.",
             (("lock_door", {"door": "garage", "locked": True}), ("set_lights", {"room": "porch", "state": "off"})),
             replace("lights", "thermostat", within="set_lights")),
    ToolTask("tool_function_name", ("freeze_card", "get_balance", "list_transactions"),
             "My card ending in 4417 was stolen, block it right away.",
             (("freeze_card", {"card_last4": "4417", "reason": "stolen"}),),
             replace("freeze_card", "get_balance")),
    ToolTask("tool_function_name", ("log_workout", "set_alarm", "set_volume"),
             "Wake me up at 06:15 on weekdays.",
             (("set_alarm", {"time": "06:15", "repeat": "weekdays"}),),
             replace("set_alarm", "log_workout")),
    ToolTask("tool_function_name", ("request_ride", "book_table"),
             "Book a table for 4 at Casa Lupa on 2024-09-14 at 19:30.",
             (("book_table", {"restaurant": "Casa Lupa", "date": "2024-09-14", "time": "19:30", "party_size": 4}),),
             replace("book_table", "request_ride")),
    ToolTask("tool_function_name", ("delete_file", "list_files", "upload_file"),
             "List the 10 largest files in /backups, then permanently delete /backups/2019.tar.",
             (("list_files", {"folder": "/backups", "sort_by": "size", "limit": 10}),
              ("delete_file", {"path": "/backups/2019.tar", "permanent": True})),
             replace("list_files", "upload_file")),

    # ---- tool_enum_value: another value of the same enum
    ToolTask("tool_enum_value", ("set_thermostat", "set_lights", "lock_door"),
             "Cool the bedroom down to 19 degrees.",
             (("set_thermostat", {"room": "bedroom", "mode": "cool", "target_c": 19}),),
             replace("cool", "heat", within='"cool"')),
    ToolTask("tool_enum_value", ("set_lights", "set_thermostat"),
             "Turn on the lights in the study, warm white at 60% brightness.",
             (("set_lights", {"room": "study", "state": "on", "brightness": 60, "color": "warm"}),),
             replace("warm", "cool", within='"warm"')),
    ToolTask("tool_enum_value", ("search_flights", "choose_seat", "get_flight_status"),
             "Find business class flights from MAD to JFK on 2024-12-20 for 2 passengers.",
             (("search_flights", {"origin": "MAD", "destination": "JFK", "date": "2024-12-20", "cabin": "business",
                                  "passengers": 2}),),
             replace("business", "first", within='"business"')),
    ToolTask("tool_enum_value", ("choose_seat", "get_flight_status"),
             "For booking QX7T2L, give me seat 14C and a vegetarian meal.",
             (("choose_seat", {"booking_ref": "QX7T2L", "seat": "14C", "meal": "vegetarian"}),),
             replace("vegetarian", "vegan", within='"vegetarian"')),
    ToolTask("tool_enum_value", ("transfer_money", "get_balance"),
             "Send 250 EUR from my savings account to DE89370400440532013000 with the reference 'rent March'.",
             (("transfer_money", {"from_account": "savings", "to_iban": "DE89370400440532013000", "amount": 250,
                                  "currency": "EUR", "reference": "rent March"}),),
             replace("savings", "checking", within='"savings"')),
    ToolTask("tool_enum_value", ("share_file", "upload_file", "list_files"),
             "Give tom@greenleaf.org edit access to /designs/logo-v2.svg for 7 days.",
             (("share_file", {"path": "/designs/logo-v2.svg", "email": "tom@greenleaf.org", "permission": "edit",
                              "expires_in_days": 7}),),
             replace("edit", "view", within='"edit"')),
    ToolTask("tool_enum_value", ("play_music", "set_volume", "add_to_playlist"),
             "Play the album Kind of Blue on shuffle.",
             (("play_music", {"query": "Kind of Blue", "kind": "album", "shuffle": True}),),
             replace("album", "track", within='"album"')),
    ToolTask("tool_enum_value", ("request_ride", "book_table"),
             "Get me an XL ride for 5 people from Central Station to 12 Harbour Road.",
             (("request_ride", {"pickup": "Central Station", "dropoff": "12 Harbour Road", "ride_type": "xl",
                                "passengers": 5}),),
             replace("xl", "standard", within='"xl"')),
    ToolTask("tool_enum_value", ("log_workout", "set_alarm"),
             "Log a 40-minute swim of 1.5 km.",
             (("log_workout", {"activity": "swim", "minutes": 40, "distance_km": 1.5}),),
             replace("swim", "run", within='"swim"')),
    ToolTask("tool_enum_value", ("list_files", "delete_file", "share_file"),
             "Show the files in /photos/2024, most recently modified first, 20 at most.",
             (("list_files", {"folder": "/photos/2024", "sort_by": "modified", "limit": 20}),),
             replace("modified", "name", within='"modified"')),
    ToolTask("tool_enum_value", ("lock_door", "set_lights", "set_thermostat"),
             "Unlock the patio door and set the living room heating to auto.",
             (("lock_door", {"door": "patio", "locked": False}),
              ("set_thermostat", {"room": "living room", "mode": "auto"})),
             replace("patio", "back", within='"patio"')),

    # ---- tool_number: a wrong numeric argument
    ToolTask("tool_number", ("set_thermostat", "set_lights"),
             "Set the nursery to heat at 22.5 degrees.",
             (("set_thermostat", {"room": "nursery", "mode": "heat", "target_c": 22.5}),),
             replace("5", "0", within="22.5")),
    ToolTask("tool_number", ("set_volume", "play_music"),
             "Turn the car volume to 35.",
             (("set_volume", {"level": 35, "device": "car"}),),
             replace("35", "53")),
    ToolTask("tool_number", ("transfer_money", "list_transactions", "get_balance"),
             "Transfer 1200 USD from checking to GB29NWBK60161331926819.",
             (("transfer_money", {"from_account": "checking", "to_iban": "GB29NWBK60161331926819", "amount": 1200,
                                  "currency": "USD"}),),
             replace("2", "5", within="1200")),
    ToolTask("tool_number", ("search_flights", "get_flight_status"),
             "Search economy flights from LHR to NRT on 2025-01-05 for 3 passengers.",
             (("search_flights", {"origin": "LHR", "destination": "NRT", "date": "2025-01-05", "cabin": "economy",
                                  "passengers": 3}),),
             replace("3", "2", within='"passengers": 3')),
    ToolTask("tool_number", ("schedule_meeting", "find_free_slot", "cancel_meeting"),
             "Schedule 'Budget review' on 2024-10-15 at 14:00 for 90 minutes, private.",
             (("schedule_meeting", {"title": "Budget review", "date": "2024-10-15", "start_time": "14:00",
                                    "duration_min": 90, "visibility": "private"}),),
             replace("9", "6", within=": 90")),
    ToolTask("tool_number", ("list_transactions", "get_balance"),
             "Show my savings transactions of the last 14 days above 500.",
             (("list_transactions", {"account": "savings", "days": 14, "min_amount": 500}),),
             replace("14", "7")),
    ToolTask("tool_number", ("book_table", "request_ride"),
             "Reserve an outdoor table for 6 at Osteria Nonna on 2024-11-23 at 20:00.",
             (("book_table", {"restaurant": "Osteria Nonna", "date": "2024-11-23", "time": "20:00", "party_size": 6,
                              "seating": "outdoor"}),),
             replace("6", "8", within='"party_size": 6')),
    ToolTask("tool_number", ("log_workout", "set_alarm", "set_volume"),
             "I rowed for 25 minutes and covered 5.2 km, log it.",
             (("log_workout", {"activity": "row", "minutes": 25, "distance_km": 5.2}),),
             replace("2", "8", within="5.2")),
    ToolTask("tool_number", ("set_lights", "lock_door"),
             "Dim the dining room lights to 30 percent.",
             (("set_lights", {"room": "dining room", "state": "on", "brightness": 30}),),
             replace("3", "4", within=": 30")),
    ToolTask("tool_number", ("list_files", "delete_file"),
             "List the 5 most recently modified files in /invoices.",
             (("list_files", {"folder": "/invoices", "sort_by": "modified", "limit": 5}),),
             insert("1", after='"limit": ')),
    ToolTask("tool_number", ("upload_file", "share_file", "list_files"),
             "Upload ~/Desktop/plan.pdf to /team for the team, then let li@acme.com view /team/plan.pdf for 3 days.",
             (("upload_file", {"local_path": "~/Desktop/plan.pdf", "folder": "/team", "visibility": "team"}),
              ("share_file", {"path": "/team/plan.pdf", "email": "li@acme.com", "permission": "view",
                              "expires_in_days": 3})),
             insert("0", after='"expires_in_days": 3')),

    # ---- tool_missing_argument: one required argument deleted with its key (the JSON stays valid)
    ToolTask("tool_missing_argument", ("set_thermostat", "set_lights", "lock_door"),
             "Put the office thermostat on auto at 21 degrees.",
             (("set_thermostat", {"room": "office", "mode": "auto", "target_c": 21}),),
             delete(', "mode": "auto"')),
    ToolTask("tool_missing_argument", ("search_flights", "get_flight_status"),
             "Find flights from CDG to DXB on 2024-12-01.",
             (("search_flights", {"origin": "CDG", "destination": "DXB", "date": "2024-12-01"}),),
             delete(', "date": "2024-12-01"')),
    ToolTask("tool_missing_argument", ("transfer_money", "get_balance", "list_transactions"),
             "Move 75.50 GBP from checking to GB33BUKB20201555555555.",
             (("transfer_money", {"from_account": "checking", "to_iban": "GB33BUKB20201555555555", "amount": 75.5,
                                  "currency": "GBP"}),),
             delete('"from_account": "checking", ')),
    ToolTask("tool_missing_argument", ("share_file", "delete_file"),
             "Let ana@riverbank.net view /minutes/2024-09.docx.",
             (("share_file", {"path": "/minutes/2024-09.docx", "email": "ana@riverbank.net", "permission": "view"}),),
             delete(', "email": "ana@riverbank.net"')),
    ToolTask("tool_missing_argument", ("book_table", "request_ride"),
             "Reserve a table at Sushi Kaito for 2 on 2024-10-31 at 18:30.",
             (("book_table", {"restaurant": "Sushi Kaito", "date": "2024-10-31", "time": "18:30", "party_size": 2}),),
             delete(', "time": "18:30"')),
    ToolTask("tool_missing_argument", ("schedule_meeting", "cancel_meeting"),
             "Set up 'Sprint planning' on 2024-11-04 at 10:00 for 60 minutes.",
             (("schedule_meeting", {"title": "Sprint planning", "date": "2024-11-04", "start_time": "10:00",
                                    "duration_min": 60}),),
             delete(', "start_time": "10:00"')),
    ToolTask("tool_missing_argument", ("play_music", "add_to_playlist", "set_volume"),
             "Play my Morning Run playlist.",
             (("play_music", {"query": "Morning Run", "kind": "playlist"}),),
             delete(', "kind": "playlist"')),
    ToolTask("tool_missing_argument", ("request_ride", "book_table"),
             "Order a standard ride from the airport to Hotel Mira.",
             (("request_ride", {"pickup": "the airport", "dropoff": "Hotel Mira", "ride_type": "standard"}),),
             delete(', "dropoff": "Hotel Mira"')),
    ToolTask("tool_missing_argument", ("freeze_card", "get_balance"),
             "I lost my card ending in 0932, please freeze it.",
             (("freeze_card", {"card_last4": "0932", "reason": "lost"}),),
             delete(', "reason": "lost"')),
    ToolTask("tool_missing_argument", ("upload_file", "list_files", "share_file"),
             "Upload ./notes/ideas.md to /personal and keep it private.",
             (("upload_file", {"local_path": "./notes/ideas.md", "folder": "/personal", "visibility": "private"}),),
             delete('"local_path": "./notes/ideas.md", ')),
    ToolTask("tool_missing_argument", ("get_flight_status", "choose_seat", "search_flights"),
             "Check the status of JL44 on 2024-12-03 and put me in seat 2A on booking ZK81PQ.",
             (("get_flight_status", {"flight_no": "JL44", "date": "2024-12-03"}),
              ("choose_seat", {"booking_ref": "ZK81PQ", "seat": "2A"})),
             delete('"flight_no": "JL44", ')),
]


# ================================================================ data: instruction tasks (11 per kind)

INSTRUCTION_TASKS = [
    # ---- inst_ends_with: the closing phrase changed
    InstructionTask(
        "inst_ends_with", "Write a short welcome message for new members of a hiking club.",
        (("ends_with", {"phrase": "See you on the trail!"}), ("no_commas", {}), ("word_count", {"max": 45})),
        "Welcome to the Ridge Walkers! We meet every Saturday at eight by the old mill and walk for about three "
        "hours. Bring water and good boots. See you on the trail!",
        replace("trail", "hills", within="the trail!")),
    InstructionTask(
        "inst_ends_with", "Write a short apology to a customer whose parcel arrived late.",
        (("sentence_count", {"min": 2, "max": 3}), ("ends_with", {"phrase": "Thank you for your patience."})),
        "We are sorry that your parcel reached you four days late. A refund of the shipping fee is on its way. "
        "Thank you for your patience.",
        replace("patience", "understanding")),
    InstructionTask(
        "inst_ends_with", "Write a short announcement for the opening of a neighborhood bakery.",
        (("uppercase", {}), ("ends_with", {"phrase": "COME HUNGRY!"}), ("keyword_include", {"keywords": ["bread"]})),
        "OUR BAKERY ON ELM STREET OPENS THIS FRIDAY AT SEVEN. FRESH BREAD AND CINNAMON ROLLS WILL BE WAITING. "
        "COME HUNGRY!",
        replace("HUNGRY", "EARLY")),
    InstructionTask(
        "inst_ends_with", "Write a thank-you note to a piano teacher.",
        (("starts_with", {"phrase": "Dear Ms. Alvarez,"}), ("ends_with", {"phrase": "With gratitude, Lena"}),
         ("word_count", {"max": 50})),
        "Dear Ms. Alvarez, thank you for three years of patient lessons. You taught me to love scales and to play "
        "Chopin without fear. I will miss our Tuesday afternoons. With gratitude, Lena",
        replace("gratitude", "love", within="With gratitude")),
    InstructionTask(
        "inst_ends_with", "Describe a museum's new dinosaur exhibit in two or three sentences.",
        (("sentence_count", {"min": 2, "max": 3}), ("ends_with", {"phrase": "Tickets are free for children."}),
         ("keyword_exclude", {"keywords": ["scary"]})),
        "The new hall shows a full Tyrannosaurus skeleton found in Montana. Visitors can touch real fossil bones and "
        "watch a short film about the dig. Tickets are free for children.",
        replace("children", "students")),
    InstructionTask(
        "inst_ends_with", "Write a text reminding a patient of a dentist appointment.",
        (("ends_with", {"phrase": "Reply YES to confirm."}), ("placeholders", {"n": 2}), ("no_commas", {})),
        "Hello [patient name]. This is a reminder of your check-up with Dr. Reyes on [date] at half past nine. "
        "Please arrive ten minutes early. Reply YES to confirm.",
        replace("YES", "OK")),
    InstructionTask(
        "inst_ends_with", "Write a short product description for wireless earbuds.",
        (("title", {}), ("ends_with", {"phrase": "Order yours today."}), ("char_count", {"max": 260})),
        "<<Pulse Buds>>\nPulse Buds give you eight hours of clear sound on a single charge. The case adds three more "
        "full charges and fits in any pocket. Order yours today.",
        replace("today", "now")),
    InstructionTask(
        "inst_ends_with", "Write a short note asking a neighbour to water your plants.",
        (("lowercase", {}), ("ends_with", {"phrase": "thanks a million."}), ("word_count", {"max": 50})),
        "hi sam, i am away from friday to sunday. could you water the tomatoes and the fern on the balcony once a "
        "day? the key is under the blue pot. thanks a million.",
        replace("million", "lot")),
    InstructionTask(
        "inst_ends_with", "Write two sentences inviting colleagues to a farewell lunch for Priya.",
        (("ends_with", {"phrase": "Please RSVP by Wednesday."}), ("keyword_include", {"keywords": ["Priya", "lunch"]})),
        "Join us on Friday at noon at Green Fork for a farewell lunch for Priya after six great years on the team. "
        "Please RSVP by Wednesday.",
        replace("Wednesday", "Thursday")),
    InstructionTask(
        "inst_ends_with", "Write a short radio weather update for a coastal town.",
        (("ends_with", {"phrase": "Stay dry out there."}), ("sentence_count", {"max": 4}),
         ("punctuation_ban", {"chars": "!"})),
        "Heavy rain moves in from the west this afternoon. Winds will reach fifty kilometres per hour along the "
        "harbour. The ferry to Skell Island is cancelled until tomorrow. Stay dry out there.",
        replace("dry", "safe")),
    InstructionTask(
        "inst_ends_with", "Write a short message to a cycling club announcing a route change.",
        (("no_commas", {}), ("ends_with", {"phrase": "Ride safe."}), ("keyword_frequency", {"keyword": "route", "n": 2})),
        "This Sunday we take the river route instead of the hill route because the bridge on Mill Lane is closed. "
        "We still meet at the fountain at eight. Ride safe.",
        replace("safe", "on")),

    # ---- inst_no_commas: one comma inserted
    InstructionTask(
        "inst_no_commas", "Write a short invitation to a board game night.",
        (("no_commas", {}), ("word_count", {"max": 40}), ("title", {})),
        "<<Game Night>>\nOn Friday at seven we meet in the back room of the Copper Kettle. Bring your favourite board "
        "game and a snack to share.",
        insert(",", after="On Friday at seven")),
    InstructionTask(
        "inst_no_commas", "Give three tips for keeping a basil plant healthy.",
        (("bullet_count", {"n": 3}), ("no_commas", {})),
        "* Keep the pot on a sunny windowsill.\n* Water the soil when the top feels dry.\n* Pinch off flower buds so "
        "the leaves keep growing.",
        insert(",", after="flower buds")),
    InstructionTask(
        "inst_no_commas", "Describe a sunrise over a lake in two sentences.",
        (("no_commas", {}), ("sentence_count", {"min": 2, "max": 2}), ("lowercase", {})),
        "the sky over the lake turns pink and then gold. a heron lifts off the still water and the first boats head "
        "out.",
        insert(",", after="still water")),
    InstructionTask(
        "inst_no_commas", "Write a one-paragraph update for a software team about a delayed release.",
        (("no_commas", {}), ("keyword_include", {"keywords": ["release", "Thursday"]}), ("word_count", {"max": 60})),
        "The release moves from Tuesday to Thursday because two payment tests still fail on the staging server. Maya "
        "is fixing the tests today and Leo will review her patch tomorrow morning. Please hold all other merges "
        "until then.",
        insert(",", after="fixing the tests today")),
    InstructionTask(
        "inst_no_commas", "Write a short note explaining how to recycle glass bottles.",
        (("no_commas", {}), ("starts_with", {"phrase": "Rinse each bottle"}),
         ("keyword_exclude", {"keywords": ["plastic"]})),
        "Rinse each bottle and take off the metal cap. Put clear glass in the white bin and coloured glass in the "
        "green bin. Collection is every second Monday.",
        insert(",", after="in the white bin")),
    InstructionTask(
        "inst_no_commas", "Write a short description of a cozy cafe.",
        (("no_commas", {}), ("uppercase", {})),
        "THE LITTLE CAFE ON BAKER STREET SMELLS OF FRESH COFFEE AND WARM CROISSANTS. SOFT JAZZ PLAYS WHILE STUDENTS "
        "READ BY THE WINDOW.",
        insert(",", after="SOFT JAZZ PLAYS")),
    InstructionTask(
        "inst_no_commas", "Write a message to parents about a school trip to the science museum.",
        (("no_commas", {}), ("placeholders", {"n": 1}), ("sentence_count", {"max": 4})),
        "On [date] our class visits the science museum. The bus leaves at half past eight and returns by three. "
        "Please pack a lunch and a water bottle.",
        insert(",", after="On [date]")),
    InstructionTask(
        "inst_no_commas", "Write a caption for a photo of a mountain hut in winter.",
        (("no_commas", {}), ("char_count", {"max": 120}), ("keyword_include", {"keywords": ["snow"]})),
        "Fresh snow on the roof and smoke from the chimney at the Alder Hut this morning.",
        insert(",", after="on the roof")),
    InstructionTask(
        "inst_no_commas", "Write a short motivational message for runners before a marathon.",
        (("no_commas", {}), ("ends_with", {"phrase": "You've got this."}), ("word_count", {"max": 40})),
        "Start slow and trust your training. The last ten kilometres are where your months of early mornings pay "
        "off. You've got this.",
        insert(",", after="Start slow")),
    InstructionTask(
        "inst_no_commas", "Explain in two sentences why bees matter to farmers.",
        (("no_commas", {}), ("sentence_count", {"min": 2, "max": 2}), ("keyword_frequency", {"keyword": "bees", "n": 2})),
        "Bees carry pollen from flower to flower so crops like apples and almonds can form fruit. Without bees many "
        "farms would need to pollinate by hand at great cost.",
        insert(",", after="Without bees")),
    InstructionTask(
        "inst_no_commas", "Write a short lost-cat notice.",
        (("no_commas", {}), ("title", {}), ("placeholders", {"n": 1})),
        "<<Lost Cat>>\nMilo is a grey tabby with a white chest and a red collar. He went missing near Oak Park on "
        "Sunday evening. If you see him please call [phone number].",
        insert(",", after="If you see him")),

    # ---- inst_forbidden_keyword: a keyword_exclude word inserted or substituted
    InstructionTask(
        "inst_forbidden_keyword", "Write a short review of a budget hotel.",
        (("keyword_exclude", {"keywords": ["cheap"]}), ("sentence_count", {"max": 3}), ("no_commas", {})),
        "The Harbor Inn is affordable and spotless. Our room faced the quiet side street and the beds were firm. "
        "Breakfast was simple but fresh.",
        replace("affordable", "cheap")),
    InstructionTask(
        "inst_forbidden_keyword", "Describe a new running shoe in two sentences.",
        (("keyword_exclude", {"keywords": ["very", "really"]}), ("sentence_count", {"min": 2, "max": 2})),
        "The Strider 5 is light and springy on long runs. Its wide toe box keeps your feet comfortable after twenty "
        "kilometres.",
        insert(" very", after="The Strider 5 is")),
    InstructionTask(
        "inst_forbidden_keyword", "Write a short welcome note for hotel guests.",
        (("keyword_exclude", {"keywords": ["luxury", "luxurious"]}), ("starts_with", {"phrase": "Welcome to"}),
         ("word_count", {"max": 40})),
        "Welcome to the Linden House. Your room has a rain shower and a view of the old town. Breakfast is served "
        "from seven to ten in the garden room.",
        replace("rain", "luxury")),
    InstructionTask(
        "inst_forbidden_keyword", "Write a short update for a customer whose laptop repair is finished.",
        (("keyword_exclude", {"keywords": ["problem", "issue"]}), ("placeholders", {"n": 1}), ("no_commas", {})),
        "Good news [customer name]. We found the fault in the charging port and replaced it. You can pick up your "
        "laptop any weekday before six.",
        replace("fault", "issue")),
    InstructionTask(
        "inst_forbidden_keyword", "Write a short text describing a city park in autumn.",
        (("keyword_exclude", {"keywords": ["beautiful"]}), ("lowercase", {}), ("sentence_count", {"max": 3})),
        "rowan park is lovely in october. the maples turn red and orange and children kick through piles of leaves.",
        replace("lovely", "beautiful")),
    InstructionTask(
        "inst_forbidden_keyword", "Write a short pitch for a meal-prep delivery service.",
        (("keyword_exclude", {"keywords": ["healthy", "diet"]}), ("word_count", {"max": 50}),
         ("ends_with", {"phrase": "First week half price."})),
        "FreshBox delivers five balanced dinners to your door every Monday. Each meal takes ten minutes to heat and "
        "comes with a recipe card. First week half price.",
        replace("balanced", "healthy")),
    InstructionTask(
        "inst_forbidden_keyword", "Write two sentences about a volunteer beach cleanup.",
        (("keyword_exclude", {"keywords": ["trash"]}), ("sentence_count", {"min": 2, "max": 2}),
         ("keyword_include", {"keywords": ["Saturday"]})),
        "Forty volunteers collected over sixty bags of litter from Sandy Bay on Saturday. The town will recycle the "
        "bottles and cans.",
        replace("litter", "trash")),
    InstructionTask(
        "inst_forbidden_keyword", "Write a short note to your team about the new office coffee machine.",
        (("keyword_exclude", {"keywords": ["just"]}), ("no_commas", {}), ("word_count", {"max": 35})),
        "The new coffee machine in the kitchen is ready. Press the green button and wait for the light to turn blue. "
        "Please rinse the milk jug after use.",
        insert(" just", after="green button and")),
    InstructionTask(
        "inst_forbidden_keyword", "Describe a train journey through the Alps in two or three sentences.",
        (("keyword_exclude", {"keywords": ["stunning", "breathtaking"]}), ("sentence_count", {"min": 2, "max": 3})),
        "The train climbs slowly past frozen waterfalls and tiny villages. From the window you can see glaciers "
        "shining in the sun. Every tunnel ends with a new view of the peaks.",
        replace("new", "stunning", within="a new view")),
    InstructionTask(
        "inst_forbidden_keyword", "Write a short reply to a friend who asked how your exam went.",
        (("keyword_exclude", {"keywords": ["hard", "difficult"]}), ("lowercase", {}), ("word_count", {"max": 40})),
        "the exam went well i think. the essay question on the french revolution was tricky but i had revised it "
        "twice. results come out next friday.",
        replace("tricky", "hard")),
    InstructionTask(
        "inst_forbidden_keyword", "Write an ad for a used bicycle for sale.",
        (("keyword_exclude", {"keywords": ["cheap", "bargain"]}), ("placeholders", {"n": 1}),
         ("sentence_count", {"max": 4})),
        "Selling my blue city bike with seven gears and new tyres. It has a basket and a rear light. It is yours for "
        "a fair 90 euros. Call [phone number] after six.",
        replace("fair", "cheap")),

    # ---- inst_case: one word's case changed under `lowercase` or `uppercase`
    InstructionTask(
        "inst_case", "Write a short text message telling a friend you will be late for dinner.",
        (("lowercase", {}), ("word_count", {"max": 30})),
        "sorry, the tram broke down near the bridge. i will be about twenty minutes late, so order without me.",
        replace("i", "I", within=". i w")),
    InstructionTask(
        "inst_case", "Describe your favourite season in two sentences.",
        (("lowercase", {}), ("sentence_count", {"min": 2, "max": 2}), ("keyword_include", {"keywords": ["autumn"]})),
        "autumn is my favourite season because the air is crisp and the light is soft. every october i walk through "
        "the woods near my grandmother's house.",
        replace("october", "October")),
    InstructionTask(
        "inst_case", "Write a short note to a roommate about grocery shopping.",
        (("lowercase", {}), ("bullet_count", {"n": 3})),
        "i am going to the shop at six. please add anything you need:\n* oat milk\n* two lemons\n* coffee beans "
        "from brazil",
        replace("brazil", "Brazil")),
    InstructionTask(
        "inst_case", "Write a three-line poem about the sea.",
        (("lowercase", {}), ("keyword_exclude", {"keywords": ["blue"]})),
        "grey waves fold and break\nsalt wind carries gull voices\nthe tide keeps its time",
        replace("the", "The", within="the tide")),
    InstructionTask(
        "inst_case", "Write a short reminder about the office fire drill.",
        (("lowercase", {}), ("no_commas", {}), ("placeholders", {"n": 1})),
        "the fire drill is on thursday at [time]. leave by the nearest stairs and meet at the car park on harley "
        "street.",
        replace("thursday", "Thursday")),
    InstructionTask(
        "inst_case", "Write a short product note for a handmade candle.",
        (("lowercase", {}), ("char_count", {"max": 200}), ("title", {})),
        "<<cedar glow>>\nour cedar glow candle is poured by hand in small batches. it burns for forty hours and "
        "smells of cedar and orange peel.",
        replace("cedar", "Cedar", within="our cedar")),
    InstructionTask(
        "inst_case", "Write a short safety announcement for a swimming pool.",
        (("uppercase", {}), ("sentence_count", {"max": 3})),
        "NO RUNNING ON THE POOL DECK. CHILDREN UNDER TEN MUST SWIM WITH AN ADULT. THE POOL CLOSES AT 9 PM.",
        replace("PM", "pm")),
    InstructionTask(
        "inst_case", "Write a headline and one sentence for a school sports day poster.",
        (("uppercase", {}), ("title", {}), ("word_count", {"max": 30})),
        "<<SPORTS DAY>>\nJOIN US ON THE FIELD THIS FRIDAY FOR RACES, GAMES AND ICE CREAM.",
        replace("FRIDAY", "Friday")),
    InstructionTask(
        "inst_case", "Write a short warning sign for a construction site.",
        (("uppercase", {}), ("no_commas", {}), ("keyword_include", {"keywords": ["helmet"]})),
        "DANGER. HARD HAT AREA. WEAR A HELMET AND SAFETY BOOTS AT ALL TIMES BEYOND THIS GATE.",
        replace("BOOTS", "boots")),
    InstructionTask(
        "inst_case", "Write a short cheer for a football team.",
        (("uppercase", {}), ("ends_with", {"phrase": "GO TIGERS!"}), ("sentence_count", {"max": 4})),
        "WE RUN. WE FIGHT. WE NEVER QUIT. GO TIGERS!",
        replace("FIGHT", "Fight")),
    InstructionTask(
        "inst_case", "Write a short shop-window notice about holiday opening hours.",
        (("uppercase", {}), ("placeholders", {"n": 1}), ("char_count", {"max": 150})),
        "CLOSED ON [DATE] FOR THE HOLIDAY. WE REOPEN ON MONDAY AT 8 AM WITH FRESH STOCK.",
        replace("MONDAY", "Monday")),

    # ---- inst_word_count: words added past a `word_count` maximum
    InstructionTask(
        "inst_word_count", "Write a short bio for a local potter.",
        (("word_count", {"max": 25}), ("keyword_include", {"keywords": ["clay"]})),
        "Nora Hill has worked with clay for twenty years. She makes mugs and bowls in her studio by the harbour and "
        "teaches evening classes.",
        insert(" every Tuesday", after="evening classes")),
    InstructionTask(
        "inst_word_count", "Summarize the plot of Romeo and Juliet in one sentence.",
        (("word_count", {"max": 23}), ("keyword_include", {"keywords": ["Verona"]})),
        "Two young lovers from feuding families in Verona marry in secret, and a chain of misunderstandings ends in "
        "both of their deaths.",
        insert(" sudden and tragic", after="both of their")),
    InstructionTask(
        "inst_word_count", "Write a short out-of-office reply.",
        (("starts_with", {"phrase": "Thank you for your email."}), ("word_count", {"max": 26}),
         ("placeholders", {"n": 1})),
        "Thank you for your email. I am away until [date] with no access to email. For urgent matters please "
        "contact Omar at the front desk.",
        insert(" or call reception", after="front desk")),
    InstructionTask(
        "inst_word_count", "Describe a farmers' market in two sentences.",
        (("word_count", {"max": 26}), ("no_commas", {}), ("sentence_count", {"min": 2, "max": 2})),
        "Every Saturday the town square fills with stalls of apples and honey and fresh eggs. Local bands play while "
        "families taste cheese and warm bread.",
        insert(" from nearby farms", after="fresh eggs")),
    InstructionTask(
        "inst_word_count", "Write a short caption for a photo of a city at night.",
        (("word_count", {"max": 15}), ("lowercase", {})),
        "the city never sleeps: neon signs, late trams and one lit window on every street.",
        insert(" quiet", after="every")),
    InstructionTask(
        "inst_word_count", "Give two tips for better sleep.",
        (("word_count", {"max": 22}), ("bullet_count", {"n": 2})),
        "* Go to bed and get up at the same time every day.\n* Keep your phone out of the bedroom at night.",
        insert(" even on weekends", after="every day")),
    InstructionTask(
        "inst_word_count", "Write a short thank-you message to a delivery driver.",
        (("word_count", {"max": 16}), ("keyword_include", {"keywords": ["rain"]})),
        "Thank you for bringing our parcel through the rain today. You made our evening much easier.",
        insert(" heavy", after="through the")),
    InstructionTask(
        "inst_word_count", "Write a short description of a hiking trail for a park website.",
        (("title", {}), ("keyword_exclude", {"keywords": ["easy"]}), ("word_count", {"max": 32})),
        "<<Fern Gully Loop>>\nThis six kilometre loop follows a creek through old rainforest. Expect muddy steps "
        "after rain and allow about two hours. Dogs are not allowed on the trail.",
        insert(" and a short swim", after="about two hours")),
    InstructionTask(
        "inst_word_count", "Write a short message asking a colleague to review a document.",
        (("word_count", {"max": 26}), ("placeholders", {"n": 1}), ("ends_with", {"phrase": "Thanks!"})),
        "Hi Jonas, could you review the supplier contract in [folder name] by Thursday? I mainly need a second look "
        "at the payment terms. Thanks!",
        insert(" and the delivery dates", after="payment terms")),
    InstructionTask(
        "inst_word_count", "Write a short notice about a change to the gym's opening hours.",
        (("uppercase", {}), ("word_count", {"max": 22})),
        "FROM MAY 1 THE GYM OPENS AT 6 AM ON WEEKDAYS AND CLOSES AT 10 PM. WEEKEND HOURS STAY THE SAME.",
        insert(" AS BEFORE", after="STAY THE SAME")),
    InstructionTask(
        "inst_word_count", "Write a one-sentence tagline for an electric scooter.",
        (("word_count", {"max": 12}), ("keyword_include", {"keywords": ["city"]})),
        "Glide through the city in silence and never hunt for parking again.",
        insert(" or fuel", after="parking")),
]


if __name__ == "__main__":
    main()
