"""The program of one sharded-learner process: ``python -m stages.train.fsdp_rank``, N of
them started by gfcr.transport.sharded_ranks (``RANK``, ``WORLD_SIZE`` and a file store
in their environment: the group meets in the store, nothing of it listens beyond loopback).

Each rank connects to the flow process (the address and key in its environment), takes
its setup (the policy component, the train stage, the seed), builds the policy, shards it
(stages.train.fsdp) and builds the stage's learner over it. Then it serves commands:
every rank receives each command from the flow process directly (so no rank waits in a
collective between updates, however long generation takes), runs it in step with the
others, and answers; rank 0's answer carries the value. A rank that fails answers with
its traceback and exits; the flow process then stops the others: the learner is gone
and the run fails, naming the rank.
"""

from __future__ import annotations

import os
import socket
import sys
import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import torch
import torch.distributed as dist

from gfcr.core.stage import StepContext, TrainResult
from gfcr.weights.versions import WeightStore
from gfcr.transport import sharded, sharded_ranks
from stages.engines.torch_io import TORCH_IO
from stages.train import fsdp
from stages.train.ranks import Shardable


class _NoTask:
    """The task of a rank's step context: a learner trains on the batch it is given,
    and never reads the task, which stays in the flow process."""

    def train_prompts(self) -> pa.Table:
        raise TypeError("a sharded learner's rank has no task")

    def heldout_prompts(self) -> pa.Table:
        raise TypeError("a sharded learner's rank has no task")

    def score(self, completion: str, answer: str | None, meta: str | None) -> float:
        raise TypeError("a sharded learner's rank has no task")


_NO_TASK = _NoTask()


@dataclass(frozen=True)
class _Gathered:
    """A full state dict on rank 0, as gfcr.weights.versions.WeightStore.publish writes it."""

    state: dict[str, torch.Tensor]

    def save(self, path: Path, dtype: str | None = None) -> None:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in self.state.items()}, str(path))


class Rank:
    """One process's policy shard and learner, and the commands the flow process sends."""

    def __init__(self, setup: sharded.Setup, device: torch.device) -> None:
        self.setup, self.device = setup, device
        self.rank = dist.get_rank()
        self.store = WeightStore(Path(setup.weights), TORCH_IO, keep=setup.keep)
        self.component = setup.policy
        self.restart(setup.stage)

    def restart(self, stage: Any, component: Any = None) -> None:
        """A fresh policy (the component's initial weights; another ``component``'s when
        given) and ``stage``'s learner."""
        setup = self.setup
        self.component = self.component if component is None else component
        build = self.component.build
        policy = build(seed=setup.seed)
        fsdp.shard(policy.model, self.device, offload=setup.offload)
        learner = stage.learner(policy, seed=setup.seed)
        if not isinstance(learner, Shardable):
            raise TypeError(f"stage {stage.label!r}: its learner "
                            f"({type(learner).__name__}) cannot be sharded (it has no "
                            "ranks, optimizer, updates and reference)")
        learner.ranks = fsdp.Collective(lambda: build(seed=setup.seed).model,
                                        self.device, offload=setup.offload)
        learner.device = self.device
        self.policy, self.learner = policy, learner

    def update(self, step: int, version: int, batch: pa.Table, new: int) -> TrainResult:
        ctx = StepContext(run_id=self.setup.run_id, step=step, seed=self.setup.seed,
                          policy_version=version, task=_NO_TASK)
        result = self.learner.update(ctx, batch)
        peaks: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(peaks, (result.metrics.get("peak_memory_mb", 0.0),
                                       fsdp.state_mb(self.policy.model,
                                                     self.learner.optimizer)))
        for r, (peak, state) in enumerate(peaks):
            result.metrics[f"peak_memory_mb/rank{r}"] = float(peak)
            result.metrics[f"state_mb/rank{r}"] = float(state)
        result.metrics["peak_memory_mb"] = max(float(peak) for peak, _ in peaks)
        self.publish(new)
        return result

    def publish(self, version: int) -> None:
        """Gather the weights to rank 0, which writes them as ``version``."""
        state = fsdp.full_state(self.policy.model)
        if self.rank == 0:  # one name per tied tensor, as safetensors' readers expect
            names = _names(self.policy.model)
            self.store.publish(_Gathered({k: v for k, v in state.items() if k in names}),
                               version, self.setup.run_id)

    def load(self, path: str, version: int) -> None:
        """Load a full weights file (rank 0 reads it) and publish it as ``version``."""
        state: dict[str, Any] = {}
        if self.rank == 0:
            from safetensors.torch import load_file

            state = _all_names(self.policy.model, load_file(path), path)
        fsdp.load_full(self.policy.model, state)
        self.publish(version)

    def save(self, path: str) -> dict[str, Any]:
        """A sharded checkpoint of the learner in the DCP folder ``path``; what else the
        next update depends on, for the flow process's checkpoint."""
        learner = self.learner
        fsdp.save_sharded(Path(path), self.policy.model, learner.optimizer, learner.reference)
        return {"updates": learner.updates, "reference": learner.reference is not None}

    def restore(self, path: str, meta: dict[str, Any]) -> None:
        learner = self.learner
        learner.reference = learner.ranks.frozen_copy(self.policy.model) \
            if meta["reference"] else None
        fsdp.load_sharded(Path(path), self.policy.model, learner.optimizer,
                          learner.reference)
        learner.updates = int(meta["updates"])

    def logprobs(self, prompts: list[list[int]], completions: list[list[int]],
                 temperature: float) -> list[list[float]]:
        return list(self.learner.logprobs(prompts, completions, temperature))


def _names(model: torch.nn.Module) -> set[str]:
    """The model's tensors by one name each (a tied weight by its first name)."""
    kept = model.state_dict().keys()
    return {n for n, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()
                                                        if n in kept}


def _all_names(model: torch.nn.Module, state: dict[str, Any], path: str
               ) -> dict[str, Any]:
    """``state`` under every name of each tied tensor (a file holds one of them, which
    one depends on its writer); ValueError naming what the file lacks."""
    aliases: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(param), []).append(name)
    out = dict(state)
    for names in aliases.values():
        found = [n for n in names if n in state]
        for name in names if found else ():
            out.setdefault(name, state[found[0]])
    missing = sorted(model.state_dict().keys() - out.keys())
    if missing:
        raise ValueError(f"weights file {path!r} lacks {len(missing)} tensor(s) of the "
                         f"policy, e.g. {missing[:3]!r}")
    return out


def _device(kind: str, local_rank: int) -> torch.device:
    if kind == "cuda" or (kind == "auto" and torch.cuda.is_available()):
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def serve(conn: socket.socket, rank: int) -> None:
    """Set up, then run commands until told to stop (or the flow process is gone)."""
    setup = sharded.receive(conn)
    if not isinstance(setup, sharded.Setup):
        raise TypeError(f"rank {rank}: the first message is {type(setup).__name__}, "
                        "not the learner's setup")
    device = _device(setup.device, int(os.environ.get("LOCAL_RANK", "0")))
    world = int(os.environ["WORLD_SIZE"])
    store = dist.FileStore(os.environ[sharded_ranks.STORE], world)  # nothing listens
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=store,
                            rank=rank, world_size=world,
                            timeout=timedelta(seconds=setup.timeout_s))
    worker = Rank(setup, device)
    worker.publish(0)
    sharded.send(conn, ("ok", os.getpid()))
    commands: dict[str, Callable[..., Any]] = {"update": worker.update, "load": worker.load, "save": worker.save,
                "restore": worker.restore, "logprobs": worker.logprobs,
                "restart": worker.restart, "publish": worker.publish}
    while True:
        name, args = sharded.receive(conn)
        if name == "stop":
            break
        value = commands[name](*args)
        sharded.send(conn, ("ok", value if rank == 0 else None))
    dist.destroy_process_group()


def main() -> None:
    rank = int(os.environ["RANK"])
    conn = sharded.connect(rank)
    try:
        serve(conn, rank)
    except sharded.FlowGone:
        sys.exit(0)  # the flow process ended: nothing to answer
    except BaseException:
        sharded.send(conn, ("error", traceback.format_exc()))
        sys.exit(1)


if __name__ == "__main__":
    main()
