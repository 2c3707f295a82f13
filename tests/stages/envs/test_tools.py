"""The Python tool in the sandbox, driven as the policy drives it: tool calls in a reply
to the python_tool environment. Attacks of tests/stages/filter/test_hostile.py sent as
tool calls are still contained (each with its control, run outside the sandbox), and
errors, limits and malformed calls are recorded as the turn's tool error."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

import stages  # noqa: F401 - provides the sandbox to gfcr.core.codebox
from stages.envs.python_tool import PythonArithmetic
from stages.envs.tools import parse_call
from stages.sandbox import unavailable
from tests.resources.sandbox_users import require
from tests.stages.filter.test_hostile import _connect, _Listener, _pidfd_kill, _survivor


def call(code: str) -> str:
    return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + \
        "</tool_call>"


@pytest.fixture
def env() -> PythonArithmetic:
    require(unavailable() is None, f"namespaces unavailable: {unavailable()}")
    env = PythonArithmetic(sandbox={"memory_mb": 128, "wall_seconds": 10.0},
                           tool_error_reward=-0.5)
    env.reset({"prompt": "What is 6 * 7?", "answer": "42"})
    return env


def unsandboxed(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True,
                          timeout=30)


def test_parse_call_reads_the_hermes_format_and_names_what_is_wrong() -> None:
    assert parse_call("no call, 42") is None
    ok = parse_call('think <tool_call>{"name": "python", "arguments": {"code": "1"}}</tool_call>')
    assert ok is not None and (ok.name, ok.arguments, ok.error) == ("python", {"code": "1"}, None)
    bad = parse_call("<tool_call>{not json</tool_call>")
    assert bad is not None and bad.error is not None and bad.error.startswith("parse:")
    shape = parse_call('<tool_call>["python"]</tool_call>')
    assert shape is not None and "name" in (shape.error or "")


def test_a_tool_call_runs_in_the_sandbox_then_the_answer_is_scored(env: PythonArithmetic) -> None:
    step = env.step(call("print(6 * 7)"))
    assert not step.done and step.tool_name == "python" and step.tool_error is None
    assert [m.content for m in step.messages] == ["42"] and step.reward == 0.0
    final = env.step("It is 42.")
    assert final.done and final.reward == 1.0


def test_errors_limits_and_bad_calls_are_tool_errors_with_their_reward(env: PythonArithmetic) -> None:
    cases: dict[str, str | tuple[str, ...]] = {
        call("1 / 0"): "error: ZeroDivisionError",
        call("while True:\n    pass"): ("cpu_time", "wall_time"),  # whichever comes first
        call("x = bytearray(1 << 30)"): "memory",
        "<tool_call>{oops</tool_call>": "parse:",
        '<tool_call>{"name": "shell", "arguments": {}}</tool_call>': "unknown tool 'shell'",
        '<tool_call>{"name": "python", "arguments": {"src": "1"}}</tool_call>': "arguments:",
    }
    for reply, error in cases.items():
        step = env.step(reply)
        assert step.tool_error is not None and step.tool_error.startswith(error), (reply, step)
        assert step.reward == -0.5 and not step.done
        assert any(e.split(":")[0] in step.messages[0].content
                   for e in ((error,) if isinstance(error, str) else error))


def test_output_is_capped(env: PythonArithmetic) -> None:
    step = env.step(call("print('x' * 100000)"))
    assert len(step.messages[0].content) == 512 and step.tool_error is None


def test_a_tool_call_cannot_read_a_host_file(env: PythonArithmetic, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text(f"host-secret-{secrets.token_hex(8)}")
    attack = f"import os\nfd = os.open({bytes(secret)!r}, os.O_RDONLY)\nprint(os.read(fd, 100))"
    assert secret.read_text() in unsandboxed(attack).stdout  # the control
    step = env.step(call(attack))
    assert secret.read_text() not in step.messages[0].content
    assert step.tool_error is not None and "FileNotFoundError" in step.tool_error


def test_a_tool_call_cannot_reach_a_host_listener(env: PythonArithmetic) -> None:
    listener = _Listener()
    try:
        assert "connected" in unsandboxed(_connect(listener.port)).stdout
        assert listener.connected()  # the control
        while listener.connected():
            pass
        step = env.step(call(_connect(listener.port)))
        assert "refused" in step.messages[0].content
        assert "connected" not in step.messages[0].content and not listener.connected()
    finally:
        listener.sock.close()


def test_a_tool_call_cannot_signal_a_host_process(env: PythonArithmetic) -> None:
    victim = subprocess.Popen(["sleep", "60"])
    try:
        step = env.step(call(_pidfd_kill(victim.pid)))
        time.sleep(0.2)
        assert victim.poll() is None, step
        assert step.tool_error is not None and "ProcessLookupError" in step.tool_error
    finally:
        victim.kill()
        victim.wait()


def test_a_process_forked_by_a_tool_call_does_not_survive_it(env: PythonArithmetic,
                                                             tmp_path: Path) -> None:
    marker = f"3{secrets.randbelow(10 ** 6)}.25"
    target = tmp_path / "survived.txt"
    step = env.step(call(_survivor(target, marker)))
    time.sleep(1.5)  # past the survivor's own sleep
    assert not target.exists() and (step.tool_error or "").startswith("processes")
    assert not [p for p in os.listdir("/proc") if p.isdigit() and _has(p, marker)]


def _has(pid: str, marker: str) -> bool:
    try:
        return marker in Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return False
