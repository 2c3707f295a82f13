"""LoRA adapters through peft: what the learner trains and the engines apply, shared.

LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models") adds to a
frozen linear layer ``W`` a trained low-rank update ``(alpha / r) * B @ A``, with ``B``
zero at the start, so the adapted model starts equal to its base. peft injects the
adapter layers into the model's own modules in place (``inject_adapter_in_model``): an
engine that shares the learner's module generates with the adapter with nothing to
move; one with its own copy gets the adapter tensors (:class:`AdapterState`) and
:func:`apply` s them; vLLM loads a folder in peft's format (:func:`write_folder`).

The learner (stages.train.lora) injects the adapter at its first update, after any warm
start has trained the base; this module knows no learner and no engine.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch

ADAPTER_FILE, CONFIG_FILE = "adapter_model.safetensors", "adapter_config.json"
"""peft's file names for an adapter folder (vLLM's LoRA loader reads the same)."""
PREFIX = "base_model.model."
"""The prefix peft writes before module names in an adapter file (a PeftModel's path to
the base model), which vLLM strips when it reads one."""
_META = "gfcr_lora"


def lora_config(config: dict[str, Any]) -> Any:
    """peft's ``LoraConfig`` from ``config`` (its fields: r, lora_alpha, lora_dropout,
    target_modules)."""
    from peft import LoraConfig

    return LoraConfig(**config)


def inject(model: torch.nn.Module, config: dict[str, Any], *, seed: int) -> bool:
    """Inject the LoRA layers of ``config`` into ``model`` in place, base frozen; whether
    it injected (False: it had them). ``A`` is drawn from a generator seeded by ``seed``,
    the caller's torch generator left as it was, so a run is reproducible."""
    if has_adapter(model):
        return False
    from peft import inject_adapter_in_model

    devices = [p.device for p in model.parameters() if p.is_cuda][:1]
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        inject_adapter_in_model(lora_config(config), model)
    return True


def has_adapter(model: torch.nn.Module) -> bool:
    """Whether peft has injected an adapter into ``model``."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    return any(isinstance(m, BaseTunerLayer) for m in model.modules())


def adapter_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The adapter's parameters (what the optimizer gets), in module order."""
    return [p for n, p in model.named_parameters() if ".lora_" in n]


def _peft_name(name: str) -> str:
    """``...q_proj.lora_A.default.weight`` -> ``...q_proj.lora_A.weight`` (peft's file
    names drop the adapter's name)."""
    return name.replace(".default.", ".")


@dataclass(frozen=True)
class AdapterState:
    """One version of an adapter: its peft config and tensors by peft's names (no adapter
    name, no ``base_model.model.`` prefix). The live parameters' tensors unless copied."""

    config: dict[str, Any]
    tensors: dict[str, torch.Tensor]

    def copied(self) -> "AdapterState":
        return AdapterState(dict(self.config),
                            {k: v.detach().clone() for k, v in self.tensors.items()})

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())


def state_of(model: torch.nn.Module, config: dict[str, Any]) -> AdapterState:
    """The adapter of ``model`` (live tensors)."""
    return AdapterState(config, {_peft_name(n): p.detach() for n, p in
                                 model.named_parameters() if ".lora_" in n})


def apply(model: torch.nn.Module, state: AdapterState, *, seed: int = 0) -> None:
    """Copy ``state`` into ``model``'s adapter in place, injecting it first if missing."""
    inject(model, state.config, seed=seed)
    params = {_peft_name(n): p for n, p in model.named_parameters() if ".lora_" in n}
    if params.keys() != state.tensors.keys():
        missing = sorted(set(state.tensors) ^ set(params))[:3]
        raise ValueError(f"lora: the adapter's tensors do not match the model's adapter "
                         f"layers (e.g. {missing}); same target_modules and r on both sides?")
    with torch.no_grad():
        for name, param in params.items():
            param.copy_(state.tensors[name])


def write_folder(state: AdapterState, folder: Path, *, dtype: str | None = None,
                 base: str = "") -> None:
    """Write ``state`` to ``folder`` in peft's format (``adapter_model.safetensors``,
    ``adapter_config.json``), cast to ``dtype``; ``base``: see :func:`write_file`."""
    folder.mkdir(parents=True, exist_ok=True)
    write_file(state, folder / ADAPTER_FILE, dtype=dtype, base=base)
    (folder / CONFIG_FILE).write_text(json.dumps(state.config, indent=2, sort_keys=True))


def write_file(state: AdapterState, path: Path, *, dtype: str | None = None,
               base: str = "") -> None:
    """The adapter's tensors as peft's ``adapter_model.safetensors`` holds them
    (``base_model.model.`` names), its config and ``base`` (a fingerprint of the base
    weights) in the file's metadata."""
    from safetensors.torch import save_file

    want = None if dtype is None else getattr(torch, dtype)  # a torch dtype by name
    tensors = {PREFIX + k: (v if want is None else v.to(want)).detach().cpu().contiguous()
               for k, v in state.tensors.items()}
    save_file(tensors, str(path),
              metadata={"format": "pt", _META: json.dumps(state.config), "base": base})


def is_adapter_file(path: Path) -> bool:
    """Whether ``path`` is an adapter file written by :func:`write_folder`."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return _META in (f.metadata() or {})


def read_file(path: Path) -> tuple[AdapterState, str]:
    """The adapter in ``path`` (a file :func:`write_folder` wrote) and its base fingerprint."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        tensors = {k[len(PREFIX):]: f.get_tensor(k) for k in f.keys()}
    return AdapterState(json.loads(meta[_META]), tensors), meta.get("base", "")


def fingerprint(model: torch.nn.Module) -> str:
    """A sha256 over the base weights (every tensor but the adapter's): what an adapter
    was trained on, checked when a checkpoint's adapter is loaded on a rebuilt base."""
    digest = hashlib.sha256()
    for name, tensor in _base_tensors(model):
        digest.update(name.encode())
        flat = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
        digest.update(flat.numpy().data)  # the tensor's own bytes, no copy
    return digest.hexdigest()


def _base_tensors(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    for name, tensor in model.state_dict().items():
        if ".lora_" not in name:
            yield name, tensor


class disabled:
    """Within it, ``model`` runs as its base (every adapter layer off): the frozen
    reference of a KL term is the base itself, no copy."""

    def __init__(self, model: torch.nn.Module) -> None:
        from peft.tuners.tuners_utils import BaseTunerLayer

        self.layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]

    def __enter__(self) -> None:
        for layer in self.layers:
            layer.enable_adapters(False)

    def __exit__(self, *exc: Any) -> None:
        for layer in self.layers:
            layer.enable_adapters(True)
