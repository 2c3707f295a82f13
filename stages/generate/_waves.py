"""Turn-waves: chat requests from many agent threads, generated in batched engine calls.

Agents run on their own threads and call the endpoint whenever they like; the engine and
the tokenizer are used from one thread only, the generate stage's (an HF engine shares its
model with the trainer, a vLLM ``LLM`` is not meant to be called from several threads, and
a fast tokenizer used from several threads at once can fail with "Already borrowed"). The
server's request threads put :class:`Ask` items (the request's messages) on a
:class:`Waves` queue and wait; the stage's thread takes a wave (:meth:`Waves.gather`),
renders each ask's prompt ids, generates them all in one ``engine.generate`` call and
answers each.

A wave closes as soon as every live episode is waiting on the model (nothing else can
arrive; this makes the waves of agents that only talk to the model deterministic), or
``window`` seconds after its first ask, so an agent busy with a tool delays the others by
at most the window.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from stages.generate._episodes import Call, Episode


@dataclass
class Ask:
    """One chat request, waiting for its answer."""

    episode: Episode
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    max_tokens: int
    stop: tuple[str, ...] = ()
    call: Call | None = None
    """Its prompt ids and record, once rendered on the stage's thread."""
    done: threading.Event = field(default_factory=threading.Event)
    response: dict[str, Any] | None = None
    error: str | None = None
    """Why no response came (the episode ended, the step ended, a bad request)."""
    status: int = 503
    code: str | None = None
    """The API error's code (``context_length_exceeded``), when it has one."""

    def answer(self, response: dict[str, Any]) -> None:
        self.response = response
        self.done.set()

    def fail(self, status: int, error: str, code: str | None = None) -> None:
        self.status, self.error, self.code = status, error, code
        self.done.set()


class Waves:
    """The queue between the server's request threads and the stage's thread."""

    def __init__(self, window: float) -> None:
        self.window = window
        self._asks: list[Ask] = []
        self._cond = threading.Condition()
        self._closed: str | None = None
        self._woken = False

    def put(self, ask: Ask) -> None:
        """Queue ``ask`` (answered at once with an error once the queue is closed)."""
        with self._cond:
            if self._closed is not None:
                ask.fail(503, self._closed)
                return
            self._asks.append(ask)
            self._cond.notify_all()

    def wake(self) -> None:
        """An episode ended: a :meth:`gather` waiting for a first ask returns (empty), so
        the caller can start the next episode; one filling a wave looks again."""
        with self._cond:
            self._woken = True
            self._cond.notify_all()

    def gather(self, live: Callable[[], int], timeout: float) -> list[Ask]:
        """The next wave: waits up to ``timeout`` for a first ask, then until as many asks
        wait as ``live()`` episodes are running, or ``window`` seconds have passed since
        the first one. Empty when nothing came or an episode ended (the caller checks
        its episodes)."""
        with self._cond:
            self._cond.wait_for(lambda: bool(self._asks) or self._woken or live() == 0,
                                timeout)
            self._woken = False
            if not self._asks:
                return []
            until = time.monotonic() + self.window
            while len(self._asks) < live() and (left := until - time.monotonic()) > 0:
                self._cond.wait(left)
            wave, self._asks = self._asks, []
            return wave

    def drop(self, episode: Episode, reason: str) -> None:
        """Answer the queued asks of ``episode`` with ``reason`` (it timed out)."""
        with self._cond:
            for ask in [a for a in self._asks if a.episode is episode]:
                ask.fail(410, reason)
                self._asks.remove(ask)

    def close(self, reason: str) -> None:
        """Answer every queued ask with ``reason`` and refuse new ones."""
        with self._cond:
            self._closed = reason
            for ask in self._asks:
                ask.fail(503, reason)
            self._asks = []
