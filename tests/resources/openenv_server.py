"""A small environment server in OpenEnv's HTTP shapes, run as its own process by the
RemoteEnv tests: ``python -m tests.resources.openenv_server PORT_FILE MODE``.

The game: guess the episode's number (``seed % 8``) from "higher"/"lower"; the right
guess ends the episode with reward 1. ``POST /reset`` and ``POST /step`` take and answer
OpenEnv's bodies (``{"observation": {"prompt": ...}, "reward": ..., "done": ...}``),
one environment per ``episode_id``. ``MODE`` makes it misbehave on the second step of
every episode: ``die`` (the process exits), ``hang`` (no answer for an hour), ``big``
(an answer of 4 MiB), ``redirect`` (a 307 to another address), ``ok`` (none). It writes
its port to PORT_FILE once it listens.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

STATE: dict[str, dict[str, int]] = {}
LOCK = threading.Lock()


def answer(prompt: str, reward: float | None, done: bool) -> dict[str, Any]:
    return {"observation": {"prompt": prompt}, "reward": reward, "done": done,
            "metadata": {}}


class Handler(BaseHTTPRequestHandler):
    mode = "ok"

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        episode = str(body.get("episode_id"))
        if self.path.endswith("/reset"):
            with LOCK:
                STATE[episode] = {"secret": int(body.get("seed") or 0) % 8, "steps": 0}
            return self._send(answer("Guess my number from 0 to 7, like 3.", None, False))
        with LOCK:
            state = STATE[episode]
            state["steps"] += 1
        if state["steps"] == 2 and self._misbehave():
            return
        reply = str(body["action"]["message"])
        guess = next((int(c) for c in reply if c.isdigit()), -1)
        if guess == state["secret"]:
            return self._send(answer("", 1.0, True))
        hint = "higher" if guess < state["secret"] else "lower"
        return self._send(answer(hint, 0.0, False))

    def _misbehave(self) -> bool:
        """Misbehave as the mode says; whether the request was answered."""
        if self.mode == "die":
            os._exit(3)
        if self.mode == "hang":
            time.sleep(3600)
        if self.mode == "big":
            self._send({"observation": {"prompt": "x" * (4 << 20)}, "done": False})
        if self.mode == "redirect":
            self.send_response(307)
            self.send_header("Location", "http://127.0.0.2:9/step")
            self.send_header("Content-Length", "0")
            self.end_headers()
        return self.mode in ("big", "redirect")

    def _send(self, data: dict[str, Any]) -> None:
        raw = json.dumps(data).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


def main() -> None:
    port_file, Handler.mode = Path(sys.argv[1]), sys.argv[2]
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    port_file.write_text(str(server.server_address[1]))
    server.serve_forever()


if __name__ == "__main__":
    main()
