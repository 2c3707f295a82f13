"""The learner's memory: the peak of one step, reported as the ``peak_memory_mb`` step
metric, and gradient checkpointing.

The peak: on CUDA it is torch's own count: ``max_memory_allocated`` after
``reset_peak_memory_stats`` (tensors only, the allocator's cache excluded). On CPU torch
keeps no such count, so it is the process's peak resident set (Linux ``VmHWM``), reset at
the start of the step by writing ``5`` to ``/proc/self/clear_refs`` (proc(5)): weights,
optimizer state and everything else resident count, as they do for the machine. Where
that file cannot be written (not Linux) the figure is the process's lifetime peak
(``getrusage``) and says so with ``peak_memory_scope`` 0 instead of 1.

Gradient checkpointing (Chen et al. 2016, "Training Deep Nets with Sublinear Memory
Cost") is transformers' own, per decoder layer.
"""

from __future__ import annotations

import resource
from pathlib import Path
from typing import Any

import torch

_CLEAR_REFS, _STATUS = Path("/proc/self/clear_refs"), Path("/proc/self/status")


class PeakMemory:
    """``with PeakMemory(device) as peak: ...`` then ``peak.metrics()``."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.per_step, self.mb = device, False, 0.0

    def __enter__(self) -> "PeakMemory":
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self.per_step = True
        else:
            try:
                _CLEAR_REFS.write_text("5")
                self.per_step = True
            except OSError:
                self.per_step = False
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            self.mb = torch.cuda.max_memory_allocated(self.device) / 2**20
        else:
            self.mb = _peak_rss_mb(self.per_step)

    def metrics(self) -> dict[str, float]:
        return {"peak_memory_mb": self.mb, "peak_memory_scope": float(self.per_step)}


def _peak_rss_mb(since_reset: bool) -> float:
    """``VmHWM`` (peak resident set since the last reset) in MiB, or ``ru_maxrss``."""
    if since_reset:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return float(line.split()[1]) / 1024  # kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def checkpoint_layers(model: Any, label: str) -> None:
    """Recompute each layer's activations in the backward instead of keeping them
    (transformers' gradient checkpointing; only in training mode, so the engine's
    decoding sharing the model is unaffected)."""
    if not getattr(model, "supports_gradient_checkpointing", False):  # getattr: any module
        raise ValueError(f"stage {label!r}: gradient_checkpointing=True but the policy's "
                         f"model ({type(model).__name__}) does not support it")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
