"""Token ids back to text for a stored run: its policy's tokenizer, rebuilt from the run's
stored spec (gfcr.core.capabilities.DecodesTokens), never the model.

The store keeps each turn's token ids, not its text; the report and ``gfcr ui`` show every
turn as text through :func:`run_decoder`, and the ids only where no tokenizer can be had
(a checkpoint whose files are not on this machine, a policy type no longer installed).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import yaml

from gfcr.core.capabilities import DecodesTokens
from gfcr.core.registry import lookup

Decode = Callable[[Sequence[int]], str]

_CACHE: dict[str, Decode | None] = {}
_LOCK = threading.Lock()


def run_decoder(spec_yaml: str | None) -> Decode | None:
    """The ``decode`` of the policy in ``spec_yaml`` (a run's stored spec), or None where
    it cannot be had; built once per spec text in this process."""
    if not spec_yaml:
        return None
    with _LOCK:
        if spec_yaml not in _CACHE:
            _CACHE[spec_yaml] = _build(spec_yaml)
        return _CACHE[spec_yaml]


def _build(spec_yaml: str) -> Decode | None:
    try:
        data: object = yaml.safe_load(spec_yaml)
        policy = data.get("policy") if isinstance(data, dict) else None
        if not isinstance(policy, dict) or not isinstance(policy.get("type"), str):
            return None
        spec = lookup("policy", policy["type"])(**policy)
        return spec.decoder() if isinstance(spec, DecodesTokens) else None
    except Exception:  # noqa: BLE001 - an old or foreign spec: the ids are shown instead
        return None


def safe(decode: Decode | None) -> Decode | None:
    """``decode`` that falls back to the ids as text on ids its tokenizer refuses."""
    if decode is None:
        return None

    def run(ids: Sequence[int]) -> str:
        try:
            return decode(ids)
        except Exception:  # noqa: BLE001 - an id outside the vocabulary
            return " ".join(map(str, ids))
    return run
