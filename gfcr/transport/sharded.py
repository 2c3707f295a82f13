"""A learner sharded over processes (gfcr.core.services.Learner): the train stage's learner on
FSDP2, in a process group started beside the flow process.

``Pipeline(learner=LearnerPlacement(ranks=N))`` puts it in place of the in-process
learner (gfcr.launch.placement). The run starts N processes of ``python -m
stages.train.fsdp_rank`` (gloo on CPU, NCCL on GPUs; gfcr.transport.sharded_ranks: they
meet in a file store, nothing of theirs listens beyond loopback); each rank
connects back to this process over a local socket, authenticated by a key in its
environment, and this process sends every command to every rank, so no rank idles in a
collective while the loop generates. Replies come back on the same sockets.

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
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from gfcr.core.services import WeightHandle
from gfcr.core.stage import StepContext, TrainResult
from gfcr.weights.versions import WEIGHTS, WeightStore
from gfcr.transport import sharded_ranks
from gfcr.transport.sharded_ranks import ADDRESS, KEY, StartFailed

__all__ = ["ADDRESS", "KEY", "ShardedLearner", "ShardedLearnerError", "Setup"]
DCP = "learner.dcp"
"""The ranks' sharded checkpoint, beside the checkpoint's weights file."""
_HEADER = struct.Struct("!Q")


class ShardedLearnerError(RuntimeError):
    """A rank failed or died, or the group did not answer in time; names the rank."""


class FlowGone(ConnectionError):
    """The flow process closed the connection (a rank then just exits)."""


@dataclass(frozen=True)
class Setup:
    """What every rank needs to build its shard of the learner (pickled to it)."""

    policy: Any
    """The pipeline's policy component: each rank builds the same initial weights."""
    stage: Any
    """The train stage, whose ``learner(policy, seed=)`` the ranks drive."""
    seed: int
    run_id: str
    weights: str
    """The folder the ranks publish weight versions in (gfcr.weights.versions)."""
    keep: int
    device: str
    offload: bool
    timeout_s: float


# --------------------------------------------------------------------------- wire


def send(conn: socket.socket, value: Any) -> None:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    conn.sendall(_HEADER.pack(len(data)) + data)


def receive(conn: socket.socket) -> Any:
    """The next message; FlowGone when the other end closed."""
    (size,) = _HEADER.unpack(_exactly(conn, _HEADER.size))
    return pickle.loads(_exactly(conn, size))


def _exactly(conn: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = conn.recv(min(left, 1 << 20))
        if not chunk:
            raise FlowGone("the connection closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def connect(rank: int) -> socket.socket:
    """A rank's connection to the flow process, introduced by the key and its rank
    (raw bytes: the flow process unpickles nothing from an unknown peer)."""
    host, port = os.environ[ADDRESS].rsplit(":", 1)
    conn = socket.create_connection((host, int(port)))
    conn.sendall(bytes.fromhex(os.environ[KEY]) + struct.pack("!I", rank))
    return conn


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

    def __init__(self, setup: Setup, ranks: int, policy: Any, where: Path) -> None:
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
            kind, value = receive(conn)
        except (FlowGone, OSError):
            self._fail(f"rank {rank} is gone (its connection closed)")
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
