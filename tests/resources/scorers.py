"""User scorers for verifier tests: a slow one and a hostile in-process one."""

from __future__ import annotations

import time


def slow(completion: str, answer: str | None, meta: str | None) -> float:
    """Hangs (as a pathological parser can) far past any sensible timeout."""
    time.sleep(30)
    return 1.0


def nan(completion: str, answer: str | None, meta: str | None) -> float:
    return float("nan")
