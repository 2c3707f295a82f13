"""A run in one process: the step loop and everything it drives here.

The loop and its rounds (``loop``, ``rounds``, ``runtime``), the in-process services
(``inprocess``), how rewards are applied (``rewards``, ``metrics``), checkpoints,
resumption and weight versions (``checkpoint``, ``resume``, ``weights``), background
commits and table stashes, held-out evaluation, cancellation, the MLflow hook. Filter
results are applied by ``gfcr.core.filters``; helper threads and child processes are
``gfcr.procs``. It imports only ``gfcr.core`` and ``gfcr.procs``; it never imports Prefect
(that is ``gfcr.transport``).
"""
