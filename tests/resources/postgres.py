"""The local PostgreSQL server in the tests (127.0.0.1:5432, user postgres): databases
created for a test or a module and dropped after it, or a skip where the server (or
psycopg2) is not there."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import pytest

PG = dict(host="127.0.0.1", port=5432, user="postgres", dbname="test")
"""Where the admin connection goes (``dbname``: a database that is always there)."""


@contextmanager
def created(names: list[str]) -> Iterator[None]:
    """The databases ``names`` (unused names: callers add a random tag) for the ``with``
    block, dropped after it even while a client still holds them; skips the test where
    PostgreSQL is unreachable."""
    psycopg2 = pytest.importorskip("psycopg2")
    try:
        admin = psycopg2.connect(connect_timeout=3, **PG)
    except psycopg2.OperationalError as exc:
        pytest.skip(f"PostgreSQL at {PG['host']}:{PG['port']} is unreachable: {exc}")
    admin.autocommit = True
    for name in names:
        admin.cursor().execute(f"CREATE DATABASE {name}")
    try:
        yield
    finally:
        for name in names:
            admin.cursor().execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.close()
