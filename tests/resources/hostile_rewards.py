"""A user scorer that returns an astronomical reward (issue 26's 1e308 drill)."""

from __future__ import annotations


def astronomical(completion: str, answer: str | None, meta: str | None) -> float:
    """1e308 for a completion of even length, 0 for an odd one: groups that are not flat."""
    return 1e308 if len(completion) % 2 == 0 else 0.0
