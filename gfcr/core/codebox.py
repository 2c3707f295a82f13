"""Running model-written code, for any stage: the sandbox reached through gfcr.

The sandbox (bubblewrap namespaces, a memory cgroup, rlimits) lives with the code
verifiers in ``stages.sandbox``, which provides itself here when it is imported
(``import stages`` does). An environment's tool (``stages.envs``) runs code through
:func:`run_code`, so it needs no other kind's folder, and every caller gets the same
confinement and the same verdicts.
"""

from __future__ import annotations

from typing import Literal, Protocol

Isolation = Literal["namespaces", "unsafe"]


class CodeOutcome(Protocol):
    """How a sandboxed run ended: ``verdict`` ("ok", "failed", "error", or a limit:
    "cpu_time", "wall_time", "memory", "file_size", "processes", ...), its output."""

    @property
    def verdict(self) -> str: ...

    @property
    def stdout(self) -> str: ...

    @property
    def stderr(self) -> str: ...

    @property
    def seconds(self) -> float: ...


class CodeRunner(Protocol):
    """Runs a Python program under limits; never raises for what the program does."""

    def __call__(self, source: str, *, isolation: Isolation, cpu_seconds: int,
                 wall_seconds: float, memory_mb: int, file_mb: int) -> CodeOutcome: ...


_RUNNERS: list[CodeRunner] = []


def provide(runner: CodeRunner) -> None:
    """Make ``runner`` the one :func:`run_code` uses (the sandbox module calls this)."""
    _RUNNERS[:] = [runner]


def run_code(source: str, *, isolation: Isolation = "namespaces", cpu_seconds: int = 2,
             wall_seconds: float = 5.0, memory_mb: int = 256, file_mb: int = 1) -> CodeOutcome:
    """Run ``source`` in the sandbox under these limits. Raises ``RuntimeError`` when no
    sandbox was provided (``stages`` not imported), and whatever the sandbox raises when
    it cannot isolate (it names the opt-in)."""
    if not _RUNNERS:
        raise RuntimeError("no code sandbox is provided: import stages (its "
                           "stages.sandbox provides one)")
    return _RUNNERS[0](source, isolation=isolation, cpu_seconds=cpu_seconds,
                       wall_seconds=wall_seconds, memory_mb=memory_mb, file_mb=file_mb)
