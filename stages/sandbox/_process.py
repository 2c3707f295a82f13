"""The process side of the sandbox (standard library only): start, confine, collect.

:mod:`stages.sandbox` documents what the sandbox guarantees; this module builds
the bubblewrap command line (or, in the opted-in unsafe mode, a bare one), runs the
launcher (``_launch.py``) and the program under it, and turns how the process ended
into a verdict. It imports nothing outside the standard library, so that a test can run
it as another user (``nobody``) from a copy without the project's environment.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal, Protocol

from stages.sandbox import _cgroup, _seccomp

Isolation = Literal["namespaces", "unsafe"]

VIOLATIONS = frozenset({"wall_time", "cpu_time", "memory", "file_size", "processes",
                        "network", "filesystem", "signal"})
"""Verdicts that mean the sandbox stopped the program (as opposed to ok/failed/error)."""

_LAUNCHER = Path(__file__).with_name("_launch.py")
_OUTPUT_CAP = 64 * 1024
_CHANNEL_CAP = 8 << 20
"""The result channel is a file the program writes: ``file_mb`` bounds it too."""
_BWRAP_EXIT = 128
"""bwrap reports a program killed by signal ``s`` as exit status 128 + s."""


class Limits(Protocol):
    """What a run needs to know of its sandbox (:class:`stages.sandbox.Sandbox`)."""

    @property
    def isolation(self) -> Isolation: ...
    @property
    def cpu_seconds(self) -> int: ...
    @property
    def wall_seconds(self) -> float: ...
    @property
    def memory_mb(self) -> int: ...
    @property
    def file_mb(self) -> int: ...


@dataclass(frozen=True)
class _Probe:
    isolation: Isolation = "namespaces"
    cpu_seconds: int = 2
    wall_seconds: float = 10.0
    memory_mb: int = 512
    file_mb: int = 1


@dataclass(frozen=True)
class Outcome:
    """What a sandboxed run did. ``verdict``: ok, failed (an AssertionError), error
    (another exception), or one of :data:`VIOLATIONS`. ``channel``: what the program
    wrote to fd 3."""

    verdict: str
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float
    isolation: Isolation
    channel: str = ""

    @property
    def violation(self) -> bool:
        return self.verdict in VIOLATIONS


def run(source: str, sandbox: Limits) -> Outcome:
    """Run ``source`` under ``sandbox`` and classify how it ended; ``OSError`` if the
    sandbox itself fails to start."""
    with ExitStack() as stack:
        program, launcher, filter_, started, out, err, channel = (
            stack.enter_context(tempfile.TemporaryFile()) for _ in range(7))
        for f, data in ((program, source.encode()), (launcher, _LAUNCHER.read_bytes()),
                        (filter_, _seccomp.program() or b"")):
            f.write(data)
            f.flush()
            f.seek(0)
        config = {"python": _python(), "channel": channel.fileno(), "started": started.fileno(),
                  "cpu_seconds": sandbox.cpu_seconds, "memory_mb": sandbox.memory_mb,
                  "file_mb": sandbox.file_mb}
        group = _group(sandbox)
        if group is not None:
            stack.callback(group.close)
        if sandbox.isolation == "unsafe":
            workdir = tempfile.mkdtemp(prefix="gfcr-sandbox-")
            stack.callback(shutil.rmtree, workdir, ignore_errors=True)
            argv, fds, kwargs = _unsafe(config, program, workdir)
        else:
            argv, fds, kwargs = _namespaces(config, (program, launcher, filter_),
                                            2 * sandbox.file_mb << 20)
        begun = time.perf_counter()
        proc = subprocess.Popen(_cgroup.enter(group) + argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                env={}, start_new_session=True, close_fds=True,
                                pass_fds=(channel.fileno(), started.fileno(), *fds), **kwargs)
        timed_out = _wait(proc, sandbox.wall_seconds)
        seconds = time.perf_counter() - begun
        stdout, stderr = _read(out, _OUTPUT_CAP), _read(err, _OUTPUT_CAP)
        if not _read(started, 1) and not timed_out:
            # the launcher marks its start before the program runs: bwrap failed, or the
            # interpreter could not start (a program cannot fake this either way)
            raise OSError(f"the sandbox could not start: {stderr.strip()[-500:]}")
        verdict = ("memory" if group is not None and group.oom_killed() else
                   "wall_time" if timed_out else classify(proc.returncode, stderr))
        return Outcome(verdict, proc.returncode, stdout, stderr, seconds, sandbox.isolation,
                       _read(channel, _CHANNEL_CAP))


def _group(sandbox: Limits) -> _cgroup.Group | None:
    """The run's memory cgroup, limited to ``memory_mb``: required in the namespaces
    (``OSError`` naming why where none can be made), used where one can be in unsafe mode."""
    try:
        return _cgroup.create(sandbox.memory_mb << 20)
    except OSError:
        if sandbox.isolation == "unsafe":
            return None
        raise


_Command = tuple[list[str], list[int], dict[str, Any]]
"""A command line, the descriptors it needs passed, and Popen's other arguments."""


def _unsafe(config: dict[str, Any], program: IO[bytes], workdir: str) -> _Command:
    """Opted-in unsafe mode: the launcher and the program straight from the host."""
    main = Path(workdir) / "main.py"
    main.write_bytes(program.read())
    config.update(program=str(main), processes=0)
    return [_python(), "-I", "-S", str(_LAUNCHER), json.dumps(config)], [], {"cwd": workdir}


def _namespaces(config: dict[str, Any], files: tuple[IO[bytes], ...],
                disk_bytes: int) -> _Command:
    """bwrap, run as the calling user: fresh namespaces, uid 65534 inside with no
    capabilities, the seccomp filter, and a root holding only what Python needs."""
    program, launcher, filter_ = files
    config.update(program="/work/main.py", processes=1)
    fds = [f.fileno() for f in files]
    argv = [shutil.which("bwrap") or "bwrap", "--unshare-user", "--unshare-pid",
            "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--disable-userns", "--uid", "65534", "--gid", "65534", "--cap-drop", "ALL",
            "--die-with-parent", "--new-session", "--clearenv", "--hostname", "sandbox"]
    if os.fstat(filter_.fileno()).st_size:  # empty on an architecture it does not know
        argv += ["--seccomp", str(filter_.fileno())]
    prefix = os.path.realpath(sys.base_prefix)
    binds = ["/usr"] + ([] if prefix == "/usr" or prefix.startswith("/usr/") else [prefix])
    for top in ("/bin", "/sbin", "/lib", "/lib64", "/lib32"):
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            binds.append(top)
    for path in binds:
        argv += ["--ro-bind", path, path]
    # /dev (with /dev/shm) read-only: bwrap's --dev is a tmpfs without a size limit
    argv += ["--dev", "/dev", "--remount-ro", "/dev", "--size", str(disk_bytes), "--tmpfs", "/work",
             "--size", str(disk_bytes), "--tmpfs", "/tmp",
             "--ro-bind-data", str(launcher.fileno()), "/gfcr/launch.py",
             "--file", str(program.fileno()), "/work/main.py", "--remount-ro", "/",
             "--chdir", "/work",
             "--", _python(), "-I", "-S", "/gfcr/launch.py", json.dumps(config)]
    return argv, fds, {}


def _wait(proc: "subprocess.Popen[Any]", wall_seconds: float) -> bool:
    """Wait for the sandbox; on timeout kill it. True if killed. Its process group is
    killed either way (in unsafe mode, the program's own children with it)."""
    try:
        proc.wait(timeout=wall_seconds)
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    return timed_out


def _read(f: IO[bytes], cap: int) -> str:
    f.seek(0)
    return f.read(cap).decode(errors="replace")


def classify(returncode: int | None, stderr: str) -> str:
    """The verdict of a finished run from its exit status and the last error line."""
    if returncode == 0:
        return "ok"
    if returncode is not None and (returncode < 0 or returncode > _BWRAP_EXIT):
        sig = -returncode if returncode < 0 else returncode - _BWRAP_EXIT
        if sig in (signal.SIGXCPU, signal.SIGKILL):
            return "cpu_time"
        return "file_size" if sig == signal.SIGXFSZ else "signal"
    last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    rules = (("MemoryError", "memory"), ("BlockingIOError", "processes"),
             ("Resource temporarily unavailable", "processes"),
             ("can't start new thread", "processes"), ("Network is unreachable", "network"),
             ("ConnectionRefusedError", "network"),
             ("File too large", "file_size"), ("No space left on device", "file_size"),
             ("Read-only file system", "filesystem"), ("PermissionError", "filesystem"),
             ("AssertionError", "failed"))
    for needle, verdict in rules:
        if needle in last:
            return verdict
    return "error"


def _python() -> str:
    """The real interpreter binary (not a venv link): the sandbox binds only its prefix."""
    # getattr: set only inside a virtualenv
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def unavailable() -> str | None:
    """Why namespaces cannot be had here (None when they can), found by running a
    program in them."""
    if sys.platform != "linux":
        return f"namespaces need Linux, this is {sys.platform}"
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed"
    try:
        probe = run("print('ok')", _Probe())
    except OSError as err:
        return str(err)
    if probe.verdict != "ok" or probe.stdout.strip() != "ok":
        return f"a probe program failed in it ({probe.verdict}: {probe.stderr.strip()[-300:]})"
    return None
