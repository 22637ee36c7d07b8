"""DuckDB over a run directory: the `responses`, `credits` and `training` views of schemas/views.sql.

The connection is read-only to the run. The views read exactly the part files the manifest lists
(never a glob of the folder), file access is limited to the run folder, extensions are neither
installed nor loaded, and the configuration is locked before any user SQL runs. `run_query` also
accepts only read statements (DuckDB's statement type SELECT: SELECT, WITH, FROM-first, DESCRIBE,
SHOW, SUMMARIZE, PIVOT), so COPY, ATTACH, CREATE, INSTALL, SET, PRAGMA and the like never run, not
even into the run folder.
"""
from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

import duckdb
import pyarrow.dataset as ds

from tokencredit.schemas import SCHEMA_VERSION, TABLES, views_sql

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


def connect(out: str | Path, *, allow_incomplete: bool = False,
            memory_limit: str | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with the run's views, read-only to the run (module docstring).

    DuckDB spills into a temporary folder of this connection's own (its default, `.tmp` in the
    current folder, would litter wherever the command ran), removed when the process ends;
    `memory_limit` ("4GB"; None: DuckDB's default, 80% of the machine) bounds what it keeps in memory.
    Raises IncompleteRunError (a ValueError) when the run's manifest is not complete, unless
    `allow_incomplete`: then the views read the shards written so far.
    """
    out = str(out)
    run = run_files(out, allow_incomplete=allow_incomplete)
    settings = {**_LOCKDOWN, "temp_directory": _private_temp_dir()}
    if memory_limit is not None:
        settings["memory_limit"] = memory_limit
    try:
        con = duckdb.connect(config=settings)
    except duckdb.Error as error:
        raise ValueError(f"cannot open DuckDB with memory limit {memory_limit!r}: {error}") from None
    sources = {}
    for name, paths in run.files.items():
        if paths and run.local:
            sources[name] = f"read_parquet({_sql_list(paths)})"
        else:  # no files yet, or a remote run (DuckDB reads it through pyarrow's filesystem)
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


def _private_temp_dir() -> str:
    folder = tempfile.mkdtemp(prefix="tokencredit-duckdb-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def check_read_only(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    """Raise ValueError unless every statement of `sql` is a read (statement type SELECT)."""
    try:
        statements = con.extract_statements(sql)
    except duckdb.Error as error:
        raise ValueError(f"the query failed: {error}") from None
    if not statements:
        raise ValueError("the query is empty")
    for statement in statements:
        if statement.type not in READ_STATEMENTS:
            kind = statement.type.name
            raise ValueError(f"only read statements run here (SELECT, WITH, DESCRIBE, SHOW, SUMMARIZE); "
                             f"refused a {kind} statement: {' '.join(statement.query.split())[:80]}")


def run_query(out: str | Path, sql: str, *, allow_incomplete: bool = False,
              memory_limit: str | None = None) -> duckdb.DuckDBPyRelation:
    """The relation of the last statement of `sql` (reads only) over run directory `out`."""
    con = connect(out, allow_incomplete=allow_incomplete, memory_limit=memory_limit)
    check_read_only(con, sql)
    return con.sql(sql)
