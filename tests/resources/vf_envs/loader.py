"""An environment module with ``load_environment(**args)`` returning a ``vf.Env`` (the
single-turn environment's taskset, ``num_tasks`` of them)."""

from __future__ import annotations

import sys
from typing import Any

import verifiers.v1 as vf

from tests.resources.vf_envs import single


def load_environment(num_tasks: int = 3) -> Any:
    sys.modules.setdefault("gfcr_test_vf_single", single)  # an id verifiers can import
    config = vf.resolve_env_config({"taskset": {"id": "gfcr_test_vf_single",
                                                "num_tasks": num_tasks}})
    return vf.load_environment(config)
