"""A straggler for the fleet tests: a reverse proxy in front of one real vLLM server that
forwards every route to it (health, weight info, reloads, aborts, generation) until it
is stalled; then it holds each ``/inference/v1/generate`` request unanswered until it is
released (and answers it 503 then: its client gave up long before), while every other
route still answers - a server that stays healthy but stops making progress. It records
the generate requests it held and the aborts it forwarded. A pipeline stage stalls and
releases it with ``POST /straggler/stall`` and ``POST /straggler/release``."""

from __future__ import annotations

import http.client
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

GENERATE, ABORT = "/inference/v1/generate", "/inference/v1/abort_requests"


class Straggler:
    """The proxy, serving on a thread of its own at :attr:`url` until :meth:`close`."""

    def __init__(self, target: str) -> None:
        self.target = urlsplit(target)
        self.held: list[str] = []  # request ids of the generate requests held
        self.aborted: list[str] = []  # request ids of the aborts forwarded
        self.moving = threading.Event()
        self.moving.set()
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}"
        threading.Thread(target=self._http.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.moving.set()  # the held requests end
        self._http.shutdown()
        self._http.server_close()


def _handler(proxy: Straggler) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._serve(b"")

        def do_POST(self) -> None:
            self._serve(self.rfile.read(int(self.headers.get("Content-Length") or 0)))

        def _serve(self, body: bytes) -> None:
            if self.path in ("/straggler/stall", "/straggler/release"):
                (proxy.moving.clear if self.path.endswith("stall") else proxy.moving.set)()
                return self._answer(200, b"{}", "application/json")
            if self.path == ABORT:
                proxy.aborted.extend(json.loads(body)["request_ids"])
            if self.path == GENERATE and not proxy.moving.is_set():
                proxy.held.append(json.loads(body)["request_id"])
                proxy.moving.wait()
                return self._answer(503, b"released straggler", "text/plain")
            upstream = http.client.HTTPConnection(proxy.target.hostname or "127.0.0.1",
                                                  proxy.target.port, timeout=600)
            passed = {name: self.headers[name] for name in ("Content-Type", "Authorization")
                      if self.headers.get(name)}  # the fleet's key goes on to the server
            upstream.request(self.command, self.path, body or None, passed)
            reply = upstream.getresponse()
            self._answer(reply.status, reply.read(), reply.getheader("Content-Type", ""))
            upstream.close()

        def _answer(self, status: int, data: bytes, kind: str) -> None:
            try:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except OSError:  # the client gave up (a held request past its deadline)
                pass

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler
