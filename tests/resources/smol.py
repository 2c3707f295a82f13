"""The converted SmolLM2-135M-Instruct for tests: the developer's cache (``.gfcr``) when
it holds it, else converted once into a temporary run root; a skip (a failure under
``CI=true``) without the wheel (README, "A real model: SmolLM2")."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stages.engines import smollm2


def smol_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run root whose cache holds the converted model."""
    cached = Path(".gfcr")
    if (smollm2.model_dir(cached) / smollm2.MARKER).is_file():
        return cached
    try:
        smollm2.gguf_file()
    except smollm2.ModelUnavailable as err:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true: {err}")
        pytest.skip(str(err))
    root = tmp_path_factory.mktemp("smol-root")
    smollm2.import_model(root)
    return root
