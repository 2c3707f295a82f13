"""gfcr.procs.wire, the one wire between gfcr's processes: frames under a cap and a
deadline, failures named, and both sides of a socket proving the key before a frame."""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time

import pytest

from gfcr.procs import wire


def test_frames_round_trip_and_their_failures_are_named():
    r, w = os.pipe()
    wire.write_frame(w, b"x" * 30_000)
    assert wire.read_frame(r) == b"x" * 30_000
    wire.write_frame(w, b"y" * 65)
    with pytest.raises(wire.TooLarge, match="65 bytes"):
        wire.read_frame(r, cap=64)
    with pytest.raises(TimeoutError):
        wire.read_frame(r, deadline=time.monotonic() + 0.2)  # nothing more was sent
    with pytest.raises(wire.PeerGone, match="process has ended"):
        wire.read_frame(r, alive=lambda: False)
    os.close(w)
    with pytest.raises(wire.PeerGone, match="closed"):
        wire.read_frame(r)
    os.close(r)


def _host(server: socket.socket, key: bytes, got: dict[str, object]) -> None:
    conn, _ = server.accept()
    nonce = wire.challenge(conn)
    try:
        got["hello"] = wire.admit(conn, key, nonce, wire.read_exact(
            conn.fileno(), wire.answer_size(4)))
        wire.write_frame(conn.fileno(), b"welcome")
    except wire.Refused as err:
        got["refused"] = err
    conn.close()


@pytest.mark.parametrize("same_key", [True, False])
def test_a_peer_joins_only_with_the_key(same_key: bool):
    server = socket.create_server(("127.0.0.1", 0))
    key, got = secrets.token_bytes(16), {}
    host = threading.Thread(target=_host, args=(server, key, got))
    host.start()
    if same_key:
        conn = wire.join(server.getsockname(), key, b"r\0\0\1")
        assert wire.read_frame(conn.fileno()) == b"welcome"
        conn.close()
        host.join()
        assert got == {"hello": b"r\0\0\1"}
    else:
        with pytest.raises(wire.PeerGone):  # refused: closed before any frame
            wire.join(server.getsockname(), secrets.token_bytes(16), b"r\0\0\1")
        host.join()
        assert isinstance(got["refused"], wire.Refused)
    server.close()


def test_a_rank_reads_nothing_from_a_host_without_the_key():
    server = socket.create_server(("127.0.0.1", 0))

    def impostor() -> None:  # challenges, then proves nothing
        conn, _ = server.accept()
        wire.challenge(conn)
        conn.recv(wire.answer_size(4))
        conn.sendall(bytes(wire.PROOF))
        conn.close()

    thread = threading.Thread(target=impostor)
    thread.start()
    with pytest.raises(wire.Refused, match="does not hold the key"):
        wire.join(server.getsockname(), secrets.token_bytes(16), b"\0\0\0\0")
    thread.join()
    server.close()
