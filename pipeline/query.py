"""DuckDB over a run directory: the `responses`, `credits` and `training` views of schemas/views.sql."""
from __future__ import annotations

from pathlib import Path

import duckdb

from schemas import views_sql

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


def connect(out: str | Path) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with the run's views created."""
    out = str(out)
    if "://" not in out and not (Path(out) / "responses").is_dir():
        raise FileNotFoundError(f"{out} is not a tokencredit run directory (no responses/ folder)")
    con = duckdb.connect()
    con.execute(views_sql(out))
    return con


def run_query(out: str | Path, sql: str) -> duckdb.DuckDBPyRelation:
    return connect(out).sql(sql)
