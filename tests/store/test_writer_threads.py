"""The writer connection runs DuckDB single-threaded (step commits are catalog round
trips); compaction gets every thread while it runs, and the writer goes back to one."""

from __future__ import annotations

from store import RolloutStore
from store._duck import WRITER_THREADS, all_threads
from store.maintenance import compact

from .conftest import make_rollouts


def _threads(con) -> int:
    return int(con.execute("SELECT current_setting('threads')").fetchone()[0])


def test_writer_is_single_threaded_and_compaction_gets_all_threads(tmp_path):
    with RolloutStore.open(tmp_path / "s") as store:
        assert _threads(store._con) == WRITER_THREADS == 1
        default = _threads(store.connection())  # the reader keeps DuckDB's default
        with all_threads(store._con):
            assert _threads(store._con) == default
        assert _threads(store._con) == 1
        store.start_run("run", pipeline="p", spec_yaml="x", spec_hash="h", code_version="c")
        for step in range(3):
            store.commit_step("run", step, make_rollouts(8, step=step), policy_version=step,
                              metrics={})
        compact(store)
        assert _threads(store._con) == 1
        assert store.sql("SELECT count(*) AS n FROM rollouts")["n"][0].as_py() == 24
