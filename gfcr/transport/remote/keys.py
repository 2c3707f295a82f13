"""A pool's key: the secret that signs the score calls a run sends to its pool's workers.

Anyone who reaches the Prefect API can create task runs for a pool's task, and the code
and spec hashes in a call can be recomputed by anyone: they say that run and worker agree,
not who sent the call. So every call is signed with an HMAC-SHA256 (RFC 2104) of its
canonical JSON under a key that the runs and the workers of a pool hold and that never
travels through Prefect: a file, named by ``gfcr engine-worker --key-file`` and
:class:`gfcr.transport.remote.pool.WorkerPool` ``key_file``, or by the environment variable
``GFCR_POOL_KEY_FILE`` on both sides. A worker refuses an unsigned call, one signed under
another key, and one whose fields were changed after signing, before it reads anything
the call names (:mod:`gfcr.transport.remote.guard`).

Make a key with ``umask 077; python -c "import secrets; print(secrets.token_hex(32))" >
pool.key``: the file must hold at least 32 characters and be readable by its owner only.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
from pathlib import Path
from typing import Any

from gfcr.procs import wire

KEY_ENV = "GFCR_POOL_KEY_FILE"
MIN_CHARS = 32
MAKE = ('umask 077; python -c "import secrets; print(secrets.token_hex(32))" > pool.key')


class KeyProblem(ValueError):
    """A pool key that is missing, too short or readable by others; the message says which
    and how to make one."""


def key_path(path: str | Path | None) -> Path:
    """``path``, or the file ``GFCR_POOL_KEY_FILE`` names; KeyProblem when neither."""
    chosen = path or os.environ.get(KEY_ENV)
    if not chosen:
        raise KeyProblem(f"engine pools need a pool key: name its file with --key-file or "
                         f"{KEY_ENV} (runs and workers of a pool use the same file; make "
                         f"one with `{MAKE}`)")
    return Path(chosen).expanduser()


def load_key(path: str | Path | None) -> bytes:
    """The key in ``path`` (or the file ``GFCR_POOL_KEY_FILE`` names), checked: a file
    of at least MIN_CHARS characters that only its owner may read."""
    return read_key(key_path(path), "pool key")


def read_key(where: Path, what: str) -> bytes:
    """The key in the file ``where`` (a ``what``: "pool key", "fleet key"), checked: a
    regular file of at least MIN_CHARS characters that only its owner may read; KeyProblem
    naming the file and the fix otherwise. Shared by score pools and fleets
    (gfcr.transport.fleet_gate)."""
    make = MAKE.replace("pool.key", where.name)
    try:
        info = where.stat()
        text = where.read_bytes().strip()
    except OSError as err:
        raise KeyProblem(f"{what} {str(where)!r}: cannot read it ({err.strerror}); make "
                         f"one with `{make}`") from None
    if not stat.S_ISREG(info.st_mode):
        raise KeyProblem(f"{what} {str(where)!r} is not a file")
    if info.st_mode & 0o077:
        raise KeyProblem(f"{what} {str(where)!r} may be read by others (mode "
                         f"{stat.S_IMODE(info.st_mode):o}): `chmod 600 {where}`")
    if len(text) < MIN_CHARS:
        raise KeyProblem(f"{what} {str(where)!r} holds {len(text)} characters; a key "
                         f"needs at least {MIN_CHARS} (make one with `{make}`)")
    return text


def new_key(path: str | Path) -> Path:
    """Write a fresh key to ``path`` (owner-only); for tests and first set-ups."""
    where = Path(path)
    fd = os.open(where, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_hex(32) + "\n")
    return where


def sign(kind: str, call: Any, key: bytes) -> str:
    """The HMAC of ``call`` (a ScoreCall) as a ``kind`` call (gfcr.transport.remote.pool.KIND)."""
    return wire.sign(key, canonical(kind, call))


def signed_by(kind: str, call: Any, mac: str, key: bytes) -> bool:
    """Whether ``mac`` is ``call``'s HMAC under ``key`` (compared in constant time)."""
    return wire.signed(key, canonical(kind, call), mac)


def canonical(kind: str, call: Any) -> bytes:
    """The bytes a call's signature covers: its kind and every field, as JSON with
    sorted keys (the same on both sides whatever order Prefect's JSON keeps)."""
    body = {"kind": kind, "call": call.model_dump(mode="json")}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), default=str).encode()
