"""The program of one sharded-learner rank: ``python -m gfcr.transport.sharded_rank``, N of
them started by gfcr.transport.sharded_ranks (``RANK``, ``WORLD_SIZE``, the address, key
and file store below in their environment).

Each rank joins the flow process over loopback (gfcr.procs.wire: both sides prove the
key before either reads a frame), takes its setup (gfcr.core.sharding.ShardSetup: the
policy component, the train stage, the seed) and asks the stage for its
:class:`~gfcr.core.sharding.RankWorker` (stages.train builds an FSDP2 shard). Then it
serves commands: every rank receives each command from the flow process directly (so no
rank waits in a collective between updates, however long generation takes), runs it in
step with the others, and answers; rank 0's answer carries the value. After an update,
a load or a restart, the ranks gather the weights and rank 0 publishes them as a version
(gfcr.weights.versions). A rank that fails answers with its traceback and exits; the flow
process then stops the others and the run fails, naming the rank.
"""

from __future__ import annotations

import os
import pickle
import struct
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa

from gfcr.core.sharding import RankPlace, RankWorker, ShardedTrainer, ShardSetup
from gfcr.core.stage import StepContext, TrainResult
from gfcr.procs import wire
from gfcr.weights.versions import WeightStore

ADDRESS, KEY, STORE = "GFCR_LEARNER_ADDRESS", "GFCR_LEARNER_KEY", "GFCR_LEARNER_STORE"
"""The environment a rank is started with: the flow process's address, the run's key
(hex), the file store the group meets in."""


class _NoTask:
    """The task of a rank's step context: a learner trains on the batch it is given,
    and never reads the task, which stays in the flow process."""

    def train_prompts(self) -> pa.Table:
        raise TypeError("a sharded learner's rank has no task")

    def heldout_prompts(self) -> pa.Table:
        raise TypeError("a sharded learner's rank has no task")

    def score(self, completion: str, answer: str | None, meta: str | None) -> float:
        raise TypeError("a sharded learner's rank has no task")


class RankServer:
    """The commands of the flow process (gfcr.transport.sharded), run on a worker."""

    def __init__(self, setup: ShardSetup, worker: RankWorker, rank: int) -> None:
        self.setup, self.worker, self.rank = setup, worker, rank
        io = worker.policy.io
        if io is None:
            raise TypeError("the sharded policy has no tensor I/O (gfcr.core.policy.Policy.io)")
        self.store = WeightStore(Path(setup.weights), io, keep=setup.keep)
        self.commands: dict[str, Callable[..., Any]] = {
            "update": self.update, "load": self.load, "save": worker.save,
            "restore": worker.restore, "logprobs": worker.logprobs,
            "restart": worker.restart, "publish": self.publish}

    def update(self, step: int, version: int, batch: pa.Table, new: int) -> TrainResult:
        ctx = StepContext(run_id=self.setup.run_id, step=step, seed=self.setup.seed,
                          policy_version=version, task=_NoTask())
        result = self.worker.update(ctx, batch)
        self.publish(new)
        return result

    def load(self, path: str, version: int) -> None:
        self.worker.load(path)
        self.publish(version)

    def publish(self, version: int) -> None:
        """Gather the weights to rank 0, which writes them as ``version``."""
        weights = self.worker.gathered()
        if self.rank == 0:
            self.store.publish(weights, version, self.setup.run_id)


def serve(fd: int, rank: int) -> None:
    """Set up, then run commands until told to stop (or the flow process is gone)."""
    setup = pickle.loads(wire.read_frame(fd))  # the flow process proved the key
    if not isinstance(setup, ShardSetup):
        raise TypeError(f"rank {rank}: the first message is {type(setup).__name__}, "
                        "not the learner's setup")
    if not isinstance(setup.stage, ShardedTrainer):
        raise TypeError(f"stage {type(setup.stage).__name__}: its learner cannot be "
                        "sharded (it has no rank_worker)")
    place = RankPlace(rank, int(os.environ["WORLD_SIZE"]),
                      int(os.environ.get("LOCAL_RANK", "0")), os.environ[STORE])
    worker = setup.stage.rank_worker(setup, place)
    commands = RankServer(setup, worker, rank)
    commands.publish(0)
    wire.write_frame(fd, pickle.dumps(("ok", os.getpid())))
    while True:
        name, args = pickle.loads(wire.read_frame(fd))
        if name == "stop":
            break
        value = commands.commands[name](*args)
        wire.write_frame(fd, pickle.dumps(("ok", value if rank == 0 else None)))
    worker.close()


def main() -> None:
    rank = int(os.environ["RANK"])
    host, port = os.environ[ADDRESS].rsplit(":", 1)
    conn = wire.join((host, int(port)), bytes.fromhex(os.environ[KEY]),
                     struct.pack("!I", rank))
    try:
        serve(conn.fileno(), rank)
    except wire.PeerGone:
        sys.exit(0)  # the flow process ended: nothing to answer
    except BaseException:
        wire.write_frame(conn.fileno(), pickle.dumps(("error", traceback.format_exc())))
        sys.exit(1)


if __name__ == "__main__":
    main()
