"""math-verify's comparison in a module of its own: a scorer worker process
(:mod:`gfcr.procs.scorer_workers`) that scores math imports this and math-verify, nothing more."""

from __future__ import annotations

import logging
from typing import Any

import math_verify


def _not_the_timeout_notice(record: logging.LogRecord) -> bool:
    """math-verify warns on every call that its timeouts are off: they are meant to be,
    the worker's deadline bounds the call (a line per call would flood the console)."""
    return not record.getMessage().startswith("Timeout is disabled")


for _name in ("math_verify.grader", "math_verify.parser"):
    logging.getLogger(_name).addFilter(_not_the_timeout_notice)


class MathScore:
    """1.0 when the completion's last parsable expression equals the reference answer
    mathematically, else 0.0. math-verify's own signal-based timeouts are off (they only
    work on a main thread); Verify's ``timeout`` bounds the call instead."""

    def __call__(self, completion: str, answer: Any, meta: Any) -> float:
        if answer is None:
            raise ValueError("math verifier: the rollout has no reference answer")
        gold = math_verify.parse(str(answer), parsing_timeout=None)
        pred = math_verify.parse(completion, parsing_timeout=None)
        return float(math_verify.verify(gold, pred, timeout_seconds=None))

    def warm(self) -> None:
        """Build math-verify's parsers once, when a worker loads the scorer, so that its
        first call is not charged for them."""
        self("\\boxed{1}", "1", None)
