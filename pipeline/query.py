"""DuckDB over a run directory: the `responses`, `credits` and `training` views of schemas/views.sql."""
from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pyarrow.fs as pafs

from schemas import SCHEMA_VERSION, views_sql

SUMMARY_SQL = """
SELECT task,
       regexp_replace(reward, '^c[0-9]+_', '') AS reward,
       count(*) AS responses,
       round(avg(score), 3) AS mean_score,
       round(avg((score >= 1)::INT), 3) AS pass_rate
FROM (SELECT task, unnest(reward_names) AS reward, unnest(rewards) AS score
      FROM responses WHERE status = 'ok')
GROUP BY ALL ORDER BY ALL
"""


def gdpo_options(out: str) -> dict:
    """The run's GDPO options as recorded in its manifest ({} when it records none)."""
    fs, root = pafs.FileSystem.from_uri(out) if "://" in out else (pafs.LocalFileSystem(), str(Path(out).resolve()))
    path = f"{root}/manifest.json"
    if fs.get_file_info(path).type == pafs.FileType.NotFound:
        return {}
    with fs.open_input_stream(path) as stream:
        manifest = json.loads(stream.read())
    return ((manifest.get("config") or {}).get("credit") or {}).get("gdpo") or {}


def connect(out: str | Path) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with the run's views created."""
    out = str(out)
    if "://" not in out and not (Path(out) / "responses").is_dir():
        raise FileNotFoundError(f"{out} is not a tokencredit run directory (no responses/ folder)")
    con = duckdb.connect()
    try:
        con.execute(views_sql(out, gdpo_options(out)))
    except duckdb.BinderException as err:
        raise ValueError(f"run dir {out}: cannot create the views ({str(err).splitlines()[0]}); was it written "
                         f"by another schema version than {SCHEMA_VERSION}? Re-annotate it") from err
    return con


def run_query(out: str | Path, sql: str) -> duckdb.DuckDBPyRelation:
    return connect(out).sql(sql)
