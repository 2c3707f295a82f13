"""The store in DuckDB's own tools: the SQL that opens it, and DuckDB's local UI on it.

A store is read by any DuckDB client once the right extensions are loaded, the catalog
attached read-only and the shipped views (``group_stats``, ``prompt_history``, ...)
created over it: ``statements`` gets that script from the store backend (store.script
for DuckLake). The UI is DuckDB's ``ui`` extension (package ``duckdb-extension-ui``).
"""

from __future__ import annotations

import os

import duckdb

from gfcr.core import storage

_KEEP: list[object] = []  # the UI's connection lives as long as the process


class StoreSqlError(ValueError):
    """The store cannot be opened, or an extension is missing; the message says which."""


def statements(uri: str | os.PathLike[str]) -> str:
    """A DuckDB SQL script that opens the store at ``uri`` read-only as ``lake``, with the
    shipped views (the store backend writes it: store.script)."""
    lake = storage.backend()
    try:
        return lake.duckdb_script(uri)
    except lake.errors + (FileNotFoundError, ImportError) as e:
        raise StoreSqlError(str(e)) from e


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
    quoted = path.replace("'", "''")  # a SQL string literal
    con.execute(f"LOAD '{quoted}'")
    con.execute(f"SET ui_local_port = {int(port)}")
    con.execute("CALL start_ui_server()")
    _KEEP.append(con)
    return f"http://localhost:{int(port)}"
