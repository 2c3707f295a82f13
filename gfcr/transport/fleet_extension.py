"""gfcr's worker extension for vLLM's own server (``--worker-extension-cls``): load a
published weights version (gfcr.weights.versions) into the running engine, in place.

vLLM mixes this class into its worker; gfcr's gate on the server
(gfcr.transport.fleet_gate, ``POST /gfcr/load``, the fleet's key required) is the only way
to call it: the server has no ``/collective_rpc`` route, so no other worker method
(``save_sharded_state``, ``reload_weights`` on any path) is reachable over HTTP.

``gfcr_load(folder)`` checks everything before it touches the model (issue 30): the
folder is a published version under the server's weights root with a manifest naming
plain files of its own folder whose SHA-256 match (gfcr.weights.published); every file
parses as safetensors; the tensors' names and shapes are exactly those of the checkpoint
the server started from (the embedding and output head: either, a tied model's file holds
one) and their dtypes floating point. Only then are the tensors, held
in memory, handed to vLLM's own ``reload_weights``, so a bad request leaves the previous
weights serving and the server alive (vLLM's reload empties the layers first: a file that
failed halfway left a half-loaded model that died at its next generate). It returns the
manifest's ``version`` and ``id``; the gate labels the weights with them. The embedding
or head the file left out is added from the other (safetensors' ``save_model`` drops a
shared tensor; vLLM's reload keeps a stale one without it, see
``stages.engines._vllm_run._save_tied``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gfcr.weights.published import BadVersion, Checked, check
from gfcr.transport.fleet_gate import ROOT_ENV  # set by gfcr engine serve
HEAD = "lm_head.weight"
FLOATS = ("float32", "float16", "bfloat16")


class WeightsByVersion:
    """Methods vLLM adds to each of its workers (no state of its own but the label and
    the shapes of the checkpoint the server started from)."""

    _gfcr_loaded: dict[str, Any] | None = None
    _gfcr_shapes: dict[str, tuple[int, ...]] | None = None

    def gfcr_load(self, folder: str) -> dict[str, Any]:
        """Load the complete version published in ``folder`` (checked first: see the
        module); its manifest's ``version`` and ``id``."""
        root = os.environ.get(ROOT_ENV)
        if not root:
            raise BadVersion(f"gfcr_load: the server has no weights root ({ROOT_ENV}); "
                             f"start it with `gfcr engine serve --weights-root DIR`")
        checked = check(folder, root)
        # getattr: vLLM's worker, which this class extends
        runner = getattr(self, "model_runner")
        tensors = _tensors(checked, self._gfcr_expected(runner))
        getattr(self, "reload_weights")(weights_iterator=iter(tensors))
        loaded = {"version": checked.version, "id": checked.ident}
        self._gfcr_loaded = loaded
        return loaded

    def gfcr_loaded(self) -> dict[str, Any] | None:
        """The version this worker loaded through :meth:`gfcr_load` (None: the weights
        it started with)."""
        return self._gfcr_loaded

    def _gfcr_expected(self, runner: Any) -> dict[str, tuple[int, ...]]:
        """Tensor name -> shape of the checkpoint the server started from (its
        safetensors headers, read once)."""
        if self._gfcr_shapes is None:
            self._gfcr_shapes = _shapes(Path(str(runner.model_config.model)))
        return self._gfcr_shapes


def _shapes(model: Path) -> dict[str, tuple[int, ...]]:
    from safetensors import safe_open

    files = sorted(model.glob("*.safetensors")) if model.is_dir() else []
    if not files:
        raise BadVersion(f"gfcr_load: the server's model {str(model)!r} is not a folder of "
                         f"safetensors files, so a load cannot be checked against it")
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                shapes[name] = tuple(f.get_slice(name).get_shape())
    return shapes


def _tensors(checked: Checked, expected: dict[str, tuple[int, ...]]) -> list[tuple[str, Any]]:
    """Every tensor of ``checked``'s files, parsed and compared with ``expected``; the
    input embedding and output head both given when the file holds one of them.
    BadVersion naming the file and tensor otherwise."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    out: dict[str, Any] = {}
    for name, data in checked.blobs.items():
        where = checked.folder / name
        try:
            tensors = load(data)
        except (SafetensorError, ValueError, RuntimeError) as err:
            raise BadVersion(f"{where}: not a safetensors file ({err})") from None
        for key, tensor in tensors.items():
            if key in out:
                raise BadVersion(f"{where}: tensor {key!r} is in two files")
            if str(tensor.dtype).removeprefix("torch.") not in FLOATS:
                raise BadVersion(f"{where}: tensor {key!r} is {tensor.dtype}, not one of "
                                 f"{FLOATS}")
            out[key] = tensor
    pair = _tied_pair(expected)
    if not pair & set(out):
        raise BadVersion(f"{checked.folder}: neither of the tied tensors {sorted(pair)}")
    missing = sorted(set(expected) - set(out) - pair)
    unknown = sorted(set(out) - set(expected) - pair)
    if missing or unknown:
        raise BadVersion(f"{checked.folder}: tensors do not match the served model's: "
                         f"missing {missing[:5]}, unknown {unknown[:5]}")
    shared = next((expected[k] for k in sorted(pair) if k in expected), None)
    for key, tensor in out.items():
        want = expected[key] if key in expected else shared  # else: a tied one
        if want is not None and tuple(tensor.shape) != want:
            raise BadVersion(f"{checked.folder}: tensor {key!r} has shape "
                             f"{tuple(tensor.shape)}, the served model's {want}")
    for key in pair - set(out):  # safetensors keeps one of a shared pair: both go in
        out[key] = out[next(iter(pair - {key}))]
    return list(out.items())


def _tied_pair(expected: dict[str, tuple[int, ...]]) -> set[str]:
    """The input embedding and the output head, which a tied model shares: safetensors
    writes one of a shared pair (either), so a file may hold one; both are handed to
    vLLM (a model whose head is not tied gets both from gfcr's files)."""
    embed = next((k for k in expected if k.endswith("embed_tokens.weight")), None)
    return {embed, HEAD} if embed is not None else {HEAD}
