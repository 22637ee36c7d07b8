"""Prompt files in public formats -> rows in the native record layout (`schemas/records.py`).

    rows = read_rows("ifeval_input_data.jsonl", "ifeval")     # [Row(path, line_no, raw, obj)]

Where rows come from, by path:
    *.jsonl, or a *.json holding one object per line     one row per line
    *.json holding a list (Spider, BIRD)                 one row per item (line_no = item number)
    *.parquet                                            one row per table row  (Arrow rows: null
    a `datasets` folder (save_to_disk)                   one row per example     object keys dropped;
                                                         `split` from the split name if train/test)
    any other folder                                     every *.jsonl in it, sorted (BFCL: its BFCL_*.json)

What each format makes of a row:
    native, hf  the row is the record; `columns` renames first (`{"prompt": "question"}` takes
                `prompt` from the column `question`; a value in quotes, "'sql'", is a constant)
    ifeval      {key, prompt, instruction_id_list, kwargs} -> task `instructions`; IFEval ids
    ifbench     become constraint kinds through `tokencredit.verifiers.ifeval.from_ifeval` (ifbench: IFBench
                ids it does not know are rejected, naming the kind)
    spider      {db_id, question, query} -> task `sql` on DATABASES/<db_id>/<db_id>.sqlite, the
    bird        prompt holding the schema (BIRD: {db_id, question, evidence, SQL}, evidence as a hint)
    bfcl        a question file with its possible-answer file (`possible_answer/<same name>` beside
                it) -> task `tools`; BFCL's accepted values become `arguments`, `alternatives`
                and, where "" marks an optional parameter, `defaults` (see `_bfcl_reference`);
                the answer itself is kept as `possible_answer` for the `bfcl` semantics

`databases_root` gives the folder that `db` paths resolve in: DATABASES above.
"""
from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokencredit.schemas.records import RecordError

from tokencredit.verifiers.ifeval import from_ifeval
from tokencredit.verifiers.sandbox import schema_of

FORMATS = ("native", "hf", "ifeval", "ifbench", "spider", "bird", "bfcl")
DEFAULT_SEMANTICS = {"ifeval": "ifeval", "ifbench": "ifeval", "bfcl": "bfcl"}
SQL_INSTRUCTION = "Answer with the SQL query between <sql> and </sql>."
TOOL_INSTRUCTION = "Answer with the call(s) as <tool_call>{...}</tool_call>."
_MAX_EXPANSIONS = 256  # accepted values one BFCL dict answer may expand to


@dataclass
class Row:
    path: str
    line_no: int  # 1-based line (JSONL) or item / row number
    raw: str
    obj: Any = None
    error: RecordError | None = None  # the row could not be read or converted


def databases_root(path: str | Path, format: str, databases: str | Path | None) -> Path:
    """The folder that `db` paths must resolve inside."""
    if databases is not None:
        return Path(databases)
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    return folder / ("database" if format in ("spider", "bird") else "databases")


def read_rows(path: str | Path, format: str = "native", columns: dict[str, str] | None = None,
              databases: str | Path | None = None) -> Iterator[Row]:
    """The rows of `path` converted to native records; unreadable or unconvertible ones carry `error`."""
    if format not in FORMATS:
        raise ValueError(f"unknown format {format!r}; choose from {', '.join(FORMATS)}")
    root = databases_root(path, format, databases)
    if format == "bfcl":
        yield from _bfcl_rows(Path(path))
        return
    for row in _source_rows(Path(path)):
        if row.error is None:
            try:
                row.obj = _convert(format, _renamed(row.obj, columns or {}, row.line_no), row.line_no, root)
            except RecordError as e:
                row.error = e
        yield row


# ---------------------------------------------------------------- sources

def source_files(path: str | Path, format: str = "native") -> list[Path]:
    """The files `read_rows` reads for `path` (a run's identity hashes them); FileNotFoundError as it."""
    path = Path(path)
    if format == "bfcl":
        questions = sorted(path.glob("BFCL_*.json")) if path.is_dir() else [path]
        answers = [q.parent / "possible_answer" / q.name for q in questions]
        return questions + [a for a in answers if a.is_file()]
    if path.is_dir() and any((path / name).exists() for name in ("dataset_info.json", "dataset_dict.json", "state.json")):
        return sorted(p for p in path.rglob("*") if p.is_file())
    if path.is_dir():
        return sorted(path.glob("*.jsonl"))
    if not path.is_file():
        raise FileNotFoundError(f"no task file at {path}")
    return [path]


def _source_rows(path: Path) -> Iterator[Row]:
    if path.is_dir() and any((path / name).exists() for name in ("dataset_info.json", "dataset_dict.json", "state.json")):
        yield from _dataset_rows(path)
    elif path.is_dir():
        files = sorted(path.glob("*.jsonl"))
        if not files:
            raise FileNotFoundError(f"no task file at {path} (no *.jsonl in it)")
        for file in files:
            yield from _jsonl_rows(file)
    elif not path.is_file():
        raise FileNotFoundError(f"no task file at {path}")
    elif path.suffix == ".parquet":
        yield from _parquet_rows(path)
    elif path.suffix == ".json" and path.read_bytes().lstrip()[:1] == b"[":
        yield from _json_list_rows(path)
    else:
        yield from _jsonl_rows(path)


def _jsonl_rows(file: Path) -> Iterator[Row]:
    for line_no, raw in enumerate(file.read_bytes().splitlines(), start=1):
        if not raw.strip():
            continue
        text = raw.decode("utf-8", errors="replace")
        try:
            yield _row(str(file), line_no, text, raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            yield Row(str(file), line_no, text, error=RecordError(f"line {line_no}", "<line>",
                                                                 f"not UTF-8 ({e.reason} at byte {e.start})"))
        except json.JSONDecodeError as e:
            # Some of the parser's messages end in "at" ("Unterminated string starting at"): one "at" is enough.
            yield Row(str(file), line_no, text, error=RecordError(
                f"line {line_no}", "<line>", f"invalid JSON: {e.msg.removesuffix(' at')} at column {e.colno}"))
        except RecursionError:
            yield Row(str(file), line_no, text, error=RecordError(f"line {line_no}", "<line>", "invalid JSON: "
                                                                 "nested more deeply than the JSON parser allows"))


def _json_list_rows(file: Path) -> Iterator[Row]:
    try:
        text = file.read_bytes().decode("utf-8")
        items, long_ints = _loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ValueError(f"{file}: not a JSON list ({e})") from None
    for i, item in enumerate(items, start=1):
        raw = json.dumps(item, ensure_ascii=False)
        error = _long_int_error(item, i) if long_ints else None
        yield Row(str(file), i, raw, None if error else item, error)


def _row(path: str, line_no: int, raw: str, text: str) -> Row:
    obj, long_ints = _loads(text)
    error = _long_int_error(obj, line_no) if long_ints else None
    return Row(path, line_no, raw, None if error else obj, error)


class _LongInt(str):
    """The digits of an integer longer than Python converts (`sys.get_int_max_str_digits`), kept as text."""


def _loads(text: str) -> tuple[Any, bool]:
    """(the parsed JSON, whether it holds a `_LongInt`): json.loads stops a whole file at an over-long integer
    with no line or field, so such a text is parsed again keeping those digits as text."""
    try:
        return json.loads(text), False
    except json.JSONDecodeError:
        raise
    except ValueError:  # only int() of too many digits raises a plain ValueError in the parser
        return json.loads(text, parse_int=_int), True


def _int(digits: str) -> int | _LongInt:
    limit = sys.get_int_max_str_digits()
    return _LongInt(digits) if limit and len(digits.lstrip("-")) > limit else int(digits)


def _long_int_error(obj: Any, line_no: int) -> RecordError | None:
    """The error naming the first field of a row that holds a `_LongInt`, None when it holds none."""
    stack = [("", obj)]
    while stack:  # iterative: a value may nest as deeply as the parser allows
        where, value = stack.pop()
        if isinstance(value, _LongInt):
            has_id = isinstance(obj, dict) and isinstance(obj.get("id"), str) and obj["id"]
            why = f"an integer of {len(value.lstrip('-'))} digits, more than the {sys.get_int_max_str_digits()} Python reads"
            return RecordError(obj["id"] if has_id else f"line {line_no}", where or "<line>", why)
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for key, item in reversed(list(items)):
            stack.append((f"{where}[{key}]" if isinstance(value, list) else f"{where}.{key}" if where else key, item))
    return None


def _parquet_rows(file: Path) -> Iterator[Row]:
    import pyarrow.parquet as pq

    for i, row in enumerate(pq.read_table(file).to_pylist(), start=1):
        row = _without_nulls(row)
        yield Row(str(file), i, json.dumps(row, default=str, ensure_ascii=False), row)


def _dataset_rows(folder: Path) -> Iterator[Row]:
    import datasets

    loaded = datasets.load_from_disk(str(folder))
    splits = loaded.items() if isinstance(loaded, datasets.DatasetDict) else [(None, loaded)]
    number = itertools.count(1)
    for split, dataset in splits:
        for row in dataset:
            row = _without_nulls(row)
            if split in ("train", "test"):
                row.setdefault("split", split)
            yield Row(f"{folder}" + (f"[{split}]" if split else ""), next(number),
                      json.dumps(row, default=str, ensure_ascii=False), row)


def _without_nulls(value: Any) -> Any:
    """Arrow stores objects as structs with every key of the column, null where a row has none:
    drop those keys again (a JSON null argument cannot be told apart from an absent one there)."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def _renamed(obj: Any, columns: dict[str, str], line_no: int) -> Any:
    """`obj` with each native field taken from its mapped column (or set to a quoted constant)."""
    if not columns or not isinstance(obj, dict):
        return obj
    out = dict(obj)
    for field, source in columns.items():
        if len(source) >= 2 and source[0] == source[-1] and source[0] in "'\"":
            out[field] = source[1:-1]
        elif source in obj:
            out[field] = obj[source]
        else:
            raise RecordError(f"line {line_no}", source, f"no column {source!r} to map to {field!r}")
    return out


# ---------------------------------------------------------------- conversions

def _convert(format: str, obj: Any, line_no: int, root: Path) -> Any:
    if format in ("native", "hf"):
        return obj
    if not isinstance(obj, dict):
        return obj  # the record parser says what is wrong with it
    if format in ("ifeval", "ifbench"):
        return _from_ifeval(obj, line_no)
    return _from_spider(obj, line_no, root, bird=format == "bird")


def _from_ifeval(obj: dict, line_no: int) -> dict:
    record_id = str(obj["key"]) if "key" in obj else f"line {line_no}"
    ids, kwargs = obj.get("instruction_id_list"), obj.get("kwargs")
    if not isinstance(ids, list) or not ids:
        raise RecordError(record_id, "instruction_id_list", "expected a non-empty list of instruction ids")
    if not isinstance(kwargs, list) or len(kwargs) != len(ids) or not all(isinstance(k, dict) for k in kwargs):
        raise RecordError(record_id, "kwargs", f"expected a list of {len(ids)} objects, one per instruction")
    constraints = []
    for i, (instruction_id, args) in enumerate(zip(ids, kwargs)):
        try:
            c = from_ifeval(instruction_id, args)
        except ValueError as e:
            raise RecordError(record_id, f"instruction_id_list[{i}]", str(e)) from None
        constraints.append({"kind": c.kind, "args": c.args})
    return {"id": record_id, "task": "instructions", "prompt": obj.get("prompt"), "constraints": constraints,
            **({"split": obj["split"]} if "split" in obj else {})}


def _from_spider(obj: dict, line_no: int, root: Path, bird: bool) -> dict:
    record_id = str(obj.get("id", obj.get("question_id", f"item-{line_no}")))
    query_field = "SQL" if bird else "query"
    for field in ("db_id", "question", query_field):
        if not isinstance(obj.get(field), str) or not obj[field].strip():
            raise RecordError(record_id, field, "missing (expected a non-empty string)")
    db = f"{obj['db_id']}/{obj['db_id']}.sqlite"
    db_path = resolve_db(db, root, record_id)
    tables = schema_of(str(db_path))
    schema = "; ".join(f"{t}({', '.join(cols)})" for t, cols in tables.items())
    hint = f"Hint: {obj['evidence'].strip()}\n" if bird and str(obj.get("evidence") or "").strip() else ""
    prompt = f"Schema: {schema}.\nQuestion: {obj['question'].strip()}\n{hint}{SQL_INSTRUCTION}"
    return {"id": record_id, "task": "sql", "prompt": prompt, "db": db, "reference_sql": obj[query_field]}


def resolve_db(db: str, root: Path, record_id: str) -> Path:
    """`root/db` when it is an SQLite file inside `root`; RecordError (field `db`) otherwise."""
    if "\x00" in db:
        raise RecordError(record_id, "db", f"{db!r} holds a null byte, which no file name can")
    if Path(db).is_absolute():
        raise RecordError(record_id, "db", f"absolute paths are refused; give a path inside {root}")
    path = (root / db).resolve()
    if not path.is_relative_to(root.resolve()):
        raise RecordError(record_id, "db", f"{db!r} resolves outside the databases folder {root}")
    if not path.is_file():
        raise RecordError(record_id, "db", f"database file not found: {root / db}")
    with open(path, "rb") as f:
        if f.read(16) != b"SQLite format 3\x00":
            raise RecordError(record_id, "db", f"{root / db} is not an SQLite database file")
    return path


# ---------------------------------------------------------------- BFCL

def _bfcl_rows(path: Path) -> Iterator[Row]:
    files = sorted(path.glob("BFCL_*.json")) if path.is_dir() else [path]
    if not files or not files[0].is_file():
        raise FileNotFoundError(f"no BFCL question file at {path}")
    for file in files:
        answers_file = file.parent / "possible_answer" / file.name
        if not answers_file.is_file():
            if path.is_dir():
                continue  # a category without answers (irrelevance, multi-turn): nothing to verify
            raise FileNotFoundError(f"no possible-answer file for {file} (expected {answers_file})")
        answers = {row.obj.get("id"): row.obj for row in _jsonl_rows(answers_file) if isinstance(row.obj, dict)}
        for row in _jsonl_rows(file):
            if row.error is None:
                try:
                    row.obj = _from_bfcl(row.obj, answers, row.line_no)
                except RecordError as e:
                    row.error = e
            yield row


def _from_bfcl(obj: Any, answers: dict[str, dict], line_no: int) -> Any:
    if not isinstance(obj, dict):
        return obj
    record_id = str(obj.get("id", f"line {line_no}"))
    if record_id not in answers:
        raise RecordError(record_id, "id", "no possible answer with this id")
    turns = obj.get("question")
    if not isinstance(turns, list) or len(turns) != 1 or not isinstance(turns[0], list):
        raise RecordError(record_id, "question", "expected one turn (a list of messages); multi-turn is not supported")
    question = "\n".join(str(m.get("content", "")) for m in turns[0] if isinstance(m, dict))
    functions = obj.get("function")
    if not isinstance(functions, list) or not functions:
        raise RecordError(record_id, "function", "expected a non-empty list of functions")
    ground_truth = answers[record_id].get("ground_truth")
    if not isinstance(ground_truth, list) or not ground_truth:
        raise RecordError(record_id, "ground_truth", "expected a non-empty list of calls")
    by_name = {f.get("name"): f for f in functions if isinstance(f, dict)}
    calls = [_bfcl_reference(record_id, i, call, by_name) for i, call in enumerate(ground_truth)]
    listing = "\n".join(json.dumps(f, ensure_ascii=False) for f in functions)
    prompt = f"Tools:\n{listing}\nRequest: {question.strip()}\n{TOOL_INSTRUCTION}"
    return {"id": record_id, "task": "tools", "prompt": prompt, "tools": functions, "reference_calls": calls}


def _bfcl_reference(record_id: str, index: int, call: Any, functions: dict[str, dict]) -> dict:
    """One BFCL answer {name: {param: [accepted values, "" = may be left out]}} as a reference call.

    The first accepted value is the reference value and the rest its alternatives; a parameter
    that may be left out (and is not required) is a default; one whose only accepted value is ""
    must be left out, so it is not in the reference (passing it is an extra argument), nor is an
    optional one the function does not declare. A dict
    value, itself {key: [accepted values]}, expands to every dict it accepts. The answer itself is
    kept as `possible_answer`: the `bfcl` semantics judges by it, as BFCL's checker does."""
    where = f"ground_truth[{index}]"
    if not isinstance(call, dict) or len(call) != 1:
        raise RecordError(record_id, where, "expected {function name: {parameter: [accepted values]}}")
    (name, params), = call.items()
    declared = functions.get(name, {}).get("parameters", {})
    required = set(declared.get("required", []))
    arguments, defaults, alternatives = {}, {}, {}
    for param, accepted in params.items():
        if not isinstance(accepted, list):
            raise RecordError(record_id, f"{where}.{param}", "expected a list of accepted values")
        optional = "" in accepted and param not in required
        if optional and param not in declared.get("properties", {}):
            continue  # an optional parameter the function lacks: passing it is an extra argument in BFCL too
        values = [v for value in accepted if value != "" for v in _expanded(value, record_id, f"{where}.{param}")]
        if not values:
            if not optional:
                raise RecordError(record_id, f"{where}.{param}", "no accepted value for a required parameter")
            continue
        (defaults if optional else arguments)[param] = values[0]
        if len(values) > 1:
            alternatives[param] = values[1:]
    return {"name": name, "arguments": arguments, "defaults": defaults, "alternatives": alternatives,
            "possible_answer": params}


_OMITTED = object()


def _expanded(value: Any, record_id: str, where: str) -> list[Any]:
    """The concrete values a BFCL answer value accepts: itself, or for {key: [accepted]} (and lists
    of those) every combination."""
    if isinstance(value, dict) and all(isinstance(v, list) for v in value.values()) and value:
        options = [[(k, o) for v in accepted for o in ([_OMITTED] if v == "" else _expanded(v, record_id, where))]
                   for k, accepted in value.items()]
        combos = _capped_product(options, record_id, where)
        return [{k: v for k, v in combo if v is not _OMITTED} for combo in combos]
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        combos = _capped_product([_expanded(v, record_id, where) for v in value], record_id, where)
        return [list(combo) for combo in combos]
    return [value]


def _capped_product(options: list[list], record_id: str, where: str) -> list[tuple]:
    size = 1
    for o in options:
        size *= len(o)
    if size > _MAX_EXPANSIONS:
        raise RecordError(record_id, where, f"accepts {size} combinations of values (at most {_MAX_EXPANSIONS})")
    return list(itertools.product(*options))
