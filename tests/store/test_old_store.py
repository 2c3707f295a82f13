"""Stores written by earlier gfcrs (tests/resources/stores/v1, v2 and v3: schema versions
1-3, see tests.resources.old_store) open, are read, resumed (migrated to this version on
the way) and reported by today's code."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from gfcr.cli import app
from store import RolloutStore
from store._versions import SCHEMA_VERSION
from tests.resources import old_store

RUN = old_store.RUN_ID


def test_the_old_store_opens_read_only_and_reads_its_rows() -> None:
    with RolloutStore.open(old_store.FIXTURE / "store", read_only=True) as s:
        steps = s.sql("SELECT step, n_rollouts FROM steps WHERE run_id = ? ORDER BY step",
                      [RUN]).to_pylist()
        rows = s.sql("SELECT count(*) AS n, count(DISTINCT step) AS steps, "
                     "min(len(completion_ids)) AS shortest FROM rollouts").to_pylist()[0]
    assert [r["step"] for r in steps] == list(range(old_store.STEPS))
    assert rows["n"] == sum(r["n_rollouts"] for r in steps) and rows["steps"] == 2
    assert rows["shortest"] > 0


@pytest.mark.parametrize("version", sorted(old_store.VERSIONS))
def test_the_old_run_resumes_and_is_reported(tmp_path: Path, version: str) -> None:
    root = old_store.copy(tmp_path / "root", version)
    stored = old_store.STEPS_OF[version]
    cli = CliRunner()
    done = cli.invoke(app, ["run", "--resume", RUN, "--steps", str(stored + 1),
                            "--root", str(root), "--executor", "local", "--no-track", "--json"])
    assert done.exit_code == 0, done.output
    assert f'"resumed_from": {stored - 1}' in done.stdout
    with RolloutStore.open(root / "store", read_only=True) as s:
        steps = s.sql("SELECT step FROM steps WHERE run_id = ? ORDER BY step", [RUN])
        per_step = s.sql("SELECT step, count(*) AS n, count(turns) AS with_turns FROM lake.rollouts "
                         "GROUP BY step ORDER BY step")
        turns = s.sql("SELECT step, count(DISTINCT rollout_id) AS n FROM turns "
                      "WHERE source = 'policy' GROUP BY step ORDER BY step")
        version_now = s.sql("SELECT max(version) AS v FROM schema_versions")["v"].to_pylist()
    every = [16] * (stored + 1)
    assert steps["step"].to_pylist() == list(range(stored + 1))
    assert per_step["n"].to_pylist() == every
    assert per_step["with_turns"].to_pylist() == every  # old rows' turns stored (version 4)
    assert turns["n"].to_pylist() == every and version_now == [SCHEMA_VERSION]
    page = tmp_path / "report.html"
    report = cli.invoke(app, ["report", RUN, "--root", str(root), "--out", str(page)])
    assert report.exit_code == 0, report.output
    assert RUN in page.read_text()
    doctor = cli.invoke(app, ["doctor", RUN, "--root", str(root)])
    assert doctor.exit_code in (0, 1), doctor.output
