"""A run in one process: the step loop and everything it drives here.

The loop and its rounds (``loop``, ``rounds``, ``runtime``), the in-process services
(``inprocess``), how filter results and rewards are applied (``filters``, ``rewards``,
``metrics``), checkpoints, resumption and weight versions (``checkpoint``, ``resume``,
``weights``), background commits and table stashes, held-out evaluation, cancellation, the
MLflow hook, and the helper and scorer child processes. It imports only ``gfcr.core``; it
never imports Prefect (that is ``gfcr.transport``).
"""
