"""The contracts: what a stage, an engine, a service, a store and a pipeline are.

The rollout schema (``rollout``), the stage kinds (``stage``) and their registry
(``registry``), the configs' base (``spec``), the engine, policy and service protocols
(``engine``, ``policy``, ``services``), the store protocols (``storage``), optional
capabilities, and the ``Pipeline`` that validates a composition of them (``pipeline``,
``settings``, ``sizes``, ``loading``). Stages, stores and pipelines are written against
this package. It imports nothing of gfcr but ``gfcr.config`` (reading what a user writes),
and never Prefect, MLflow or torch at import time.
"""
