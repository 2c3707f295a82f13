"""The bodies of the ``gfcr`` command's subcommands (the app itself is ``gfcr.cli``).

``run``, ``deploy``, ``sql``, ``report``/``doctor``, ``store``, ``model``, ``stages``,
``engine-worker``; how failures are shown (``errors``, ``guard``, ``exits``) and the
store in DuckDB's own tools (``duck_session``). Nothing below imports it.
"""
