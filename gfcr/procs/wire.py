"""The one wire between gfcr's processes: frames, authentication, deadlines, named failures.

Every process boundary that gfcr owns (not HTTP, not Prefect's) speaks this: the sharded
learner's ranks over loopback sockets (gfcr.transport.sharded), and the run's child
processes over pipes (:mod:`gfcr.procs.childproc`: scorer workers, the store's lease
renewer). It works on file descriptors, so a socket and a pipe are read alike.

- **A frame** is an 8-byte big-endian length and that many bytes. What the bytes mean
  (JSON, a pickle) is the caller's business; a reader may cap a frame's size.
- **Deadlines** are ``time.monotonic()`` values; ``None`` waits as long as it takes (a rank
  waits for its next command however long generation runs). Past one: ``TimeoutError``.
- **Failures are named:** :class:`PeerGone` (the other end closed, or ``alive()`` says its
  process ended), :class:`TooLarge` (a frame over the reader's cap), :class:`Refused` (a
  peer that did not prove the key), ``TimeoutError``.
- **Authentication** is HMAC-SHA256 under a shared key (:func:`sign`, :func:`signed`): a
  score pool's calls, which travel through Prefect, are signed whole
  (gfcr.transport.remote.keys). On a socket between processes that share a key, the
  accepting side sends a nonce, the connecting side answers with ``HMAC(key, "join" +
  nonce + hello + its own nonce)``, its hello and its nonce, and the accepting side
  proves itself back with ``HMAC(key, "host" + that nonce)``. Neither side reads a
  frame, let alone unpickles one, from a peer that has not proved the key; the key
  itself never crosses the wire. An inherited pipe needs none: only the two processes
  hold it.

>>> import os
>>> r, w = os.pipe()
>>> write_frame(w, b"hello")
>>> read_frame(r, cap=16)
b'hello'
>>> os.close(w)
>>> read_frame(r)
Traceback (most recent call last):
...
gfcr.procs.wire.PeerGone: the other end has closed
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import select
import socket
import time
from typing import Callable

HEADER = 8
"""Bytes of a frame's length."""
NONCE = 16
PROOF = hashlib.sha256().digest_size


class PeerGone(EOFError):
    """The other end closed its end, or its process ended."""


class TooLarge(ValueError):
    """A frame larger than the reader accepts."""


class Refused(ConnectionError):
    """A peer that did not prove the shared key."""


def _always() -> bool:
    return True


# ------------------------------------------------------------------ frames


def write_frame(fd: int, body: bytes, deadline: float | None = None) -> None:
    """Write one frame to ``fd`` (blocking, or not: either works) by ``deadline``;
    TimeoutError past it, PeerGone when the reader has gone."""
    data = memoryview(len(body).to_bytes(HEADER, "big") + body)
    while data:
        if not _ready(fd, deadline, write=True):
            raise TimeoutError("the other end did not take the frame in time")
        try:
            data = data[os.write(fd, data):]
        except BlockingIOError:
            continue
        except (BrokenPipeError, ConnectionResetError):
            raise PeerGone("the other end has closed") from None


def read_frame(fd: int, deadline: float | None = None, cap: int | None = None,
               alive: Callable[[], bool] = _always) -> bytes:
    """Read one frame of at most ``cap`` bytes from ``fd`` by ``deadline``: TimeoutError
    past it, PeerGone at the end of the stream or once ``alive()`` says the writer has
    ended, TooLarge for a frame over ``cap``."""
    size = int.from_bytes(read_exact(fd, HEADER, deadline, alive), "big")
    if cap is not None and size > cap:
        raise TooLarge(f"a frame of {size} bytes (the limit is {cap})")
    return read_exact(fd, size, deadline, alive)


def read_exact(fd: int, n: int, deadline: float | None = None,
               alive: Callable[[], bool] = _always) -> bytes:
    """Exactly ``n`` bytes from ``fd`` (see :func:`read_frame` for the failures)."""
    buf = bytearray()
    while len(buf) < n:
        tick = time.monotonic() + 0.5
        if not _ready(fd, tick if deadline is None else min(deadline, tick), write=False):
            if not alive():
                raise PeerGone("the other end's process has ended")
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError("no answer in time")
            continue
        try:
            chunk = os.read(fd, min(n - len(buf), 1 << 20))
        except BlockingIOError:
            continue
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            raise PeerGone("the other end has closed")
        buf += chunk
    return bytes(buf)


def _ready(fd: int, deadline: float | None, *, write: bool) -> bool:
    """Whether ``fd`` can be written (or read, or has hung up) before ``deadline``; poll,
    not select, so a descriptor numbered past select's 1,024 (a process holding many
    files, as an engine's does) works too."""
    left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
    poller = select.poll()
    poller.register(fd, select.POLLOUT if write else select.POLLIN)
    return bool(poller.poll(None if left is None else left * 1000.0))


# ------------------------------------------------------------------ authentication


def challenge(conn: socket.socket) -> bytes:
    """The accepting side's first move: send a fresh nonce; keep it for :func:`admit`."""
    nonce = secrets.token_bytes(NONCE)
    conn.sendall(nonce)
    return nonce


def answer_size(hello: int) -> int:
    """How many bytes the connecting side answers a challenge with (a hello of
    ``hello`` bytes)."""
    return PROOF + hello + NONCE


def admit(conn: socket.socket, key: bytes, nonce: bytes, answer: bytes) -> bytes:
    """Check the connecting side's ``answer`` to ``nonce`` and prove this side back; its
    hello. Refused (the caller closes the connection) when the proof is wrong."""
    proof, rest = answer[:PROOF], answer[PROOF:]
    hello, theirs = rest[:-NONCE], rest[-NONCE:]
    if not hmac.compare_digest(proof, _mac(key, b"join", nonce, hello, theirs)):
        raise Refused("a peer that does not hold the key")
    conn.sendall(_mac(key, b"host", theirs))
    return hello


def join(address: tuple[str, int], key: bytes, hello: bytes,
         timeout: float = 30.0) -> socket.socket:
    """Connect to ``address`` and prove the key (with ``hello``, e.g. a rank); the
    connection, once the other side has proved the key back (Refused when it did not)."""
    conn = socket.create_connection(address, timeout=timeout)
    try:
        nonce = _recv_exact(conn, NONCE)
        ours = secrets.token_bytes(NONCE)
        conn.sendall(_mac(key, b"join", nonce, hello, ours) + hello + ours)
        if not hmac.compare_digest(_recv_exact(conn, PROOF), _mac(key, b"host", ours)):
            raise Refused(f"{address[0]}:{address[1]} does not hold the key")
    except BaseException:
        conn.close()
        raise
    conn.settimeout(None)
    return conn


def sign(key: bytes, message: bytes) -> str:
    """``message``'s HMAC-SHA256 under ``key``, in hex."""
    return _mac(key, message).hex()


def signed(key: bytes, message: bytes, mac: str) -> bool:
    """Whether ``mac`` is :func:`sign` of ``message`` under ``key`` (constant time)."""
    return hmac.compare_digest(sign(key, message), mac)


def _mac(key: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, b"".join(parts), hashlib.sha256).digest()


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            raise PeerGone("the other end closed during the handshake")
        buf += chunk
    return buf
