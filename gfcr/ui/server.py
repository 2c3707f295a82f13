"""The HTTP server of ``gfcr ui``: routes, the access token, the live feed, static files.

A ``ThreadingHTTPServer`` (standard library) answers GET only: every page reads the store
read-only (:mod:`gfcr.ui.context`), so nothing a request asks can write. Bound to
127.0.0.1 it needs nothing more; bound to any other address it asks for a token, given in
the printed URL and kept in a cookie. A page that cannot be answered (an unknown run, a
malformed filter, a store that cannot be read) is a page saying so, never a traceback.

The live feed (``/events?run=RUN_ID``, server-sent events) reads the run's marker (its
status and last committed step: two small tables) every :data:`POLL_S` seconds and sends
an event when it changes; the page then fetches what moved. Readers attach the catalog
read-only and see only committed snapshots, so the feed never blocks the writer.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.resources import files
from typing import Callable
from urllib.parse import parse_qsl, unquote, urlsplit

from gfcr.ui import pages_evals, pages_rollout, pages_rollouts, pages_runs
from gfcr.ui.context import PageContext, UiError
from gfcr.ui.html import error_page, json_text, plain

POLL_S = 0.4
"""How often the live feed reads a run's marker (seconds)."""
HEARTBEAT_S = 10.0
"""A comment line at least this often keeps an idle feed open."""
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
_STATIC = {"ui.js": "text/javascript", "ui.css": "text/css"}

_ICON = ('<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16"><rect width="16" height="16" '
         'rx="3" fill="#1d2330"/><path d="M3 12 L7 7 L10 9 L13 4" stroke="#9cc3ff" fill="none"/></svg>')

Handler = Callable[[PageContext, list[str], dict[str, str]], tuple[str, str]]


def _html(render: Callable[..., str]) -> Handler:
    return lambda ctx, parts, params: ("text/html; charset=utf-8", render(ctx, *parts, params))


ROUTES: list[tuple[tuple[str, ...], Handler]] = [
    ((), _html(lambda ctx, params: pages_runs.runs_page(ctx, params))),
    (("compare",), _html(lambda ctx, params: pages_runs.compare_page(ctx, params))),
    (("runs", "*"), _html(lambda ctx, run, params: pages_runs.run_page(ctx, run))),
    (("runs", "*", "rollouts"), _html(pages_rollouts.rollouts_page)),
    (("runs", "*", "rollouts", "*"), _html(lambda ctx, run, rid, p: pages_rollout.rollout_page(ctx, run, rid))),
    (("runs", "*", "groups", "*"), _html(lambda ctx, run, gid, p: pages_rollouts.group_page(ctx, run, gid))),
    (("runs", "*", "evaluations"), _html(pages_evals.evaluations_page)),
    (("prompts", "*"), _html(pages_rollouts.prompt_page)),
    (("fragment", "runs"), _html(lambda ctx, params: pages_runs.runs_table(ctx))),
    (("fragment", "runs", "*", "head"), _html(lambda ctx, run, p: pages_runs.run_head(ctx, run))),
    (("fragment", "runs", "*", "steps"), _html(lambda ctx, run, p: pages_runs.steps_table(ctx, run))),
    (("fragment", "runs", "*", "drops"), _html(lambda ctx, run, p: pages_runs.drops_fragment(ctx, run))),
    (("fragment", "runs", "*", "doctor"), _html(lambda ctx, run, p: pages_runs.doctor_fragment(ctx, run))),
    (("favicon.ico",), lambda ctx, parts, params: ("image/svg+xml", _ICON)),
    (("api", "series"), lambda ctx, parts, params: ("application/json", json_text(pages_runs.series(ctx, params)))),
]


def route(path: str) -> tuple[Handler, list[str]] | None:
    """The handler of ``path`` and the path's variable segments (unquoted), or None."""
    parts = [unquote(p) for p in path.strip("/").split("/") if p]
    for pattern, handler in ROUTES:
        if len(pattern) == len(parts) and all(p in ("*", q) for p, q in zip(pattern, parts)):
            return handler, [q for p, q in zip(pattern, parts) if p == "*"]
    return None


class UiServer(ThreadingHTTPServer):
    """``gfcr ui``'s server over the store at ``store``; ``token`` (None: none asked)."""

    daemon_threads = True

    def __init__(self, store: str, host: str = "127.0.0.1", port: int = 8765,
                 token: str | None = None):
        self.ctx = PageContext(store)
        self.feed = PageContext(store)  # the live feed's own connection: pages never wait on it
        self.token = token if token is not None else (None if host in LOOPBACK else secrets.token_urlsafe(16))
        self.stopping = threading.Event()
        self.failures: list[str] = []
        """What each page that failed unexpectedly (status 500) said, oldest first."""
        super().__init__((host, port), _Request)

    @property
    def url(self) -> str:
        host, port = str(self.server_address[0]), self.server_address[1]
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}/" + (f"?token={self.token}" if self.token else "")

    def handle_error(self, request: object, client_address: object) -> None:
        """A browser that closed its connection early (a page left, a feed dropped) is
        normal here; nothing is printed."""

    def warm(self) -> None:
        """Open the store for the pages and the feed now, not on the first request (an
        error is shown by the first page that needs the store)."""
        for ctx in (self.ctx, self.feed):
            try:
                ctx.store()
            except UiError:
                return

    def server_close(self) -> None:
        self.stopping.set()
        super().server_close()
        self.ctx.close()
        self.feed.close()


class _Request(BaseHTTPRequestHandler):
    server: UiServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # quiet: a page per click
        pass

    def do_GET(self) -> None:  # noqa: N802 - the standard library's name
        url = urlsplit(self.path)
        params = dict(parse_qsl(url.query, keep_blank_values=True))
        if not self._allowed(params):
            return self._send(403, "text/html; charset=utf-8", error_page(
                403, "this server asks for its token: open the URL `gfcr ui` printed (with ?token=...)"))
        if url.path.startswith("/static/"):
            return self._static(url.path.removeprefix("/static/"))
        if url.path == "/events":
            return self._events(params.get("run", ""))
        found = route(url.path)
        if found is None:
            return self._send(404, "text/html; charset=utf-8", error_page(404, f"no page at {url.path!r}"))
        handler, parts = found
        try:
            with self.server.ctx.serial:
                kind, body = handler(self.server.ctx, parts, params)
        except UiError as e:
            return self._fail(e.status, e.message, url.path)
        except Exception as e:  # noqa: BLE001 - a page says what failed, never a traceback
            self.server.failures.append(f"{url.path}: {type(e).__name__}: {e}")
            return self._fail(500, f"{type(e).__name__}: {e}", url.path)
        self._send(200, kind, body, cookie=params.get("token"))

    def _fail(self, status: int, message: str, path: str) -> None:
        if path.startswith("/api/"):
            return self._send(status, "application/json", json.dumps({"error": message}))
        self._send(status, "text/html; charset=utf-8", error_page(status, message))

    def _allowed(self, params: dict[str, str]) -> bool:
        token = self.server.token
        if token is None:
            return True
        cookies = dict(c.strip().split("=", 1) for c in (self.headers.get("Cookie") or "").split(";") if "=" in c)
        given = params.get("token") or cookies.get("gfcr_ui_token", "")
        return secrets.compare_digest(given.encode(), token.encode())

    def _send(self, status: int, kind: str, body: str, cookie: str | None = None) -> None:
        data = body.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        if cookie and self.server.token:
            self.send_header("Set-Cookie", f"gfcr_ui_token={cookie}; Path=/; HttpOnly; SameSite=Strict")
        self.end_headers()
        self.wfile.write(data)

    def _static(self, name: str) -> None:
        if name not in _STATIC:
            return self._send(404, "text/plain", f"no static file {name!r}")
        self._send(200, _STATIC[name], files("gfcr.ui").joinpath("static", name).read_text("utf-8"))

    def _events(self, run_id: str) -> None:
        """Server-sent events: ``marker`` (the run's, or every run's digest) when it changes."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        last: object = None
        beat = time.monotonic()
        try:
            while not self.server.stopping.is_set():
                now = _marker(self.server.feed, run_id)
                if now != last:
                    self.wfile.write(f"event: marker\ndata: {json_text(now)}\n\n".encode())
                    self.wfile.flush()
                    last, beat = now, time.monotonic()
                elif time.monotonic() - beat > HEARTBEAT_S:
                    self.wfile.write(b": beat\n\n")
                    self.wfile.flush()
                    beat = time.monotonic()
                time.sleep(POLL_S)
        except (BrokenPipeError, ConnectionResetError, OSError):
            pass
        self.close_connection = True


def _marker(ctx: PageContext, run_id: str) -> object:
    """A run's marker, or (no run named) every run's (id, status, steps); an error's text."""
    try:
        if run_id:
            return plain(ctx.browse().marker(run_id) or {"missing": run_id})
        table = ctx.browse().runs_overview()
        return [[r["run_id"], r["status"], r["steps"]] for r in table.select(["run_id", "status", "steps"]).to_pylist()]
    except UiError as e:
        return {"error": e.message}
    except Exception as e:  # noqa: BLE001 - the feed reports, the page shows it
        return {"error": f"{type(e).__name__}: {e}"}


def serve(store: str, host: str = "127.0.0.1", port: int = 8765, token: str | None = None) -> UiServer:
    """Start the server in a daemon thread and return it (``server.url``;
    ``server.shutdown()`` then ``server.server_close()`` stop it)."""
    server = UiServer(store, host, port, token)
    threading.Thread(target=server.serve_forever, name="gfcr-ui", daemon=True).start()
    threading.Thread(target=server.warm, name="gfcr-ui-warm", daemon=True).start()
    return server
