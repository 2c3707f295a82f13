"""Refuse SQL that may write, by allow-list: only reading statements, table functions
that read, and DuckDB's built-in scalar functions pass.

``RolloutStore.sql`` and ``gfcr sql`` are read paths. Each statement of the query is
classified by ``duckdb.extract_statements`` (the parser, not a regex); anything but a
SELECT (which includes DESCRIBE/SHOW/SUMMARIZE/VALUES/FROM-first forms) or an EXPLAIN of
one is refused. The SELECT's syntax tree (``json_serialize_sql``) is then walked, and
every function it calls must be on a list of what reads:

- a table function must be in ``READ_TABLE_FUNCTIONS`` (generators, DuckDB's catalog
  views, file readers that the sandboxed connection confines to the store's folders),
  unqualified or ``system.main.``. Everything else is refused, whatever its name or
  catalog: DuckDB's ``checkpoint()`` and ``force_checkpoint()`` (which flush DuckLake's
  inlined rows into new Parquet files before the read-only catalog refuses the commit,
  leaving orphans), DuckLake's functions in every spelling (``ducklake_snapshots``,
  ``lake.snapshots()``, and the unqualified ``snapshots()`` or ``options()`` the attached
  catalog resolves), functions that run SQL given as text (``query``), logging and
  profiling switches, other databases' scanners;
- a scalar, aggregate or window function must be one of DuckDB's own built-ins (listed
  once per process from a connection with nothing attached, so no extension or catalog
  adds to it), or an operator; a catalog-qualified call is refused.

A statement the serialiser cannot show (``PRAGMA table_info('x')``, which DuckDB runs as a
SELECT) passes only in the form ``PRAGMA name`` or ``PRAGMA name('literal')`` with
``pragma_name`` on the table-function list. The connection the query then runs on has
the catalog attached read-only and file access confined (``store._duck.connect``,
``sandbox``), so the guard is not the only wall. Messages quote at most a short excerpt.
"""

from __future__ import annotations

import json
import os
import re
import threading
from typing import Any

import duckdb

from ._duck import scalar

_EXPLAIN = re.compile(r"^\s*explain\s+(analy[sz]e\s+)?", re.IGNORECASE)
_PRAGMA = re.compile(r"^\s*pragma\s+(\w+)\s*(\(\s*'[^']*'\s*\))?\s*;?\s*$", re.IGNORECASE)
READ_TABLE_FUNCTIONS = frozenset({
    # generators
    "range", "generate_series", "unnest", "repeat", "repeat_row", "json_each", "json_tree",
    "histogram", "histogram_values", "summary", "pg_timezone_names", "icu_calendar_names",
    # DuckDB's catalog and settings, read
    "duckdb_columns", "duckdb_constraints", "duckdb_databases", "duckdb_dependencies",
    "duckdb_functions", "duckdb_indexes", "duckdb_keywords", "duckdb_schemas",
    "duckdb_sequences", "duckdb_settings", "duckdb_tables", "duckdb_types", "duckdb_views",
    "pragma_collations", "pragma_database_size", "pragma_platform", "pragma_show",
    "pragma_show_tables", "pragma_show_tables_expanded", "pragma_table_info",
    "pragma_version", "pragma_database_list", "pragma_user_agent",
    # files: the sandboxed connection reads only inside the store's folders
    "read_parquet", "parquet_scan", "parquet_metadata", "parquet_schema",
    "parquet_file_metadata", "parquet_kv_metadata", "read_csv", "read_csv_auto", "read_json",
    "read_json_auto", "read_ndjson", "read_ndjson_auto", "read_json_objects",
    "read_json_objects_auto", "read_ndjson_objects", "read_text", "read_blob", "glob",
    "sniff_csv"})
"""The table functions a read path may call: each only reads (DuckDB 1.5)."""
_SYNTAX = frozenset({"unnest", "unlist", "!"})
"""Function names the parser writes for syntax (``UNNEST(x)`` in a select list, ``!x``)
that DuckDB does not list as functions."""
EXCERPT = 120


class ReadOnlyError(PermissionError):
    """A statement that writes was sent through a read path; the message names its type."""


def check_read_only(query: str) -> list[str]:
    """Return the statements of ``query``; raise ``ReadOnlyError`` unless each one only
    reads (see the module docstring)."""
    try:
        statements = duckdb.extract_statements(query)
    except duckdb.Error as exc:
        raise ValueError(f"cannot parse SQL {excerpt(query)}: {short(exc)}") from exc
    if not statements:
        raise ValueError(f"no SQL statement in {excerpt(query)}")
    for statement in statements:
        kind = _kind(statement)
        if kind != "SELECT":
            raise ReadOnlyError(
                f"the store is read-only through this path: refused {kind} statement "
                f"{excerpt(statement.query)}; only SELECT (and EXPLAIN of one) may run")
        refused = sorted(refused_functions(_EXPLAIN.sub("", statement.query, count=1)))
        if refused:
            raise ReadOnlyError(
                f"the store is read-only through this path: refused function(s) "
                f"{', '.join(refused)} in {excerpt(statement.query)}; only functions that "
                "read may run here (DuckDB's built-ins and the table functions listed in "
                "store._guard.READ_TABLE_FUNCTIONS; use `gfcr store compact` for "
                "maintenance)")
    return [s.query for s in statements]


_PARSER: dict[int, tuple[duckdb.DuckDBPyConnection, frozenset[str]]] = {}
"""By process id, one in-memory connection that serialises queries' syntax trees, with
the names of DuckDB's built-in scalar, aggregate and macro functions, made on first use
and kept (a connection per query cost ~25 ms, a report's dozen queries a third of a
second); a forked child makes its own."""
_PARSER_LOCK = threading.Lock()


def refused_functions(select: str) -> set[str]:
    """Names of the functions ``select`` calls that are not on the allow-lists (an
    unrecognised statement form is refused as a whole, named by its first word)."""
    with _PARSER_LOCK:
        if os.getpid() not in _PARSER:
            con = duckdb.connect()
            names = frozenset(r[0].lower() for r in con.execute(
                "SELECT DISTINCT function_name FROM duckdb_functions() WHERE database_name = "
                "'system' AND function_type IN ('scalar', 'aggregate', 'macro')").fetchall())
            _PARSER[os.getpid()] = (con, names)
        con, builtins = _PARSER[os.getpid()]
        tree = json.loads(str(scalar(con, "SELECT json_serialize_sql(?)", [select])))
    if tree.get("error"):
        return _unserialisable(select)
    found: set[str] = set()
    _walk(tree, found, builtins)
    return found


def _unserialisable(select: str) -> set[str]:
    """A SELECT the serialiser cannot show: only ``PRAGMA name['(literal)']`` of a table
    function on the list passes."""
    match = _PRAGMA.match(select)
    if match and f"pragma_{match.group(1).lower()}" in READ_TABLE_FUNCTIONS:
        return set()
    return {f"PRAGMA {match.group(1)}" if match else (select.split() or ["?"])[0]}


def _walk(node: Any, found: set[str], builtins: frozenset[str]) -> None:
    if isinstance(node, dict):
        if node.get("type") == "TABLE_FUNCTION" and isinstance(node.get("function"), dict):
            call = node["function"]
            if not (_unqualified(call) and
                    str(call.get("function_name", "")).lower() in READ_TABLE_FUNCTIONS):
                found.add(_name(call))
            for value in call.get("children", []):  # its arguments: scalar expressions
                _walk(value, found, builtins)
            for key, value in node.items():
                if key != "function":
                    _walk(value, found, builtins)
            return
        name = node.get("function_name")
        if isinstance(name, str) and not node.get("is_operator"):
            if not _unqualified(node) or (name.lower() not in builtins
                                          and name.lower() not in _SYNTAX):
                found.add(_name(node))
        for value in node.values():
            _walk(value, found, builtins)
    elif isinstance(node, list):
        for value in node:
            _walk(value, found, builtins)


def _unqualified(call: dict[str, Any]) -> bool:
    """Unqualified, or named in DuckDB's own ``system.main``."""
    return (call.get("catalog") or "system") == "system" and \
        (call.get("schema") or "main") == "main"


def _name(call: dict[str, Any]) -> str:
    parts = [call.get("catalog"), call.get("schema"), call.get("function_name")]
    return ".".join(str(p) for p in parts if p)


def excerpt(query: str, limit: int = EXCERPT) -> str:
    """``query`` quoted on one line, cut to ``limit`` characters with its length noted."""
    flat = " ".join(query.split())
    if len(flat) <= limit:
        return repr(flat)
    return f"{flat[:limit]!r}... ({len(query)} characters)"


def short(exc: BaseException, limit: int = 300) -> str:
    """An error message on one line of at most ``limit`` characters: DuckDB's messages
    quote the query's line, which can be the whole query."""
    flat = " ".join(str(exc).split())
    return flat if len(flat) <= limit else flat[:limit] + "..."


def _kind(statement: duckdb.Statement) -> str:
    kind = statement.type.name
    if kind != "EXPLAIN":
        return kind
    inner = _EXPLAIN.sub("", statement.query, count=1)
    try:
        parsed = duckdb.extract_statements(inner)
    except duckdb.Error:
        return "EXPLAIN"
    if len(parsed) == 1 and parsed[0].type.name == "SELECT":
        return "SELECT"
    return f"EXPLAIN {parsed[0].type.name}" if parsed else "EXPLAIN"
