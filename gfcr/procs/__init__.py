"""gfcr's own processes and the one wire between them: a public API, standard library only.

- ``wire``: frames, authentication by a shared key (HMAC), deadlines and named failures,
  spoken on every boundary gfcr owns (the sharded learner's ranks, the child processes);
- ``childproc``: child processes started light and tied to the run's life (the store's
  lease renewer, scorer workers);
- ``scorer_workers``: scorer calls in worker processes that the run kills at their
  deadline (Verify's user scorers);
- ``helper``: calls on a reused helper thread under a time limit, and their CPU charged to
  the calling stage.

Operators (``stages``) and the store use these modules; they import nothing of gfcr but
the standard library, so ``gfcr.runner`` and ``gfcr.transport`` build on them.
"""
