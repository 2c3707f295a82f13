"""RemoteEnv against a real HTTP server in another process (tests/resources/openenv_server.py,
OpenEnv's reset/step shapes): episodes play over HTTP; a server that dies mid-episode,
hangs past the deadline, answers too much or redirects ends those episodes with the
reason recorded, and the stage returns every row."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from gfcr.core.environment import resolve_env
from gfcr.core.rollout import EPISODE_END, col
from stages import HF, RemoteEnv, TinyLlama
from stages.envs.remote import RemoteEnvError
from tests.resources.rollouts import context
from tests.stages.generate.test_episodes import plan

ROOT = Path(__file__).resolve().parents[3]


def serve(tmp_path: Path, mode: str) -> tuple[subprocess.Popen[bytes], str]:
    port_file = tmp_path / f"port-{mode}"
    proc = subprocess.Popen([sys.executable, "-m", "tests.resources.openenv_server",
                             str(port_file), mode], cwd=ROOT)
    deadline = time.monotonic() + 60
    while not port_file.exists() or not port_file.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)
    return proc, f"http://127.0.0.1:{port_file.read_text()}"


@pytest.fixture
def server(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    proc, url = serve(tmp_path, request.param)
    try:
        yield url
    finally:
        proc.kill()
        proc.wait()


def play(url: str, **options: Any) -> list[dict[str, Any]]:
    engine = HF(device="cpu").build(TinyLlama().build(seed=0), seed=0)
    stage = RemoteEnv(url=url, n=2, max_turns=3, max_tokens=3, env_workers=4, **options)
    return stage.generate(context(), plan(), engine, None).to_pylist()


@pytest.mark.parametrize("server", ["ok"], indirect=True)
def test_episodes_play_over_http_with_the_servers_observations_and_rewards(server: str
                                                                           ) -> None:
    env = resolve_env("remote")(url=server)
    first = env.reset({"prompt": "q", "prompt_id": "p1"})
    assert first[0].content == "Guess my number from 0 to 7, like 3."
    answers = [env.step(str(g)) for g in range(8)]
    done = next(i for i, a in enumerate(answers) if a.done)
    assert answers[done].reward == 1.0 and all(a.reward == 0.0 for a in answers[:done])
    assert {a.messages[0].content for a in answers[:done]} <= {"higher", "lower"}
    rows = play(server)
    assert len(rows) == 6 and all(r[col.SCORE_ERROR] is None for r in rows)
    assert {r[EPISODE_END] for r in rows} <= {"done", "turn_limit"}
    for r in rows:  # the reward is the server's: 1 exactly when the episode ended done
        assert r[col.REWARD] == (1.0 if r[EPISODE_END] == "done" else 0.0)


@pytest.mark.parametrize("server", ["die"], indirect=True)
def test_a_server_that_dies_mid_episode_ends_its_episodes_with_the_reason(server: str) -> None:
    rows = play(server)
    assert len(rows) == 6
    failed = [r for r in rows if r[EPISODE_END] == "env_error"]
    assert failed, "every episode reaching a second step meets the dead server"
    for r in failed:
        assert "RemoteEnvError" in r[col.SCORE_ERROR] and server in r[col.SCORE_ERROR]
        assert r[col.REWARD] == 0.0 and r[col.TURNS][1]["source"] == "policy"
    assert all(r[EPISODE_END] in ("done", "env_error") for r in rows)


@pytest.mark.parametrize("server", ["hang"], indirect=True)
def test_a_server_that_hangs_is_cut_at_the_deadline_with_the_reason(server: str) -> None:
    rows = play(server, timeout=1.0)
    failed = [r for r in rows if r[EPISODE_END] == "env_error"]
    assert failed and len(rows) == 6
    for r in failed:
        assert "no answer from" in r[col.SCORE_ERROR] and "within 1s" in r[col.SCORE_ERROR]


@pytest.mark.parametrize("server", ["big", "redirect"], indirect=True)
def test_an_oversized_answer_or_a_redirect_is_refused(server: str) -> None:
    env = resolve_env("remote")(url=server, max_bytes=1 << 20)
    env.reset({"prompt": "q", "prompt_id": "p1"})
    env.step("9")  # the first step is answered
    with pytest.raises(RemoteEnvError, match=r"max_bytes|HTTP 307"):
        env.step("9")


def test_a_url_that_is_not_http_is_refused_at_build() -> None:
    for bad in ("file:///etc/passwd", "ftp://h/x", "http://", "http://u:p@h:1/x",
                "http://h:1/x?q=1"):
        with pytest.raises(ValueError, match="url"):
            RemoteEnv(url=bad)


def test_a_server_that_is_not_there_is_an_error_naming_the_call() -> None:
    env = resolve_env("remote")(url="http://127.0.0.1:9", timeout=2.0)
    with pytest.raises(RemoteEnvError, match=r"reset: http://127.0.0.1:9 failed"):
        env.reset({"prompt": "q"})
