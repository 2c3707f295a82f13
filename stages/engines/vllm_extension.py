"""gfcr's worker extension for vLLM's own server (``--worker-extension-cls``): load a
published weights version (gfcr.runner.weights) into the running engine, in place.

vLLM mixes this class into its worker, so a client calls its methods through the
server's ``POST /collective_rpc`` route (``VLLM_SERVER_DEV_MODE=1``), which passes
string arguments only. ``gfcr_load(folder)`` reads the folder's manifest (written last,
so a folder with one is complete), loads its safetensors through vLLM's own
``reload_weights`` from an iterator, and returns the manifest's ``version`` and ``id``;
``gfcr_loaded()`` says which it holds. The iterator adds the tied output head when the
file left it out (safetensors' ``save_model`` drops a shared tensor; vLLM's reload keeps
a stale head without it, see ``stages.engines._vllm_run._save_tied``).

The client (stages.engines._fleet_client) then drops the prefix cache and relabels the engine's
weight version, so every token vLLM samples afterwards is tagged with it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

MANIFEST = "manifest.json"  # gfcr.runner.weights.MANIFEST; not imported: the worker loads this alone


class WeightsByVersion:
    """Methods vLLM adds to each of its workers (no state of its own but the label)."""

    _gfcr_loaded: dict[str, Any] | None = None

    def gfcr_load(self, folder: str) -> dict[str, Any]:
        """Load the complete version published in ``folder``; its manifest's fields."""
        path = Path(folder)
        manifest = path / MANIFEST
        if not manifest.is_file():
            raise FileNotFoundError(f"gfcr_load: {folder} has no {MANIFEST}: not a complete "
                                    f"published version")
        info = json.loads(manifest.read_text())
        files = [path / name for name in info.get("files", [])]
        # getattr: vLLM's worker, which this class extends
        runner = getattr(self, "model_runner")
        reload = getattr(self, "reload_weights")
        reload(weights_iterator=_tensors(files, _tied(runner)))
        loaded = {"version": int(info["version"]), "id": str(info.get("id", ""))}
        self._gfcr_loaded = loaded
        return loaded

    def gfcr_loaded(self) -> dict[str, Any] | None:
        """The version this worker loaded through :meth:`gfcr_load` (None: the weights
        it started with)."""
        return self._gfcr_loaded


def _tied(runner: Any) -> bool:
    config = runner.model_config.hf_config
    return bool(getattr(config, "tie_word_embeddings", False))  # getattr: per architecture


def _tensors(files: list[Path], tied: bool) -> Iterator[tuple[str, Any]]:
    from safetensors import safe_open

    names: set[str] = set()
    embed = None
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                tensor = f.get_tensor(name)
                names.add(name)
                if name.endswith("embed_tokens.weight"):
                    embed = (name, tensor)
                yield name, tensor
    head = "lm_head.weight"
    if tied and head not in names and embed is not None:
        yield head, embed[1]
