"""A fresh temp store per test."""

from __future__ import annotations

import pytest

from store import RolloutStore


@pytest.fixture
def store(tmp_path):
    with RolloutStore.open(tmp_path / "store") as s:
        yield s
