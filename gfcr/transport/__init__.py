"""How a run's calls leave its process: Prefect tasks, a fleet, score pools.

The executors that run stage calls as Prefect tasks (``executors``), their progress in
Prefect's logs (``progress``), crashed flow runs (``prefect_crash``), the temporary
server's reaper (``reaper``), a fleet of vLLM servers that generates for a run
(``fleet``, ``fleet_serve``), a sharded learner (``sharded``), and the pools' workers
that serve scoring calls for any run (``remote``). The only package that knows Prefect's
tasks and task workers. It imports ``gfcr.core``, ``gfcr.runner`` and ``gfcr.report``.
"""
