"""How a run's calls leave its process: Prefect tasks and engine workers.

The executors that run stage calls as Prefect tasks (``executors``), their progress in
Prefect's logs (``progress``), crashed flow runs (``prefect_crash``), the temporary
server's reaper (``reaper``), and the engine workers that serve generate and scoring calls
for any run (``remote``). The only package that knows Prefect's tasks and task workers. It
imports ``gfcr.core``, ``gfcr.runner`` and ``gfcr.report``.
"""
