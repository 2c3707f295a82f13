"""One GPU shared by vLLM and the learner (issue 33): the memory share vLLM is started
with beside the learner's resident state, and sleep mode on by default only where it
exists (in this process, on a GPU)."""

from __future__ import annotations

import pytest
import torch

from stages.engines.vllm import VLLM, colocated_share

GIB = 2**30


def _weights(n: int, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A module of ``n`` parameters that holds no memory (torch's meta device)."""
    return torch.nn.Linear(n, 1, bias=False, device="meta", dtype=dtype)


@pytest.mark.parametrize("params, dtype, total_gib, share", [
    (500_000_000, torch.float32, 144, 0.848),  # 0.5B fp32 on an H200: 4 x 2 GB resident
    (500_000_000, torch.bfloat16, 144, 0.874),  # the same in bf16: half the bytes
    (7_000_000_000, torch.float32, 80, 0.1),    # 7B fp32 on 80 GB: nothing left, the floor
    (1_000_000, torch.float32, 80, 0.9),        # a tiny model: vLLM's own default, the cap
])
def test_the_colocated_share_leaves_room_for_the_learners_resident_state(
        params, dtype, total_gib, share):
    assert colocated_share(_weights(params, dtype), total_gib * GIB) == pytest.approx(share,
                                                                                      abs=1e-3)


def test_sleep_mode_is_on_by_default_only_when_colocated_on_a_gpu():
    cuda = torch.cuda.is_available()
    assert VLLM()._sleeps() is cuda  # in this process: on exactly when there is a GPU
    assert VLLM(in_process=False)._sleeps() is False
    assert VLLM(sleep_mode=True)._sleeps() and not VLLM(sleep_mode=False)._sleeps()
