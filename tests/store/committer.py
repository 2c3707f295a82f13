"""A committing process for the kill and concurrency tests (imported, not collected).

``commit_steps`` runs in a child process started from a forkserver that has imported
this module (so a child starts in a fraction of a second): it opens the store, sends
"ready", then commits steps FIRST..LAST of a run and sends ``(step, committed)`` for each.
Each step's table is a pure function of (run, step), see ``step_table``.
"""

from __future__ import annotations

import multiprocessing

import pyarrow as pa

from store import RolloutStore
from store._commit import STAGE_MIN_ROWS
from tests.store.conftest import make_rollouts


def step_rows(step: int) -> int:
    """Rows of a step, covering the three write paths: inlined in the catalog (4 rows),
    INSERTed as Parquet (24), staged with pyarrow and registered (>= STAGE_MIN_ROWS)."""
    return {3: 4, 4: STAGE_MIN_ROWS}.get(step % 5, 24)


def step_table(run_id: str, step: int) -> pa.Table:
    """The step's rollouts; from step 6 on they carry an extra column (schema evolution)."""
    n = step_rows(step)
    extra = {"difficulty": [0.1 * i for i in range(n)]} if step >= 6 else {}
    return make_rollouts(n, run_id=run_id, step=step, **extra)


def commit_steps(uri: str, run_id: str, first: int, last: int, data_path: str | None, out) -> None:
    """Commit steps ``first..last`` of ``run_id``; report on the pipe end ``out``."""
    with RolloutStore.open(uri, data_path=data_path) as store:
        out.send("ready")
        for step in range(first, last + 1):
            result = store.commit_step(run_id, step, step_table(run_id, step),
                                       policy_version=step, metrics={"step": float(step)})
            out.send((step, result.committed))
    out.send("done")


def start(uri: str, run_id: str, first: int, last: int, data_path: str | None = None):
    """Start ``commit_steps`` in a forkserver child; return (process, receiving pipe end)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    receive, send = ctx.Pipe(duplex=False)
    process = ctx.Process(target=commit_steps, args=(uri, run_id, first, last, data_path, send), daemon=True)
    process.start()
    send.close()
    return process, receive


def drain(receive) -> list:
    """Every message a child sent until it ended (or was killed)."""
    messages = []
    while True:
        try:
            messages.append(receive.recv())
        except EOFError:
            return messages
