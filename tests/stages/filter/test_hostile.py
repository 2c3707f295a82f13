"""Hostile programs against the code sandbox, as root and as ``nobody`` (issues 12, 26).

Each attack below once succeeded under the old ``rlimits`` fallback, which every
non-root user got silently. Each test runs the attack unsandboxed first, as the same
user, to show it works there (the control), then in the sandbox, and checks the host:
its files, its store catalog, its processes, its listener. Under ``CI=true`` none of
them may skip (tests/resources/sandbox_users.py).
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import sqlite3
import time
from pathlib import Path

import pytest

from tests.resources.sandbox_users import USERS, User, host_dir


@pytest.fixture(scope="module")
def host():
    path = host_dir()
    secret = path / "secret.txt"
    secret.write_text(f"host-secret-{secrets.token_hex(8)}")
    secret.chmod(0o644)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module", params=USERS)
def user(request, host):
    home = host / request.param
    home.mkdir()
    home.chmod(0o777)
    user = User(request.param, home)
    yield user
    user.close()


def _secret(host: Path) -> str:
    return (host / "secret.txt").read_text()


def _leaked(out: dict, text: str) -> bool:
    return text in out["stdout"] + out["stderr"] + out["channel"]


def test_a_bytes_path_cannot_read_a_host_file(user, host):
    attack = (f"import os\nfd = os.open({bytes(host / 'secret.txt')!r}, os.O_RDONLY)\n"
              f"print(os.read(fd, 100))")
    assert _secret(host) in user.unsandboxed(attack).stdout  # the control
    out = user.sandboxed(attack)
    assert not _leaked(out, _secret(host)) and "FileNotFoundError" in out["stderr"], out


@pytest.fixture(scope="module")
def catalog(host):
    from store import RolloutStore

    root = host / "store"
    with RolloutStore.open(root):
        pass
    for path in [root, *root.rglob("*")]:
        path.chmod(0o777 if path.is_dir() else 0o666)
    return root / "catalog.sqlite"


def _columns(path: Path) -> int:
    with sqlite3.connect(path) as con:
        return con.execute("SELECT count(*) FROM ducklake_column").fetchone()[0]


def test_sqlite3_cannot_write_the_store_catalog(user, catalog):
    def attack(path: Path) -> str:
        return (f"import sqlite3\ncon = sqlite3.connect({str(path)!r})\n"
                f"con.execute('DELETE FROM ducklake_column')\ncon.commit()")
    copy = catalog.with_name(f"copy-{user.name}.sqlite")
    shutil.copy(catalog, copy)
    copy.chmod(0o666)
    assert user.unsandboxed(attack(copy)).returncode == 0 and _columns(copy) == 0  # control
    before = _columns(catalog)
    out = user.sandboxed(attack(catalog))
    assert before > 0 and _columns(catalog) == before, out
    assert "unable to open database file" in out["stderr"], out


def _pidfd_kill(pid: int) -> str:
    return (f"import os, signal\nfd = os.pidfd_open({pid})\n"
            f"signal.pidfd_send_signal(fd, signal.SIGKILL)\nos.kill({pid}, signal.SIGKILL)")


def test_pidfd_send_signal_cannot_reach_a_host_process(user):
    control, victim = user.spawn("sleep", "60"), user.spawn("sleep", "60")
    try:
        user.unsandboxed(_pidfd_kill(control.pid))
        assert control.wait(timeout=10) == -9  # the control: the signal lands
        out = user.sandboxed(_pidfd_kill(victim.pid))
        time.sleep(0.2)
        assert victim.poll() is None, out
        assert "ProcessLookupError" in out["stderr"], out
    finally:
        for proc in (control, victim):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


class _Listener:
    """A TCP server on the host, on every address, that records who connects."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("0.0.0.0", 0))
        self.sock.listen(4)
        self.sock.settimeout(0.5)
        self.port = self.sock.getsockname()[1]

    def connected(self) -> bool:
        try:
            conn, _ = self.sock.accept()
        except socket.timeout:
            return False
        conn.close()
        return True


def _connect(port: int) -> str:
    addresses = sorted({"127.0.0.1", socket.gethostbyname(socket.gethostname())})
    return (f"import socket\nfor host in {addresses!r}:\n    try:\n"
            f"        socket.create_connection((host, {port}), timeout=1).sendall(b'x')\n"
            f"        print('connected', host)\n"
            f"    except OSError as err:\n        print('refused', host, err)\n")


def test_a_tcp_connection_cannot_reach_a_host_listener(user):
    listener = _Listener()
    try:
        assert "connected" in user.unsandboxed(_connect(listener.port)).stdout
        assert listener.connected()  # the control
        while listener.connected():
            pass
        out = user.sandboxed(_connect(listener.port))
        assert "connected" not in out["stdout"] and "refused" in out["stdout"], out
        assert not listener.connected()
    finally:
        listener.sock.close()


def test_disabling_an_audit_hook_through_gc_gains_nothing(user, host):
    """The old fallback's guard was an audit hook; a program found its closure through
    ``gc.get_objects()`` and emptied it. The sandbox has no in-process guard to disable:
    the same program, after its bypass, still reads no host file and reaches no port."""
    listener = _Listener()
    attack = f"""
import gc, os, socket
for obj in gc.get_objects():
    if callable(obj) and getattr(obj, "__closure__", None):
        for cell in obj.__closure__:
            try:
                if "socket." in cell.cell_contents or "_socket" in cell.cell_contents:
                    cell.cell_contents = type(cell.cell_contents)()  # the guard's lists
            except (ValueError, TypeError):
                pass
try:
    print(open({str(host / 'secret.txt')!r}).read())
except OSError as err:
    print("no file", err)
try:
    socket.create_connection(("127.0.0.1", {listener.port}), timeout=1)
    print("connected")
except OSError as err:
    print("no network", err)
"""
    try:
        out = user.sandboxed(attack)
        assert "no file" in out["stdout"] and "no network" in out["stdout"], out
        assert not _leaked(out, _secret(host)) and not listener.connected()
    finally:
        listener.sock.close()


def test_stdout_and_stderr_cannot_be_swapped_for_symlinks(user, host):
    """The old sandbox read the program's output back from files by path, in a folder
    next to its working directory; a program replaced them with symlinks to a host file,
    whose content came back as its output. Now output goes to unlinked files held open."""
    attack = f"""
import glob, os
targets = ["/proc/self/fd/1", "/proc/self/fd/2", "../stdout", "../stderr",
           *glob.glob("/tmp/gfcr-sandbox-*/std*"), *glob.glob("/tmp/tmp*")]
for target in targets:
    try:
        real = os.path.realpath(target)
        os.remove(real)
        os.symlink({str(host / 'secret.txt')!r}, real)
        print("swapped", real)
    except OSError as err:
        print("kept", target, type(err).__name__)
print("done")
"""
    out = user.sandboxed(attack)
    assert out["verdict"] == "ok" and "swapped" not in out["stdout"], out
    assert out["stdout"].endswith("done\n") and not _leaked(out, _secret(host)), out


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker in (entry / "cmdline").read_text():
                found.append(int(entry.name))
        except OSError:
            pass
    return found


def _survivor(path: Path, marker: str) -> str:
    return f"""
import os, time
if os.fork() == 0:
    if os.fork() == 0:
        os.closerange(0, 3)  # a daemon: its parent's pipes close, the verdict comes
        time.sleep(0.5)
        open({str(path)!r}, "w").write("survived")
        os.execv("/bin/sleep", ["sleep", "{marker}"])
    os._exit(0)
print("parent done")
"""


def test_a_double_forked_process_does_not_survive_the_verdict(user, host):
    marker = f"3{secrets.randbelow(10 ** 6)}.5"
    control_file, sandbox_file = host / f"{user.name}-control.txt", host / f"{user.name}-sb.txt"
    try:
        assert user.unsandboxed(_survivor(control_file, marker)).returncode == 0
        deadline = time.monotonic() + 20
        while not control_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert control_file.exists()  # the control: it outlived its parent, wrote the file
    finally:
        for pid in _processes_with(marker):
            os.kill(pid, 9)
    marker = f"3{secrets.randbelow(10 ** 6)}.25"
    out = user.sandboxed(_survivor(sandbox_file, marker))
    time.sleep(1.5)  # past the survivor's own sleep
    assert not sandbox_file.exists() and _processes_with(marker) == [], out
    assert out["verdict"] == "processes", out


_HOLD = """
import os
held = 0
try:
    for i in range({n}):
        fd = os.open("{where}%d" % i, os.O_CREAT | os.O_RDWR)
        os.posix_fallocate(fd, 0, 7 << 20)
        os.close(fd)
        held += 7
    print("held", held, "MB")
except OSError as err:
    print("refused at", held, "MB:", err)
"""


@pytest.mark.parametrize("where", ["/dev/shm/hog", "/dev/hog", "/tmp/hog", "/work/hog"])
def test_fallocate_in_a_sandbox_tmpfs_is_bounded(user, where):
    """bwrap's /dev (and /dev/shm in it) was a tmpfs with no size limit, outside
    ``memory_mb`` and ``file_mb``: files of 7 MB each, made with ``posix_fallocate`` and
    closed, held 2 GB of host memory there. Now /dev is read-only and every writable
    tmpfs is sized and charged to the run's memory cgroup."""
    if where.startswith(("/work", "/tmp")):  # the control: the work folders are usable
        assert "held 7 MB" in user.sandboxed(_HOLD.format(n=1, where=where))["stdout"]
    out = user.sandboxed(_HOLD.format(n=40, where=where), memory_mb=128)
    assert "held" not in out["stdout"], out
    assert out["verdict"] == "memory" or "refused at" in out["stdout"], out


def test_memfd_anonymous_files_count_against_the_memory_limit(user):
    """Anonymous files are in no mount: 60 memfds of 7 MB each (under ``file_mb``) held
    420 MB past a 128 MB ``memory_mb``. The run's memory cgroup charges them."""
    hog = ("import os\nfds = []\nfor _ in range({n}):\n    fd = os.memfd_create('hog')\n"
           "    os.posix_fallocate(fd, 0, 7 << 20)\n    fds.append(fd)\n"
           "print('held', 7 * len(fds), 'MB')")
    assert "held 14 MB" in user.sandboxed(hog.format(n=2), memory_mb=128)["stdout"]  # control
    out = user.sandboxed(hog.format(n=60), memory_mb=128)
    assert out["verdict"] == "memory" and "held" not in out["stdout"], out


def test_system_v_shared_memory_counts_against_the_memory_limit(user):
    """SysV segments outlive their detach (in the sandbox's IPC namespace): 8 segments
    of 64 MB, each touched then detached, stay inside ``RLIMIT_AS`` but not the cgroup."""
    hog = ("import ctypes\nlibc = ctypes.CDLL(None)\nlibc.shmat.restype = ctypes.c_void_p\n"
           "for _ in range(8):\n    seg = libc.shmget(0, 64 << 20, 0o1600)\n"
           "    at = libc.shmat(seg, None, 0)\n    ctypes.memset(at, 1, 64 << 20)\n"
           "    libc.shmdt(ctypes.c_void_p(at))\nprint('held 512 MB')")
    out = user.sandboxed(hog, memory_mb=128)
    assert out["verdict"] == "memory" and "held" not in out["stdout"], out


def test_an_inode_bomb_counts_against_the_memory_limit(user):
    """Empty files take no tmpfs blocks, so ``--size`` does not bound them (bubblewrap
    0.8 sets no inode limit); their kernel memory is charged to the run's cgroup."""
    bomb = ("import os\nn = 0\ntry:\n    while True:\n"
            "        os.close(os.open('/work/f%d' % n, os.O_CREAT | os.O_WRONLY))\n"
            "        n += 1\nexcept OSError as err:\n    print('stopped at', n, err)")
    out = user.sandboxed(bomb, wall_seconds=60.0, memory_mb=64, cpu_seconds=30)
    assert out["verdict"] == "memory" or "stopped at" in out["stdout"], out
