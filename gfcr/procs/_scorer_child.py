"""The worker side of :mod:`gfcr.procs.scorer_workers`: load scorers, call them, answer in JSON.

Requests are pickles from the run (``("load", key, pickled scorer)`` or ``("score", key,
args)``); answers are JSON objects: ``{"value": float}`` or ``{"error": "Type: message",
"type": "module.Type"}``, each with the CPU seconds the request took. Whatever a scorer
raises, ``SystemExit`` included, is an answer; a scorer that ends the process some other
way leaves the run to say so. Standard library only, beyond what the scorers import.
"""

from __future__ import annotations

import json
import pickle
import time
from typing import Any, Callable

from gfcr.procs import childproc


def main(args: list[str]) -> None:
    requests, answers = int(args[0]), int(args[1])
    _first_to_go()
    scorers: dict[str, Callable[..., Any]] = {}
    while (frame := childproc.recv(requests)) is not None:
        childproc.send(answers, json.dumps(_answer(pickle.loads(frame), scorers)).encode())


def _first_to_go() -> None:
    """Offer this worker to the kernel's out-of-memory killer before the run: a scorer
    that a completion sends into a huge computation should take itself down, not the
    trainer (the run then records the call's failure)."""
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:  # not Linux: nothing to offer
        pass


def _answer(message: tuple[Any, ...], scorers: dict[str, Callable[..., Any]]) -> dict[str, Any]:
    kind, key, body = message
    cpu = time.process_time()
    try:
        if kind == "load":
            scorer = pickle.loads(body)
            warm = getattr(scorer, "warm", None)  # getattr: an optional hook of the scorer
            if callable(warm):
                warm()
            scorers[key] = scorer
            answer: dict[str, Any] = {"loaded": True}
        else:
            answer = {"value": float(scorers[key](*body))}
    except BaseException as err:  # noqa: BLE001 - a scorer may raise anything: an answer
        kind_of = type(err)
        answer = {"error": f"{kind_of.__name__}: {err}"[:500],
                  "type": f"{kind_of.__module__}.{kind_of.__qualname__}"}
    answer["cpu"] = time.process_time() - cpu
    return answer
