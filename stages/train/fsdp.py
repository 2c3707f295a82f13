"""FSDP2 for the sharded learner's processes (gfcr.transport.sharded starts them;
gfcr.transport.sharded_rank is their program, stages.train.fsdp_rank their shard).

Each process holds a shard of every parameter, gradient and AdamW moment:
``fully_shard`` (torch.distributed.fsdp, "FSDP2": per-parameter sharding over DTensor,
Zhao et al. 2023 for FSDP) wraps each decoder layer and then the root, so a forward
gathers one layer at a time and a backward reduce-scatters its gradients. Gradients are
*summed* over processes, not averaged as FSDP does by default: each process's loss is
already divided by the whole batch's counts (stages.train.ranks). On a GPU the layers
compute in bf16 with fp32 reductions and fp32 master weights (``MixedPrecisionPolicy``);
``offload`` keeps the shards and the optimizer state in CPU memory (``CPUOffloadPolicy``).

Weights leave as a full state dict gathered to rank 0 (on CPU) once per version; the
learner's state goes to a sharded checkpoint (torch.distributed.checkpoint, DCP: each
process writes its shards), which any number of processes can load.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_state_dict, set_model_state_dict,
                                                     set_state_dict)
from torch.distributed.fsdp import (CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy,
                                    OffloadPolicy, fully_shard)

from stages.train.ranks import Pack, padded_parts


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks: modules whose class transformers lists in the
    model's ``_no_split_modules`` (LlamaDecoderLayer, GPT2Block, ...)."""
    # getattr: a transformers model declares it; another causal LM may not
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise TypeError(f"sharded learner: cannot find the decoder layers of "
                        f"{type(model).__name__} (no module of a class in its "
                        f"_no_split_modules={sorted(names)!r}), so it cannot be sharded")
    return layers


def shard(model: torch.nn.Module, device: torch.device, *, offload: bool) -> None:
    """``fully_shard`` each decoder layer, then the root, in place; gradients summed
    over processes. bf16 compute with fp32 reductions on a GPU."""
    mixed = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if device.type == "cuda" else MixedPrecisionPolicy()
    place: OffloadPolicy = CPUOffloadPolicy() if offload else OffloadPolicy()
    if not offload:
        model.to(device)
    for layer in decoder_layers(model):
        fully_shard(layer, mp_policy=mixed, offload_policy=place)
    fully_shard(model, mp_policy=mixed, offload_policy=place)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM


def full_state(model: torch.nn.Module) -> dict[str, Any]:
    """The whole model's weights on rank 0 in CPU memory (empty on the other ranks);
    every rank must call it."""
    return get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_full(model: torch.nn.Module, state: dict[str, Any]) -> None:
    """Load a full state dict given on rank 0 (``{}`` elsewhere) into the shards."""
    set_model_state_dict(model, state, options=StateDictOptions(
        full_state_dict=True, broadcast_from_rank0=True))


def save_sharded(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 reference: torch.nn.Module | None) -> None:
    """Each rank writes its shards of the weights, AdamW state and KL reference to the
    DCP folder ``path``."""
    import torch.distributed.checkpoint as dcp

    dcp.save(_templates(model, optimizer, reference), checkpoint_id=str(path))


def load_sharded(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 reference: torch.nn.Module | None) -> None:
    """Load the DCP folder ``path`` into this process group's shards, whatever the
    number of processes that wrote it (DCP reshards on load)."""
    import torch.distributed.checkpoint as dcp

    state = _templates(model, optimizer, reference)
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    if reference is not None:
        set_model_state_dict(reference, state["reference"])


def _templates(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               reference: torch.nn.Module | None) -> dict[str, Any]:
    weights, optim = get_state_dict(model, optimizer)
    state: dict[str, Any] = {"model": weights, "optim": optim}
    if reference is not None:
        state["reference"] = get_model_state_dict(reference)
    return state


def state_mb(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> float:
    """MiB this rank holds of the weights, gradients and optimizer state (its shards)."""
    from torch.distributed.tensor import DTensor

    def local(t: torch.Tensor) -> int:
        t = t.to_local() if isinstance(t, DTensor) else t
        return t.numel() * t.element_size()

    total = 0
    for p in model.parameters():
        total += local(p) + (local(p.grad) if p.grad is not None else 0)
    for state in optimizer.state.values():
        total += sum(local(v) for v in state.values() if isinstance(v, torch.Tensor))
    return total / 2**20


class Collective:
    """The learner's processes as one update sees them (stages.train.ranks.Ranks), over
    the default process group. ``build`` makes a fresh unsharded model of the policy's
    architecture (for the KL reference)."""

    def __init__(self, build: Callable[[], torch.nn.Module], device: torch.device, *,
                 offload: bool) -> None:
        self.build, self.device, self.offload = build, device, offload
        self.rank, self.world = dist.get_rank(), dist.get_world_size()

    def parts(self, rows: list[int], lengths: list[int], pack: Pack
              ) -> list[list[int] | None]:
        return padded_parts(rows, lengths, pack, self.rank, self.world)

    def total(self, values: dict[str, float]) -> dict[str, float]:
        gathered: list[dict[str, float] | None] = [None] * self.world
        dist.all_gather_object(gathered, values)
        out: dict[str, float] = {}
        for part in gathered:  # rank order: the same float sums on every process
            for key, value in (part or {}).items():
                out[key] = out.get(key, 0.0) + value
        return out

    def frozen_copy(self, model: torch.nn.Module) -> torch.nn.Module:
        """A second sharded model holding ``model``'s current weights, with no gradient."""
        ref = self.build()
        shard(ref, self.device, offload=self.offload)
        set_model_state_dict(ref, get_model_state_dict(model))
        ref.eval()
        for p in ref.parameters():
            p.requires_grad_(False)
        return ref
