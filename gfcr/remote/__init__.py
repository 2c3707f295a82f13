"""Engine workers: a run's generate stage on long-lived worker processes (issue 16).

:mod:`gfcr.remote.call` (the call as data), :mod:`gfcr.remote.worker` (the worker side,
``gfcr engine-worker``; :mod:`gfcr.remote.serve` starts it), :mod:`gfcr.remote.guard`
(what a worker checks before it runs a call), :mod:`gfcr.remote.keys` (the pool's key that
signs the calls), :mod:`gfcr.remote.pool` (sending a call and waiting for it, bounded),
:mod:`gfcr.remote.dispatch` (the run side, ``--generate-pool``), :mod:`gfcr.remote.scoring`
(scoring filter stages on the workers, ``--score-pool``).
"""
