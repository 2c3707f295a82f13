"""The sharded learner's processes (gfcr.transport.sharded): ``ranks`` copies of gfcr's
rank program (gfcr.transport.sharded_rank) started directly, and their authenticated
connections back.

Nothing of the group listens beyond this host (issue 30, drill T1): torchrun's
rendezvous (its c10d ``TCPStore``) listened on every interface, whatever address it was
given, and took anyone's reads and writes. Instead the ranks meet in a
``torch.distributed.FileStore`` in a folder only this user can read (``GFCR_LEARNER_STORE``),
and gloo's pairs and NCCL's bootstrap bind to the loopback interface
(``GLOO_SOCKET_IFNAME=lo``, ``NCCL_SOCKET_IFNAME=lo``: one host; NCCL over a file store is
not yet run on GPUs here). Each rank connects back to this process on 127.0.0.1 and
answers a challenge with the key in its environment (gfcr.procs.wire: an HMAC, the key
never crosses), and this process proves the key back; a peer that sends nothing cannot
hold the accept loop (drill T3): every connection's answer is read as it arrives, with
its own deadline.

The ranks share one process group (the first rank's), so :meth:`RankProcesses.stop` ends them
all; a rank that dies is named with its exit status (:meth:`RankProcesses.cause`).
"""

from __future__ import annotations

import os
import secrets
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gfcr.procs import wire
from gfcr.transport import sharded_rank
from gfcr.transport.sharded_rank import ADDRESS, KEY, STORE

HELLO_S = 10.0
"""How long a connection may take to answer the challenge with its proof and rank."""
HELLO = struct.Struct("!I")
"""A rank's hello: its rank."""


class StartFailed(RuntimeError):
    """The ranks exited or did not all connect in time; the message says which."""


class RankProcesses:
    """The ranks' processes, by rank, in one process group."""

    def __init__(self, procs: list[subprocess.Popen], log: Path, store: Path) -> None:
        self.procs, self.log, self.store = procs, log, store

    def exited(self) -> bool:
        return any(p.poll() is not None for p in self.procs)

    def wait(self, timeout: float) -> None:
        """Wait until every rank exited, at most ``timeout`` seconds in all."""
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return

    def cause(self) -> str:
        """The rank that failed, as "rank R was killed by signal S" (a killed rank
        first: the others may have failed because of it) or "rank R exited with code C"
        ("" when none failed)."""
        codes = [(rank, p.poll()) for rank, p in enumerate(self.procs)]
        failed = sorted(((code > 0, rank, code) for rank, code in codes if code),
                        key=lambda x: (x[0], x[1]))
        if not failed:
            return ""
        _, rank, code = failed[0]
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        return f"rank {rank} {how}"

    def stop(self) -> None:
        """TERM the group, then KILL what is left; the store folder goes."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if all(p.poll() is not None for p in self.procs):
                break
            try:
                os.killpg(self.procs[0].pid, sig)
            except ProcessLookupError:
                pass
            self.wait(15)
        for proc in self.procs:  # a rank that left the group: by its own pid
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        shutil.rmtree(self.store, ignore_errors=True)


def start(ranks: int, log: Path, timeout_s: float) -> tuple[RankProcesses, list[socket.socket]]:
    """``ranks`` rank processes and each one's authenticated connection, by rank."""
    server = socket.create_server(("127.0.0.1", 0))
    key = secrets.token_bytes(16)
    store = Path(tempfile.mkdtemp(prefix="gfcr-learner-"))  # mode 0700
    root = str(Path(__file__).resolve().parent.parent.parent)  # gfcr and stages beside it
    env = {**os.environ, ADDRESS: f"127.0.0.1:{server.getsockname()[1]}", KEY: key.hex(),
           STORE: str(store / "store"), "GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo",
           "WORLD_SIZE": str(ranks), "LOCAL_WORLD_SIZE": str(ranks),
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
           "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH"))
                                         if p)}
    procs: list[subprocess.Popen] = []
    with open(log, "ab") as out:
        for rank in range(ranks):
            group = 0 if rank == 0 else procs[0].pid  # rank 0's group (not the terminal's)
            procs.append(subprocess.Popen(
                [sys.executable, "-m", sharded_rank.__name__], stdout=out, stderr=subprocess.STDOUT,
                env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                process_group=group))
    started = RankProcesses(procs, log, store)
    try:
        return started, accept(server, started, key, timeout_s)
    except BaseException:
        started.stop()
        raise
    finally:
        server.close()


def accept(server: socket.socket, ranks: RankProcesses, key: bytes,
           timeout_s: float) -> list[socket.socket]:
    """Each rank's connection, by rank: every connection is challenged as it arrives and
    its answer read as it comes (select), each within HELLO_S; a wrong proof, a bad rank
    or silence closes it (gfcr.procs.wire)."""
    size, want = wire.answer_size(HELLO.size), len(ranks.procs)
    conns: dict[int, socket.socket] = {}
    pending: dict[socket.socket, tuple[float, bytes, bytes]] = {}
    deadline = time.monotonic() + timeout_s
    while len(conns) < want:
        now = time.monotonic()
        if ranks.exited() or now > deadline:
            for conn in pending:
                conn.close()
            why = ranks.cause() or ("a rank exited" if ranks.exited()
                                    else f"not all connected in {timeout_s:g} s")
            raise StartFailed(f"{why} (ranks connected: {sorted(conns)})")
        for conn, (since, _, _) in list(pending.items()):
            if now - since > HELLO_S:
                del pending[conn]
                conn.close()
        ready, _, _ = select.select([server, *pending], [], [], 0.5)
        for sock in ready:
            if sock is server:
                conn, _ = server.accept()
                try:
                    nonce = wire.challenge(conn)
                except OSError:
                    conn.close()
                    continue
                conn.setblocking(False)
                pending[conn] = (time.monotonic(), nonce, b"")
                continue
            since, nonce, got = pending.pop(sock)
            try:
                chunk = sock.recv(size - len(got))
            except OSError:
                chunk = b""
            if not chunk:
                sock.close()
            elif len(got + chunk) < size:
                pending[sock] = (since, nonce, got + chunk)
            else:
                _admit(sock, nonce, got + chunk, key, want, conns)
    return [conns[r] for r in range(want)]


def _admit(conn: socket.socket, nonce: bytes, answer: bytes, key: bytes, ranks: int,
           conns: dict[int, socket.socket]) -> None:
    conn.setblocking(True)
    try:
        (rank,) = HELLO.unpack(wire.admit(conn, key, nonce, answer))
    except (wire.Refused, OSError):
        conn.close()  # not one of ours
        return
    if not 0 <= rank < ranks or rank in conns:
        conn.close()
        return
    conns[rank] = conn
