"""Load task records from JSONL: validate each line, keep the good ones, report the bad ones.

    records, rejected = load_tasks("tasks.jsonl")   # a file, a folder of *.jsonl, or "demo"

The record layout is in the docstring of `schemas/records.py`. Constraint kinds are checked by
the instructions verifier, not here: this module only checks shapes and types.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from schemas.records import (
    TASKS,
    Constraint,
    InstructionSpec,
    RecordError,
    SqlSpec,
    TaskRecord,
    ToolCall,
    ToolSpec,
)

SPLITS = ("train", "test")
DEMO = "demo"  # load_tasks("demo") reads the bundled verifiers/demo/*.jsonl


@dataclass
class Rejected:
    line_no: int | None  # 1-based line in `path`; None when the annotate stage rejected a loaded record
    record_id: str | None  # None when the line has no usable id
    reason: str
    raw: str
    path: str = ""


def load_tasks(path: str | Path) -> tuple[list[TaskRecord], list[Rejected]]:
    """Records of a JSONL file, of every *.jsonl in a folder (sorted), or of the demo sets.

    Bad lines (invalid JSON or UTF-8, not an object, bad fields, duplicate id) become
    `Rejected`; blank lines are skipped. Raises FileNotFoundError when there is nothing to read.
    """
    records: list[TaskRecord] = []
    rejected: list[Rejected] = []
    first_line: dict[str, tuple[str, int]] = {}  # id -> (file, line) where it was first loaded
    for file in _jsonl_files(path):
        for line_no, raw in enumerate(file.read_bytes().splitlines(), start=1):
            if not raw.strip():
                continue
            try:
                record = parse_line(raw, line_no, file.parent)
                _check_unique(record.id, first_line, file, line_no)
            except RecordError as e:
                record_id = None if e.record_id == f"line {line_no}" else e.record_id
                rejected.append(Rejected(line_no, record_id, str(e), _text(raw), str(file)))
                continue
            first_line[record.id] = (file.name, line_no)
            records.append(record)
    return records, rejected


def _jsonl_files(path: str | Path) -> list[Path]:
    if str(path) == DEMO:
        path = demo_dir()
    path = Path(path)
    files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
    if not files or not files[0].is_file():
        raise FileNotFoundError(f"no task file at {path}" + (" (no *.jsonl in it)" if path.is_dir() else ""))
    return files


def demo_dir() -> Path:
    """The folder of the bundled demo sets (inside the installed `verifiers` package)."""
    return Path(str(resources.files("verifiers").joinpath("demo")))


def _check_unique(record_id: str, first_line: dict[str, tuple[str, int]], file: Path, line_no: int) -> None:
    if record_id in first_line:
        where, first = first_line[record_id]
        where = f"line {first}" if where == file.name else f"{where} line {first}"
        raise RecordError(record_id, "id", f"duplicate id (first on {where})")


def parse_line(raw: bytes, line_no: int, base_dir: Path) -> TaskRecord:
    """One JSONL line -> TaskRecord; RecordError (with id `line N` when unknown) if it is bad."""
    where = f"line {line_no}"
    try:
        obj = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise RecordError(where, "<line>", f"not UTF-8 ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise RecordError(where, "<line>", f"invalid JSON: {e.msg} at column {e.colno}") from None
    return parse_record(obj, line_no, base_dir)


def parse_record(obj: Any, line_no: int, base_dir: Path) -> TaskRecord:
    """Validate one decoded record; `db` paths resolve against `base_dir / "databases"`."""
    if not isinstance(obj, dict):
        raise RecordError(f"line {line_no}", "<line>", f"expected a JSON object, got {_json_type(obj)}")
    record_id = obj.get("id")
    if not isinstance(record_id, str) or not record_id.strip():
        raise RecordError(f"line {line_no}", "id", _problem("a non-empty string", obj, "id", isinstance(record_id, str)))
    task = _string(obj, "task", record_id)
    if task not in TASKS:
        raise RecordError(record_id, "task", f"unknown task {task!r}, expected one of {', '.join(TASKS)}")
    split = obj.get("split", "train")
    if split not in SPLITS:
        raise RecordError(record_id, "split", f"expected 'train' or 'test', got {split!r}")
    parse_spec = {"sql": _sql_spec, "instructions": _instruction_spec, "tools": _tool_spec}[task]
    return TaskRecord(
        id=record_id,
        task=task,
        prompt=_string(obj, "prompt", record_id),
        reference_response=_string(obj, "reference_response", record_id),
        spec=parse_spec(obj, record_id, Path(base_dir)),
        split=split,
    )


def _sql_spec(obj: dict, record_id: str, base_dir: Path) -> SqlSpec:
    db = Path(_string(obj, "db", record_id))
    db_path = db if db.is_absolute() else base_dir / "databases" / db
    if not db_path.is_file():
        raise RecordError(record_id, "db", f"database file not found: {db_path}")
    return SqlSpec(db_path=str(db_path), reference_sql=_string(obj, "reference_sql", record_id))


def _instruction_spec(obj: dict, record_id: str, base_dir: Path) -> InstructionSpec:
    items = _list(obj, "constraints", record_id, non_empty=True)
    constraints = []
    for i, item in enumerate(items):
        name = f"constraints[{i}]"
        _require_dict(item, name, record_id)
        constraints.append(Constraint(kind=_string(item, "kind", record_id, name), args=_dict(item, "args", record_id, name)))
    return InstructionSpec(constraints=tuple(constraints))


def _tool_spec(obj: dict, record_id: str, base_dir: Path) -> ToolSpec:
    tools = _list(obj, "tools", record_id, non_empty=True)
    names = set()
    for i, tool in enumerate(tools):
        _require_dict(tool, f"tools[{i}]", record_id)
        names.add(_string(tool, "name", record_id, f"tools[{i}]"))
    calls = []
    for i, item in enumerate(_list(obj, "reference_calls", record_id, non_empty=False)):
        name = f"reference_calls[{i}]"
        _require_dict(item, name, record_id)
        call = ToolCall(name=_string(item, "name", record_id, name), arguments=_dict(item, "arguments", record_id, name))
        if call.name not in names:
            raise RecordError(record_id, f"{name}.name", f"{call.name!r} is not one of the tools ({', '.join(sorted(names))})")
        calls.append(call)
    return ToolSpec(tools=tuple(tools), reference_calls=tuple(calls))


def _string(obj: dict, key: str, record_id: str, parent: str = "") -> str:
    value = obj.get(key)
    if isinstance(value, str) and value.strip():
        return value
    raise RecordError(record_id, _field(parent, key), _problem("a non-empty string", obj, key, isinstance(value, str)))


def _list(obj: dict, key: str, record_id: str, non_empty: bool) -> list:
    value = obj.get(key)
    if isinstance(value, list) and (value or not non_empty):
        return value
    what = "a non-empty list" if non_empty else "a list"
    raise RecordError(record_id, key, _problem(what, obj, key, isinstance(value, list)))


def _dict(obj: dict, key: str, record_id: str, parent: str) -> dict:
    value = obj.get(key)
    if isinstance(value, dict):
        return value
    raise RecordError(record_id, _field(parent, key), _problem("an object", obj, key, False))


def _require_dict(value: Any, name: str, record_id: str) -> None:
    if not isinstance(value, dict):
        raise RecordError(record_id, name, f"expected an object, got {_json_type(value)}")


def _field(parent: str, key: str) -> str:
    return f"{parent}.{key}" if parent else key


def _problem(what: str, obj: dict, key: str, empty: bool) -> str:
    if key not in obj:
        return f"missing (expected {what})"
    if empty:
        return f"empty (expected {what})"
    return f"expected {what}, got {_json_type(obj[key])}"


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    if value is None:
        return "null"
    return names.get(type(value), type(value).__name__)


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")
