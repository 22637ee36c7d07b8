"""Which of a run's tables (`schemas.TABLES`) a read statement reads, so that a query is checked (`writer.run_files`)
on those tables' parts alone: a query of `credits` neither checks nor reads the parts of `responses`.

DuckDB serializes a SELECT statement's syntax tree (`json_serialize_sql`), and every table it references, in a
join, a subquery, a CTE or an expression, is a node of that tree. The views of schemas/views.sql name their tables
through placeholders and earlier views by name, which gives the tables behind each view (`training` reads
`responses`). A statement is resolved only when every name it references is a view of the run or one of its own
CTEs, written as a plain identifier (a quoted file name, `FROM 'credits/part-00001.parquet'`, is read by DuckDB's
replacement scans), in the default catalog, and every table reference is of a kind the walk knows: a table
function (`read_parquet`, `query`) can name a part file itself. Anything else, and a statement DuckDB does not
serialize (a PIVOT without an IN list, a parse error), resolves to None: check every table.
"""
from __future__ import annotations

import functools
import json
import re
from typing import Any

import duckdb

from tokencredit.schemas import TABLES, views_sql

# table references whose own reads are the tables named in them (an EMPTY is a FROM-less SELECT's)
_KNOWN_REFERENCES = frozenset({"BASE_TABLE", "JOIN", "SUBQUERY", "EMPTY", "EXPRESSION_LIST", "PIVOT", "SHOW_REF"})
# every kind of table reference DuckDB has (TableReferenceType): one without its alias or sample is one still
_REFERENCES = _KNOWN_REFERENCES | {"INVALID", "TABLE_FUNCTION", "CTE", "EMPTY_FROM", "COLUMN_DATA", "DELIM_GET",
                                   "BOUND_TABLE_REF"}
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_VIEW = re.compile(r"CREATE OR REPLACE VIEW (\w+) AS\s", re.IGNORECASE)
_COMMENT = re.compile(r"--[^\n]*")


def tables_read(con: duckdb.DuckDBPyConnection, sql: str) -> tuple[str, ...] | None:
    """The tables of TABLES (in TABLES' order) that the statements `sql` read through the run's views, or None when
    that cannot be told (module docstring). `con`: any DuckDB connection (the parse runs no statement of `sql`)."""
    views = _views()
    statements = _parse(con, sql)
    names = _names(statements, views) if statements is not None else None
    if names is None or not names <= views.keys():
        return None
    read = set().union(*(views[name] for name in names))
    return tuple(name for name in TABLES if name in read)


@functools.cache  # the package's own file: the same in every call
def _views() -> dict[str, frozenset[str]]:
    """Each view of schemas/views.sql -> the tables it reads: the placeholders in its body and the tables of the
    earlier views it names. Its own SQL, so a word's match (comments left out) is enough, and can only add tables;
    DuckDB's parse of the bodies would cost 5 ms a query."""
    text = _COMMENT.sub("", views_sql({t: "{" + t + "}" for t in TABLES}))
    parts = _VIEW.split(text)  # text before the first view, then each view's name and body
    views: dict[str, frozenset[str]] = {}
    for name, body in zip(parts[1::2], parts[2::2]):
        named = [views[view] for view in views if re.search(rf"\b{view}\b", body, re.IGNORECASE)]
        views[name.lower()] = frozenset({t for t in TABLES if "{" + t + "}" in body}.union(*named))
    return views


def _parse(con: duckdb.DuckDBPyConnection, sql: str) -> list[Any] | None:
    """DuckDB's syntax trees of the statements `sql`, or None where it does not serialize them."""
    try:
        tree = json.loads(con.execute("SELECT json_serialize_sql(?::VARCHAR)", [sql]).fetchone()[0])
    except (duckdb.Error, ValueError):
        return None
    return None if tree.get("error") else tree["statements"]


def _names(statements: list[Any], views: dict[str, frozenset[str]]) -> set[str] | None:
    """The lower-cased names of the tables and views the `statements` reference that are not their own CTEs (a
    CTE named like one of `views` counts as the view), or None: a name that is not a plain identifier of the
    default catalog, or a table reference of a kind the walk does not know."""
    names: set[str] = set()
    ctes: set[str] = set()
    if not _walk(statements, names, ctes):
        return None
    return {name for name in names if name not in ctes or name in views}


def _walk(node: Any, names: set[str], ctes: set[str]) -> bool:
    """Add the names of the table references under `node` to `names` and its CTEs' to `ctes`; False at a
    reference that does not resolve. A table reference is a node with an alias and a sample, or of a reference's
    type (an expression has a class)."""
    if isinstance(node, list):
        return all(_walk(item, names, ctes) for item in node)
    if not isinstance(node, dict):
        return True
    kind = node.get("type")
    if "class" not in node and (("alias" in node and "sample" in node) or kind in _REFERENCES):
        if kind not in _KNOWN_REFERENCES:
            return False
        if kind == "BASE_TABLE" or (kind == "SHOW_REF" and node.get("table_name")):
            name = node.get("table_name", "")
            if not _IDENTIFIER.fullmatch(name) or node.get("catalog_name", "") not in ("", "memory") \
                    or node.get("schema_name", "") not in ("", "main"):
                return False
            names.add(name.lower())
    for entry in (node.get("cte_map") or {}).get("map", ()):
        ctes.add(str(entry.get("key", "")).lower())
    return all(_walk(value, names, ctes) for value in node.values())
