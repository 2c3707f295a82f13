"""``gfcr ui``: serve the live web view of a store (gfcr.ui) until Ctrl-C, and the
``--ui`` of ``gfcr run``: the same server in a background thread beside the run."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer
from rich.console import Console

if TYPE_CHECKING:  # the server loads when the command runs
    from gfcr.ui.server import UiServer

err = Console(stderr=True)

ROOT_HELP = "Run root: the store, MLflow database, caches (default .gfcr)."
STORE_HELP = "Store folder or URI (default ROOT/store)."
HOST_HELP = ("Address to listen on; 127.0.0.1 (default) serves this machine only. Any other "
             "address asks for the token printed in the URL.")


def ui(
    root: Path = typer.Option(Path(".gfcr"), help=ROOT_HELP),
    store: Optional[str] = typer.Option(None, help=STORE_HELP),
    port: int = typer.Option(8765, min=0, max=65535, help="Port (0: any free one)."),
    host: str = typer.Option("127.0.0.1", help=HOST_HELP),
) -> None:
    """Serve a live web view of the store's runs (read-only; Ctrl-C stops it)."""
    server = start(store or root / "store", host, port)
    server.warm()
    err.print(f"gfcr ui on the store at {server.ctx.uri}: {server.url}  (Ctrl-C stops it)",
              markup=False, highlight=False, soft_wrap=True)
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def start(store: str | Path, host: str, port: int, *, thread: bool = False) -> UiServer:
    """The UI server on ``host:port`` over ``store``; started in a daemon thread if
    ``thread``. A port in use or an address that cannot be bound fails naming it."""
    from gfcr.ui import UiServer, serve

    try:
        return serve(str(store), host, port) if thread else UiServer(str(store), host, port)
    except OSError as e:
        err.print(f"error: cannot listen on {host}:{port}: {e.strerror or e}; choose another "
                  "--port (0: any free one)", markup=False, highlight=False)
        raise typer.Exit(2) from None
