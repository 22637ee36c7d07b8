"""Run one untrusted SELECT against a SQLite file without letting it write, escape or hang.

Layers, each enough on its own for the common attacks:
  1. the file is opened read-only and immutable through a URI, extensions stay disabled;
  2. the statement must start with SELECT, WITH or VALUES, and be the only statement;
  3. an authorizer allows only SELECT, READ, FUNCTION (minus file and extension functions)
     and RECURSIVE (recursive CTEs): ATTACH, PRAGMA (also the pragma_* table functions),
     writes, DDL and transactions are denied;
  4. a progress handler stops the query after `timeout_s` seconds of wall time, SQLite's
     length limit caps any single string or blob, and the result is fetched row by row up
     to a row cap and a total-size cap;
  5. the statement runs in a worker process (`python -I sandbox.py`, stdlib only), because
     SQLite calls no progress handler while it prepares a statement, and preparing can take
     seconds and gigabytes (a chain of CTEs that each join the previous one with itself doubles
     both per level). The worker is killed at the deadline; its SQLite heap is capped
     (`PRAGMA hard_heap_limit`, process-wide, hence a process of its own), temporary tables
     and sorts stay in that heap (`temp_store = MEMORY`), and it may not write a byte to any
     file (RLIMIT_FSIZE 0). Idle workers are reused, so a query costs a pipe round trip. A worker ends
     when its caller does, however the caller ends, even mid-query (`_end_with_caller`).
Every refusal raises `SandboxError` with a message fit for feedback, naming the bound that stopped it.
"""
from __future__ import annotations

import atexit
import dataclasses
import functools
import marshal
import os
import resource
import select
import signal
import sqlite3
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

STARTS = ("SELECT", "WITH", "VALUES")
_ALLOWED_ACTIONS = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
# Functions that touch files or native code (most are absent from Python's SQLite build, listed
# so that a build that has them still refuses them), and printf/format, whose width argument
# makes one call loop for seconds inside C, where the progress handler cannot stop it.
_DENIED_FUNCTIONS = {"load_extension", "readfile", "writefile", "edit", "fts3_tokenizer", "lsdir", "printf", "format"}
_ACTION_NAMES = {
    getattr(sqlite3, f"SQLITE_{name}"): name.replace("_", " ")
    for name in (
        "ATTACH", "DETACH", "PRAGMA", "INSERT", "UPDATE", "DELETE", "TRANSACTION", "SAVEPOINT",
        "ANALYZE", "REINDEX", "ALTER_TABLE", "CREATE_TABLE", "CREATE_TEMP_TABLE", "CREATE_INDEX",
        "CREATE_TEMP_INDEX", "CREATE_VIEW", "CREATE_TEMP_VIEW", "CREATE_TRIGGER",
        "CREATE_TEMP_TRIGGER", "CREATE_VTABLE", "DROP_TABLE", "DROP_TEMP_TABLE", "DROP_INDEX",
        "DROP_TEMP_INDEX", "DROP_VIEW", "DROP_TEMP_VIEW", "DROP_TRIGGER", "DROP_TEMP_TRIGGER",
        "DROP_VTABLE",
    )
}
_WRITES = {sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_DELETE}
_SCHEMA_TABLES = {"sqlite_master", "sqlite_temp_master", "sqlite_schema", "sqlite_temp_schema"}
_NUMBER_BYTES = 8  # what an INTEGER / REAL / NULL cell counts towards `max_bytes`


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 2.0  # wall time of prepare + execute + fetch
    max_memory_bytes: int = 256_000_000  # SQLite's heap in the worker, temporary tables and sorts included
    max_rows: int = 10_000
    max_bytes: int = 8_000_000  # total size of all result cells (str: characters, blob: bytes)
    max_value_bytes: int = 100_000  # largest string or blob SQLite may build while running
    max_like_pattern: int = 1_000  # LIKE/GLOB pattern length: their cost is string x pattern
    max_sql_chars: int = 100_000


class SandboxError(Exception):
    """The query was refused, failed, or went past a limit; str(e) is the feedback."""


@dataclass(frozen=True)
class QueryResult:
    columns: tuple[str, ...]
    rows: list[tuple]


def top_level_words(sql: str) -> list[str]:
    """Upper-cased words of `sql` outside parentheses, string literals, quoted names and comments."""
    words, depth, i, n = [], 0, 0, len(sql)
    while i < n:
        ch = sql[i]
        if sql.startswith("--", i):
            i = _find_end(sql, "\n", i + 2)
        elif sql.startswith("/*", i):
            i = _find_end(sql, "*/", i + 2)
        elif ch in "'\"`[":
            i = _find_end(sql, "]" if ch == "[" else ch, i + 1)
        elif ch == "(":
            depth, i = depth + 1, i + 1
        elif ch == ")":
            depth, i = max(depth - 1, 0), i + 1
        elif ch.isalpha() or ch == "_":
            j = i
            while j < n and (sql[j].isalnum() or sql[j] == "_"):
                j += 1
            if depth == 0:
                words.append(sql[i:j].upper())
            i = j
        else:
            i += 1
    return words


def _find_end(sql: str, closer: str, start: int) -> int:
    """Index just past `closer` at or after `start` (the end of `sql` when unterminated)."""
    at = sql.find(closer, start)
    return len(sql) if at < 0 else at + len(closer)


def has_top_level_order_by(sql: str) -> bool:
    words = top_level_words(sql)
    return any(a == "ORDER" and b == "BY" for a, b in zip(words, words[1:]))


def run_select(db_path: str | Path, sql: str, limits: Limits = Limits()) -> QueryResult:
    """Run one read-only statement on the SQLite file `db_path` in a worker process; raise
    SandboxError on refusal."""
    _check_text(sql, limits)
    path = Path(db_path).resolve()
    if not path.is_file():
        raise SandboxError(f"The database file {path} does not exist.")
    worker = _take_worker(limits.max_memory_bytes)
    try:
        reply = worker.ask((str(path), sql, dataclasses.astuple(limits)), limits.timeout_s + _KILL_GRACE_S)
    except BaseException:
        worker.close()
        raise
    _give_back(worker)
    if reply[0] == "error":
        raise SandboxError(reply[1])
    return QueryResult(tuple(reply[1]), [tuple(row) for row in reply[2]])


@functools.lru_cache(maxsize=256)
def schema_of(db_path: str) -> dict[str, tuple[str, ...]]:
    """Table name -> column names of the SQLite file (opened read-only and immutable; cached)."""
    conn = _open_readonly(db_path, Limits())
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                             "AND name NOT LIKE 'sqlite_%' ORDER BY name")]
        return {t: tuple(r[1] for r in conn.execute("SELECT * FROM pragma_table_info(?)", (t,))) for t in tables}
    finally:
        conn.close()


def _check_text(sql: str, limits: Limits) -> None:
    if len(sql) > limits.max_sql_chars:
        raise SandboxError(f"Refused: the query is longer than {limits.max_sql_chars} characters.")
    words = top_level_words(sql)
    if not words or words[0] not in STARTS:
        found = words[0] if words else "nothing"
        raise SandboxError(f"Refused: the query must start with SELECT or WITH, found {found}.")


def _open_readonly(db_path: str | Path, limits: Limits) -> sqlite3.Connection:
    path = Path(db_path).resolve()
    if not path.is_file():
        raise SandboxError(f"The database file {path} does not exist.")
    uri = f"file:{quote(str(path))}?mode=ro&immutable=1"
    conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
    if hasattr(conn, "enable_load_extension"):  # absent when Python's SQLite cannot load extensions at all
        conn.enable_load_extension(False)
    conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, limits.max_value_bytes)
    conn.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, limits.max_sql_chars)
    conn.setlimit(sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH, limits.max_like_pattern)
    return conn


def _execute(conn: sqlite3.Connection, sql: str, limits: Limits) -> QueryResult:
    denied: list[str] = []
    conn.set_authorizer(lambda action, arg1, arg2, db, trigger: _authorize(denied, action, arg1, arg2))
    deadline = time.monotonic() + limits.timeout_s
    conn.set_progress_handler(lambda: time.monotonic() > deadline, 1000)
    try:
        cursor = conn.execute(sql)
        rows = _fetch_bounded(cursor, limits)
    except SandboxError:
        raise
    except MemoryError:
        raise SandboxError(f"Refused: the query needed more than {limits.max_memory_bytes / 1e6:g} MB of memory "
                           "(temporary tables and sorts included).") from None
    except sqlite3.ProgrammingError as e:
        if "one statement" in str(e):
            raise SandboxError("Refused: only one SQL statement may run.") from None
        raise SandboxError(f"The query failed: {e}.") from None
    except Exception as e:  # hostile input may trip any sqlite3 / encoding error; all are refusals
        if denied:
            raise SandboxError(f"Refused: {denied[0]} is not allowed; only a read-only SELECT may run.") from None
        if time.monotonic() > deadline:
            raise SandboxError(f"Refused: the query ran longer than {limits.timeout_s:g} s.") from None
        raise SandboxError(f"The query failed: {e}.") from None
    columns = tuple(d[0] for d in cursor.description or ())
    return QueryResult(columns, rows)


def _authorize(denied: list[str], action: int, arg1: str | None, arg2: str | None) -> int:
    if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() in _DENIED_FUNCTIONS:
        denied.append(f"the function {arg2}()")
        return sqlite3.SQLITE_DENY
    if action in _ALLOWED_ACTIONS:
        return sqlite3.SQLITE_OK
    # DDL reaches the authorizer first as a write to the schema table (so does a pragma_*
    # table function, which registers itself there), and is refused at that point.
    if action in _WRITES and arg1 in _SCHEMA_TABLES:
        denied.append("changing the schema")
    elif action in _WRITES:
        denied.append(f"{_ACTION_NAMES[action]} on table {arg1}")
    else:
        denied.append(_ACTION_NAMES.get(action, f"SQLite action {action}"))
    return sqlite3.SQLITE_DENY


def _fetch_bounded(cursor: sqlite3.Cursor, limits: Limits) -> list[tuple]:
    # Row by row, so that at most one row past a cap is ever held.
    rows: list[tuple] = []
    size = 0
    for row in cursor:
        rows.append(row)
        if len(rows) > limits.max_rows:
            raise SandboxError(f"Refused: the result has more than {limits.max_rows} rows.")
        size += sum(map(_cell_size, row))
        if size > limits.max_bytes:
            raise SandboxError(f"Refused: the result is larger than {limits.max_bytes} bytes.")
    return rows


def _cell_size(value) -> int:
    return len(value) if isinstance(value, (str, bytes)) else _NUMBER_BYTES


# ---------------------------------------------------------------- worker processes

_KILL_GRACE_S = 0.2  # past `timeout_s`: the worker's own progress handler answers first when it can
_START_TIMEOUT_S = 60.0  # an interpreter's start, not counted in any query's time
_AS_MARGIN_BYTES = 256_000_000  # address space beyond the SQLite heap: the interpreter, the result
_MAX_IDLE = 16
_HEADER = struct.Struct("<Q")
_idle: list[_Worker] = []
_idle_lock = threading.Lock()


class _Worker:
    """One `python -I sandbox.py` process, serving one query at a time over its stdin/stdout. It is
    started before a query's clock runs: on a loaded machine an interpreter can take seconds to start,
    and that must not count as the query's time."""

    def __init__(self, max_memory: int):
        self.max_memory = max_memory
        # a session of its own: Ctrl-C at a terminal (SIGINT to the foreground group) must not kill it under a
        # running query, which would read as the response's verifier error; the process it serves ends it
        self.proc = subprocess.Popen([sys.executable, "-I", __file__, str(max_memory)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
        if not self._answers_within(_START_TIMEOUT_S) or _receive(self.proc.stdout) != ("ready",):
            self.close()
            raise SandboxError(f"The SQLite worker process did not start within {_START_TIMEOUT_S:g} s.")

    def ask(self, request: tuple, seconds: float) -> tuple:
        _send(self.proc.stdin, request)
        if not self._answers_within(seconds):
            raise SandboxError(f"Refused: the query ran longer than {request[2][0]:g} s.")
        reply = _receive(self.proc.stdout)
        if reply is None:
            raise SandboxError(f"The query failed: its SQLite process ended with status {self.proc.wait()}.")
        return reply

    def _answers_within(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        fd = self.proc.stdout.fileno()
        while not select.select([fd], [], [], max(deadline - time.monotonic(), 0))[0]:
            if time.monotonic() >= deadline:
                return False
        return True

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.proc.stdin.close()
        self.proc.stdout.close()


def _take_worker(max_memory: int) -> _Worker:
    with _idle_lock:
        for i, worker in enumerate(_idle):
            if worker.max_memory == max_memory:
                return _idle.pop(i)
    return _Worker(max_memory)


def _give_back(worker: _Worker) -> None:
    with _idle_lock:
        if len(_idle) < _MAX_IDLE:
            _idle.append(worker)
            return
    worker.close()


def idle_worker_pids() -> set[int]:
    """The process ids of the idle workers, kept for the next query."""
    with _idle_lock:
        return {worker.proc.pid for worker in _idle}


@atexit.register
def close_workers() -> None:
    """End the idle workers (a busy one ends when this process does: its stdin closes)."""
    with _idle_lock:
        workers, _idle[:] = list(_idle), []
    for worker in workers:
        worker.close()


def _send(stream, obj) -> None:
    data = marshal.dumps(obj)  # plain values only: a reply can carry nothing that runs code
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _receive(stream):
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    return marshal.loads(stream.read(_HEADER.unpack(header)[0]))


def _serve(max_memory: int) -> None:
    """The worker's loop: (db path, sql, limits) in, ("ok", columns, rows) or ("error", message) out."""
    resource.setrlimit(resource.RLIMIT_AS, (max_memory + _AS_MARGIN_BYTES,) * 2)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past RLIMIT_FSIZE fails instead of killing
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    requests, replies = os.fdopen(0, "rb"), os.fdopen(1, "wb")
    threading.Thread(target=_end_with_caller, name="caller-watch", daemon=True).start()
    _send(replies, ("ready",))
    while (request := _receive(requests)) is not None:
        path, sql, fields = request
        _send(replies, _serve_one(path, sql, Limits(*fields)))


def _end_with_caller() -> None:
    """Exit once the caller's end of the request pipe closes: the caller ended (killed with SIGKILL too). An idle
    worker would read end-of-file anyway; this ends one mid-query, which would run on until its deadline, or
    longer while SQLite prepares the statement."""
    watch = select.poll()
    watch.register(0, 0)  # no event asked: a hang-up (no writer left) is reported all the same
    watch.poll()
    os._exit(0)


def _serve_one(path: str, sql: str, limits: Limits) -> tuple:
    try:
        conn = _open_readonly(path, limits)
    except (SandboxError, sqlite3.Error) as e:
        return ("error", f"The database file {path} cannot be opened: {e}")
    try:
        conn.execute(f"PRAGMA hard_heap_limit = {int(limits.max_memory_bytes)}")
        conn.execute("PRAGMA temp_store = MEMORY")
        result = _execute(conn, sql, limits)
        return ("ok", list(result.columns), result.rows)
    except SandboxError as e:
        return ("error", str(e))
    finally:
        conn.close()


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
