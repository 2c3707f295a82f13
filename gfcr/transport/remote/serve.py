"""``gfcr engine-worker``'s process: check what it needs, say what it waits for, serve.

Before serving, :func:`serve_pool` loads the pool's key (gfcr.transport.remote.keys), sets the list
of code the worker resolves by import path (gfcr.config.refs), and checks that the Prefect API
answers, saying at once which address it waits for and failing with that address after
``api_wait_s`` (a worker whose API is unreachable otherwise sat silent in Prefect's own
retries)."""

from __future__ import annotations

import importlib
import logging
import sys
import time
from pathlib import Path

from gfcr.config import refs
from gfcr.transport.remote import guard, worker
from gfcr.transport.remote.keys import load_key

API_WAIT_S = 30.0


def say(message: str) -> None:
    """A line on stderr at once (Prefect's logging configuration may hide gfcr's)."""
    print(f"{time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


def serve_pool(pool: str, *, name: str | None = None, limit: int = 1,
               timeout: float | None = None, imports: tuple[str, ...] = (),
               key_file: str | Path | None = None, allow_refs: tuple[str, ...] = (),
               api_wait_s: float = API_WAIT_S) -> None:
    """Serve ``pool``'s score calls until stopped (or ``timeout`` seconds).
    Needs a Prefect API server (PREFECT_API_URL), the result storage the runs use and the
    pool's key (``key_file`` or GFCR_POOL_KEY_FILE). ``imports``: modules that register
    components the runs name (a task of one's own) besides the ``gfcr.plugins`` entry
    points; their public names, and ``allow_refs``, are the code the calls may name by
    import path (a scorer function)."""
    from prefect.settings import PREFECT_API_URL
    from prefect.task_worker import serve

    from gfcr.core.registry import load_plugins

    url = PREFECT_API_URL.value()
    if not url:
        raise RuntimeError("an engine worker needs a Prefect API server: set PREFECT_API_URL "
                           "(task workers cannot use Prefect's temporary server)")
    guard.hold_key(load_key(key_file))
    worker.WORKER = name or worker.WORKER
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    reach_api(str(url), api_wait_s)
    load_plugins()  # the stages' and engines' imports, before the first call
    for module in imports:
        importlib.import_module(module)
    refs.allow(allow_refs, imports)
    say(f"engine worker {worker.WORKER} serves pool {pool!r} (calls signed with its key only)")
    serve(worker.score_task(pool), limit=limit, timeout=timeout)


def reach_api(url: str, wait_s: float) -> None:
    """Return once the Prefect API at ``url`` answers its health check; say at once that
    the worker waits for it, and raise RuntimeError naming it after ``wait_s``."""
    import httpx

    say(f"engine worker {worker.WORKER}: connecting to the Prefect API at {url}")
    deadline, said = time.monotonic() + wait_s, False
    while True:
        try:
            httpx.get(f"{url.rstrip('/')}/health", timeout=5.0)
            return  # an answer, whatever its status: the address is reachable
        except httpx.TransportError as err:
            if time.monotonic() >= deadline:
                raise RuntimeError(f"cannot reach the Prefect API at {url} ({err}); start "
                                   "the server, or set PREFECT_API_URL to it") from None
            if not said:
                said = True
                say(f"engine worker {worker.WORKER}: the Prefect API at {url} does not "
                    f"answer ({err}); retrying for {wait_s:g} s")
        time.sleep(1.0)
