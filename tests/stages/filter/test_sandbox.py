"""The code sandbox's limits: each is hit, classified, and the next run works (verl #7603:
model output must never run in the trainer's process). Attacks on the host, as root and
as nobody, are in test_hostile.py."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from stages.sandbox import Sandbox, SandboxUnavailable, run_python, unavailable
from stages import CodeTests, Verify
from stages.filter.verifiers import UnsafeSandbox
from tests.resources.rollouts import context, rollouts
from tests.resources.sandbox_users import require

FAST = Sandbox(cpu_seconds=1, wall_seconds=2.0, memory_mb=256, file_mb=1)
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def mode():
    require(unavailable() is None, f"namespaces unavailable: {unavailable()}")
    return "namespaces"


def run(source: str, mode: str):
    return run_python(source, FAST.model_copy(update={"isolation": mode}))


def test_a_plain_program_runs_and_its_output_comes_back(mode):
    out = run("import sys\nprint(sum(range(10)))\nprint('oops', file=sys.stderr)", mode)
    assert (out.verdict, out.returncode, out.stdout, out.stderr.strip()) == ("ok", 0, "45\n", "oops")
    assert run("assert 1 + 1 == 3", mode).verdict == "failed"
    assert run("import no_such_module", mode).verdict == "error"
    # a program cannot pass itself off as a sandbox that failed to start (a scorer error)
    assert run("import sys\nprint('bwrap: fake', file=sys.stderr)\nsys.exit(1)",
               mode).verdict == "error"


def test_an_infinite_loop_is_stopped_by_the_cpu_limit(mode):
    # a generous wall limit: on a shared machine one CPU-second can take several seconds
    limits = FAST.model_copy(update={"wall_seconds": 10.0})
    out = run_python("while True:\n    pass", limits)
    assert out.verdict == "cpu_time" and out.violation


def test_a_sleeper_is_killed_at_the_wall_time_limit(mode):
    out = run("import time\ntime.sleep(60)", mode)
    assert out.verdict == "wall_time" and out.seconds < FAST.wall_seconds + 1


def test_a_fork_bomb_cannot_fork_nor_start_threads(mode):
    for bomb in ("import os\nwhile True:\n    os.fork()",
                 "import subprocess\nsubprocess.run(['true'])",
                 "import threading\nthreading.Thread(target=print).start()"):
        out = run(bomb, mode)
        assert out.verdict == "processes", (bomb, out.stderr)


def test_a_memory_bomb_hits_the_memory_limit(mode):
    out = run("hog = []\nwhile True:\n    hog.append(bytearray(10 ** 7))", mode)
    assert out.verdict == "memory", out.stderr


def test_a_huge_file_hits_the_file_size_limit(mode):
    out = run("with open('big', 'w') as f:\n    f.write('x' * (8 << 20))", mode)
    assert out.verdict == "file_size", out.stderr


def test_writing_outside_the_work_directory_leaves_no_file(mode, tmp_path):
    target = tmp_path / "escaped.txt"
    for path in ("../escaped.txt", str(target), "/usr/escaped.txt"):
        out = run(f"open({path!r}, 'w').write('pwned')", mode)
        assert out.verdict in ("filesystem", "error"), (path, out.stderr)
    assert not target.exists() and not Path("/usr/escaped.txt").exists()


def test_environment_secrets_and_user_files_are_out_of_reach(mode, monkeypatch):
    monkeypatch.setenv("GFCR_TEST_SECRET", "hunter2-secret")
    program = f"""
import os
print(dict(os.environ))
for path in ['/proc/{os.getpid()}/environ', '/proc/self/environ', {str(REPO / 'pyproject.toml')!r}]:
    try:
        print(open(path, 'rb').read()[:4000])
    except Exception as err:
        print('denied', type(err).__name__)
"""
    out = run(program, mode)
    assert "hunter2-secret" not in out.stdout + out.stderr
    assert "gfcr" not in out.stdout  # pyproject.toml's project name
    assert out.stdout.count("denied") == 3


def test_a_socket_cannot_reach_a_listening_server(mode):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    try:
        out = run(f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), "
                  f"timeout=1)\ns.sendall(b'stolen')", mode)
        assert out.verdict == "network", out.stderr
        with pytest.raises(socket.timeout):
            server.accept()
    finally:
        server.close()


def test_the_run_goes_on_after_hostile_programs(mode):
    for hostile in ("while True: pass", "x = bytearray(10 ** 10)"):
        assert run(hostile, mode).violation
    assert run("print('still fine')", mode).stdout == "still fine\n"


def test_the_result_channel_comes_back_and_the_isolation_is_recorded(mode):
    out = run("import os\nos.write(3, b'[1, 2]')\nprint('hi')", mode)
    assert (out.channel, out.stdout, out.isolation) == ("[1, 2]", "hi\n", "namespaces")


def test_without_namespaces_code_refuses_to_run_naming_why_and_the_opt_in(monkeypatch,
                                                                         tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on it
    unavailable.cache_clear()
    try:
        assert "bubblewrap (bwrap) is not installed" in str(unavailable())
        with pytest.raises(SandboxUnavailable, match=r'not installed.*isolation="unsafe"'):
            run_python("print(1)", FAST)
        out = run_python("import os\nprint(os.path.exists('/etc'))", FAST.model_copy(
            update={"isolation": "unsafe"}))
        assert (out.stdout, out.isolation) == ("True\n", "unsafe")  # the host is in reach
        with pytest.raises(ValueError, match=r"stage 'verify': the code sandbox cannot isolate"):
            Verify(scorer=CodeTests(sandbox=FAST)).apply(context(), rollouts(["g"]))
        with pytest.warns(UnsafeSandbox, match="step 3: CodeTests runs model-written code"):
            CodeTests(sandbox=FAST.model_copy(update={"isolation": "unsafe"})).scorer(
                context(step=3))
    finally:
        unavailable.cache_clear()


def test_without_a_memory_cgroup_the_sandbox_refuses_naming_why(mode, monkeypatch, tmp_path):
    """Memory outside the address space (tmpfs files, memfd, SysV segments) is bounded
    only by the run's memory cgroup: where none can be made, namespaces are refused."""
    monkeypatch.setenv("GFCR_SANDBOX_CGROUP", str(tmp_path))
    unavailable.cache_clear()
    try:
        assert "is not a cgroup directory with a memory controller" in str(unavailable())
        with pytest.raises(SandboxUnavailable, match=r"memory cgroup.*isolation=\"unsafe\""):
            run_python("print(1)", FAST)
        out = run_python("print(1)", FAST.model_copy(update={"isolation": "unsafe"}))
        assert (out.verdict, out.stdout) == ("ok", "1\n")  # the opt-in still runs
    finally:
        unavailable.cache_clear()
