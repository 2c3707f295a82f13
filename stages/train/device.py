"""Where the learner's work runs, read from the model at every update, and its optimizer
fitted to it.

The learner is built before the engine places the policy (the HF engine moves the model
to CUDA when it is built, ``HF(device="auto")`` on any GPU machine), and a model may be
moved or cast after that. So nothing here is remembered from the build: the device and
dtype are the trained weights' own when an update starts (:func:`placement`), and an
optimizer made for another placement is made again, its state carried over
(:func:`refit`; ``load_state_dict`` casts the state to each parameter's device and dtype).
That was the first bug gfcr met on a GPU (issue 33): the learner kept the CPU it was
built on and the first update failed with "Expected all tensors to be on the same
device".

AdamW (Loshchilov & Hutter 2019) uses torch's fused kernel on CUDA (one launch for every
parameter's update instead of a few per tensor), the multi-tensor ``foreach`` one
elsewhere. Its state (two moments a weight, 8 bytes a parameter in fp32) may leave the
GPU between updates (:func:`move_state`), for an engine that shares the GPU with the
learner (``GRPO(offload_optimizer=True)``), at the cost of a host round trip per update.
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch

Placement = tuple[torch.device, torch.dtype]


def placement(params: Iterable[torch.Tensor]) -> Placement:
    """``(device, dtype)`` of the first trained weight: where the update's tensors go."""
    for p in params:
        return p.device, p.dtype
    raise ValueError("placement: the model has no parameters to train")


def adamw(params: list[torch.nn.Parameter], lr: float) -> torch.optim.AdamW:
    """AdamW with betas (0.9, 0.999) and no weight decay over ``params``: torch's fused
    kernel when every one is a plain CUDA tensor (not a sharded DTensor), else the
    default (``foreach``). Fused and foreach compute the same update up to rounding."""
    fused = bool(params) and all(p.device.type == "cuda" and not _sharded(p) for p in params)
    return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), weight_decay=0.0,
                             fused=fused or None)


def refit(optimizer: torch.optim.Optimizer,
          make: Callable[[], torch.optim.Optimizer]) -> torch.optim.Optimizer:
    """A new optimizer from ``make`` (over the same parameters, now elsewhere) holding
    ``optimizer``'s state, cast to each parameter's device and dtype."""
    state = optimizer.state_dict()
    fresh = make()
    fresh.load_state_dict(state)
    return fresh


def move_state(optimizer: torch.optim.Optimizer, to: torch.device | None) -> None:
    """Every state tensor to ``to`` (offload: the CPU), or back beside its parameter
    (None). AdamW's ``step`` counter lives on the CPU unless the kernel is fused or
    capturable, so it goes back there."""
    for group in optimizer.param_groups:
        on_device = bool(group.get("fused") or group.get("capturable"))
        for p in group["params"]:
            state = optimizer.state.get(p, {})
            for key, value in state.items():
                if not isinstance(value, torch.Tensor):
                    continue
                where = to if to is not None else (
                    p.device if key != "step" or on_device else torch.device("cpu"))
                if value.device != where:
                    state[key] = value.to(where)


def state_device(optimizer: torch.optim.Optimizer) -> torch.device | None:
    """Where the optimizer's moments are (None: no state yet)."""
    for state in optimizer.state.values():
        for key, value in state.items():
            if key != "step" and isinstance(value, torch.Tensor):
                return value.device
    return None


def floats(values: dict[str, torch.Tensor]) -> dict[str, float]:
    """0-d tensors as floats, in one device-to-host copy (one sync per update)."""
    if not values:
        return {}
    stacked = torch.stack([v.reshape(()).double() for v in values.values()]).tolist()
    return dict(zip(values, stacked))


def scalar(norm: torch.Tensor) -> float:
    """The clipped-before norm as a float; a sharded model's is a replicated DTensor."""
    if torch.distributed.is_available():
        from torch.distributed.tensor import DTensor

        if isinstance(norm, DTensor):
            return float(norm.full_tensor())
    return float(norm)


def fitted(optimizer: torch.optim.Optimizer, placed: Placement,
           params: list[torch.nn.Parameter], make: Callable[[], torch.optim.Optimizer]
           ) -> tuple[torch.optim.Optimizer, Placement]:
    """The optimizer for where ``params`` are now, its state beside them, and that
    placement. Made again by ``make``, with its state, when the weights moved or changed
    dtype since ``placed``, or are other tensor objects than the ones it holds (a model
    materialised from the "meta" device, or converted with tensor swapping, gets new
    parameter objects: an optimizer over the old ones would update orphans)."""
    now = placement(params)
    held = [p for group in optimizer.param_groups for p in group["params"]]
    same = len(held) == len(params) and all(a is b for a, b in zip(held, params))
    if now != placed or not same:
        if len(held) != len(params) and optimizer.state:
            raise ValueError(f"learner: the model now has {len(params)!r} trained tensors "
                             f"but its optimizer state is for {len(held)!r}; the model "
                             "was changed (tied or untied weights?) after an update")
        optimizer = refit(optimizer, make) if len(held) == len(params) else make()
    move_state(optimizer, None)
    return optimizer, now


def _sharded(p: torch.Tensor) -> bool:
    if not torch.distributed.is_available():
        return False
    from torch.distributed.tensor import DTensor

    return isinstance(p, DTensor)
