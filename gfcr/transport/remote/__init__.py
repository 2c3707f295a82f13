"""Engine workers: a run's generate stage on long-lived worker processes (issue 16).

:mod:`gfcr.transport.remote.call` (the call as data), :mod:`gfcr.transport.remote.worker` (the
worker side, ``gfcr engine-worker``; :mod:`gfcr.transport.remote.serve` starts it),
:mod:`gfcr.transport.remote.guard` (what a worker checks before it runs a call),
:mod:`gfcr.transport.remote.keys` (the pool's key that signs the calls),
:mod:`gfcr.transport.remote.pool` (sending a call and waiting for it, bounded),
:mod:`gfcr.transport.remote.dispatch` (the run side, ``--generate-pool``),
:mod:`gfcr.transport.remote.scoring` (scoring filter stages on the workers, ``--score-pool``).
"""
