"""The weight versions a learner publishes for other processes: one folder per policy
version on shared storage, its manifest written last (``versions``), and the check a
reader runs before it loads one (``published``: a version folder under an allowed root,
files hashed as published). Fleets' inference servers and a sharded learner's ranks read
them. It imports ``gfcr.core`` and ``gfcr.checkpoints`` (the fsync of ``durable``).
"""
