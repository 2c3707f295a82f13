"""Run roots written by earlier gfcrs, kept as test fixtures: the store (DuckLake catalog
+ Parquet, data path relative to the store folder) and the run's last checkpoint.

``tests/resources/stores/v1`` was written by gfcr at commit de1eb5e (before the store
recorded a schema version, which reads as version 1) with ``python -m
tests.resources.old_store tests/resources/stores/v1``: the default pipeline, shrunk (a
1-layer tiny policy, 2 prompts of 8 samples a step, no warm start), run for
:data:`STEPS` steps under run id :data:`RUN_ID`. Running that command again with today's
code would write today's schema, so the folder is not regenerated: it is what the new
code must keep opening, reading, resuming and reporting.

``tests/resources/stores/v2`` and ``v3`` are the same run carried on by later gfcrs, one
step each (``python -m tests.resources.old_store --resume ROOT STEPS`` run with the
code of that version, on a copy of the fixture before; then :func:`tidy`):

- ``v2``: the v1 root resumed to 3 steps by gfcr at commit 71e31a5^ (schema version 2:
  ``rollouts.turns``, null in the two steps stored under version 1);
- ``v3``: the v2 root resumed to 4 steps by gfcr at commit 0da2080 (schema version 3:
  evaluation sets, ``eval_completions``).

So each holds the rows of every version before it, as a store carried through the
versions does.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

FIXTURE = Path(__file__).parent / "stores" / "v1"
RUN_ID = "v1"
STEPS = 2
VERSIONS = {"v1": 1, "v2": 2, "v3": 3}
"""Fixture folder -> the schema version of its store."""
STEPS_OF = {"v1": 2, "v2": 3, "v3": 4}
"""Fixture folder -> the steps its run has committed."""
PAGES = ["/", f"/runs/{RUN_ID}", f"/runs/{RUN_ID}/rollouts?kept=false",
         f"/api/series?runs={RUN_ID}", f"/fragment/runs/{RUN_ID}/doctor"]
"""``gfcr ui`` pages of the fixture's run that every version's store is served."""


def root(version: str = "v1") -> Path:
    """The checked-in run root of fixture ``version`` (read it; never write to it)."""
    return FIXTURE.parent / version


def copy(to: Path, version: str = "v1") -> Path:
    """A writable copy of fixture ``version``'s run root at ``to`` (the checked-in one
    stays untouched); returns ``to``."""
    shutil.copytree(root(version), to)
    return to


def check_pages(store: str, pages: list[str]) -> None:
    """``gfcr ui`` on ``store`` answers each of ``pages`` (paths) with 200 and no traceback,
    shows a rollout's two turns (derived from the flat columns where the store predates
    ``rollouts.turns``) and records no failure."""
    from gfcr.ui import serve
    from tests.resources.web import get

    server = serve(store, port=0)
    try:
        base = server.url.rstrip("/")
        for path in pages:
            status, body = get(base + path)
            assert status == 200 and "Traceback" not in body, (path, body[-500:])
        _, listing = get(base + f"/runs/{RUN_ID}/rollouts")
        rollout = listing.split(f"/runs/{RUN_ID}/rollouts/")[1].split('"')[0]
        status, one = get(base + f"/runs/{RUN_ID}/rollouts/{rollout}")
        assert status == 200 and one.count('class="turn ') == 2
        assert server.failures == []
    finally:
        server.shutdown()
        server.server_close()


def write(root: Path) -> None:
    """Write the fixture's run under ``root`` (see the module docstring)."""
    from gfcr.core.loading import load
    from gfcr.launch.run import execute
    from tests.pipelines.test_pipelines import _shrunk

    pipeline = _shrunk(load("default")).with_overrides([f"steps={STEPS}"])
    execute(pipeline, root=root, executor="local", run_id=RUN_ID)
    for leftover in ("staging", "mlruns"):
        shutil.rmtree(root / leftover, ignore_errors=True)


def resume(root: Path, steps: int) -> None:
    """Carry the run at ``root`` on to ``steps`` steps (with the code on the path)."""
    from typer.testing import CliRunner

    from gfcr.cli import app

    done = CliRunner().invoke(app, ["run", "--resume", RUN_ID, "--steps", str(steps), "--root",
                                    str(root), "--executor", "local", "--no-track", "--json"])
    if done.exit_code:
        raise SystemExit(done.output)


def tidy(root: Path) -> None:
    """Keep the newest checkpoint only, drop the report, fold the catalog's write-ahead
    log into it (the fixture is as small as it can be and read without its -wal file)."""
    import sqlite3

    checkpoints = sorted((root / "runs" / RUN_ID / "checkpoints").iterdir(),
                         key=lambda p: int(p.name.split("-")[1]))
    for old in checkpoints[:-1]:
        shutil.rmtree(old)
    (root / "runs" / RUN_ID / "report.html").unlink(missing_ok=True)
    for leftover in ("staging", "mlruns"):
        shutil.rmtree(root / leftover, ignore_errors=True)
    con = sqlite3.connect(root / "store" / "catalog.sqlite")
    try:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        con.close()


if __name__ == "__main__":
    if sys.argv[1] == "--resume":
        resume(Path(sys.argv[2]), int(sys.argv[3]))
        tidy(Path(sys.argv[2]))
    else:
        write(Path(sys.argv[1]))
