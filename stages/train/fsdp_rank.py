"""One rank of a sharded learner, on FSDP2: the :class:`gfcr.core.sharding.RankWorker`
that :meth:`stages.train.grpo.GRPO.rank_worker` builds in each process that gfcr's rank
program (gfcr.transport.sharded_rank) starts.

It joins the group (gloo on CPU, NCCL on GPUs) in the file store the program names,
builds the policy, shards it (stages.train.fsdp) and builds the stage's learner over it,
with the learner's collectives set to this group (stages.train.ranks). The program sends
it the flow process's commands; every rank runs each in step with the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch
import torch.distributed as dist

from gfcr.core.sharding import RankPlace, ShardSetup
from gfcr.core.stage import StepContext, TrainResult
from stages.train import fsdp
from stages.train.ranks import Shardable


@dataclass(frozen=True)
class _Gathered:
    """A full state dict on rank 0, as gfcr.weights.versions.WeightStore.publish writes it."""

    state: dict[str, torch.Tensor]

    def save(self, path: Path, dtype: str | None = None) -> None:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in self.state.items()}, str(path))


class Rank:
    """One process's policy shard and learner (gfcr.core.sharding.RankWorker)."""

    def __init__(self, stage: Any, setup: ShardSetup, place: RankPlace) -> None:
        self.setup, self.rank = setup, place.rank
        self.device = _device(setup.device, place.local_rank)
        store = dist.FileStore(place.store, place.world)  # nothing listens
        dist.init_process_group("nccl" if self.device.type == "cuda" else "gloo",
                                store=store, rank=place.rank, world_size=place.world,
                                timeout=timedelta(seconds=setup.timeout_s))
        self.component = setup.policy
        self.restart(stage)

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

    def update(self, ctx: StepContext, batch: pa.Table) -> TrainResult:
        result = self.learner.update(ctx, batch)
        peaks: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(peaks, (result.metrics.get("peak_memory_mb", 0.0),
                                       fsdp.state_mb(self.policy.model,
                                                     self.learner.optimizer)))
        for r, (peak, state) in enumerate(peaks):
            result.metrics[f"peak_memory_mb/rank{r}"] = float(peak)
            result.metrics[f"state_mb/rank{r}"] = float(state)
        result.metrics["peak_memory_mb"] = max(float(peak) for peak, _ in peaks)
        return result

    def gathered(self) -> _Gathered | None:
        """The weights gathered to rank 0, one name per tied tensor (as safetensors'
        readers expect); None on the other ranks."""
        state = fsdp.full_state(self.policy.model)
        if self.rank != 0:
            return None
        names = _names(self.policy.model)
        return _Gathered({k: v for k, v in state.items() if k in names})

    def load(self, path: str) -> None:
        """Load a full weights file (rank 0 reads it)."""
        state: dict[str, Any] = {}
        if self.rank == 0:
            from safetensors.torch import load_file

            state = _all_names(self.policy.model, load_file(path), path)
        fsdp.load_full(self.policy.model, state)

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

    def close(self) -> None:
        dist.destroy_process_group()


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
