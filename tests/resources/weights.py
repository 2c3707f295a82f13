"""Policy weights for the engine tests: drawn wider than the default init, so greedy text
varies from token to token instead of repeating one character."""

from __future__ import annotations

from typing import Any

import torch


def wide(policy: Any, seed: int) -> Any:
    """``policy`` with every weight matrix redrawn from N(0, 0.2^2) (a generator seeded
    with ``seed``; the 1-d norms and biases kept); returns ``policy``."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.model.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    return policy
