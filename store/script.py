"""The SQL script that opens a store in any DuckDB client (``gfcr sql --script``, the UI).

A DuckLake store is read by any DuckDB client of this version once three things are
right, which :func:`statements` writes out: the ``ducklake`` extension and the catalog's
extension loaded from the files the ``duckdb-extension-*`` packages ship (offline; the
sqlite one must be loaded under the name ``sqlite_scanner``, which ``store._duck`` links it
as), the catalog attached read-only, and the views created over it: the shipped ones
(``group_stats``, ``prompt_history``, ``turns``, ...) and, for a store older than this
gfcr, the ones that present today's tables over it (``store._compat``). gfcr reaches it through the store backend
(gfcr.core.storage.StoreBackend.duckdb_script).
"""

from __future__ import annotations

import os

from ._duck import _attach_options, connect, extension_path, quote_literal
from ._location import resolve
from .views import statements as view_statements


def statements(uri: str | os.PathLike[str]) -> str:
    """A DuckDB SQL script that opens the store at ``uri`` read-only as ``lake``; raises
    StoreError (no store there), FileNotFoundError or ImportError (an extension missing)."""
    catalog, _ = resolve(uri, data_path=None, read_only=True, create=False)
    extensions = [extension_path("ducklake"), extension_path(catalog.kind)]
    con = connect(catalog, read_only=True)
    try:
        views = [" ".join(statement.split()) + ";" for statement in view_statements(con)]
    finally:
        con.close()
    lines = [
        f"-- gfcr store {os.fspath(uri)}: open it with `duckdb -init THIS_FILE` or paste it",
        "SET autoinstall_known_extensions = false;",
        "SET autoload_known_extensions = false;",
        "SET TimeZone = 'UTC';",
        *(f"LOAD {quote_literal(str(path))};" for path in extensions),
        f"ATTACH {quote_literal(catalog.attach_uri)} AS lake ({_attach_options(catalog, True)});",
        "USE lake;",
        "-- the views (store/views.py, store/_compat.py); tables: rollouts, steps, runs, evaluations",
        *views,
    ]
    return "\n".join(lines)
