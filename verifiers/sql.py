"""Text-to-SQL verifier: format, executable, execution (in this order).

    format      the response holds exactly one non-empty <sql>...</sql> block       1 / 0
    executable  that query runs in the read-only sandbox (`tokencredit.verifiers.sandbox`)      1 / 0
    execution   its result equals the reference query's result                      1 / 0

A failed `format` or `executable` carries the spans that break it (`format_spans`: the extra or
misplaced tag, where a missing one belongs; `error_spans`: the name or token the database's error
names). A wrong result (`execution`) has none: nothing in the response says where it goes wrong.

Results are compared as multisets of rows, in order only when the reference query has a
top-level ORDER BY. Numbers compare numerically (3 == 3.0, floats to a relative 1e-6);
text, blobs and NULL compare only with their own kind. Column names are ignored.
"""
from __future__ import annotations

import difflib
import functools
import math
import re

from tokencredit.schemas.records import RecordError, RewardScore, SqlSpec, TaskRecord

from tokencredit.verifiers.sandbox import QueryResult, SandboxError, has_top_level_order_by, run_select, schema_of
from tokencredit.verifiers.parts import label_runs
from tokencredit.verifiers.spans import Span, merged, word

REWARDS = ("format", "executable", "execution")
OPEN, CLOSE = "<sql>", "</sql>"
FORMAT_RULE = "The query must be a single SQL statement between <sql> and </sql>."
EXECUTABLE_RULE = "The query must run on the database without error."
_MISSING = re.compile(r"no such (table|column): ([\w.]*\w)")
_NAMED = re.compile(r"no such (?:table|column): ([\w.]*\w)|near \"([^\"]+)\": syntax error|"
                    r"ambiguous column name: ([\w.]*\w)")
_TAG = re.compile(r"</?sql>")
_BLOCK = re.compile(r"<sql>(.*?)</sql>", re.DOTALL)
_REL_TOL, _ABS_TOL = 1e-6, 1e-9
_SHOWN_CHARS = 60  # longest row text quoted in a mismatch note


def reward_names(record: TaskRecord) -> list[str]:
    return list(REWARDS)


def validate(record: TaskRecord) -> None:
    """Raise RecordError (field `reference_sql`) when the record's reference query does not run."""
    reference_result(record.id, record.spec.db_path, record.spec.reference_sql)


def verify(record: TaskRecord, response: str) -> list[RewardScore]:
    """Score one response; raises only RecordError, when the record's reference query fails.

    Each `feedback` states what the check expects (the format rule, a fix for a failed query, the
    reference query); `observed` says what the response did.
    """
    spec: SqlSpec = record.spec
    query, found = extract_query(response)
    fmt = RewardScore("format", float(query is not None), FORMAT_RULE, found,
                      format_spans(response) if query is None else ())
    reference = f"The reference query is: {spec.reference_sql.strip().rstrip(';').strip()}."
    if query is None:
        return [fmt, RewardScore("executable", 0.0, EXECUTABLE_RULE, "Not run: there is no single <sql> block."),
                RewardScore("execution", 0.0, reference, "The query did not run.")]
    try:
        got = run_select(spec.db_path, query)
    except SandboxError as e:
        where = error_spans(str(e), query, response.index(OPEN) + len(OPEN))
        return [fmt, RewardScore("executable", 0.0, expected_fix(str(e), spec.db_path), str(e), where),
                RewardScore("execution", 0.0, reference, "The query did not run.")]
    want = reference_result(record.id, spec.db_path, spec.reference_sql)
    note = compare_results(got, want, ordered=has_top_level_order_by(spec.reference_sql))
    return [
        fmt,
        RewardScore("executable", 1.0, EXECUTABLE_RULE, "The query ran without error."),
        RewardScore("execution", float(note is None), reference, f"The result {note or 'matches the reference'}."),
    ]


def expected_fix(error: str, db_path: str) -> str:
    """What a failed query should have done, without quoting its wrong name: for a missing table or
    column, the closest name the database has (an error message would quote the wrong one)."""
    missing = _MISSING.search(error)
    if missing is None:
        return EXECUTABLE_RULE
    kind, name = missing.group(1), missing.group(2).split(".")[-1]
    schema = schema_of(db_path)
    names = sorted(schema) if kind == "table" else sorted({c for cols in schema.values() for c in cols})
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.0)
    return f"{EXECUTABLE_RULE} Use an existing {kind}: {close[0]}." if close else EXECUTABLE_RULE


def format_spans(response: str) -> tuple[Span, ...]:
    """Where a response breaks `format`: every tag past the first <sql> and the first </sql>, both tags of a
    </sql> before its <sql>, an empty block, or where a missing tag belongs (the last character for a
    missing </sql>, the first for a missing <sql>). No block at all: no span."""
    tags = list(_TAG.finditer(response))
    opens = [(m.start(), m.end()) for m in tags if m.group() == OPEN]
    closes = [(m.start(), m.end()) for m in tags if m.group() == CLOSE]
    if not opens and not closes:
        return ()
    spans = opens[1:] + closes[1:]
    start, end = len(response) - len(response.lstrip()), len(response.rstrip())
    if not closes:
        spans.append((end - 1, end))
    elif not opens:
        spans.append((start, start + 1))
    elif closes[0][0] < opens[0][0]:
        spans += [opens[0], closes[0]]
    elif not spans and not response[opens[0][1]:closes[0][0]].strip():
        spans.append((opens[0][0], closes[0][1]))
    return merged(spans)


def error_spans(error: str, query: str, offset: int) -> tuple[Span, ...]:
    """The name or token the database's error names, where it stands in the query (shifted by `offset`,
    the query's start in the response): `no such table: X`, `no such column: X`, `near "X": syntax error`,
    `ambiguous column name: X`. Other errors: no span."""
    named = _NAMED.search(error)
    if named is None:
        return ()
    name = next(g for g in named.groups() if g is not None)
    found = word(name, query, offset) or word(name.split(".")[-1], query, offset)
    return merged(found)


def extract_query(response: str) -> tuple[str | None, str]:
    """(query, what was found): the body of the one <sql> block, or None and why not."""
    opens, closes = response.count(OPEN), response.count(CLOSE)
    if opens == 0 and closes == 0:
        return None, "Found no <sql> block."
    if opens > 1 or closes > 1:
        return None, f"Found {max(opens, closes)} <sql> blocks."
    if closes == 0:
        return None, "Found <sql> without a closing </sql>."
    if opens == 0:
        return None, "Found </sql> without an opening <sql>."
    match = _BLOCK.search(response)
    if match is None:
        return None, "Found </sql> before <sql>."
    if not match.group(1).strip():
        return None, "Found an empty <sql> block."
    return match.group(1), "Found one <sql> block."


def response_parts(record: TaskRecord, response: str) -> list[tuple[int, int, str]]:
    """Contiguous spans covering `response`: `tags` (<sql>, </sql>), `query` (a block's body), `other`."""
    labels = ["other"] * len(response)
    # Pair each <sql> with the next tag when that is </sql>: one linear pass over the tags
    # (a lazy regex over "<sql>" * 10**5 would rescan the rest of the text from every opening).
    tags = list(_TAG.finditer(response))
    for tag, after in zip(tags, tags[1:]):
        if tag.group() == OPEN and after.group() == CLOSE:
            labels[tag.end() : after.start()] = ["query"] * (after.start() - tag.end())
    for tag in tags:
        labels[tag.start() : tag.end()] = ["tags"] * (tag.end() - tag.start())
    return label_runs(labels)


@functools.lru_cache(maxsize=4096)
def reference_result(record_id: str, db_path: str, reference_sql: str) -> QueryResult:
    """The reference query's result, cached: the database file is opened immutable."""
    try:
        return run_select(db_path, reference_sql)
    except SandboxError as e:
        raise RecordError(record_id, "reference_sql", f"the reference query does not run: {e}") from None


def compare_results(got: QueryResult, want: QueryResult, ordered: bool) -> str | None:
    """None when equal, else a short note on how `got` differs ("has 3 rows, expected 1")."""
    got_cols, want_cols = len(got.columns), len(want.columns)
    if got_cols != want_cols:
        return f"has {got_cols} column{'s' * (got_cols != 1)}, expected {want_cols}"
    if len(got.rows) != len(want.rows):
        return f"has {len(got.rows)} row{'s' * (len(got.rows) != 1)}, expected {len(want.rows)}"
    got_sorted, want_sorted = sorted(got.rows, key=_row_key), sorted(want.rows, key=_row_key)
    if not all(map(_same_row, got_sorted, want_sorted)):
        pairs = zip(got.rows, want.rows) if ordered else zip(got_sorted, want_sorted)
        row_got, row_want = next((g, w) for g, w in pairs if not _same_row(g, w))
        return f"differs: it has row {_show(row_got)} where the reference has {_show(row_want)}"
    if ordered and not all(map(_same_row, got.rows, want.rows)):
        return "has the right rows in the wrong order"
    return None


def _same_row(a: tuple, b: tuple) -> bool:
    return all(map(_same_value, a, b))


def _same_value(a, b) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=_REL_TOL, abs_tol=_ABS_TOL)
    return type(a) is type(b) and a == b


def _row_key(row: tuple) -> tuple:
    # Numbers of either type sort together so that near-equal floats end up side by side.
    return tuple(_value_key(v) for v in row)


def _value_key(v) -> tuple:
    if v is None:
        return (0, 0)
    if isinstance(v, (int, float)):
        return (1, v)
    if isinstance(v, str):
        return (2, v)
    return (3, bytes(v))


def _show(row: tuple) -> str:
    text = repr(row)
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."
