"""Check the localization benchmark's files: each case is its task's reference response with ONE edit.

    python bench/localization/check.py                     # check the files, print counts per kind and split
    python bench/localization/check.py --write-databases   # first rewrite databases/*.sqlite from databases.json

The data is hand-written: `tasks.jsonl` (the task records, native format), `cases.jsonl` (one edit each; the format
is in README.md beside this script) and `databases.json` (the SQL tasks' databases: DDL and rows, from which
databases/*.sqlite are written). `check` (run by tests/test_localization_cases.py) verifies with the project's own
verifiers that every record loads and its reference passes all its rewards, every case's response is its
reference with the one edit at its spans and fails exactly the rewards in `fails`, an instruction case blames the
constraint its kind names, a tool case changes one call as its kind says, an SQL prompt lists its database's
tables, the counts and splits, and that each database file holds what databases.json says.
"""
from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
if str(ROOT) not in sys.path:  # `python bench/localization/check.py` puts only this folder on the path
    sys.path.insert(0, str(ROOT))

from tokencredit import verifiers  # noqa: E402
from tokencredit.schemas.records import TaskRecord  # noqa: E402
from tokencredit.verifiers import tools as tool_verifier  # noqa: E402

TASKS_FILE, CASES_FILE, DB_FOLDER, DATABASES = "tasks.jsonl", "cases.jsonl", "databases", "databases.json"
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


def edit_span(a: int, replacement: str) -> list[int]:
    """The edited characters of the response; for a deletion, the first character after it (where
    the response departs from the reference)."""
    return [a, a + (len(replacement) or 1)]


def build_database(folder: Path, name: str) -> sqlite3.Connection:
    """The database `name` of databases.json, in memory."""
    db = json.loads((folder / DATABASES).read_text(encoding="utf-8"))[name]
    conn = sqlite3.connect(":memory:")
    conn.executescript(db["ddl"])
    for table, rows in db["rows"].items():
        conn.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(rows[0]))})", rows)
    conn.commit()
    return conn


def schema_text(conn: sqlite3.Connection) -> str:
    """One line per table, `name(col, col, ...)`, in creation order: what an SQL prompt lists."""
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY rowid")]
    return "\n".join(f"{t}({', '.join(c[1] for c in conn.execute(f'PRAGMA table_info({t})'))})" for t in tables)


def read_dump(path: Path) -> list[str]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


def write_databases(folder: Path = HERE) -> None:
    """databases/<name>.sqlite from databases.json (SQLite's bytes depend on its version: the check compares dumps)."""
    for name in json.loads((folder / DATABASES).read_text(encoding="utf-8")):
        target = folder / DB_FOLDER / f"{name}.sqlite"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.unlink(missing_ok=True)
        build_database(folder, name).execute("VACUUM INTO ?", (str(target),))


def check(folder: Path = HERE) -> list[str]:
    """Every problem with the benchmark files under `folder` (an empty list when all is well)."""
    problems, schemas = [], {}
    for name in json.loads((folder / DATABASES).read_text(encoding="utf-8")):
        path, conn = folder / DB_FOLDER / f"{name}.sqlite", build_database(folder, name)
        schemas[f"{name}.sqlite"] = schema_text(conn)
        if not path.is_file():
            problems.append(f"{path}: missing")
        elif read_dump(path) != list(conn.iterdump()):
            problems.append(f"{path}: content differs from {DATABASES}['{name}']")
    records, rejected = verifiers.load_tasks(folder / TASKS_FILE)
    problems += [f"{TASKS_FILE} line {r.line_no}: rejected: {r.reason}" for r in rejected]
    for r in (r for r in records if r.task == "sql"):
        db = Path(r.spec.db_path).name
        if not r.prompt.startswith(f"Database schema:\n{schemas.get(db)}\n"):
            problems.append(f"record {r.id}: its prompt does not list the tables of {db}")
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
    parser.add_argument("--write-databases", action="store_true", help="first rewrite databases/*.sqlite")
    if parser.parse_args().write_databases:
        write_databases()
    problems = check()
    if problems:
        print("\n".join(problems), file=sys.stderr)
        sys.exit(f"{len(problems)} problem(s) in {HERE}")
    print(summary([json.loads(line) for line in (HERE / CASES_FILE).read_text(encoding="utf-8").splitlines()]))


if __name__ == "__main__":
    main()
