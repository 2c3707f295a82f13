"""`gfcr sql` is really read-only (issue 12 item 5): DuckLake's functions are refused and
write nothing, files outside the store cannot be read, Ctrl-C stops a query, errors quote
a short excerpt, formats are checked; CSV ends lines with \\n and `gfcr runs` keeps run
ids whole (issue 18 item 8)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from gfcr.cli import app
from store import RolloutStore
from tests.store.conftest import make_rollouts

runner = CliRunner()
DUCKLAKE_FUNCTIONS = [  # DuckLake 1.0's functions, ducklake_<name>
    "add_data_files", "cleanup_old_files", "commit", "current_snapshot",
    "delete_orphaned_files", "expire_snapshots", "flush_inlined_data",
    "last_committed_snapshot", "list_files", "merge_adjacent_files", "options",
    "rewrite_data_files", "scan", "set_commit_message", "set_option", "settings", "snapshots",
    "table_changes", "table_deletions", "table_info", "table_insertions"]
LONG_ID = "a-run-id-long-enough-to-be-cut-in-an-80-column-terminal-20261123-101010-abcd"


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """A store with a staged (Parquet) step and small inlined steps: every maintenance
    function would have something to do."""
    root = tmp_path_factory.mktemp("sql") / "root"
    with RolloutStore.open(root / "store") as s:
        s.start_run(LONG_ID, pipeline="p", spec_yaml="x", spec_hash="h", code_version="v")
        s.commit_step(LONG_ID, 0, make_rollouts(300, run_id=LONG_ID), policy_version=0, metrics={})
        s.commit_step(LONG_ID, 1, make_rollouts(300, run_id=LONG_ID, step=1), policy_version=1,
                      metrics={})
        for step in range(2, 5):
            s.commit_step(LONG_ID, step, make_rollouts(4, run_id=LONG_ID, step=step),
                          policy_version=step, metrics={})
        s.finish_run(LONG_ID, "finished")
    return root


def _files(root):
    return sorted((str(p.relative_to(root)), p.stat().st_size)
                  for p in (root / "store" / "data").rglob("*") if p.is_file())


def _snapshots(root):
    with RolloutStore.open(root / "store", read_only=True) as s:
        return s.snapshots().num_rows


def _sql(root, query, *more):
    return runner.invoke(app, ["sql", query, "--root", str(root), *more])


WRITERS = [
    "SELECT * FROM ducklake_merge_adjacent_files('lake')",
    "SELECT * FROM ducklake_flush_inlined_data('lake')",
    "SELECT * FROM ducklake_cleanup_old_files('lake', cleanup_all => true)",
    "SELECT * FROM ducklake_delete_orphaned_files('lake', cleanup_all => true)",
    "SELECT * FROM ducklake_expire_snapshots('lake', older_than => now())",
    "SELECT * FROM ducklake_rewrite_data_files('lake')",
    "SELECT * FROM lake.merge_adjacent_files()",
    "SELECT * FROM lake.flush_inlined_data()",
    "SELECT * FROM lake.expire_snapshots(older_than => now())",
    "SELECT count(*) FROM rollouts WHERE step IN (SELECT 1 FROM ducklake_flush_inlined_data('lake'))",
    "EXPLAIN ANALYZE SELECT * FROM ducklake_merge_adjacent_files('lake')",
    "SELECT * FROM query('SELECT * FROM ducklake_merge_adjacent_files(''lake'')')",
    "SELECT * FROM query_table('rollouts')",
    "SELECT * FROM \"ducklake_merge_adjacent_files\"('lake')",
] + [f"SELECT * FROM ducklake_{name}('lake')" for name in sorted(DUCKLAKE_FUNCTIONS)]

UNLISTED = [  # issue 26 item 7: names a deny-list missed; the allow-list refuses them all
    "SELECT * FROM checkpoint()", "SELECT * FROM force_checkpoint()",
    "SELECT * FROM system.main.checkpoint()", "SELECT * FROM snapshots()",
    "SELECT * FROM options()", "SELECT * FROM settings()",
    "SELECT * FROM range(2) UNION ALL SELECT 1 FROM checkpoint()",
    "SUMMARIZE SELECT * FROM checkpoint()", "SELECT * FROM enable_logging()",
    "SELECT lake.main.abs(1)"]


@pytest.mark.parametrize("query", WRITERS)
def test_ducklake_functions_are_refused_and_write_nothing(root, query):
    files, snapshots = _files(root), _snapshots(root)
    result = _sql(root, query)
    assert result.exit_code == 2, result.output
    assert "refused function(s)" in result.output
    assert _files(root) == files and _snapshots(root) == snapshots


@pytest.mark.parametrize("query", UNLISTED)
def test_allow_list_refuses_unlisted_functions_and_writes_nothing(root, query):
    files, snapshots = _files(root), _snapshots(root)
    result = _sql(root, query)
    assert result.exit_code == 2, result.output
    assert "refused" in result.output
    assert _files(root) == files and _snapshots(root) == snapshots


def test_allow_list_keeps_the_reading_forms(root):
    for query in ["DESCRIBE rollouts", "SHOW TABLES", "SUMMARIZE steps",
                  "PRAGMA table_info('steps')", "EXPLAIN SELECT 1", "FROM steps SELECT step",
                  "SELECT step, row_number() OVER (ORDER BY step), [1, 2][1], {'a': 1}.a, "
                  "list_transform([step], x -> x + 1), unnest([1]) FROM steps",
                  "SELECT count(*) FROM range(3) r, unnest([1, 2]) u"]:
        result = _sql(root, query, "--format", "csv")
        assert result.exit_code == 0, (query, result.output)


def test_files_outside_the_store_cannot_be_read(root, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cr3t")
    for query in [f"SELECT * FROM read_text('{secret}')", "SELECT * FROM read_text('/etc/shadow')",
                  f"SELECT * FROM read_csv('{secret}')",
                  "SELECT * FROM read_parquet('/etc/*.parquet')"]:
        result = _sql(root, query)
        assert result.exit_code == 2 and "s3cr3t" not in result.output
        assert "disabled by configuration" in " ".join(result.output.split())
    ok = _sql(root, "SELECT count(*) AS n FROM rollouts", "--format", "csv")
    assert ok.exit_code == 0 and ok.stdout == "n\n612\n"


def test_an_error_quotes_a_short_excerpt(root):
    query = "SELECT step\n" + "".join(f"  , no_such_column_{i}\n" for i in range(1500)) + "FROM steps"
    result = _sql(root, query)
    assert result.exit_code == 2
    assert len(result.output) < 1200 and "no_such_column_1499" not in result.output
    refused = _sql(root, "DELETE FROM steps WHERE " + " OR ".join(["step = 1"] * 2000))
    assert refused.exit_code == 2 and len(refused.output) < 800


def test_unknown_format_is_refused(root):
    for command in (["sql", "SELECT 1", "--format", "bogus"], ["runs", "--format", "xml"]):
        result = runner.invoke(app, [*command, "--root", str(root)])
        assert result.exit_code == 2 and "is not one of table, csv, json" in result.output


def test_csv_ends_lines_with_newline_and_runs_keep_ids_whole(root):
    csv = subprocess.run([sys.executable, "-m", "gfcr.cli", "runs", "--root", str(root),
                          "--format", "csv"], capture_output=True, timeout=300)
    assert csv.returncode == 0 and b"\r\n" not in csv.stdout and csv.stdout.endswith(b"\n")
    table = runner.invoke(app, ["runs", "--root", str(root)], env={"COLUMNS": "80"},
                          terminal_width=80)
    assert table.exit_code == 0 and LONG_ID in table.stdout, table.stdout


def _holds(pid, name):
    try:
        return any(os.readlink(f"/proc/{pid}/fd/{fd}").endswith(name)
                   for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return False


def test_ctrl_c_interrupts_a_long_query(root):
    proc = subprocess.Popen([sys.executable, "-m", "gfcr.cli", "sql",
                             "SELECT sum(a.range * b.range) FROM range(100000000) a, "
                             "range(100000000) b", "--root", str(root)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not _holds(proc.pid, "catalog.sqlite") and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.2)
        time.sleep(1.0)  # the store is open: the query is about to run or running
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted" in err and "Traceback" not in err
