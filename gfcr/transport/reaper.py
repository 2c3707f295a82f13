"""The temporary Prefect server dies with the run that started it, however the run ends.

``gfcr run`` without ``PREFECT_API_URL`` starts Prefect's temporary server as a child
process, which Prefect stops at a normal exit (atexit). A ``kill -9`` of ``gfcr run``
skips that, and the server lived on, orphaned (5 of 8 kills in a drill).
:func:`dies_with_this_process` marks the processes started inside it (the server, and a
server Prefect restarts on another port) with a random token in their environment, and
first starts a small watcher (this module, run as a script, in its own session so a
terminal's Ctrl-C does not reach it) whose stdin is a pipe only this process holds open.
When this process ends, for any reason, the kernel closes the pipe; the watcher reads end
of file and stops every process that carries the token (SIGTERM, then SIGKILL after
``GRACE_SECONDS``), so a kill during the server's start-up is covered too. A child the
run forked without exec keeps the pipe open (and the server alive) until it exits too.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

GRACE_SECONDS = 10.0
MARK = "GFCR_DIES_WITH"
"""The environment variable that carries the token."""
_WATCHERS: list[subprocess.Popen[bytes]] = []
"""The watchers started; each one's stdin, open for the life of this process, is the
pipe whose end it waits for."""


@contextmanager
def dies_with_this_process() -> Iterator[None]:
    """Processes started while the block runs are stopped when this process ends."""
    token = secrets.token_hex(16)
    _WATCHERS.append(subprocess.Popen(
        [sys.executable, "-m", "gfcr.transport.reaper", token], stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
    before = os.environ.get(MARK)
    os.environ[MARK] = token
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(MARK, None)
        else:
            os.environ[MARK] = before


def marked(token: str) -> list[int]:
    """Live processes (not zombies) of this user whose environment carries ``token``."""
    needle = f"{MARK}={token}".encode() + b"\0"
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (b"\0" + (entry / "environ").read_bytes()) and _alive(entry):
                found.append(int(entry.name))
        except OSError:  # gone, or another user's
            continue
    return found


def _alive(entry: Path) -> bool:
    state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
    return state not in ("Z", "X")


def _watch(token: str) -> None:
    """Wait for end of file on stdin, then stop the processes marked with ``token``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while sys.stdin.buffer.read(4096):
        pass
    deadline = time.monotonic() + GRACE_SECONDS
    sig = signal.SIGTERM
    while True:
        pids = marked(token)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        if time.monotonic() > deadline:
            sig = signal.SIGKILL
        time.sleep(0.2)


if __name__ == "__main__":
    _watch(sys.argv[1])
