"""The localization benchmark's cases (bench/localization/) keep their promises.

Each case is a task record's reference response with one edit that fails exactly the rewards it
names. `build_cases.check` verifies that with the real verifiers on the real SQLite files; these
tests run it on the committed files and show that it catches a hand edit, a changed database, an
edit that breaks a second reward and a record shared by the two splits.
"""
import importlib.util
import json
import shutil
import sqlite3
import sys
from pathlib import Path

import pytest

from tokencredit import verifiers

HERE = Path(__file__).resolve().parent.parent / "bench" / "localization"


@pytest.fixture(scope="module")
def build_cases():
    spec = importlib.util.spec_from_file_location("build_cases", HERE / "build_cases.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


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


def test_committed_benchmark_passes_the_check(build_cases):
    assert build_cases.check() == []


def test_counts_per_kind_and_split(build_cases):
    """At least 150 cases, at least 10 per kind, every kind split about half and half."""
    cases = read_cases(HERE)
    assert len(cases) >= 150
    for kind in build_cases.KINDS:
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


def test_a_hand_edit_of_the_cases_file_is_caught(build_cases, copy):
    cases = read_cases(copy)
    cases[3]["edit_span"] = [cases[3]["edit_span"][0] + 1, cases[3]["edit_span"][1] + 1]
    write_cases(copy, cases)
    problems = build_cases.check(copy)
    assert any("cases.jsonl: differs from what build_cases.py writes" in p for p in problems)
    assert any(p.startswith(f"case {cases[3]['id']}: edit_span") for p in problems)


def test_a_changed_database_is_caught(build_cases, copy):
    with sqlite3.connect(copy / "databases" / "hospital.sqlite") as conn:
        conn.execute("UPDATE physician SET hired_year = 2016 WHERE name = 'Tomas Novak'")
    problems = build_cases.check(copy)
    assert any("hospital.sqlite: content differs" in p for p in problems)
    # the >= / > case on hired_year no longer tells the two queries apart
    assert any(p.startswith("case sql_operator-01: fails []") for p in problems)


def test_an_edit_that_breaks_a_second_reward_is_caught(build_cases, copy):
    """A tool case whose edit also breaks the JSON fails `format` too: the check names the case."""
    cases = read_cases(copy)
    case = next(c for c in cases if c["kind"] == "tool_enum_value")
    case["response"] = case["response"].replace("}}</tool_call>", "}</tool_call>", 1)
    write_cases(copy, cases)
    problems = build_cases.check(copy)
    assert f"case {case['id']}: fails ['format', 'correctness'], the case says ['correctness']" in problems


def test_a_record_in_both_splits_and_too_few_cases_are_caught(build_cases):
    cases = read_cases(HERE)
    kept = [c for c in cases if c["kind"] != "inst_case"][:140]
    twin = dict(kept[0], id="twin", split="test" if kept[0]["split"] == "dev" else "dev")
    problems = build_cases.check_counts(kept + [twin])
    assert f"record {kept[0]['record_id']} is used by both splits" in problems
    assert "141 cases, need at least 150" in problems
    assert "inst_case: 0 cases, need at least 10" in problems


def test_a_tool_edit_of_another_kind_is_caught(build_cases):
    """An enum edit filed as `tool_number` (and a number edit as `tool_missing_argument`) is refused."""
    records = {r.id: r for r in verifiers.load_tasks(HERE / "tasks.jsonl")[0]}
    cases = read_cases(HERE)
    for kind, wrong in (("tool_enum_value", "tool_number"), ("tool_number", "tool_missing_argument")):
        case = next(c for c in cases if c["kind"] == kind)
        assert build_cases.check_tool_edit(kind, records[case["record_id"]], case["response"]) == []
        problems = build_cases.check_tool_edit(wrong, records[case["record_id"]], case["response"])
        assert problems and problems[0].startswith(f"the edit is not a {wrong} edit")
