"""The store in DuckDB's own tools: the SQL that opens it, and DuckDB's local UI on it.

A DuckLake store is read by any DuckDB 1.5.5 client once three things are right, which
``statements`` writes out: the ``ducklake`` extension and the catalog's extension loaded
from the files the ``duckdb-extension-*`` packages ship (offline; the sqlite one must be
loaded under the name ``sqlite_scanner``, which ``store._duck`` links it as), the catalog
attached read-only, and the shipped views (``group_stats``, ``prompt_history``, ...)
created over it. The UI is DuckDB's ``ui`` extension (package ``duckdb-extension-ui``).
"""

from __future__ import annotations

import os
from typing import Any

import duckdb

from store._duck import _attach_options, extension_path, quote_literal
from store._location import StoreError, resolve
from store.views import VIEWS, view_query

_KEEP: list[Any] = []  # the UI's connection lives as long as the process


class StoreSqlError(ValueError):
    """The store cannot be opened, or an extension is missing; the message says which."""


def statements(uri: str | os.PathLike[str]) -> str:
    """A DuckDB SQL script that opens the store at ``uri`` read-only as ``lake``."""
    try:
        catalog, _ = resolve(uri, data_path=None, read_only=True, create=False)
        extensions = [extension_path("ducklake"), extension_path(catalog.kind)]
    except (StoreError, FileNotFoundError, ImportError) as e:
        raise StoreSqlError(str(e)) from e
    views = [f"CREATE OR REPLACE TEMP VIEW {name} AS "
             + " ".join(view_query(name, rollouts="lake.rollouts AS rollouts",
                                   steps="lake.steps AS steps").split()) + ";"
             for name in VIEWS]
    lines = [
        f"-- gfcr store {os.fspath(uri)}: open it with `duckdb -init THIS_FILE` or paste it",
        "SET autoinstall_known_extensions = false;",
        "SET autoload_known_extensions = false;",
        "SET TimeZone = 'UTC';",
        *(f"LOAD {quote_literal(str(path))};" for path in extensions),
        f"ATTACH {quote_literal(catalog.attach_uri)} AS lake ({_attach_options(catalog, True)});",
        "USE lake;",
        "-- the shipped views (store/views.py); tables: rollouts, steps, runs",
        *views,
    ]
    return "\n".join(lines)


def ui_server(script: str, port: int) -> str:
    """Run ``script`` on an in-process DuckDB connection and start DuckDB's UI server on it
    (``duckdb-extension-ui``); returns its URL. The server lives as long as this process.
    Its page's assets come from ui.duckdb.org unless DuckDB is told otherwise, so the UI
    needs that site reachable, or the assets served locally (``ui_remote_url``)."""
    try:
        import duckdb_extension_ui
    except ImportError as e:
        raise StoreSqlError("DuckDB's UI needs the duckdb-extension-ui package "
                            f"(pip install duckdb-extension-ui=={duckdb.__version__})") from e
    folder = os.path.dirname(duckdb_extension_ui.__file__)
    path = os.path.join(folder, "extensions", f"v{duckdb.__version__}", "ui.duckdb_extension")
    if not os.path.isfile(path):
        raise StoreSqlError(f"extension file {path!r} is missing; duckdb-extension-ui must match "
                            f"duckdb=={duckdb.__version__}")
    con = duckdb.connect(config={"autoinstall_known_extensions": False,
                                 "autoload_known_extensions": False})
    con.execute(script)
    # the extension keeps its state under DuckDB's home folder and fails if it is missing
    os.makedirs(os.path.join(os.path.expanduser("~"), ".duckdb", "extension_data"), exist_ok=True)
    con.execute(f"LOAD {quote_literal(path)}")
    con.execute(f"SET ui_local_port = {int(port)}")
    con.execute("CALL start_ui_server()")
    _KEEP.append(con)
    return f"http://localhost:{int(port)}"
