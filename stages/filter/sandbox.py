"""A sandbox for model-written code: a separate, confined, throw-away Python process.

Reward code must never run model output in the trainer's process: verl #7603 (a math
grader calling ``eval()`` on model text, CVE-2026-6878) shows one poisoned sample can
forge later rewards. :func:`run_python` runs a program in a fresh interpreter (``-I``
isolated mode: no environment variables, no user site, no script directory on the path)
with an empty environment and these limits, each turned into a *verdict*:

============  ===============================================  ============================
limit         how                                              verdict when hit
============  ===============================================  ============================
CPU time      ``RLIMIT_CPU`` (SIGXCPU, SIGKILL one second on)  ``cpu_time``
wall time     the parent kills the process group               ``wall_time``
memory        ``RLIMIT_AS``                                    ``memory`` (MemoryError)
file size     ``RLIMIT_FSIZE`` (and a small tmpfs in the jail)  ``file_size``
processes     ``RLIMIT_NPROC`` (see below)                     ``processes``
network       a new, empty network namespace                   ``network``
files         a chroot of read-only system binds               ``filesystem``
============  ===============================================  ============================

Two isolation levels, chosen once per process (:func:`isolation`):

- ``jail`` (root on Linux, checked by a dry run): new mount, network, IPC and UTS
  namespaces; the program sees only a fresh tmpfs root with read-only binds of /usr and
  the interpreter's install prefix, four device nodes, and a writable /work and /tmp that
  vanish with it — no /home, /root, /proc, /etc, repository or store. It runs under a
  fresh unprivileged uid (random, so concurrent sandboxes do not share a process count)
  with ``RLIMIT_NPROC=1``: it cannot fork or start threads. ``no_new_privs`` is set.
- ``rlimits`` (anyone else): the same rlimits (``RLIMIT_NPROC=0`` stops an unprivileged
  user from forking; root ignores it), a throw-away cwd, an empty environment, and an
  audit hook (PEP 578) installed before the program that refuses sockets, subprocesses,
  fork/exec, ``ctypes`` (and importing their C modules) and opening files outside the work
  directory and the interpreter's prefix. This is weaker: audit hooks are not a security
  boundary (PEP 578 says so), so it guards against accidents and naive hostility, not a
  determined attacker. In particular, root without namespaces (a container lacking
  CAP_SYS_ADMIN) is not bound by ``RLIMIT_NPROC``: only the hook stops a fork there,
  and the program can read any file root can that the hook does not see opened.

The setup runs in a separate launcher process (``_jail.py``), not in a ``preexec_fn``:
the trainer process is multi-threaded, and forking it to run Python is unsafe.

>>> run_python("print(6 * 7)").stdout  # doctest: +SKIP
'42\\n'
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field

from gfcr.stage import Spec

Isolation = Literal["jail", "rlimits"]

VIOLATIONS = frozenset({"wall_time", "cpu_time", "memory", "file_size", "processes",
                        "network", "filesystem", "signal"})
"""Verdicts that mean the sandbox stopped the program (as opposed to ok/failed/error)."""

_LAUNCHER = Path(__file__).with_name("_jail.py")
_OUTPUT_CAP = 64 * 1024


class Limits(Spec):
    """Resource limits of one sandboxed run."""

    cpu_seconds: int = Field(2, ge=1)
    wall_seconds: float = Field(5.0, gt=0.0)
    memory_mb: int = Field(512, ge=64)
    file_mb: int = Field(8, ge=1)
    """Largest file the program (or its stdout/stderr) may write."""


@dataclass(frozen=True)
class Outcome:
    """What a sandboxed run did. ``verdict``: ok, failed (an AssertionError), error
    (another exception), or one of :data:`VIOLATIONS`."""

    verdict: str
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float
    isolation: Isolation

    @property
    def violation(self) -> bool:
        return self.verdict in VIOLATIONS


_PRELUDE = '''\
import sys as _sys
def _gfcr_guard(allowed):
    import os
    blocked = ("socket.", "subprocess.", "os.fork", "os.exec", "os.posix_spawn", "os.spawn",
               "os.system", "ctypes.", "os.kill", "signal.pthread_kill")
    modules = {"_socket": "socket", "_ssl": "socket", "_posixsubprocess": "subprocess",
               "_multiprocessing": "subprocess", "_ctypes": "ctypes"}
    def hook(event, args):
        if event == "import" and args[0] in modules:
            event = f"{modules[args[0]]}.import({args[0]})"
        if event.startswith(blocked):
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "open" and isinstance(args[0], str):
            path = os.path.realpath(args[0])
            if not any(path == a or path.startswith(a + os.sep) for a in allowed):
                raise PermissionError(f"sandbox: access to {args[0]!r} is not allowed")
    return hook
_sys.addaudithook(_gfcr_guard(%r))
del _gfcr_guard, _sys
'''


def run_python(source: str, limits: Limits = Limits(), *,
               isolation_mode: Isolation | None = None) -> Outcome:
    """Run ``source`` as ``main.py`` in a sandbox and classify how it ended. Never
    raises for anything the program does; raises ``OSError`` only if the sandbox itself
    cannot be set up."""
    mode = isolation_mode or isolation()
    host = Path(tempfile.mkdtemp(prefix="gfcr-sandbox-"))
    try:
        return _run(source, limits, mode, host)
    finally:
        shutil.rmtree(host, ignore_errors=True)


def _run(source: str, limits: Limits, mode: Isolation, host: Path) -> Outcome:
    work = host / "work"
    work.mkdir()
    program = work / "main.py"
    prefix = os.path.realpath(sys.base_prefix)
    if mode == "rlimits":
        allowed = sorted({str(work.resolve()), prefix, os.path.realpath(sys.prefix)})
        source = _PRELUDE % (allowed,) + source
    program.write_text(source)
    (host / "root").mkdir()
    config = {"mode": mode, "program": str(program), "work": str(work), "root": str(host / "root"),
              "python": _python(), "prefix": prefix, "uid": 1_000_000 + secrets.randbelow(1 << 24),
              "cpu_seconds": limits.cpu_seconds, "memory_mb": limits.memory_mb,
              "file_mb": limits.file_mb, "disk_mb": max(16, 2 * limits.file_mb)}
    started = time.perf_counter()
    with open(host / "stdout", "wb") as out, open(host / "stderr", "wb") as err:
        proc = subprocess.Popen([_python(), "-I", "-S", str(_LAUNCHER), json.dumps(config)],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=err, env={},
                                cwd=host, start_new_session=True, close_fds=True)
        timed_out = _wait(proc, limits.wall_seconds)
    seconds = time.perf_counter() - started
    stdout, stderr = _read(host / "stdout"), _read(host / "stderr")
    if "sandbox setup:" in stderr and proc.returncode != 0:
        raise OSError(f"sandbox ({mode}) could not start: {stderr.strip()[-500:]}")
    verdict = "wall_time" if timed_out else classify(proc.returncode, stderr)
    return Outcome(verdict, proc.returncode, stdout, stderr, seconds, mode)


def _wait(proc: subprocess.Popen, wall_seconds: float) -> bool:
    """Wait for the program; on timeout kill its whole process group. True if killed."""
    try:
        proc.wait(timeout=wall_seconds)
        return False
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        return True


def _read(path: Path) -> str:
    with open(path, "rb") as f:
        return f.read(_OUTPUT_CAP).decode(errors="replace")


def classify(returncode: int | None, stderr: str) -> str:
    """The verdict of a finished run from its exit status and the last error line."""
    if returncode == 0:
        return "ok"
    if returncode is not None and returncode < 0:
        sig = -returncode
        if sig in (signal.SIGXCPU, signal.SIGKILL):
            return "cpu_time"
        return "file_size" if sig == signal.SIGXFSZ else "signal"
    last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    rules = (("MemoryError", "memory"), ("BlockingIOError", "processes"),
             ("Resource temporarily unavailable", "processes"),
             ("can't start new thread", "processes"), ("Network is unreachable", "network"),
             ("sandbox: socket", "network"), ("sandbox: os.fork", "processes"),
             ("sandbox: subprocess", "processes"), ("File too large", "file_size"),
             ("Read-only file system", "filesystem"), ("PermissionError", "filesystem"),
             ("AssertionError", "failed"))
    for needle, verdict in rules:
        if needle in last:
            return verdict
    return "error"


def _python() -> str:
    """The real interpreter binary (not a venv link): the jail binds only its prefix."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


@lru_cache(maxsize=1)
def isolation() -> Isolation:
    """``jail`` when this process may build one (root on Linux and a dry run works),
    else ``rlimits``. Decided once per process."""
    if sys.platform != "linux" or os.geteuid() != 0:
        return "rlimits"
    try:
        probe = run_python("print('ok')", Limits(cpu_seconds=2, wall_seconds=10.0),
                           isolation_mode="jail")
    except OSError:
        return "rlimits"
    return "jail" if probe.verdict == "ok" and probe.stdout.strip() == "ok" else "rlimits"
