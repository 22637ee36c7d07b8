"""DuckDB over a run directory: the `responses`, `credits` and `training` views of schemas/views.sql.

The views read exactly the part files the manifest lists (never a glob of the folder), file access is
limited to the run folder, extensions are neither installed nor loaded, and the configuration is locked
before any user SQL runs. `connect`'s connection could still COPY into the run folder, so `run_query`
(what `tokencredit query` runs) accepts only read statements (DuckDB's statement type SELECT: SELECT,
WITH, FROM-first, DESCRIBE, SHOW, SUMMARIZE, PIVOT; and a PIVOT without an IN list, which DuckDB runs as
two statements), so COPY, ATTACH, CREATE, INSTALL, SET, PRAGMA and the like never run, not even into the
run folder. A run of an older schema version reads the columns added since as NULL. A query checks the parts of
the tables it reads alone (`read_tables`); the views of the others are not over their files.
"""
from __future__ import annotations

import atexit
import os
import shutil
import signal
import tempfile
import threading
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds

from tokencredit.schemas import SCHEMA_VERSION, TABLES, views_sql

from tokencredit.pipeline.dataset.read_tables import tables_read
from tokencredit.pipeline.dataset.writer import run_files

SUMMARY_SQL = """
SELECT task,
       reward,
       count(*) AS responses,
       round(avg(score), 3) AS mean_score,
       round(avg((score >= 1)::INT), 3) AS pass_rate
FROM (SELECT task, unnest(reward_names) AS reward, unnest(rewards) AS score
      FROM responses WHERE status = 'ok')
GROUP BY ALL ORDER BY ALL
"""

READ_STATEMENTS = (duckdb.StatementType.SELECT,)

# Settings applied before the views exist; then `lock_configuration` freezes them all.
_LOCKDOWN = {
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "allow_community_extensions": False,
    "python_enable_replacements": False,  # SQL must not reach the caller's Python variables
}


def gdpo_options(manifest: dict) -> dict:
    """The run's GDPO options as recorded in its manifest ({} when it records none)."""
    return ((manifest.get("config") or {}).get("credit") or {}).get("gdpo") or {}


def _sql_list(paths: list[str]) -> str:
    return "[" + ", ".join("'" + p.replace("'", "''") + "'" for p in paths) + "]"


def connect(out: str | Path, *, allow_incomplete: bool = False, memory_limit: str | None = None,
            sql: str | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with the run's views, confined to the run folder (module docstring).

    DuckDB spills into a temporary folder of this connection's own (its default, `.tmp` in the
    current folder, would litter wherever the command ran), removed when the process ends or gets SIGTERM
    (`_private_temp_dir`: a killed process's is removed by the next connection);
    `memory_limit` ("4GB"; None: DuckDB's default, 80% of the machine) bounds what it keeps in memory.
    `sql`: the statements the connection is for; only the tables they read (`read_tables`) are checked, and the
    others' views refuse to be read (their parts are neither checked nor opened). None, or statements whose
    tables cannot be told: every table.
    Raises IncompleteRunError (a ValueError) when the run's manifest is not complete, unless
    `allow_incomplete`: then the views read the shards written so far.
    """
    out = str(out)
    settings = dict(_LOCKDOWN)
    if memory_limit is not None:
        settings["memory_limit"] = memory_limit
    try:
        con = duckdb.connect(config=settings)  # first: the query's tables are told by its parse
    except duckdb.Error as error:
        raise ValueError(f"cannot open DuckDB with memory limit {memory_limit!r}: {error}") from None
    try:
        tables = tables_read(con, sql) if sql is not None else None
        tables = tuple(TABLES) if tables is None else tables
        run = run_files(out, allow_incomplete=allow_incomplete, tables=tables)
    except BaseException:
        con.close()
        raise
    con.execute("SET temp_directory = $dir", {"dir": _private_temp_dir()})
    sources = {}
    for name, paths in run.files.items():
        if name not in tables:
            con.register(f"{name}_files", _unchecked(name))
            sources[name] = f"{name}_files"
        elif paths and run.local and not _lacks_columns(paths[0], name):
            sources[name] = f"read_parquet({_sql_list(paths)})"
        else:  # no files yet, a remote run (DuckDB reads it through pyarrow's filesystem), or an older
            # schema version's files: pyarrow reads their columns added since as NULL
            relation = ds.dataset(paths, filesystem=run.fs, format="parquet", schema=TABLES[name]) \
                if paths else TABLES[name].empty_table()
            con.register(f"{name}_files", relation)
            sources[name] = f"{name}_files"
    if run.local:
        con.execute("SET allowed_directories = $dirs", {"dirs": [run.root.rstrip("/") + "/"]})
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
    try:
        con.execute(views_sql(sources, gdpo_options(run.manifest)))
    except duckdb.BinderException as err:
        raise ValueError(f"run dir {out}: cannot create the views ({str(err).splitlines()[0]}); was it written "
                         f"by another schema version than {SCHEMA_VERSION}? Re-annotate it") from err
    return con


def _unchecked(table: str) -> pa.RecordBatchReader:
    """A source of `table`'s columns that refuses to be read: the view of a table the query does not read."""
    def refuse() -> pa.RecordBatch:  # called for the first batch: never while DuckDB only binds the views
        raise ValueError(f"the query read the run's {table} table, whose parts were not checked for it "
                         f"(`read_tables` missed it)")

    return pa.RecordBatchReader.from_batches(TABLES[table], iter(refuse, None))


def _lacks_columns(path: str, table: str) -> bool:
    """True when the part file lacks a column of today's schema (a run written before that column was added)."""
    import pyarrow.parquet as pq

    return not set(TABLES[table].names) <= set(pq.read_schema(path).names)


_SPILL_PREFIX = "tokencredit-duckdb-"
_spill_folders: list[str] = []  # this process's, removed at exit and on SIGTERM


def _private_temp_dir() -> str:
    """A new spill folder named with this process's id, `tokencredit-duckdb-<pid>-<random>` in the system's
    temporary folder. A process killed with SIGKILL cannot remove its own (one query's spill reached 1 GB):
    each new one first removes those whose process is gone."""
    _sweep_spill_folders(Path(tempfile.gettempdir()))
    folder = tempfile.mkdtemp(prefix=f"{_SPILL_PREFIX}{os.getpid()}-")
    if not _spill_folders:
        atexit.register(_remove_spill_folders)
        _remove_on_sigterm()
    _spill_folders.append(folder)
    return folder


def _sweep_spill_folders(parent: Path) -> None:
    for folder in parent.glob(f"{_SPILL_PREFIX}*-*"):
        pid = folder.name[len(_SPILL_PREFIX):].split("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _remove_spill_folders() -> None:
    for folder in _spill_folders:
        shutil.rmtree(folder, ignore_errors=True)


def _remove_on_sigterm() -> None:
    """On SIGTERM remove the spill folders, then die of the signal as before. Only where nothing else
    handles SIGTERM (the default action skips atexit) and only from the main thread, where Python allows it."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def remove_and_die(signum: int, frame) -> None:
        _remove_spill_folders()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, remove_and_die)


def check_read_only(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    """Raise ValueError unless every statement of `sql` is a read (statement type SELECT)."""
    try:
        statements = con.extract_statements(sql)
    except duckdb.Error as error:
        raise ValueError(f"the query failed: {error}") from None
    if not statements:
        raise ValueError("the query is empty")
    for statement in statements:
        if statement.type not in READ_STATEMENTS and not _is_pivot(statement):
            kind = statement.type.name
            hint = " (a PIVOT without an IN list runs only as a statement of its own)" if kind == "MULTI" else ""
            raise ValueError(f"only read statements run here (SELECT, WITH, DESCRIBE, SHOW, SUMMARIZE, PIVOT); "
                             f"refused a {kind} statement{hint}: {' '.join(statement.query.split())[:80]}")


def _is_pivot(statement) -> bool:
    """Whether a statement is a PIVOT without an IN list: DuckDB makes it a MULTI statement (it reads the
    pivoted column's distinct values into an ENUM type of this in-memory session, then selects), as it does
    a COPY, CREATE or INSERT holding such a PIVOT; the statement's first keyword tells them apart, and a
    PIVOT's source is a table or a subquery, which cannot write."""
    if statement.type != duckdb.StatementType.MULTI:
        return False
    tokens = duckdb.tokenize(statement.query) + [(len(statement.query), None)]
    first = next((i for i, (_, kind) in enumerate(tokens) if kind != duckdb.token_type.comment), len(tokens) - 1)
    if tokens[first][1] != duckdb.token_type.keyword:
        return False
    word = statement.query[tokens[first][0]:tokens[first + 1][0]]
    return word.strip().upper() in ("PIVOT", "PIVOT_WIDER")


def run_query(out: str | Path, sql: str, *, allow_incomplete: bool = False,
              memory_limit: str | None = None) -> duckdb.DuckDBPyRelation:
    """The relation of the last statement of `sql` (reads only) over run directory `out`."""
    con = connect(out, allow_incomplete=allow_incomplete, memory_limit=memory_limit, sql=sql)
    check_read_only(con, sql)
    return con.sql(sql)
