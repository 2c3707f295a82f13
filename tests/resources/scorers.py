"""User scorers for verifier tests: a slow one and a hostile in-process one."""

from __future__ import annotations

import threading
import time


def slow(completion: str, answer: str | None, meta: str | None) -> float:
    """Hangs (as a pathological parser can) far past any sensible timeout."""
    time.sleep(30)
    return 1.0


def nan(completion: str, answer: str | None, meta: str | None) -> float:
    return float("nan")


RELEASE = threading.Event()
"""Set by a test to let :func:`hangs_on_hang` return."""


def hangs_on_hang(completion: str, answer: str | None, meta: str | None) -> float:
    """Hangs on the completion 'hang' until released (at most 30 s); else scores 1."""
    if completion == "hang":
        RELEASE.wait(30)
    return 1.0


def sleepy(completion: str, answer: str | None, meta: str | None) -> float:
    """Takes a tenth of a second a call."""
    time.sleep(0.1)
    return 1.0


def broken(completion: str, answer: str | None, meta: str | None) -> float:
    raise KeyError("the scorer's own bug")


def always_fails(completion: str, answer: str | None, meta: str | None) -> float:
    """Raises the same error on every rollout, as a scorer with a bug does."""
    raise ValueError("this scorer always fails")


def fails_on_odd(completion: str, answer: str | None, meta: str | None) -> float:
    """Raises one error on every completion of odd length; 0.0 on the others."""
    if len(completion) % 2:
        raise ValueError("odd-length completion")
    return 0.0


def even_length(completion: str, answer: str | None, meta: dict | None) -> float:
    """1.0 for a completion of even length: about half of a random policy's samples are
    right, so pass@k and flips have something to count (tests/gfcr/test_own_data.py)."""
    return float(len(completion) % 2 == 0)
