"""The agent endpoint's HTTP server: bounded connections, read timeouts, JSON errors.

``http.server``'s ``ThreadingHTTPServer`` gives every connection a thread for as long as
it stays open, with no limit and no read timeout: 200 connections that sent headers and
no body held 200 threads (drill A6), and a bad ``Content-Length`` or a 100,000-deep JSON
array answered 500 with Python's exception text (A5). Here:

- at most ``max_connections`` connections are served at once, a thread each; one more
  waits (in the kernel's accept queue, no thread) until a served one ends;
- a connection that sends nothing for ``read_timeout`` seconds (between requests, or in
  the middle of a body) is closed: its thread ends;
- a body is read only when its ``Content-Length`` is a non-negative integer no larger
  than ``max_body`` (else 400, or 413 past :data:`MAX_BODY`), and kept only when it
  nests at most :data:`MAX_DEPTH` deep (else 400): memory per request is bounded by
  ``max_body``;
- every answer is a JSON API error object (OpenAI's shape) or the route's JSON; an
  unexpected error is a 500 whose message names no exception (it is logged).
"""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from stages.endpoint._limits import depth

MAX_DEPTH = 64
"""Deepest nesting of lists and objects a request body may have."""
MAX_BODY = 16 * 1024 * 1024
"""The most bytes any request body may hold (a context's bound is usually lower)."""
_LOG = logging.getLogger(__name__)


class ApiError(Exception):
    """An error answered to the client as ``{"error": {...}}`` with an HTTP status."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error",
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.code = status, message, kind, code

    def payload(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": None,
                          "code": self.code}}


Route = Callable[[str, str, Any], dict[str, Any]]
"""``route(method, path, body)``: the answer's JSON, or ApiError."""


class BoundedServer(ThreadingHTTPServer):
    """A thread per connection, at most ``max_connections`` at once (module docstring)."""

    daemon_threads = True
    request_queue_size = 128  # connections past the bound wait in the kernel's queue

    def __init__(self, route: Route, *, max_connections: int, read_timeout: float,
                 max_body: int) -> None:
        self._slots = threading.BoundedSemaphore(max_connections)
        self._closing = threading.Event()
        super().__init__(("127.0.0.1", 0), _handler(route, read_timeout, max_body))

    def process_request(self, request: Any, client_address: Any) -> None:
        """Serve ``request`` once a slot is free (a served connection ends, at the latest
        after ``read_timeout`` of silence); connections past the bound wait unaccepted."""
        while not self._slots.acquire(timeout=0.25):
            if self._closing.is_set():
                self.shutdown_request(request)
                return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection's error (a client gone mid-answer) is logged, not printed."""
        _LOG.debug("gfcr agent endpoint: connection from %s failed", client_address,
                   exc_info=True)

    def shutdown(self) -> None:
        self._closing.set()
        super().shutdown()


def _handler(route: Route, read_timeout: float, max_body: int
             ) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: every answer has a Content-Length
        timeout = read_timeout  # the socket's: an idle or stalled connection is closed

        def do_GET(self) -> None:  # noqa: N802 - the http.server hook's name
            self._serve()

        def do_POST(self) -> None:  # noqa: N802
            self._serve()

        def _serve(self) -> None:
            try:
                status, payload = 200, route(self.command, self.path, self._body())
            except ApiError as err:
                status, payload = err.status, err.payload()
            except (TimeoutError, ConnectionError):
                self.close_connection = True  # the client stalled or left: no answer
                return
            except Exception:  # noqa: BLE001 - answered to the client, not raised
                _LOG.exception("gfcr agent endpoint: %s %s failed", self.command,
                               self.path[:200])
                status = 500
                payload = ApiError(500, "internal error in gfcr's agent endpoint (logged "
                                        "by the run)", "server_error").payload()
            data = json.dumps(payload).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except OSError:  # the client left before its answer: nothing to tell it
                self.close_connection = True

        def _body(self) -> Any:
            return None if self.command != "POST" else _read_body(self, max_body)

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: an agent's calls are recorded in the rollouts, not in the log."""

    return Handler


def _read_body(handler: BaseHTTPRequestHandler, max_body: int) -> Any:
    """A POST's JSON body, read only when its size is declared and within ``max_body``."""
    raw = handler.headers.get("Content-Length") or "0"
    if not (raw.strip().isascii() and raw.strip().isdigit()):
        handler.close_connection = True  # where the body ends is unknown
        raise ApiError(400, f"Content-Length {raw[:40]!r} is not a non-negative "
                            "integer")
    size = int(raw)
    if size > max_body:  # past the context's bound (a 400, as OpenAI's), or 16 MiB (413)
        handler.close_connection = True  # its body stays unread
        raise ApiError(413 if size > MAX_BODY else 400,
                       f"request body of {size} bytes is over this endpoint's {max_body}: "
                       "longer than the policy's context can hold (AgentEnv.max_context)",
                       code="context_length_exceeded")
    data = handler.rfile.read(size)
    if len(data) < size:
        handler.close_connection = True
        raise ApiError(400, f"the request body ended after {len(data)} of its "
                            f"{size} bytes")
    try:
        body = json.loads(data or b"null")
    except RecursionError:  # the parser's own limit (~1,000 levels)
        raise ApiError(400, f"the request body nests deeper than {MAX_DEPTH} "
                            "levels") from None
    except ValueError as err:
        raise ApiError(400, f"the request body is not JSON: {str(err)[:200]}") from None
    if not depth(body, MAX_DEPTH):
        raise ApiError(400, f"the request body nests deeper than {MAX_DEPTH} levels")
    return body
