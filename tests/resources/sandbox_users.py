"""Run sandboxed (and, for the controls, unsandboxed) programs as root or as ``nobody``.

The sandbox must hold for every user, so the hostile suite runs each attack in two
configurations: the test process's own (root, as CI runs it) and an unprivileged one,
where the scoring process itself runs as ``nobody`` (``setpriv``). ``nobody`` cannot
read this checkout or its virtualenv wherever they live, so that configuration runs a
copy of the sandbox's process side (standard library only: ``_process``, ``_launch``,
``_seccomp``, ``_cgroup``) from a world-readable temporary folder, with the system's
python3. ``nobody`` may not make cgroups in root's, so root delegates one to it (a
folder of its memory cgroup that ``nobody`` owns, named by ``$GFCR_SANDBOX_CGROUP``), as
a deployment running the scorer as an unprivileged user would.

Under ``CI=true`` a configuration that cannot be set up fails; elsewhere it skips.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from stages.sandbox import _cgroup, _process
from stages.sandbox import Sandbox, run_python, unavailable

SANDBOX = Path(_process.__file__).parent
NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
USERS = ["root", "nobody"]

_RUNNER = """\
import json, sys
from dataclasses import dataclass
sys.path.insert(0, sys.argv[1])
from stages.sandbox import _process

@dataclass(frozen=True)
class Limits:
    isolation: str = "namespaces"
    cpu_seconds: int = 2
    wall_seconds: float = 5.0
    memory_mb: int = 512
    file_mb: int = 8

request = json.load(sys.stdin)
out = _process.run(request["source"], Limits(**request["limits"]))
print(json.dumps({"verdict": out.verdict, "stdout": out.stdout, "stderr": out.stderr,
                  "channel": out.channel, "isolation": out.isolation}))
"""


def require(ok: bool, why: str) -> None:
    """Skip a test that cannot run here, or fail it under CI=true, which may not skip."""
    if not ok:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true: the hostile sandbox suite may not skip: {why}")
        pytest.skip(why)


def host_dir() -> Path:
    """A temporary folder every user can read and write: what an attack targets must be
    in reach of the user it runs as, or a failed attack would prove nothing."""
    path = Path(tempfile.mkdtemp(prefix="gfcr-hostile-", dir="/tmp"))
    path.chmod(0o777)
    return path


def delegate(user: str) -> Path:
    """A memory cgroup below this process's that ``user`` may make groups in."""
    found = _cgroup.parent()
    require(not isinstance(found, str), f"no memory cgroup to delegate: {found}")
    assert not isinstance(found, str)
    path = Path(tempfile.mkdtemp(prefix=f"gfcr-{user}-", dir=found[0]))
    for entry in [path, *path.iterdir()]:
        shutil.chown(entry, user)
    return path


class User:
    """One configuration: sandboxed runs and unsandboxed controls as ``name``."""

    def __init__(self, name: str, home: Path) -> None:
        self.name = name
        self.python: str | None = sys.executable
        require(unavailable() is None, f"namespaces unavailable: {unavailable()}")
        self.as_nobody = name == "nobody" and os.geteuid() == 0
        if name == "root":
            require(os.geteuid() == 0, "the root configuration needs root")
        if self.as_nobody:
            require(shutil.which("setpriv") is not None, "setpriv is not installed")
            self.python = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
            require(self.python is not None, "no system python3 for nobody to run")
            self.copy = home / "sandbox"
            for package in ("stages", "stages/sandbox"):
                (self.copy / package).mkdir(parents=True)
                (self.copy / package / "__init__.py").write_text("")
            for name_ in ("_process.py", "_launch.py", "_seccomp.py", "_cgroup.py"):
                shutil.copy(SANDBOX / name_, self.copy / "stages/sandbox" / name_)
            (self.copy / "runner.py").write_text(_RUNNER)
            for path in [self.copy, *self.copy.rglob("*")]:
                path.chmod(0o755)
            self.cgroup = delegate("nobody")

    def close(self) -> None:
        """Remove the cgroup delegated to ``nobody``, if any."""
        if self.as_nobody:
            _cgroup.Group(self.cgroup, 0).close()

    @property
    def prefix(self) -> list[str]:
        return NOBODY if self.as_nobody else []

    def sandboxed(self, source: str, wall_seconds: float = 5.0, **limits: Any) -> dict[str, Any]:
        """Run ``source`` in the sandbox as this user; its outcome as a dict. ``limits``:
        other fields of :class:`Sandbox` (``memory_mb``, ...)."""
        limits["wall_seconds"] = wall_seconds
        if not self.as_nobody:
            out = run_python(source, Sandbox(**limits))
            return {"verdict": out.verdict, "stdout": out.stdout, "stderr": out.stderr,
                    "channel": out.channel, "isolation": out.isolation}
        request = json.dumps({"source": source, "limits": limits})
        done = subprocess.run([*NOBODY, str(self.python), "-I", str(self.copy / "runner.py"),
                               str(self.copy)], input=request, capture_output=True, text=True,
                              timeout=60, cwd="/",
                              env={**os.environ, _cgroup.ENV: str(self.cgroup)})
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def unsandboxed(self, source: str) -> subprocess.CompletedProcess[str]:
        """The control: the same program run as this user without the sandbox."""
        return subprocess.run([*self.prefix, str(self.python), "-I", "-c", source],
                              capture_output=True, text=True, timeout=60, cwd="/tmp")

    def spawn(self, *argv: str) -> subprocess.Popen[bytes]:
        """A host process owned by this user (a victim for signals)."""
        return subprocess.Popen([*self.prefix, *argv])
