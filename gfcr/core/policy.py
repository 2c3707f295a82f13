"""The trainable policy: its model and tokenizer, its version, and how its framework writes
and reads its tensors (:class:`TensorIO`), so checkpoints and published weight versions
need no tensor library in gfcr. The learner owns it; an in-process engine may share it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gfcr.core.engine import Tokenizer


class TensorIO(Protocol):
    """How a policy's framework writes and reads checkpoint files (gfcr.checkpoints.checkpoint), so the
    runtime needs no tensor library: the weights, a state file of tensors and plain data
    that loads without running code, and the framework's global random generators (with
    numpy's, in a form its state file holds). stages.engines.torch_io is torch's."""

    def save_weights(self, model: Any, path: Path, dtype: str | None = None) -> None:
        """Write ``model``'s weights to ``path``, cast to ``dtype`` (a name such as
        "bfloat16"; None: as the model holds them)."""
        ...

    def load_weights(self, model: Any, path: Path) -> None: ...

    def save_state(self, state: dict[str, Any], path: Path) -> None: ...

    def load_state(self, path: Path) -> dict[str, Any]: ...

    def rng_state(self) -> dict[str, Any]: ...

    def set_rng_state(self, rng: dict[str, Any]) -> None: ...


@dataclass
class Policy:
    """The trainable policy: the learner's (gfcr.core.services.Learner), which an in-process
    engine may share. Only the engines, the learner and these methods touch ``model``
    (tools/policy_model.py checks it).

    ``model`` is a causal LM with the transformers call convention
    (``model(input_ids=..., attention_mask=...).logits``).
    """

    model: Any
    tokenizer: Tokenizer
    version: int = 0
    remedy: str = ""
    """What to change in the pipeline when the tokenizer cannot represent a task's text
    (e.g. "set policy.tokenizer='byte'"); quoted by the check at the start of a run."""
    io: TensorIO | None = None
    """How checkpoints write and read this policy's tensors (None: it cannot be
    checkpointed); set by the policy component that builds it."""
    adapter: dict[str, Any] | None = None
    """The adapter the learner trains over this policy's frozen weights (peft's LoRA
    config: stages.train.lora), set when the learner is built; None: it trains every
    weight. An engine that must prepare for adapters when it starts (vLLM's
    ``enable_lora``) reads it."""

    def weights(self) -> Any:
        """The live tensors (the model's state dict): what an in-process handle holds."""
        return self.model.state_dict()

    def load(self, state: Any) -> None:
        """Copy ``state`` (a state dict) into the model in place."""
        self.model.load_state_dict(state)

    def save_weights(self, path: Path, dtype: str | None = None) -> None:
        self._io().save_weights(self.model, path, dtype)

    def load_weights(self, path: Path) -> None:
        self._io().load_weights(self.model, path)

    def _io(self) -> TensorIO:
        if self.io is None:
            raise TypeError("the policy has no tensor I/O (gfcr.core.policy.Policy.io), so its "
                            "weights cannot be written or read; its policy component must "
                            "set one (stages.engines.torch_io.TORCH_IO for torch models)")
        return self.io
