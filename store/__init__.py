"""The rollout store: DuckLake catalog + Parquet data, queried with DuckDB.

``RolloutStore.open(uri)`` opens a store folder (SQLite catalog) or a PostgreSQL catalog
with a shared data path; ``commit_step`` writes a step exactly once; ``sql`` runs
read-only SQL over the ``rollouts``, ``steps`` and ``runs`` tables and the shipped views
(``group_stats``, ``prompt_history``, ``step_metrics``, ``lineage``). ``LakeHistory`` is the
typed read API (with time travel) for replay and curriculum stages; ``export`` and
``compact`` maintain a store.
"""

from .history import LakeHistory
from .lake import CommitResult, ReadOnlyError, RolloutStore, StoreError
from .maintenance import CompactResult, compact, export

__all__ = ["CommitResult", "CompactResult", "LakeHistory", "ReadOnlyError", "RolloutStore", "StoreError",
           "compact", "export"]
