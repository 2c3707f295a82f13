"""The Python tool on SmolLM2's own chat template: a demonstration episode renders to
the ids an Episodes run holds (tool turn out of the loss), the policy's turn decoded
from those ids parses as a python call in the environment and at the endpoint, the
sandbox answers it; and the SFT warm start trains on such demonstrations."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gfcr.chat.formats import chat_format
from gfcr.core.environment import Message
from gfcr.core.trajectory import Trajectory
from stages import SFT, ReasoningGym, SmolLM2, TinyLlama
from stages.endpoint._toolcalls import parse
from stages.envs.python_demos import call_text, expression, python_call, python_half
from stages.envs.python_tool import INSTRUCTIONS, PythonArithmetic
from stages.envs.tools import PYTHON, parse_call
from stages.train.sft import _examples, _loss_mask
from stages.train.sft_demos import Example, encode
from tests.resources.smol import smol_root

ROW = {"prompt": "State the final answer to the following arithmetic problem: 4821 - 967 =",
       "answer": "3854", "meta": json.dumps({"metadata": {"expression": "4821 - 967"}})}


@pytest.fixture(scope="module")
def smol(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return SmolLM2(root=str(smol_root(tmp_path_factory))).build(seed=0)


def test_the_expression_comes_from_the_metadata_or_the_question() -> None:
    assert expression(ROW) == "4821 - 967"
    assert expression({"prompt": "What is 12 + 30 =", "meta": None}) == "12 + 30"
    with pytest.raises(ValueError, match="no arithmetic expression"):
        expression({"prompt": "Sort these words", "meta": "{}"})


def test_half_the_demonstrations_call_the_tool_the_others_answer_at_once() -> None:
    rows = [{**ROW, "prompt": f"What is {i} + 1000 ="} for i in range(40)]
    demos = [python_half(r) for r in rows]
    calls = [d for d in demos if len(d.messages) == 5]
    assert 10 <= len(calls) <= 30 and [python_half(r) for r in rows] == demos
    assert all(d.messages[-1] == Message("assistant", "3854") for d in demos)


def test_a_demonstration_is_an_episodes_ids_with_the_tool_turn_masked(smol: Any) -> None:
    tok = smol.tokenizer
    got = encode(tok, python_call(ROW))
    traj = Trajectory(chat_format(tok)).start(
        [Message("system", INSTRUCTIONS), Message("user", ROW["prompt"])], [PYTHON])
    first = tok.encode(call_text("print(4821 - 967)")) + [tok.eos_token_id]
    traj.add_policy(first, [0.0] * len(first))
    traj.observe([Message("tool", "3854", name="python")])
    last = tok.encode("3854") + [tok.eos_token_id]
    traj.add_policy(last, [0.0] * len(last))
    assert (got.prompt, got.completion, got.mask) == tuple(traj.flat()[i] for i in (0, 1, 3))
    masked = tok.decode([i for i, m in zip(got.completion, got.mask) if not m])
    assert masked.split() == ["tool", "3854", "assistant"]  # ChatML's markup is special ids
    assert sum(got.mask) == len(first) + len(last)


def test_smollm2s_turn_parses_as_a_python_call_that_the_sandbox_answers(smol: Any) -> None:
    tok = smol.tokenizer
    ids = encode(tok, python_call(ROW)).completion
    turn = tok.decode(ids[:ids.index(tok.eos_token_id) + 1])  # as the engine decodes it
    call = parse_call(turn)
    assert call is not None and call.error is None
    assert (call.name, call.arguments) == ("python", {"code": "print(4821 - 967)"})
    content, calls = parse(turn, {"python"}, "c")  # the endpoint's reading
    assert content is None and json.loads(calls[0]["function"]["arguments"]) == call.arguments
    env = PythonArithmetic()
    env.reset({"prompt": ROW["prompt"], "answer": ROW["answer"]})
    step = env.step(turn)
    assert step.tool_error is None and step.messages[0].content == "3854"
    assert env.step("3854").reward == 1.0
    bad = env.step('<tool_call>{"name": "python", "arguments": {"code": "1/0"}}</tool_call>')
    assert bad.tool_error is not None and "ZeroDivisionError" in bad.tool_error


def test_sft_trains_on_demonstrations_and_caches_them_apart(tmp_path: Path) -> None:
    policy = TinyLlama(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                       max_position=512).build(seed=0)
    task = ReasoningGym(dataset="chain_sum", train_size=4, heldout_size=2,
                        config={"min_terms": 2, "max_terms": 2, "min_digits": 3, "max_digits": 3})
    demos = SFT(steps=2, batch_size=2, lr=1e-3,
                demonstrations="stages.envs.python_demos:python_call")
    examples = _examples(policy, task, demos.demonstrations)
    assert all(not all(e.mask) and any(e.mask) for e in examples)  # the tool turn is out
    masks = _loss_mask([Example([1], [4, 5, 6], [True, False, True]), Example([1], [4], [True])], 4)
    assert masks.tolist() == [[1.0, 0.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]]  # padding out too
    metrics = demos.run(policy, task, seed=0, cache_dir=tmp_path)
    assert metrics["cached"] == 0.0 and metrics["loss"] > 0
    plain = SFT(steps=2, batch_size=2, lr=1e-3)
    assert plain.cache_key(policy, task, 0) != demos.cache_key(policy, task, 0)
    assert "demonstrations" not in json.dumps(plain._spec_key())  # old caches stay valid
    assert demos.run(policy, task, seed=0, cache_dir=tmp_path)["cached"] == 1.0
