"""Refuse SQL that writes, using DuckDB's own statement classification.

``RolloutStore.sql`` and ``gfcr sql`` are read paths. Each statement of the query is
classified by ``duckdb.extract_statements`` (the parser, not a regex); anything but a
SELECT (which includes PRAGMA/DESCRIBE/SHOW/SUMMARIZE/VALUES/FROM-first forms) or an
EXPLAIN of one is refused. EXPLAIN ANALYZE runs its statement, so its inner statement is
classified too. The connection the query then runs on has the catalog attached
read-only, so a table function that writes fails there as well.
"""

from __future__ import annotations

import re

import duckdb

_EXPLAIN = re.compile(r"^\s*explain\s+(analy[sz]e\s+)?", re.IGNORECASE)


class ReadOnlyError(PermissionError):
    """A statement that writes was sent through a read path; the message names its type."""


def check_read_only(query: str) -> list[str]:
    """Return the statements of ``query``; raise ``ReadOnlyError`` if any may write."""
    try:
        statements = duckdb.extract_statements(query)
    except duckdb.Error as exc:
        raise ValueError(f"cannot parse SQL {query!r}: {exc}") from exc
    if not statements:
        raise ValueError(f"no SQL statement in {query!r}")
    for statement in statements:
        kind = _kind(statement)
        if kind != "SELECT":
            raise ReadOnlyError(
                f"the store is read-only through this path: refused {kind} statement "
                f"{statement.query.strip()[:200]!r}; only SELECT (and EXPLAIN of one) may run")
    return [s.query for s in statements]


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
