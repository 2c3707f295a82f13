"""The contracts: what a stage, an engine, a service, a store and a pipeline are.

The rollout schema (``rollout``), the stage kinds and their registry (``stage``), the
configs' base (``spec``), how a filter's result marks a table (``filters``), the engine and service protocols (``engine``, ``services``), the
store protocols (``storage``), the sharded learner's rank contract (``sharding``), optional
capabilities, and the ``Pipeline`` that validates a
composition of them (``pipeline``, ``settings``, ``sizes``, ``loading``). Stages, stores and
pipelines are written against this package. It imports nothing else of gfcr, and never
Prefect, MLflow or torch at import time.
"""
