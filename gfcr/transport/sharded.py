"""A learner sharded over processes (gfcr.core.services.Learner): the train stage's learner on
FSDP2, in a process group started beside the flow process.

``Pipeline(learner=LearnerPlacement(ranks=N))`` puts it in place of the in-process
learner (gfcr.launch.placement). The run starts N processes of gfcr's rank program
(gfcr.transport.sharded_rank, started by gfcr.transport.sharded_ranks: gloo on CPU, NCCL
on GPUs; they meet in a file store, nothing of theirs listens beyond loopback), which
builds each rank's shard through the train stage (gfcr.core.sharding.ShardedTrainer:
stages.train's FSDP2). Each rank joins this process over a local socket
(gfcr.procs.wire: both sides prove the run's key before a frame is read), and this
process sends every command to every rank, so no rank idles in a collective while the
loop generates. Replies come back on the same sockets, as pickles read only from the
ranks that proved the key.

What moves:

- a batch goes to every rank; each computes the batch-level quantities (advantages,
  counts) and trains on its share of the rows (stages.train.ranks);
- weights come back as files: after each update the ranks gather a full state dict to
  rank 0, which publishes it as a version folder (gfcr.weights.versions.WeightStore); the handle
  (:class:`ShardedHandle`) names that folder, and the in-process engine loads it into
  its own policy;
- checkpoints: the flow process's checkpoint (gfcr.checkpoints.checkpoint) gets the full weights file
  and, beside it, the ranks' sharded state (``learner.dcp``: torch.distributed.checkpoint),
  which loads on any number of ranks.

A rank that fails answers with its traceback, a rank that dies closes its socket; either
way the group is stopped and the run fails with :class:`ShardedLearnerError` naming the
rank. Collectives time out after ``timeout_s``, so a stuck group cannot hang the run.
"""

from __future__ import annotations

import os
import pickle
import select
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from gfcr.core.services import WeightHandle
from gfcr.core.sharding import ShardedTrainer, ShardSetup
from gfcr.core.stage import StepContext, TrainResult
from gfcr.procs import wire
from gfcr.weights.versions import WEIGHTS, WeightStore
from gfcr.transport import sharded_ranks
from gfcr.transport.sharded_ranks import StartFailed

__all__ = ["ShardedLearner", "ShardedLearnerError", "Setup"]
DCP = "learner.dcp"
"""The ranks' sharded checkpoint, beside the checkpoint's weights file."""


class ShardedLearnerError(RuntimeError):
    """A rank failed or died, or the group did not answer in time; names the rank."""


Setup = ShardSetup
"""What every rank needs (gfcr.core.sharding.ShardSetup), by the name placement uses."""


def send(conn: socket.socket, value: Any) -> None:
    """One command to a rank (that proved the key)."""
    wire.write_frame(conn.fileno(), pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))


# --------------------------------------------------------------------------- handles


@dataclass(frozen=True)
class ShardedHandle:
    """A version the ranks published: its weights file, loaded into ``policy`` (the
    flow process's, which the engine generates with) when asked for tensors."""

    version: int
    file: Path
    policy: Any

    def state(self) -> Any:
        self.policy.load_weights(self.file)
        return self.policy.weights()

    def save(self, path: Path, dtype: str | None = None) -> None:
        if dtype is None:
            shutil.copyfile(self.file, path)
        else:
            self.state()
            self.policy.save_weights(path, dtype)

    def frozen(self) -> "ShardedHandle":
        return self  # a published version's file does not change


# --------------------------------------------------------------------------- learner


class ShardedLearner:
    """The train stage's learner over ``ranks`` FSDP2 processes (gfcr.core.services.Learner).
    ``policy`` is the flow process's own (the engine's): warm starts train it, and
    :meth:`publish` sends its weights to the ranks."""

    def __init__(self, setup: ShardSetup, ranks: int, policy: Any, where: Path) -> None:
        if not isinstance(setup.stage, ShardedTrainer):
            raise ShardedLearnerError(
                f"train stage {type(setup.stage).__name__}: its learner cannot be sharded "
                "(the stage has no rank_worker); run it in this process (learner.ranks=0)")
        self.setup, self.policy, self.where = setup, policy, Path(where)
        self.where.mkdir(parents=True, exist_ok=True)
        self.store = WeightStore(Path(setup.weights), policy.io, keep=setup.keep)
        self._version, self._meta = 0, {"updates": 0, "reference": False}
        self._loaded_from: Path | None = None
        self.failed: str | None = None
        self.closed = False
        self.log = self.where / "ranks.log"
        self.pids: list[int] = []
        """The ranks' process ids, by rank."""
        try:
            self.ranks, self.conns = sharded_ranks.start(ranks, self.log, setup.timeout_s)
        except StartFailed as err:
            raise ShardedLearnerError(f"sharded learner: {err}\n--- {self.log} ---\n"
                                      f"{_tail(self.log)}") from None
        self.pids = [int(pid) for pid in self._call_setup()]

    @property
    def version(self) -> int:
        return self._version

    def update(self, ctx: StepContext, batch: pa.Table) -> tuple[TrainResult, WeightHandle]:
        new = self._version + 1
        result = self._call("update", ctx.step, ctx.policy_version, batch, new)
        self._version = new
        return result, self.handle()

    def handle(self) -> WeightHandle:
        return ShardedHandle(self._version, self.store.path(self._version) / WEIGHTS,
                             self.policy)

    def publish(self) -> WeightHandle:
        """The flow process's policy (a warm start trained it) as the next version."""
        file = self.where / f".publish-{os.getpid()}.safetensors"
        self.policy.save_weights(file)
        try:
            self.load_weights(file, self._version + 1)
        finally:
            file.unlink(missing_ok=True)
        return self.handle()

    def state_dict(self) -> dict[str, Any] | None:
        """Where the ranks' state is (the DCP folder beside the weights) and what the
        next update depends on besides it; written by :meth:`save_weights`."""
        return {"sharded": DCP, **self._meta}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if state is None:
            return
        if "sharded" not in state or self._loaded_from is None:
            raise ShardedLearnerError(
                "the checkpoint holds an in-process learner's state, not a sharded one "
                f"({DCP}); resume it with learner.ranks=0 (in this process)")
        folder = self._loaded_from.parent / str(state["sharded"])
        meta = {"updates": int(state["updates"]), "reference": bool(state["reference"])}
        self._call("restore", str(folder), meta)
        self._meta = meta

    def save_weights(self, path: Path) -> None:
        """The current version's weights file, and the ranks' sharded state beside it."""
        shutil.copyfile(self.store.path(self._version) / WEIGHTS, path)
        self._meta = self._call("save", str(Path(path).parent / DCP))

    def load_weights(self, path: Path, version: int) -> None:
        self._call("load", str(path), version)
        self._version, self._loaded_from = version, Path(path)

    def logprobs(self, prompts: list[list[int]], completions: list[list[int]],
                 temperature: float) -> list[list[float]]:
        return list(self._call("logprobs", prompts, completions, temperature))

    def restart(self, stage: Any, policy: Any = None) -> None:
        """The initial weights again (of another policy component, when given), under
        ``stage``'s learner: a benchmark or test compares several on one process group."""
        self._call("restart", stage, policy)
        self._call("publish", 0)
        self._version = 0

    def close(self) -> None:
        """Stop the ranks (at once when they failed); again: nothing."""
        if self.closed:
            return
        self.closed = True
        if self.failed is None:
            for conn in self.conns:
                try:
                    send(conn, ("stop", ()))
                except OSError:
                    pass
            self.ranks.wait(60)
        self.ranks.stop()
        for conn in self.conns:
            conn.close()

    # ------------------------------------------------------------------ calls

    def _call_setup(self) -> list[Any]:
        for conn in self.conns:
            send(conn, self.setup)
        return self._answers()

    def _call(self, name: str, *args: Any) -> Any:
        if self.failed is not None:
            raise ShardedLearnerError(f"the sharded learner failed earlier: {self.failed}")
        try:
            for conn in self.conns:
                send(conn, (name, args))
        except OSError:
            pass  # a dead rank: _answers names it
        return self._answers()[0]

    def _answers(self) -> list[Any]:
        """Every rank's answer, in rank order; a failure, death or silence fails."""
        answers: dict[int, Any] = {}
        deadline = time.monotonic() + self.setup.timeout_s
        while len(answers) < len(self.conns):
            waiting = [c for r, c in enumerate(self.conns) if r not in answers]
            ready, _, _ = select.select(waiting, [], [], 1.0)
            for conn in ready:
                rank = self.conns.index(conn)
                answers[rank] = self._answer(rank, conn)
            if not ready and time.monotonic() > deadline:
                self._fail(f"no answer from rank(s) {sorted(set(range(len(self.conns))) - set(answers))} "
                           f"in {self.setup.timeout_s:g} s")
        return [answers[r] for r in range(len(self.conns))]

    def _answer(self, rank: int, conn: socket.socket) -> Any:
        try:
            kind, value = pickle.loads(wire.read_frame(conn.fileno(),
                                                       time.monotonic() + self.setup.timeout_s))
        except (wire.PeerGone, TimeoutError, OSError):
            self._fail(f"rank {rank} is gone (its connection closed mid-answer)")
        if kind == "error":
            last = str(value).strip().splitlines()[-1]
            self._fail(f"rank {rank} failed: {last}\n{value}")
        return value

    def _fail(self, why: str) -> Any:
        """Stop the group and raise, naming the rank that died (its exit status) when
        one did."""
        self.ranks.wait(2)  # a rank that failed is exiting
        cause = self.ranks.cause()
        self.ranks.stop()
        self.failed = (cause + "; " if cause else "") + why.splitlines()[0]
        tail = _tail(self.log)
        raise ShardedLearnerError(
            f"sharded learner: {cause + '; ' if cause else ''}{why}" +
            (f"\n--- {self.log} (end) ---\n{tail}" if tail else ""))


# --------------------------------------------------------------------------- process


def _tail(log: Path, lines: int = 30) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
