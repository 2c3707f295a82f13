"""LoRA training: the GRPO stage's ``lora`` option and the learner's side of it.

With ``GRPO(lora=LoraSpec(...))`` the learner trains a LoRA adapter (Hu et al. 2021)
over the policy's frozen weights, through peft (:mod:`stages.lora`):

- the adapter is injected into the policy's module at the learner's first update, after
  any warm start has trained the base (the warm start and its cache see the plain
  model); ``B`` starts at zero, so the first update starts from the warmed-up policy;
- the optimizer holds the adapter's parameters only, and so does its state;
- weights leave the learner as the adapter alone (:class:`AdapterHandle`): an engine
  sharing the module has nothing to move, one with its own copy copies the adapter,
  vLLM loads it as a LoRA (``enable_lora``, set when the engine starts from
  ``Policy.adapter``), a file sync writes the adapter folder in peft's format;
- a checkpoint holds the adapter (``model.safetensors``, with a fingerprint of the base
  in its metadata) and the adapter's optimizer state; a resumed run rebuilds the base
  (the policy, and the warm start from its cache: gfcr.launch.run) and refuses an adapter
  whose base fingerprint differs (a sha256 over the base weights: one pass over them,
  at the first update and at a resume);
- a KL term's frozen reference is the base itself (the adapter switched off), no copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import Field

from gfcr.core.policy import Policy
from gfcr.core.spec import Spec
from stages import lora as peft_lora


class LoraSpec(Spec):
    """A LoRA adapter on the policy: ``W + (alpha / r) * B @ A`` on each target module.

    >>> LoraSpec(r=8, alpha=16)  # doctest: +ELLIPSIS
    LoraSpec(r=8, alpha=16.0, dropout=0.0, target_modules=(...))
    """

    r: int = Field(8, ge=1, le=512)
    """Rank of the update (vLLM serves ranks up to 512)."""
    alpha: float = Field(16.0, gt=0.0)
    """Scale numerator: the update is multiplied by ``alpha / r``."""
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    """Dropout on the adapter's input while training (0: the learner's forward equals the
    engine's, which the off-policy correction assumes)."""
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj",
                                       "gate_proj", "up_proj", "down_proj")
    """Names of the linear modules to adapt (peft matches a module whose name ends with
    one); the default is every linear layer of a Llama block."""

    def peft_config(self) -> dict[str, Any]:
        """peft's ``LoraConfig`` fields for this spec."""
        return {"r": self.r, "lora_alpha": self.alpha, "lora_dropout": self.dropout,
                "target_modules": sorted(self.target_modules)}


@dataclass(frozen=True)
class AdapterHandle:
    """One version of the adapter (gfcr.core.services.WeightHandle): the live adapter tensors,
    or a copy of them (``frozen``)."""

    adapter: peft_lora.AdapterState
    version: int
    base: str = ""
    """The base weights' fingerprint (:func:`stages.lora.fingerprint`)."""

    def state(self) -> peft_lora.AdapterState:
        return self.adapter

    def save(self, path: Path, dtype: str | None = None) -> None:
        """The adapter's tensor file (peft's names, its config in the metadata): a
        checkpoint's weights. A file sync writes the whole folder (:meth:`save_folder`)."""
        peft_lora.write_file(self.adapter, path, dtype=dtype, base=self.base)

    def save_folder(self, folder: Path, dtype: str | None = None) -> list[str]:
        """Write the adapter folder (peft's format, what vLLM's LoRA loader reads); the
        names of the files written."""
        peft_lora.write_folder(self.adapter, folder, dtype=dtype, base=self.base)
        return [peft_lora.ADAPTER_FILE, peft_lora.CONFIG_FILE]

    def frozen(self) -> "AdapterHandle":
        return AdapterHandle(self.adapter.copied(), self.version, self.base)


class LoraTraining:
    """The learner's adapter: injected at the first update (:meth:`start`), after which
    it is what trains, hands out and checkpoints."""

    def __init__(self, spec: dict[str, Any], policy: Policy, *, seed: int) -> None:
        self.config, self.policy, self.seed = spec, policy, seed
        self.base = ""
        policy.adapter = dict(spec)  # engines that start now prepare for adapters

    @property
    def active(self) -> bool:
        return bool(self.base)

    def start(self) -> bool:
        """Inject the adapter, base frozen (once); whether it did so now."""
        if self.active:
            return False
        model = self.policy.model
        peft_lora.inject(model, self.config, seed=self.seed)
        self.base = peft_lora.fingerprint(model)
        return True

    def parameters(self) -> list[torch.nn.Parameter]:
        return peft_lora.adapter_parameters(self.policy.model)

    def handle(self, version: int) -> AdapterHandle | None:
        """The adapter as a weight handle; None before it is injected (the whole policy's
        weights are then what a generator loads)."""
        if not self.active:
            return None
        return AdapterHandle(peft_lora.state_of(self.policy.model, self.config), version,
                             self.base)

    def save(self, path: Path) -> bool:
        """Write the adapter file to ``path``; False before it is injected."""
        found = self.handle(self.policy.version)
        if found is None:
            return False
        found.save(path)
        return True

    def load(self, path: Path) -> bool:
        """Load the adapter file ``path`` (injecting it first); False when ``path`` holds
        whole weights, not an adapter. Refuses an adapter trained on another base."""
        if not peft_lora.is_adapter_file(path):
            return False
        state, base = peft_lora.read_file(path)
        self.start()
        if base and base != self.base:
            raise ValueError(
                f"lora: the adapter in {str(path)!r} was trained on other base weights "
                f"(fingerprint {base[:12]}, this run's base is {self.base[:12]}): the "
                "policy or the warm start differ from the run that wrote it")
        peft_lora.apply(self.policy.model, state)
        return True

    def reference(self) -> Any:
        """A context in which the policy runs as its base: the KL term's reference."""
        return peft_lora.disabled(self.policy.model)
