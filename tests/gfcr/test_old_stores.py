"""Every read path on a store of each earlier schema version, opened read-only: ``gfcr
runs``, ``gfcr sql`` (today's tables and views), ``gfcr report``, ``gfcr doctor``, ``gfcr
store export``, ``gfcr export`` and the pages of ``gfcr ui`` read the fixtures of
tests/resources/stores (tests.resources.old_store) as today's schema, and leave every
file of the run root as it was, byte for byte."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from gfcr.cli import app
from store import RolloutStore
from store.reads import LakeRunReads
from tests.resources import old_store

RUN = old_store.RUN_ID


def _files(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _sql(store: str, query: str) -> list[dict]:
    done = CliRunner().invoke(app, ["sql", "--store", store, "--format", "json", query])
    assert done.exit_code == 0, (query, done.output)
    return json.loads(done.stdout)


@pytest.mark.parametrize("version", sorted(old_store.VERSIONS))
def test_every_read_path_reads_an_old_store_as_today_s_and_writes_nothing(
        tmp_path: Path, version: str) -> None:
    root = old_store.copy(tmp_path / version, version)
    store, before = str(root / "store"), _files(root)
    steps = old_store.STEPS_OF[version]
    assert _sql(store, "SELECT coalesce(max(version), 1) AS v FROM schema_versions") == [
        {"v": old_store.VERSIONS[version]}]
    assert _sql(store, "SELECT count(*) AS n, count(turns) AS t, count(DISTINCT step) AS s "
                       "FROM rollouts") == [{"n": 16 * steps, "t": 16 * steps, "s": steps}]
    assert _sql(store, "SELECT count(DISTINCT rollout_id) AS n FROM turns WHERE source = 'policy'"
                ) == [{"n": 16 * steps}]
    evaluations = _sql(store, "SELECT DISTINCT eval_set, samples FROM evaluations")
    assert evaluations == [{"eval_set": "heldout", "samples": None}]
    assert _sql(store, "SELECT count(*) AS n FROM eval_completions")[0]["n"] >= 0
    cli = CliRunner()
    for args in (["runs", "--store", store, "--format", "json"],
                 ["report", RUN, "--store", store, "--out", str(tmp_path / "report.html")],
                 ["store", "export", str(tmp_path / "rows.parquet"), "--store", store],
                 ["store", "export", str(tmp_path / "turns.parquet"), "--table", "turns", "--store", store],
                 ["export", RUN, "--out", str(tmp_path / "model"), "--root", str(root)]):
        done = cli.invoke(app, args)
        assert done.exit_code == 0, (args, done.output)
    doctor = cli.invoke(app, ["doctor", RUN, "--store", store, "--json"])
    assert doctor.exit_code in (0, 1) and isinstance(json.loads(doctor.stdout), list), doctor.output
    assert RUN in (tmp_path / "report.html").read_text()
    assert pq.read_table(tmp_path / "rows.parquet").column("turns").null_count == 0
    assert pq.read_table(tmp_path / "turns.parquet").num_rows == 2 * 16 * steps
    old_store.check_pages(store, [*old_store.PAGES, f"/runs/{RUN}/evaluations"])
    assert _files(root) == before


@pytest.mark.parametrize("version", sorted(old_store.VERSIONS))
def test_an_old_store_reads_the_same_before_and_after_its_migration(
        tmp_path: Path, version: str) -> None:
    """What a read-only reader is shown (store._compat) is what the migrated store holds:
    the per-run reads of the report, the doctor and ``gfcr runs`` give the same answers."""
    folder = shutil.copytree(old_store.root(version) / "store", tmp_path / version)

    def reads(read_only: bool) -> list:
        with RolloutStore.open(folder, read_only=read_only) as s:
            r = LakeRunReads(s)
            views = [sorted(r.view(name, RUN).to_pylist(), key=repr)  # some are unordered
                     for name in ("report_steps", "drops", "turn_figures")]
            return [r.runs().to_pylist(), r.evaluations(RUN).to_pylist(),
                    r.chat_samples(RUN, 4).to_pylist(), r.episode_figures(RUN), *views,
                    s.sql("SELECT * FROM turns ORDER BY rollout_id, turn").to_pylist()]
    assert reads(True) == reads(False)
