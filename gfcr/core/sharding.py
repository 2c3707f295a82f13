"""The contract between a sharded learner's rank program (gfcr.transport.sharded_rank, in
gfcr) and the train stage that knows how to shard its learner (stages.train: FSDP2).

gfcr starts the ranks and speaks to them; the stage builds what runs on each. So the
rank program is gfcr's own module and nothing in gfcr names a module of ``stages``: the
stage is handed over in the :class:`ShardSetup` (pickled to each rank once it has proved
the run's key, gfcr.procs.wire), and its :meth:`ShardedTrainer.rank_worker` builds that
rank's :class:`RankWorker`. Publishing the weight versions stays on gfcr's side: the
worker gathers the full weights, the program writes them (gfcr.weights.versions).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import pyarrow as pa

from gfcr.core.policy import Policy
from gfcr.core.stage import StepContext, TrainResult


@dataclass(frozen=True)
class ShardSetup:
    """What every rank needs to build its shard of the learner (pickled to it)."""

    policy: Any
    """The pipeline's policy component: each rank builds the same initial weights."""
    stage: Any
    """The train stage (a :class:`ShardedTrainer`), whose learner the ranks drive."""
    seed: int
    run_id: str
    weights: str
    """The folder the ranks publish weight versions in (gfcr.weights.versions)."""
    keep: int
    device: str
    offload: bool
    timeout_s: float


@dataclass(frozen=True)
class RankPlace:
    """Where one rank stands in its group: the group meets in a file store (``store``, a
    path only this user can read), so nothing of it listens beyond loopback."""

    rank: int
    world: int
    local_rank: int
    store: str


class RankWorker(Protocol):
    """One rank's shard of the policy and the stage's learner over it. Every rank runs
    each call in step with the others (the collectives inside); rank 0's value is the
    answer."""

    policy: Policy
    """This rank's policy (its ``io`` writes the published versions)."""

    def update(self, ctx: StepContext, batch: pa.Table) -> TrainResult: ...

    def gathered(self) -> Any:
        """The full weights gathered to rank 0: a handle whose ``save(path, dtype)``
        writes them there; None on the other ranks."""

    def load(self, path: str) -> None:
        """Load a full weights file into the shards."""

    def save(self, path: str) -> dict[str, Any]:
        """A sharded checkpoint in the folder ``path``; what else the next update
        depends on."""

    def restore(self, path: str, meta: dict[str, Any]) -> None: ...

    def logprobs(self, prompts: list[list[int]], completions: list[list[int]],
                 temperature: float) -> list[list[float]]: ...

    def restart(self, stage: Any, component: Any = None) -> None:
        """Fresh initial weights (of ``component`` when given) under ``stage``'s
        learner."""

    def close(self) -> None:
        """Leave the group."""


@runtime_checkable
class ShardedTrainer(Protocol):
    """A train stage whose learner can run sharded over ranks
    (``Pipeline(learner=LearnerPlacement(ranks=N))``)."""

    def rank_worker(self, setup: ShardSetup, place: RankPlace) -> RankWorker:
        """Join the group at ``place`` and build this rank's shard and learner."""
        ...
