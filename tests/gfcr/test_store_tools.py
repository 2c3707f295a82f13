"""The store in users' own tools: `gfcr sql --duckdb`'s statements open it in a DuckDB client that
knows nothing of gfcr; polars, pandas and Hugging Face datasets read it and its exports in
a process that never imports gfcr (README 'The store in your own tools')."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gfcr.cli import app
from store import RolloutStore
from tests.resources.runs import synthetic_run

WITHOUT_GFCR = """
import json, sys
import duckdb, polars as pl, pandas as pd, datasets

folder = sys.argv[1]
con = duckdb.connect(config={"autoinstall_known_extensions": False,
                             "autoload_known_extensions": False})
con.execute(open(f"{folder}/store.sql").read())
per_step = con.sql("SELECT step, count(*) AS n FROM rollouts GROUP BY step ORDER BY step").pl()
history = con.sql("SELECT * FROM prompt_history").df()
steps = con.sql("SELECT step, metrics['train/offpolicy_share'] AS share FROM steps ORDER BY step").pl()
parquet = pl.read_parquet(f"{folder}/kept.parquet")
jsonl = pd.read_json(f"{folder}/kept.jsonl", lines=True)
hf = datasets.load_from_disk(f"{folder}/kept-hf")
from_polars = datasets.Dataset.from_polars(parquet.drop("rewards"))  # datasets has no map type
leaked = sorted(m for m in sys.modules if m.split(".")[0] in ("gfcr", "store", "stages", "pipelines"))
print(json.dumps({"per_step": per_step["n"].to_list(), "prompts": len(history),
                  "share": steps["share"].to_list()[0], "parquet": parquet.height,
                  "jsonl": len(jsonl), "hf": hf.num_rows, "from_polars": from_polars.num_rows,
                  "columns": parquet.columns, "leaked": leaked}))
"""


@pytest.fixture
def store(tmp_path: Path) -> Path:
    with RolloutStore.open(tmp_path / "store") as s:
        synthetic_run(s, "r", [{"train/offpolicy_share": 0.25}] * 3)
    return tmp_path / "store"


def test_statements_and_exports_read_without_gfcr(store: Path, tmp_path: Path) -> None:
    cli = CliRunner()
    printed = cli.invoke(app, ["sql", "--duckdb", "--store", str(store)])
    assert printed.exit_code == 0, printed.output
    assert "sqlite_scanner.duckdb_extension" in printed.output and "(READ_ONLY" in printed.output
    (tmp_path / "store.sql").write_text(printed.output)
    for fmt, name in (("parquet", "kept.parquet"), ("jsonl", "kept.jsonl"), ("hf", "kept-hf")):
        done = cli.invoke(app, ["store", "export", str(tmp_path / name), "--format", fmt,
                                "--kept", "--store", str(store)])
        assert done.exit_code == 0, done.output
    result = subprocess.run([sys.executable, "-c", WITHOUT_GFCR, str(tmp_path)], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])
    with RolloutStore.open(store, read_only=True) as s:
        kept = s.sql("SELECT count(*) AS n FROM rollouts WHERE kept").column("n")[0].as_py()
        prompts = s.sql("SELECT count(*) AS n FROM prompt_history").column("n")[0].as_py()
    assert got["leaked"] == []  # gfcr, store, stages: never imported
    assert got["per_step"] == [32, 32, 32] and got["prompts"] == prompts and got["share"] == 0.25
    assert got["parquet"] == got["jsonl"] == got["hf"] == got["from_polars"] == kept
    assert {"completion", "reward", "kept", "logprobs"} <= set(got["columns"])


def test_duckdb_ui_serves_the_store(store: Path) -> None:
    """`gfcr sql --ui` starts DuckDB's UI server on the store (its page's assets come
    from ui.duckdb.org, which this machine cannot reach; the server itself answers)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "gfcr.cli", "sql", "--ui", "--port", str(port),
                             "--store", str(store)], cwd=Path(__file__).resolve().parents[2],
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline() if proc.stderr else ""
        assert f"http://localhost:{port}" in line, line
        deadline, status = time.monotonic() + 30, 0
        while time.monotonic() < deadline and status != 200:
            try:
                status = urllib.request.urlopen(f"http://localhost:{port}/info", timeout=5).status
            except OSError:
                time.sleep(0.2)
        assert status == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_missing_store_is_named(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["sql", "--duckdb", "--store", str(tmp_path / "none")])
    assert result.exit_code == 2 and "no store at" in result.output


def test_sql_wants_a_query_or_a_session(store: Path) -> None:
    cli = CliRunner()
    neither = cli.invoke(app, ["sql", "--store", str(store)])
    assert neither.exit_code == 2 and "--duckdb or --ui" in neither.output
    both = cli.invoke(app, ["sql", "SELECT 1", "--duckdb", "--store", str(store)])
    assert both.exit_code == 2 and "not both" in both.output


def test_export_takes_no_sql_and_reads_no_host_file(store: Path, tmp_path: Path) -> None:
    """Issue 26 item 7: `--where` spliced SQL into a query on an unconfined connection,
    so `UNION ALL BY NAME` exported a host file; now it is refused, and a typed filter's
    value is only ever a value."""
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cr3t")
    out = tmp_path / "out.jsonl"
    cli = CliRunner()
    attack = f"false UNION ALL BY NAME SELECT content AS run_id FROM read_text('{secret}')"
    refused = cli.invoke(app, ["store", "export", str(out), "--format", "jsonl", "--where",
                               attack, "--store", str(store)])
    assert refused.exit_code == 2 and "--match COLUMN=VALUE" in refused.output
    assert not out.exists()
    typed = cli.invoke(app, ["store", "export", str(out), "--format", "jsonl", "--match",
                             f"run_id=x' UNION ALL BY NAME SELECT content AS run_id FROM "
                             f"read_text('{secret}') --", "--store", str(store)])
    assert typed.exit_code == 0 and out.read_text() == ""
    ranged = cli.invoke(app, ["store", "export", str(out), "--format", "jsonl", "--run", "r",
                              "--step", "1:2", "--kept", "--store", str(store)])
    assert ranged.exit_code == 0, ranged.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    with RolloutStore.open(store, read_only=True) as s:
        want = s.sql("SELECT count(*) AS n FROM rollouts WHERE run_id = 'r' AND step BETWEEN 1 "
                     "AND 2 AND kept").column("n")[0].as_py()
    assert len(rows) == want > 0 and all(r["step"] in (1, 2) and r["kept"] for r in rows)
