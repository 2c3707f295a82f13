"""examples/agent_calculator.py: its safe calculator, and the script run as a user would
run it, against gfcr's endpoint over a tiny policy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gfcr.chat.formats import chat_format
from gfcr.core.engine import GenRequest, SamplingParams
from stages import HF, TinyLlama
from stages.generate._episodes import Episode
from stages.endpoint._openai_chat import OpenAIChat
from stages.generate._waves import Waves
from stages.generate.openai_api import AgentServer
from tests.resources.agents import needs_openai

needs_openai()
from examples.agent_calculator import calculate  # noqa: E402 - needs openai

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "agent_calculator.py"


@pytest.mark.parametrize("expression, value", [
    ("3*7", "21"), ("(2+3)**2 - 1", "24"), ("7/2", "3.5"), ("-4 // 3", "-2"),
    ("1/0", "error: division by zero"), ("2**1000", "error: exponent too large"),
    ("__import__('os')", "error: unsupported: Call"), ("x + 1", "error: unsupported: Name"),
    ("1 +", "error: invalid syntax")])
def test_the_calculator_evaluates_arithmetic_and_nothing_else(expression, value):
    assert calculate(expression).startswith(value)


def test_the_script_talks_to_gfcrs_endpoint_as_to_any_openai_server():
    policy = TinyLlama(hidden_size=32, num_layers=1, num_heads=2,
                       intermediate_size=64).build(seed=0)
    engine = HF(device="cpu").build(policy, seed=0)
    waves = Waves(window=0.0)
    episode = Episode(0, OpenAIChat(chat_format(policy.tokenizer)))
    with AgentServer(waves, engine.decode, model="tiny", max_tokens=8, wait=60.0) as server:
        user = subprocess.Popen([sys.executable, str(SCRIPT), server.open(episode),
                                 "What is 3 * 7?"], stdout=subprocess.PIPE, text=True)
        while user.poll() is None:  # serve its calls, one wave each, as AgentEnv does
            for ask in waves.gather(lambda: 1, timeout=0.5):
                ids = server.prepare(ask)
                assert ids is not None
                (out,) = engine.generate([GenRequest(0, ids, max_tokens=ask.max_tokens)],
                                         SamplingParams(max_tokens=8, seed=0))
                server.finish(ask, out)
        printed = user.stdout.read() if user.stdout else ""
    assert user.returncode == 0 and printed.strip() == "0.0"  # no answer to compare with
    assert 1 <= len(episode.calls) <= 3
    assert episode.calls[0].prompt_ids[-len(engine.encode("What is 3 * 7?")):] == \
        engine.encode("What is 3 * 7?")
