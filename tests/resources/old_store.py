"""A run root written by an earlier gfcr, kept as a test fixture: the store (DuckLake
catalog + Parquet, data path relative to the store folder) and the run's checkpoint.

``tests/resources/stores/v1`` was written by gfcr at commit de1eb5e (before the store
recorded a schema version, which reads as version 1) with ``python -m
tests.resources.old_store tests/resources/stores/v1``: the default pipeline, shrunk (a
1-layer tiny policy, 2 prompts of 8 samples a step, no warm start), run for
:data:`STEPS` steps under run id :data:`RUN_ID`. Running that command again with today's
code would write today's schema, so the folder is not regenerated: it is what the new
code must keep opening, reading, resuming and reporting.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

FIXTURE = Path(__file__).parent / "stores" / "v1"
RUN_ID = "v1"
STEPS = 2


def copy(to: Path) -> Path:
    """A writable copy of the fixture's run root at ``to`` (the checked-in one stays
    untouched); returns ``to``."""
    shutil.copytree(FIXTURE, to)
    return to


def write(root: Path) -> None:
    """Write the fixture's run under ``root`` (see the module docstring)."""
    from gfcr.core.loading import load
    from gfcr.launch.run import execute
    from tests.pipelines.test_pipelines import _shrunk

    pipeline = _shrunk(load("default")).with_overrides([f"steps={STEPS}"])
    execute(pipeline, root=root, executor="local", run_id=RUN_ID)
    for leftover in ("staging", "mlruns"):
        shutil.rmtree(root / leftover, ignore_errors=True)


if __name__ == "__main__":
    write(Path(sys.argv[1]))
