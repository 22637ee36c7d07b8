"""Load task records: validate each one at load, keep the good ones, report the bad ones.

    records, rejected = load_tasks("tasks.jsonl")   # a file, a folder of *.jsonl, or "demo"
    records, rejected = load_tasks("ifeval_input_data.jsonl", format="ifeval")
    records, rejected = load_tasks("poems.jsonl", plugin_tasks=("poem",))   # tasks a plugin verifies

The record layout is in the docstring of `schemas/records.py`, the public formats in
`verifiers/formats.py`. Everything a verifier would otherwise only find out at verify time is
checked here, so a bad record is rejected (with its line, field and reason) instead of failing
every response: unknown constraint kinds and bad arguments, unusable tools and reference calls,
a `db` outside the databases folder or not an SQLite file, a reference query that does not run.
"""
from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from tokencredit.schemas.records import (
    TASKS,
    Constraint,
    InstructionSpec,
    PluginSpec,
    RecordError,
    SqlSpec,
    TaskRecord,
    ToolCall,
    ToolSpec,
)

from tokencredit.verifiers import formats, instructions, sql, tools
from tokencredit.verifiers.text import encodable

SPLITS = ("train", "test")
DEMO = "demo"  # load_tasks("demo") reads the bundled verifiers/demo/*.jsonl
ANY_TASK = "*"  # in `plugin_tasks`: a plugin verifies records of every task
_CHECKS = {"sql": sql.validate, "instructions": instructions.validate, "tools": tools.validate}


@dataclass
class Rejected:
    line_no: int | None  # 1-based line in `path` (item or row number in a JSON list, Parquet or dataset);
    # None when the annotate stage rejected a loaded record (its prompt does not fit the model)
    record_id: str | None  # None when the line has no usable id
    reason: str
    raw: str
    path: str = ""
    field: str | None = None  # the field at fault; "<line>" when the line itself is unreadable


def semantics_by_task(format: str = "native", semantics: str | None = None) -> dict[str, str]:
    """{"instructions": ..., "tools": ...} from a comma list such as "ifeval,bfcl" (None: the format's default)."""
    chosen = {"instructions": "tokencredit", "tools": "tokencredit"}
    for name in (semantics or formats.DEFAULT_SEMANTICS.get(format, "tokencredit")).split(","):
        name = name.strip()
        if name == "tokencredit":
            chosen = {task: name for task in chosen}
        elif name in instructions.SEMANTICS:
            chosen["instructions"] = name
        elif name in tools.SEMANTICS:
            chosen["tools"] = name
        else:
            known = sorted({*instructions.SEMANTICS, *tools.SEMANTICS})
            raise ValueError(f"unknown semantics {name!r}; choose from {', '.join(known)}")
    return chosen


def load_tasks(path: str | Path, format: str = "native", *, databases: str | Path | None = None,
               semantics: str | None = None, columns: dict[str, str] | None = None,
               plugin_tasks: Collection[str] = (),
               check: Callable[[TaskRecord], None] | None = None) -> tuple[list[TaskRecord], list[Rejected]]:
    """Records of a prompt file or folder (`tokencredit.verifiers.formats`), or of the demo sets.

    Bad records (unreadable, bad fields, failing a load-time check, duplicate id) become
    `Rejected`; blank lines are skipped. Raises FileNotFoundError when there is nothing to read.
    `databases` is the folder `db` paths resolve in (default: `databases/` beside the file;
    `database/` for spider and bird); `plugin_tasks` are the task names plugin verifiers handle;
    `check` is one more load-time check (it raises RecordError), such as the prompt's length.
    """
    if str(path) == DEMO:
        path = demo_dir()
    by_task = semantics_by_task(format, semantics)
    root = formats.databases_root(path, format, databases)
    records: list[TaskRecord] = []
    rejected: list[Rejected] = []
    first_line: dict[str, tuple[str, int]] = {}  # id -> (file, line) where it was first loaded
    for row in formats.read_rows(path, format, columns, databases):
        try:
            if row.error is not None:
                raise row.error
            record = parse_record(row.obj, row.line_no, Path(row.path).parent, databases=root,
                                  semantics=by_task, plugin_tasks=plugin_tasks)
            _check_unique(record.id, first_line, Path(row.path), row.line_no)
            if record.task in _CHECKS:
                _CHECKS[record.task](record)
            if check is not None:
                check(record)
        except RecordError as e:
            record_id = None if e.record_id == f"line {row.line_no}" else e.record_id
            rejected.append(Rejected(row.line_no, record_id, str(e), row.raw, row.path, e.field))
            continue
        first_line[record.id] = (Path(row.path).name, row.line_no)
        records.append(record)
    return records, rejected


def demo_dir() -> Path:
    """The folder of the bundled demo sets (inside the installed `verifiers` package)."""
    return Path(str(resources.files("tokencredit.verifiers").joinpath("demo")))


def _check_unique(record_id: str, first_line: dict[str, tuple[str, int]], file: Path, line_no: int) -> None:
    if record_id in first_line:
        where, first = first_line[record_id]
        where = f"line {first}" if where == file.name else f"{where} line {first}"
        raise RecordError(record_id, "id", f"duplicate id (first on {where})")


def parse_record(obj: Any, line_no: int, base_dir: Path, *, databases: str | Path | None = None,
                 semantics: dict[str, str] | None = None, plugin_tasks: Collection[str] = ()) -> TaskRecord:
    """Validate one decoded native record (shapes and types); `db` resolves inside `databases`
    (default `base_dir / "databases"`); `semantics` as from `semantics_by_task`."""
    if not isinstance(obj, dict):
        raise RecordError(f"line {line_no}", "<line>", f"expected a JSON object, got {_json_type(obj)}")
    record_id = obj.get("id")
    if not isinstance(record_id, str) or not record_id.strip():
        raise RecordError(f"line {line_no}", "id", _problem("a non-empty string", obj, "id", isinstance(record_id, str)))
    _check_unicode(obj, record_id if encodable(record_id) else f"line {line_no}")
    task = _string(obj, "task", record_id)
    plugin = task not in TASKS
    if plugin and task not in plugin_tasks and ANY_TASK not in plugin_tasks:
        given = f"; the plugin tasks given: {', '.join(map(repr, plugin_tasks))}" if plugin_tasks else ""
        raise RecordError(record_id, "task", f"unknown task {task!r}, expected one of {', '.join(TASKS)} "
                          f"or the task of a plugin verifier (from Python load_tasks(..., plugin_tasks=({task!r},)), "
                          f"on the command line --verifier {task}=module:function{given})")
    split = obj.get("split", "train")
    if split not in SPLITS:
        raise RecordError(record_id, "split", f"expected 'train' or 'test', got {split!r}")
    reference = obj.get("reference_response")
    if reference is not None and not isinstance(reference, str):
        raise RecordError(record_id, "reference_response", f"expected a string, got {_json_type(reference)}")
    semantics = semantics or semantics_by_task()
    if plugin:
        spec = PluginSpec(dict(obj))
    elif task == "sql":
        spec = _sql_spec(obj, record_id, Path(databases) if databases is not None else Path(base_dir) / "databases")
    elif task == "instructions":
        spec = _instruction_spec(obj, record_id, semantics["instructions"])
    else:
        spec = _tool_spec(obj, record_id, semantics["tools"])
    return TaskRecord(id=record_id, task=task, prompt=_string(obj, "prompt", record_id), reference_response=reference,
                      spec=spec, split=split)


def _sql_spec(obj: dict, record_id: str, root: Path) -> SqlSpec:
    db_path = formats.resolve_db(_string(obj, "db", record_id), root, record_id)
    return SqlSpec(db_path=str(db_path), reference_sql=_string(obj, "reference_sql", record_id))


def _instruction_spec(obj: dict, record_id: str, semantics: str) -> InstructionSpec:
    items = _list(obj, "constraints", record_id, non_empty=True)
    constraints = []
    for i, item in enumerate(items):
        name = f"constraints[{i}]"
        _require_dict(item, name, record_id)
        constraints.append(Constraint(kind=_string(item, "kind", record_id, name), args=_dict(item, "args", record_id, name)))
    return InstructionSpec(constraints=tuple(constraints), semantics=semantics)


def _tool_spec(obj: dict, record_id: str, semantics: str) -> ToolSpec:
    tools_ = _list(obj, "tools", record_id, non_empty=True)
    names = set()
    for i, tool in enumerate(tools_):
        _require_dict(tool, f"tools[{i}]", record_id)
        names.add(_string(tool, "name", record_id, f"tools[{i}]"))
    calls = []
    for i, item in enumerate(_list(obj, "reference_calls", record_id, non_empty=False)):
        name = f"reference_calls[{i}]"
        _require_dict(item, name, record_id)
        call = ToolCall(name=_string(item, "name", record_id, name),
                        arguments=_dict(item, "arguments", record_id, name),
                        defaults=_dict(item, "defaults", record_id, name, optional=True),
                        alternatives=_alternatives(item, record_id, name),
                        possible_answer=_possible_answer(item, record_id, name))
        if call.name not in names:
            raise RecordError(record_id, f"{name}.name", f"{call.name!r} is not one of the tools ({', '.join(sorted(names))})")
        calls.append(call)
    return ToolSpec(tools=tuple(tools_), reference_calls=tuple(calls), semantics=semantics)


def _alternatives(item: dict, record_id: str, parent: str) -> dict[str, tuple]:
    given = _dict(item, "alternatives", record_id, parent, optional=True)
    for key, values in given.items():
        if not isinstance(values, list):
            raise RecordError(record_id, f"{parent}.alternatives.{key}", f"expected a list, got {_json_type(values)}")
    return {key: tuple(values) for key, values in given.items()}


def _possible_answer(item: dict, record_id: str, parent: str) -> dict[str, list] | None:
    """BFCL's answer of the call, {parameter: [accepted values]}, or None (null or absent)."""
    if item.get("possible_answer") is None:
        return None
    given = _dict(item, "possible_answer", record_id, parent)
    for key, values in given.items():
        if not isinstance(values, list):
            raise RecordError(record_id, f"{parent}.possible_answer.{key}",
                              f"expected a list, got {_json_type(values)}")
    return given


def _check_unicode(obj: dict, record_id: str) -> None:
    """A lone surrogate (JSON's "\\ud800") is no character: no tokenizer nor Parquet file takes it."""
    stack: list[tuple[Any, str]] = [(obj, "")]
    while stack:  # iterative: the JSON parser allows nesting deeper than a recursive walk would
        value, where = stack.pop()
        if isinstance(value, str) and not encodable(value):
            at = next(i for i, ch in enumerate(value) if not encodable(ch))
            raise RecordError(record_id, where or "<line>", f"a lone surrogate {value[at]!r} at character {at} "
                              "is not valid Unicode text")
        if isinstance(value, dict):
            stack.extend((key, where or "<line>") for key in value)
            stack.extend((item, _field(where, str(key))) for key, item in value.items())
        elif isinstance(value, list):
            stack.extend((item, f"{where}[{i}]") for i, item in enumerate(value))


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


def _dict(obj: dict, key: str, record_id: str, parent: str, optional: bool = False) -> dict:
    value = obj.get(key)
    if isinstance(value, dict):
        return value
    if optional and value is None:
        return {}
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
