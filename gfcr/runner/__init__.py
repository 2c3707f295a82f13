"""A run in one process: the step loop and everything it drives here.

The loop and its rounds (``loop``, ``rounds``, ``runtime``), the in-process services
(``inprocess``, ``serial``), how filter results and rewards are applied (``filters``,
``rewards``, ``metrics``), background commits (``commits``), the tokenizer check at the
start of a run (``tokencheck``), and the helper and scorer child processes. Checkpoints and
resumption are ``gfcr.checkpoints``, weight versions ``gfcr.weights``, held-out evaluation
``gfcr.evaluation``, trackers ``gfcr.tracking``. It imports ``gfcr.core``, ``gfcr.config``
and ``gfcr.evaluation``; it never imports Prefect (that is ``gfcr.transport``).
"""
