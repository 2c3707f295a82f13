"""A sandbox for model-written code: a throw-away Python process in fresh namespaces.

Reward code must never run model output in the trainer's process: verl #7603 (a math
grader calling ``eval()`` on model text, CVE-2026-6878) shows one poisoned sample can
forge later rewards. :func:`run_python` runs a program in a fresh interpreter (``-I``:
no environment, no user site, no script directory on the path) under bubblewrap
(``bwrap``), for every user alike, unprivileged through user namespaces:

- new user, mount, PID, network, IPC, UTS (and, where the kernel has them, cgroup)
  namespaces; no nested user namespaces; a new session (no terminal to inject into);
- a root of its own: read-only /usr (the /bin, /lib links) and the interpreter's
  install prefix, a minimal read-only /dev (so no /dev/shm to fill), and small sized
  writable tmpfs /work and /tmp that vanish with it; no /proc, /etc, /home, /root,
  repository, store or host temporary files;
- a memory cgroup of its own (:mod:`stages.sandbox._cgroup`) limited to ``memory_mb``:
  every page the run holds is charged to it, its tmpfs files, anonymous files
  (``memfd``), System V segments and the kernel memory of its files included;
- no network but its own loopback; no view of host processes (so no signal to them);
- an unprivileged uid (root starts it as a fresh random uid) with no capabilities;
- when the program ends or is killed, the PID namespace's init ends and the kernel
  kills whatever the program left behind: nothing survives the verdict.

Each limit is turned into a *verdict*:

============  ===============================================  ============================
limit         how                                              verdict when hit
============  ===============================================  ============================
CPU time      ``RLIMIT_CPU`` (SIGXCPU, SIGKILL one second on)  ``cpu_time``
wall time     the parent kills the sandbox                     ``wall_time``
memory        ``RLIMIT_AS`` and the run's memory cgroup        ``memory`` (MemoryError,
                                                               or the cgroup's OOM kill)
file size     ``RLIMIT_FSIZE`` and a tmpfs ``--size``           ``file_size``
processes     ``RLIMIT_NPROC``: no fork, no thread             ``processes``
network       an empty network namespace                       ``network``
files         a root with nothing of the host's worth reading  ``filesystem``
============  ===============================================  ============================

Where namespaces cannot be had (no ``bwrap``, or a kernel or container that forbids
unprivileged user namespaces) or no memory cgroup can be made, :func:`unavailable` says
why, and code verifiers refuse to run unless the pipeline opts in to
``Sandbox(isolation="unsafe")``: a separate process
with the same rlimits and an empty environment, but the host's files, processes and
network in reach (and a memory cgroup only where one can be made), which warns on every
step. Each outcome records the isolation used.

Besides stdout and stderr the program has a *result channel*, fd 3, which the harness
of :mod:`stages.sandbox.harness` writes its measured values to.

The package is the sandbox (not an operator: the filter kind's Verify and its code
verifiers, stages.filter.verifiers, and the Python tool of stages.envs use it): this
module (the limits, :func:`run_python`), ``_process`` (the command line, how a run ended),
``_launch`` (the launcher inside the namespaces), ``_cgroup`` and ``_seccomp`` (memory and
system-call limits), and the code-test harness (``harness``, with ``_walk``, ``_probes``,
``_values`` and ``_judge``: the verdict taken outside the sandbox).

>>> run_python("print(6 * 7)").stdout  # doctest: +SKIP
'42\\n'
"""

from __future__ import annotations

from functools import lru_cache

from pydantic import Field

from gfcr.core import codebox
from gfcr.core.stage import Spec
from stages.sandbox import _cgroup, _process
from stages.sandbox._process import VIOLATIONS, Isolation, Outcome, classify

__all__ = ["Sandbox", "Outcome", "SandboxUnavailable", "VIOLATIONS", "classify", "refusal",
           "run_python", "unavailable"]


class Sandbox(Spec):
    """How one sandboxed run is confined: the isolation and the resource limits.

    ``isolation="namespaces"`` (the default) needs bubblewrap and user namespaces and
    refuses to run without them; ``"unsafe"`` is the explicit opt-in to run without."""

    isolation: Isolation = "namespaces"
    cpu_seconds: int = Field(default=2, ge=1)
    wall_seconds: float = Field(default=5.0, gt=0.0)
    memory_mb: int = Field(default=512, ge=64)
    file_mb: int = Field(default=8, ge=1)
    """Largest file the program (or its stdout/stderr) may write."""


class SandboxUnavailable(RuntimeError):
    """Namespaces cannot be had here; the message says why and names the opt-in."""


def run_python(source: str, sandbox: Sandbox = Sandbox()) -> Outcome:
    """Run ``source`` as ``main.py`` in the sandbox and classify how it ended. Never
    raises for anything the program does; raises :class:`SandboxUnavailable` where the
    namespaces cannot be built, ``OSError`` if the sandbox fails to start."""
    if sandbox.isolation == "namespaces":
        reason = unavailable()
        if reason is not None:
            raise SandboxUnavailable(refusal(reason))
    return _process.run(source, sandbox)


def refusal(reason: str) -> str:
    """The one-paragraph refusal of a code verifier where namespaces are unavailable."""
    return (f"the code sandbox cannot isolate model-written code here: {reason}. It needs "
            f"bubblewrap (apt-get install bubblewrap) on a kernel that allows unprivileged "
            f"user namespaces, and a memory cgroup it may make groups in (cgroup v1's "
            f"memory hierarchy, or a delegated v2 group named by ${_cgroup.ENV}); or opt "
            f"in to running it without isolation, with the host's files, processes, "
            f"network and memory in its reach: "
            f"CodeTests(sandbox=Sandbox(isolation=\"unsafe\")).")


@lru_cache(maxsize=1)
def unavailable() -> str | None:
    """Why namespaces cannot be had in this process (None when they can): checked once,
    by running a program in them."""
    return _process.unavailable()


def _run_with(source: str, *, isolation: Isolation, cpu_seconds: int, wall_seconds: float,
              memory_mb: int, file_mb: int) -> Outcome:
    """:func:`run_python` with the limits as keywords: what :mod:`gfcr.core.codebox` calls."""
    return run_python(source, Sandbox(isolation=isolation, cpu_seconds=cpu_seconds,
                                      wall_seconds=wall_seconds, memory_mb=memory_mb,
                                      file_mb=file_mb))


codebox.provide(_run_with)
