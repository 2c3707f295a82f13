"""Crash and concurrency: SIGKILL during commits, 4 writers on SQLite and on PostgreSQL."""

from __future__ import annotations

import os
import random
import signal
import time
import uuid

import pytest

from store import RolloutStore
from tests.resources import postgres
from tests.resources.postgres import PG

from .committer import drain, start, step_rows


def _broken_steps(store: RolloutStore) -> list[tuple]:
    """Steps not whole, in one query (one snapshot): rows != n_rollouts, or rows without a step."""
    return store.sql("""
        WITH counted AS (SELECT run_id, step, count(*) AS n, count(DISTINCT rollout_id) AS ids
                         FROM rollouts GROUP BY ALL)
        SELECT coalesce(s.run_id, c.run_id) AS run_id, coalesce(s.step, c.step) AS step,
               s.n_rollouts, c.n, c.ids
        FROM steps s FULL OUTER JOIN counted c USING (run_id, step)
        WHERE s.n_rollouts IS DISTINCT FROM coalesce(c.n, 0) OR c.n IS DISTINCT FROM c.ids
    """).to_pylist()


def _step_counts(store: RolloutStore) -> dict[tuple[str, int], int]:
    rows = store.sql("SELECT run_id, step, count(*) AS n FROM steps GROUP BY ALL").to_pylist()
    return {(r["run_id"], r["step"]): r["n"] for r in rows}


def test_sigkill_during_commits_leaves_whole_steps(tmp_path):
    path = str(tmp_path / "store")
    RolloutStore.open(path).close()
    rng = random.Random(1234)
    last_step = 80  # more than 20 short-lived children can commit: the re-run has work left
    with RolloutStore.open(path, read_only=True) as reader:
        for trial in range(20):
            resume_from = max(0, (reader.last_step("r") or 0) - 1)  # also re-commits a done step
            child, receive = start(path, "r", resume_from, last_step)
            assert receive.recv() == "ready"
            if trial % 2:  # on a loaded machine the first commit can take longer than
                receive.recv()  # any fixed delay: every other trial waits for one
            time.sleep(rng.uniform(0.0, 0.2))
            os.kill(child.pid, signal.SIGKILL)
            child.join()
            drain(receive)
            assert _broken_steps(reader) == [], f"trial {trial}"
            assert set(_step_counts(reader).values()) <= {1}, f"trial {trial}"
        before = set(_step_counts(reader))
        assert 0 < len(before) < last_step + 1, "the kills should land mid-run"
        child, receive = start(path, "r", 0, last_step)
        messages = drain(receive)
        child.join()
        assert messages[-1] == "done"
        committed = {step for step, done in messages[1:-1] if done}
        assert committed == {s for s in range(last_step + 1) if ("r", s) not in before}
        assert _broken_steps(reader) == []
        assert _step_counts(reader) == {("r", s): 1 for s in range(last_step + 1)}
        total = reader.sql("SELECT count(*) AS n FROM rollouts").to_pylist()[0]["n"]
        assert total == sum(step_rows(s) for s in range(last_step + 1))


def _four_writers(uri: str, data_path: str | None, steps: int = 50, precreate: bool = True) -> None:
    """4 processes x ``steps`` steps into one store while this process keeps reading."""
    if precreate:
        RolloutStore.open(uri, data_path=data_path).close()
    children = [start(uri, f"w{i}", 0, steps - 1, data_path) for i in range(4)]
    if not precreate:
        assert all(receive.poll(60) for _, receive in children)  # each opened (or failed)
    with RolloutStore.open(uri, read_only=True, data_path=data_path) as reader:
        while any(child.is_alive() for child, _ in children):
            assert _broken_steps(reader) == []  # readers never see half a step
            time.sleep(0.2)
        for child, receive in children:
            messages = drain(receive)
            assert messages[-1] == "done", messages[-3:]
            assert sum(1 for m in messages[1:-1] if m[1]) == steps
        assert _broken_steps(reader) == []
        assert _step_counts(reader) == {(f"w{i}", s): 1 for i in range(4) for s in range(steps)}
        rows = reader.sql("SELECT count(*) AS n, count(DISTINCT rollout_id) AS ids FROM rollouts").to_pylist()[0]
        assert rows["n"] == rows["ids"] == 4 * sum(step_rows(s) for s in range(steps))


def test_four_writers_sqlite_catalog(tmp_path):
    _four_writers(str(tmp_path / "store"), None)


def test_four_processes_create_one_store_at_once(tmp_path):
    _four_writers(str(tmp_path / "store"), None, steps=3, precreate=False)


@pytest.fixture
def pg_database():
    """A uniquely named PostgreSQL database for one test, dropped afterwards."""
    name = f"gfcr_store_{uuid.uuid4().hex[:12]}"
    with postgres.created([name]):
        yield f"postgresql://{PG['user']}@{PG['host']}:{PG['port']}/{name}"


@pytest.mark.postgres
def test_four_writers_postgres_catalog(pg_database, tmp_path):
    _four_writers(pg_database, str(tmp_path / "data"))
