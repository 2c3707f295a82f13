"""A memory cgroup per sandbox run (standard library only): every page the program holds.

``RLIMIT_AS`` bounds the program's address space, but not memory it holds outside it:
files in a tmpfs (``/dev/shm``, the work folder), anonymous files (``memfd_create``)
written with ``write`` or ``fallocate``, System V shared memory it detached, the kernel
memory of the files and sockets it makes. A memory cgroup charges all of them to the
processes that touched them, so each run gets a fresh one whose limit is the run's
``memory_mb``; a program past it is killed by the kernel's OOM killer (the verdict
``memory``), and the host keeps its memory.

Where the cgroup comes from, in this order:

- ``$GFCR_SANDBOX_CGROUP``: a directory of a cgroup v2 or v1 memory hierarchy that this
  user may create groups in (a delegated one: ``systemd-run --user --scope -p
  Delegate=yes``, or a folder root made and gave to the user);
- else the memory cgroup this process is in (``/proc/self/cgroup``), found through
  ``/proc/self/mountinfo``: v1's ``memory`` hierarchy, or v2's unified one when its
  ``cgroup.subtree_control`` enables ``memory`` (v2 allows no controller below a group
  that holds processes, so a v2 group must be delegated with its processes in a leaf).

Each run's group is ``gfcr-sandbox-<random>`` below it; the sandbox's first process
moves itself in (:func:`enter`) before it starts bwrap, so everything after it is
charged there. After the run, :meth:`Group.close` kills whatever is left in it and
removes it.
"""

from __future__ import annotations

import os
import secrets
import signal
import time
from dataclasses import dataclass
from pathlib import Path

ENV = "GFCR_SANDBOX_CGROUP"
_FILES = {2: ("memory.max", "memory.swap.max", "memory.events"),
          1: ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes", "memory.oom_control")}


def _version(path: Path) -> int | None:
    if (path / "memory.max").exists() or (path / "cgroup.subtree_control").exists():
        return 2
    if (path / "memory.limit_in_bytes").exists():
        return 1
    return None


def _mounts() -> dict[str, tuple[str, str]]:
    """``{"1": (root, mount point), "2": ...}``: where the memory hierarchies are mounted."""
    found: dict[str, tuple[str, str]] = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            sep = fields.index("-")
            fstype, options = fields[sep + 1], fields[sep + 3].split(",")
            if fstype == "cgroup" and "memory" in options:
                found.setdefault("1", (fields[3], fields[4]))
            elif fstype == "cgroup2":
                found.setdefault("2", (fields[3], fields[4]))
    return found


def _own() -> tuple[Path, int] | str:
    """The memory cgroup this process is in, or why there is none to use."""
    try:
        mounts = _mounts()
        with open("/proc/self/cgroup") as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError as err:
        return f"cannot read this process's cgroups ({err})"
    for _, controllers, path in lines:
        key = "1" if "memory" in controllers.split(",") else "2" if controllers == "" else None
        if key is None or key not in mounts:
            continue
        root, mount = mounts[key]
        rel = os.path.relpath(path, root) if path.startswith(root) else path.lstrip("/")
        here = Path(mount) / rel
        if key == "1":
            return here, 1
        control = here / "cgroup.subtree_control"
        if control.exists() and "memory" in control.read_text().split():
            return here, 2
    return ("no memory cgroup to put it in: no cgroup v1 memory hierarchy, and this "
            "process's cgroup v2 group does not enable the memory controller for its "
            f"children; set ${ENV} to a delegated cgroup directory that does")


def parent() -> tuple[Path, int] | str:
    """The directory each run's cgroup is made in and its cgroup version, or why none."""
    named = os.environ.get(ENV)
    if not named:
        return _own()
    version = _version(Path(named))
    if version is None:
        return f"${ENV}={named!r} is not a cgroup directory with a memory controller"
    return Path(named), version


@dataclass
class Group:
    """One run's memory cgroup."""

    path: Path
    version: int

    @property
    def procs(self) -> Path:
        """The file a process writes its pid to, to move into the group."""
        return self.path / "cgroup.procs"

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of the group for passing its limit."""
        try:
            text = (self.path / _FILES[self.version][2]).read_text()
        except OSError:
            return False
        counts = dict(line.split()[:2] for line in text.splitlines() if line.strip())
        return int(counts.get("oom_kill", "0")) > 0

    def close(self) -> None:
        """Kill whatever is still in the group, then remove it (retrying while the
        kernel finishes reaping)."""
        for _ in range(200):
            try:
                pids = [int(p) for p in self.procs.read_text().split()]
            except OSError:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.01)


def create(limit_bytes: int) -> Group:
    """A fresh group limited to ``limit_bytes`` of memory (and no swap); ``OSError``
    naming why where one cannot be made."""
    found = parent()
    if isinstance(found, str):
        raise OSError(found)
    base, version = found
    path = base / f"gfcr-sandbox-{secrets.token_hex(6)}"
    try:
        path.mkdir()
    except OSError as err:
        raise OSError(f"cannot make a memory cgroup in {base} ({err.strerror}); set "
                      f"${ENV} to a cgroup directory this user may create groups in") from None
    group = Group(path, version)
    limit, swap, _ = _FILES[version]
    try:
        (path / limit).write_text(str(limit_bytes))
    except OSError as err:
        group.close()
        raise OSError(f"cannot set the memory limit of cgroup {path} ({err.strerror})") from None
    try:
        (path / swap).write_text(str(0 if version == 2 else limit_bytes))
    except OSError:
        pass  # no swap accounting: no swap to escape to either
    return group


def enter(group: Group | None) -> list[str]:
    """The command prefix that moves the sandbox's first process into ``group`` and then
    runs the rest of the command line in it (nothing when there is no group)."""
    if group is None:
        return []
    return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(group.procs)]
