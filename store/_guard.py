"""Refuse SQL that writes, using DuckDB's own statement classification and syntax tree.

``RolloutStore.sql`` and ``gfcr sql`` are read paths. Each statement of the query is
classified by ``duckdb.extract_statements`` (the parser, not a regex); anything but a
SELECT (which includes PRAGMA/DESCRIBE/SHOW/SUMMARIZE/VALUES/FROM-first forms) or an
EXPLAIN of one is refused. EXPLAIN ANALYZE runs its statement, so its inner statement is
classified too. The connection the query then runs on has the catalog attached
read-only, so a statement that writes to the catalog fails there as well.

That is not enough for DuckLake's own functions: ``SELECT * FROM
ducklake_merge_adjacent_files('lake')`` is a SELECT, and on a read-only attach it still
writes whole Parquet copies into the data folder before the commit fails
(``ducklake_cleanup_old_files`` deletes files). So every function call in the query's
syntax tree (``json_serialize_sql``) is checked, and any ``ducklake_*`` function, its
catalog-qualified form (``lake.merge_adjacent_files()``) and the functions that run SQL
given as text (``query``, ``query_table``, ``json_execute_serialized_sql``) are refused
by name. File access is closed by the connection itself (``store._duck.connect``,
``sandbox``). Messages quote at most a short excerpt of the query.
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
DUCKLAKE_FUNCTIONS = frozenset({
    "add_data_files", "cleanup_old_files", "commit", "current_snapshot",
    "delete_orphaned_files", "expire_snapshots", "flush_inlined_data",
    "last_committed_snapshot", "list_files", "merge_adjacent_files", "options",
    "rewrite_data_files", "scan", "set_commit_message", "set_option", "settings", "snapshots",
    "table_changes", "table_deletions", "table_info", "table_insertions"})
"""DuckLake's functions (``ducklake_<name>``, or ``<catalog>.<name>()``), as of DuckLake
1.0; any other ``ducklake_*`` name is refused too."""
DYNAMIC_SQL = frozenset({"query", "query_table", "json_execute_serialized_sql"})
_CALL = re.compile(r'"?\b(ducklake_\w+|query|query_table|json_execute_serialized_sql)"?\s*\(',
                   re.IGNORECASE)
EXCERPT = 120


class ReadOnlyError(PermissionError):
    """A statement that writes was sent through a read path; the message names its type."""


def check_read_only(query: str) -> list[str]:
    """Return the statements of ``query``; raise ``ReadOnlyError`` if any may write."""
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
                f"{', '.join(refused)} in {excerpt(statement.query)}; DuckLake's maintenance "
                "and metadata functions and functions that run SQL text cannot run here "
                "(use `gfcr store compact` for maintenance)")
    return [s.query for s in statements]


_PARSER: dict[int, duckdb.DuckDBPyConnection] = {}
"""By process id, one in-memory connection that serialises queries' syntax trees, made on
first use and kept (a connection per query cost ~25 ms, a report's dozen queries a third
of a second); a forked child makes its own."""
_PARSER_LOCK = threading.Lock()


def refused_functions(select: str) -> set[str]:
    """Names of the refused functions that ``select`` calls (see the module docstring)."""
    with _PARSER_LOCK:
        con = _PARSER.get(os.getpid())
        if con is None:
            con = _PARSER[os.getpid()] = duckdb.connect()
        tree = json.loads(str(scalar(con, "SELECT json_serialize_sql(?)", [select])))
    if tree.get("error"):  # a form the serialiser lacks: scan the text instead
        return {m.group(1).lower() for m in _CALL.finditer(select)}
    found: set[str] = set()
    _walk(tree, found)
    return found


def _walk(node: Any, found: set[str]) -> None:
    if isinstance(node, dict):
        name = node.get("function_name")
        if isinstance(name, str):
            low = name.lower()
            qualified = bool(node.get("schema") or node.get("catalog"))
            if (low.startswith("ducklake_") or low in DYNAMIC_SQL
                    or (qualified and low in DUCKLAKE_FUNCTIONS)):
                found.add(name)
        for value in node.values():
            _walk(value, found)
    elif isinstance(node, list):
        for value in node:
            _walk(value, found)


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
