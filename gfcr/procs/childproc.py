"""Helper processes of a run: started light, tied to the run's life, spoken to in frames.

Work that must not share the run's interpreter (a scorer that may never return, the lease
renewer that must go on while the run's threads are busy) runs in a child Python process
started by :func:`spawn`. Such a child:

- starts as ``python -c`` with the run's ``sys.path`` and imports only the module that
  serves it: packages named ``lazy`` (``stages``, ``store``, whose ``__init__`` imports
  every operator or the whole store) are entered without running their ``__init__``
  until a name is asked of the package itself, so a child that needs one small module
  does not pay seconds of imports for it;
- is started by one long-lived thread, so that the kernel ends it (``PR_SET_PDEATHSIG``,
  SIGKILL) when the run's process dies, and not when some thread of it that happened to
  start the child ends; it also leaves when the pipe from the run reaches its end;
- gets a session of its own, so a signal it sends to its process group (``os.killpg(0,
  ...)``) reaches only itself and its children, never the run.

Run and child speak :mod:`gfcr.procs.wire` frames over the pipes; the run reads its
children's frames under a deadline (``wire.read_frame``), so a child that stops answering
costs no more than the deadline, and a child that ended is ``wire.PeerGone``.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from typing import Any, Callable

from gfcr.procs import wire

_BOOT = ("import sys, json; sys.path[:] = json.loads(sys.argv[1]); "
         "from gfcr.procs.childproc import child_main; child_main()")
_PR_SET_PDEATHSIG = 1


# ------------------------------------------------------------------ the run's side


class _Spawner:
    """One daemon thread that starts every child: the parent-death signal follows the
    thread that started a child, and this one lives as long as the process."""

    def __init__(self) -> None:
        self.calls: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        threading.Thread(target=self._serve, daemon=True, name="gfcr-spawner").start()

    def _serve(self) -> None:
        while True:
            self.calls.get()()

    def run(self, make: Callable[[], "subprocess.Popen[bytes]"]) -> "subprocess.Popen[bytes]":
        box: list[Any] = []
        done = threading.Event()

        def call() -> None:
            try:
                box.append(make())
            except BaseException as err:  # noqa: BLE001 - handed to the caller
                box.append(err)
            done.set()

        self.calls.put(call)
        done.wait()
        if isinstance(box[0], BaseException):
            raise box[0]
        return box[0]


_spawner: _Spawner | None = None
_spawner_lock = threading.Lock()


def _forget() -> None:
    """In a forked child, the spawner thread does not exist: start a new one when needed."""
    global _spawner, _spawner_lock
    _spawner, _spawner_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget)


def spawn(module: str, args: list[str], *, lazy: tuple[str, ...] = (),
          pass_fds: tuple[int, ...] = ()) -> "subprocess.Popen[bytes]":
    """Start ``module.main(args)`` in a child process (see the module docstring);
    ``pass_fds`` are the descriptors it inherits (their numbers go in ``args``)."""
    global _spawner
    with _spawner_lock:
        if _spawner is None:
            _spawner = _Spawner()
    config = json.dumps({"module": module, "lazy": list(lazy), "parent": os.getpid()})
    argv = [sys.executable, "-c", _BOOT, json.dumps(sys.path), config, *args]
    return _spawner.run(lambda: subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, pass_fds=pass_fds, close_fds=True,
        start_new_session=True))


def spawn_piped(module: str, args: list[str], *, lazy: tuple[str, ...] = ()
                ) -> tuple["subprocess.Popen[bytes]", int, int]:
    """:func:`spawn` with a pipe each way: ``(proc, to_child, from_child)``, the run's
    ends. The child's ends go last in its ``args`` (its read end, then its write end) and
    are closed here once it holds them; nothing leaks when the start fails."""
    child_reads, to_child = os.pipe()
    from_child, child_writes = os.pipe()
    try:
        proc = spawn(module, [*args, str(child_reads), str(child_writes)], lazy=lazy,
                     pass_fds=(child_reads, child_writes))
    except BaseException:
        os.close(to_child)
        os.close(from_child)
        raise
    finally:
        os.close(child_reads)
        os.close(child_writes)
    return proc, to_child, from_child


def kill_piped(proc: "subprocess.Popen[bytes]", *fds: int) -> None:
    """End a child from :func:`spawn_piped` (:func:`kill`) and close the run's ends of
    its pipes, each at most once."""
    kill(proc)
    for fd in fds:
        try:
            os.close(fd)
        except OSError:  # closed already
            pass


def running(proc: "subprocess.Popen[bytes]") -> bool:
    """Whether ``proc`` has not ended, asked without reaping it: until :func:`kill` reaps
    it, its pid (and so its process group's id) cannot go to another process."""
    if proc.returncode is not None:
        return False
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
    except ChildProcessError:
        return False


def kill(proc: "subprocess.Popen[bytes]") -> None:
    """End ``proc`` and whatever it started in its session, and reap it."""
    if proc.returncode is None:  # not reaped yet: the group's id is still this child's
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait()


def how_it_ended(proc: "subprocess.Popen[bytes]") -> str:
    """``exit code N`` or ``killed by signal NAME`` (``proc`` has ended)."""
    code = proc.wait()
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


# ------------------------------------------------------------------ the child's side


def child_main() -> None:
    """The child's entry (``_BOOT``): tie it to the run, install the lazy packages, then
    run the serving module's ``main``."""
    config = json.loads(sys.argv[2])
    _die_with(int(config["parent"]))
    for name in config["lazy"]:
        lazy_package(name)
    import importlib

    importlib.import_module(config["module"]).main(sys.argv[3:])


def _die_with(parent: int) -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the pipe's end still ends the child
        pass
    if os.getppid() != parent:  # the run died before the signal was armed
        os._exit(0)


def lazy_package(name: str) -> None:
    """Enter package ``name`` without running its ``__init__`` until a name is asked of
    the package itself (``from stages import Verify`` then loads it whole)."""
    import importlib.util

    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return
    module = importlib.util.module_from_spec(spec)

    def load(attr: str) -> Any:
        del module.__dict__["__getattr__"]
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        try:
            return module.__dict__[attr]
        except KeyError:
            raise AttributeError(f"module {name!r} has no attribute {attr!r}") from None

    module.__dict__["__getattr__"] = load
    sys.modules[name] = module


def recv(fd: int) -> bytes | None:
    """The child's blocking read of one frame from the run; None once the run has closed
    its end of the pipe (it ended, or it is done with this child)."""
    try:
        return wire.read_frame(fd)
    except wire.PeerGone:
        return None


def send(fd: int, body: bytes) -> None:
    """The child's blocking write of one frame to the run."""
    wire.write_frame(fd, body)
