"""The localization benchmark's cases (bench/localization/) keep their promises.

Each case is a task record's reference response with one edit that fails exactly the rewards it
names. `check.check` (bench/localization/check.py) verifies that with the real verifiers on the real SQLite files;
these tests run it on the committed files and show that it catches a wrong edit span, a changed database, an
edit that breaks a second reward, a prompt that lists another schema and a record shared by the two splits.
"""
import importlib.util
import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from tokencredit import verifiers

HERE = Path(__file__).resolve().parent.parent / "bench" / "localization"


@pytest.fixture(scope="module")
def checker():
    spec = importlib.util.spec_from_file_location("localization_check", HERE / "check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def copy(tmp_path):
    """A copy of the benchmark's data files (not the script) to tamper with."""
    target = tmp_path / "localization"
    shutil.copytree(HERE, target, ignore=shutil.ignore_patterns("*.py", "*.md", "__pycache__"))
    return target


def read_cases(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "cases.jsonl").read_text(encoding="utf-8").splitlines()]


def write_cases(folder: Path, cases: list[dict]) -> None:
    (folder / "cases.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cases), encoding="utf-8")


def test_committed_benchmark_passes_the_check(checker):
    assert checker.check() == []


def test_counts_per_kind_and_split(checker):
    """At least 150 cases, at least 10 per kind, every kind split about half and half."""
    cases = read_cases(HERE)
    assert len(cases) >= 150
    for kind in checker.KINDS:
        splits = [c["split"] for c in cases if c["kind"] == kind]
        assert len(splits) >= 10, kind
        assert abs(splits.count("dev") - splits.count("test")) <= 1, kind


def test_each_case_is_its_reference_with_one_edit_that_fails_only_the_blamed_rewards():
    """Independent of the script: re-verify every case from the two JSONL files."""
    records = {r.id: r for r in verifiers.load_tasks(HERE / "tasks.jsonl")[0]}
    for case in read_cases(HERE):
        record = records[case["record_id"]]
        (a, b), new = case["reference_span"], case["replacement"]
        ref = record.reference_response
        assert case["response"] == ref[:a] + new + ref[b:] != ref, case["id"]
        assert all(s.score == 1.0 for s in verifiers.verify(record, ref)), case["id"]
        failing = [s.name for s in verifiers.verify(record, case["response"]) if s.score < 1.0]
        assert failing == case["fails"] and case["reward"] in failing, case["id"]


def test_a_wrong_edit_span_is_caught(checker, copy):
    cases = read_cases(copy)
    cases[3]["edit_span"] = [cases[3]["edit_span"][0] + 1, cases[3]["edit_span"][1] + 1]
    write_cases(copy, cases)
    problems = checker.check(copy)
    assert any(p.startswith(f"case {cases[3]['id']}: edit_span") for p in problems)


def test_a_changed_database_is_caught(checker, copy):
    with sqlite3.connect(copy / "databases" / "hospital.sqlite") as conn:
        conn.execute("UPDATE physician SET hired_year = 2016 WHERE name = 'Tomas Novak'")
    problems = checker.check(copy)
    assert any("hospital.sqlite: content differs from databases.json['hospital']" in p for p in problems)
    # the >= / > case on hired_year no longer tells the two queries apart
    assert any(p.startswith("case sql_operator-01: fails []") for p in problems)


def test_the_databases_are_written_from_their_json(checker, copy):
    for path in (copy / "databases").glob("*.sqlite"):
        path.unlink()
    assert any(p.endswith("hospital.sqlite: missing") for p in checker.check(copy))
    checker.write_databases(copy)
    assert checker.check(copy) == []


def test_a_prompt_that_lists_another_schema_is_caught(checker, copy):
    lines = (copy / "tasks.jsonl").read_text(encoding="utf-8").splitlines()
    record = json.loads(lines[0])
    record["prompt"] = record["prompt"].replace("physician(id, name,", "physician(id,", 1)
    (copy / "tasks.jsonl").write_text("\n".join([json.dumps(record), *lines[1:]]) + "\n", encoding="utf-8")
    assert f"record {record['id']}: its prompt does not list the tables of hospital.sqlite" in checker.check(copy)


def test_an_edit_that_breaks_a_second_reward_is_caught(checker, copy):
    """A tool case whose edit also breaks the JSON fails `format` too: the check names the case."""
    cases = read_cases(copy)
    case = next(c for c in cases if c["kind"] == "tool_enum_value")
    case["response"] = case["response"].replace("}}</tool_call>", "}</tool_call>", 1)
    write_cases(copy, cases)
    problems = checker.check(copy)
    assert f"case {case['id']}: fails ['format', 'correctness'], the case says ['correctness']" in problems


def test_a_record_in_both_splits_and_too_few_cases_are_caught(checker):
    cases = read_cases(HERE)
    kept = [c for c in cases if c["kind"] != "inst_case"][:140]
    twin = dict(kept[0], id="twin", split="test" if kept[0]["split"] == "dev" else "dev")
    problems = checker.check_counts(kept + [twin])
    assert f"record {kept[0]['record_id']} is used by both splits" in problems
    assert "141 cases, need at least 150" in problems
    assert "inst_case: 0 cases, need at least 10" in problems


def test_a_tool_edit_of_another_kind_is_caught(checker):
    """An enum edit filed as `tool_number` (and a number edit as `tool_missing_argument`) is refused."""
    records = {r.id: r for r in verifiers.load_tasks(HERE / "tasks.jsonl")[0]}
    cases = read_cases(HERE)
    for kind, wrong in (("tool_enum_value", "tool_number"), ("tool_number", "tool_missing_argument")):
        case = next(c for c in cases if c["kind"] == kind)
        assert checker.check_tool_edit(kind, records[case["record_id"]], case["response"]) == []
        problems = checker.check_tool_edit(wrong, records[case["record_id"]], case["response"])
        assert problems and problems[0].startswith(f"the edit is not a {wrong} edit")
