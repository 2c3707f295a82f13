"""Checkpoint file I/O for torch policies (gfcr.core.policy.TensorIO): the runtime's
checkpoints (gfcr.checkpoints.checkpoint) call it through the policy, so gfcr itself needs no torch.

Weights go to a safetensors file and load strictly onto the model's device; the state file
is ``torch.save`` of the learner state and random generator states, loaded with
``weights_only=True``, so nothing in a checkpoint runs code. That loader accepts tensors
and plain Python data but not numpy arrays, so numpy's generator key is held as a tensor.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


class TorchIO:
    """Writes and reads a torch policy's checkpoint files (stateless: one is shared)."""

    def save_weights(self, model: Any, path: Path, dtype: str | None = None) -> None:
        """The model's weights; cast to ``dtype`` when it is not theirs (an engine's
        dtype: the file a worker loads is then no larger than what it computes with)."""
        import torch
        from safetensors.torch import save_file, save_model

        # getattr: a torch dtype by its config name ("bfloat16")
        want = None if dtype is None else getattr(torch, dtype)
        state = model.state_dict()
        if want is None or all(t.dtype == want for t in state.values()):
            save_model(model, str(path))
            return
        save_file({k: t.detach().to(want).contiguous() for k, t in state.items()}, str(path))

    def load_weights(self, model: Any, path: Path) -> None:
        from safetensors.torch import load_model

        device = next(model.parameters()).device
        load_model(model, str(path), strict=True, device=str(device))

    def save_state(self, state: dict[str, Any], path: Path) -> None:
        import torch

        torch.save(state, path)

    def load_state(self, path: Path) -> dict[str, Any]:
        import torch

        loaded: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
        return loaded

    def rng_state(self) -> dict[str, Any]:
        """torch's, CUDA's and numpy's global generators."""
        import numpy as np
        import torch

        np_state = np.random.get_state(legacy=False)
        return {
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "numpy": {"bit_generator": np_state["bit_generator"],
                      "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
                      "pos": int(np_state["state"]["pos"]),
                      "has_gauss": int(np_state["has_gauss"]), "gauss": float(np_state["gauss"])},
        }

    def set_rng_state(self, rng: dict[str, Any]) -> None:
        import numpy as np
        import torch

        torch.set_rng_state(rng["torch"])
        if rng["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        n = rng["numpy"]
        np.random.set_state({"bit_generator": n["bit_generator"], "has_gauss": n["has_gauss"],
                             "gauss": n["gauss"], "state": {
                                 "key": n["key"].numpy().astype(np.uint32), "pos": n["pos"]}})


TORCH_IO = TorchIO()
