"""Scorers that build the pathologies ``gfcr doctor`` looks for, in real short runs."""

from __future__ import annotations


def digit_credit(completion: str, answer: str | None, meta: str | None) -> float:
    """Partial credit for digits, whatever the answer: exploitable (a policy that writes
    "0000" earns 0.9 on every prompt while never being right)."""
    return 0.9 * sum(c.isdigit() for c in completion) / max(len(completion), 1)


def brevity(completion: str, answer: str | None, meta: str | None) -> float:
    """Pays for stopping early, never for being right: lengths collapse."""
    return 0.9 * max(0.0, 1.0 - len(completion) / 12)


def flaky(completion: str, answer: str | None, meta: str | None) -> float:
    """Raises on about a third of the completions (by a hash of the text) and scores the
    rest 0: never on every rollout of a step, which would end the run (Verify)."""
    if sum(map(ord, completion)) % 9 < 3:
        raise ValueError(f"cannot parse {completion!r}")
    return 0.0
