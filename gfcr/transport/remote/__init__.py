"""Score pools: a run's scoring filter stages on long-lived worker processes.

:mod:`gfcr.transport.remote.call` (the call as data), :mod:`gfcr.transport.remote.worker` (the
worker side, ``gfcr engine-worker``; :mod:`gfcr.transport.remote.serve` starts it),
:mod:`gfcr.transport.remote.guard` (what a worker checks before it runs a call),
:mod:`gfcr.transport.remote.keys` (the pool's key that signs the calls),
:mod:`gfcr.transport.remote.pool` (sending a call and waiting for it, bounded),
:mod:`gfcr.transport.remote.scoring` (the run side, ``--score-pool``).

Generation leaves a run's process only on a fleet of vLLM servers (gfcr.transport.fleet);
the engine-worker generate path (``--generate-pool``) was removed in issue 24.
"""
