"""verifiers in the tests: present (the ``[envs]`` extra, which CI installs), or a skip on
a developer's machine and a failure under CI."""

from __future__ import annotations

import os
from typing import Any

import pytest


def needs_verifiers() -> Any:
    """``verifiers.v1``: a skip without it, a failure under CI=true."""
    try:
        import verifiers.v1 as vf
    except ImportError as err:
        message = f"verifiers is not installed ({err}); pip install -e '.[envs]'"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true: {message}")
        pytest.skip(message, allow_module_level=True)
    return vf
