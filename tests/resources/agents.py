"""Agents for the AgentEnv tests, written against the real ``openai`` client (named by
``module:function`` like a user's), an engine wrapper that keeps what the real engine was
asked and answered, and a tiny policy taught one tool call.

The tiny random policy never writes a well-formed tool call by itself; :func:`taught`
trains one (a real TinyLlama, in place, a few hundred Adam steps) until its greedy answer
to one rendered prompt is a given text, so the endpoint's tool-call path runs on a real
engine with real generated ids.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

import pyarrow as pa

from gfcr.core.engine import GenOutput, GenRequest, SamplingParams, SegmentHook
from gfcr.core.policy import Policy
from gfcr.core.rollout import PROMPT_SCHEMA, prompt_id

CALCULATOR = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate arithmetic",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}}]
TOOL_CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "3*7"}}</tool_call>'
RELEASE = threading.Event()
"""Set by a test to let a hanging agent's thread end."""
SEEN: list[Any] = []
"""What the agents saw (responses), appended in call order per thread."""


def needs_openai() -> Any:
    """The ``openai`` module: a skip without it on a developer's machine, a failure under
    CI (the test extra installs it)."""
    import pytest

    try:
        import openai
    except ImportError as err:
        if os.environ.get("CI", "").lower() == "true":
            raise
        pytest.skip(f"openai is not installed ({err}): pip install -e '.[test]'",
                    allow_module_level=True)
    return openai


def plan(*prompts: str, answer: str | None = None) -> pa.Table:
    rows = [{"prompt_id": prompt_id("t", p), "task": "t", "prompt": p, "answer": answer,
             "meta": json.dumps({"source": p})} for p in prompts]
    return pa.Table.from_pylist(rows, schema=PROMPT_SCHEMA)


def model_of(client: Any) -> str:
    return client.models.list().data[0].id


def three_turns(client: Any, task: dict) -> float:
    """A conversation of three calls, each extending the last."""
    model = model_of(client)
    messages: list[Any] = [{"role": "user", "content": task["question"]}]
    for follow_up in ("Are you sure?", "Final answer:"):
        reply = client.chat.completions.create(model=model, messages=messages, max_tokens=6)
        SEEN.append(reply)
        messages += [reply.choices[0].message, {"role": "user", "content": follow_up}]
    SEEN.append(client.chat.completions.create(model=model, messages=messages, max_tokens=6))
    return 0.25 if task["meta"]["source"] == task["prompt"] else -1.0


def follow_up(client: Any, task: dict) -> float:
    """Two calls of one conversation (the question, then a follow-up); its reward is a
    function of the task alone, so a test can check the stored one."""
    messages: list[Any] = [{"role": "user", "content": task["question"]}]
    reply = client.chat.completions.create(model="m", messages=messages, max_tokens=4)
    messages += [reply.choices[0].message, {"role": "user", "content": "Sure?"}]
    client.chat.completions.create(model="m", messages=messages, max_tokens=4)
    return follow_up_reward(task["question"])


def follow_up_reward(question: str) -> float:
    return len(question) / 100


def tool_user(client: Any, task: dict) -> float:
    """Asks with the calculator declared, runs the call the policy makes, asks again."""
    messages: list[Any] = [{"role": "user", "content": task["question"]}]
    reply = client.chat.completions.create(model="m", messages=messages, tools=CALCULATOR,
                                           max_tokens=len(TOOL_CALL) + 1, temperature=0)
    SEEN.append(reply)
    message = reply.choices[0].message
    messages.append(message.model_dump(exclude_none=True))
    result = "none"
    for call in message.tool_calls or []:
        expression = json.loads(call.function.arguments)["expression"]
        result = str(eval(expression, {"__builtins__": {}}))  # the test's own fixed text
        messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    SEEN.append(client.chat.completions.create(model="m", messages=messages, tools=CALCULATOR,
                                               max_tokens=4))
    return 1.0 if result == "21" else 0.0


def brancher(client: Any, task: dict) -> float:
    """Two calls of one conversation, then one whose history was rewritten (a branch),
    then a call that extends the branch."""
    first = [{"role": "user", "content": task["question"]}]
    a = client.chat.completions.create(model="m", messages=first, max_tokens=4)
    second = first + [a.choices[0].message, {"role": "user", "content": "more"}]
    client.chat.completions.create(model="m", messages=second, max_tokens=4)
    rewritten = first + [{"role": "assistant", "content": "a summary"},
                         {"role": "user", "content": "go on"}]
    c = client.chat.completions.create(model="m", messages=rewritten, max_tokens=4)
    client.chat.completions.create(model="m", max_tokens=4, messages=rewritten + [
        c.choices[0].message, {"role": "user", "content": "end"}])
    return 0.5


def flaky(client: Any, task: dict) -> float:
    """Raises, hangs (until RELEASE), returns a non-number, or works, by the question."""
    client.chat.completions.create(model="m", max_tokens=2,
                                   messages=[{"role": "user", "content": task["question"]}])
    if task["question"] == "raise":
        raise ValueError("the agent broke")
    if task["question"] == "hang":
        RELEASE.wait(120)
        return 1.0
    if task["question"] == "nan":
        return float("nan")
    return 1.0


def calls(client: Any, task: dict) -> float:
    """As many calls of one conversation as its question says."""
    messages: list[Any] = []
    for _ in range(int(task["question"])):
        messages.append({"role": "user", "content": "again"})
        reply = client.chat.completions.create(model="m", messages=messages, max_tokens=2)
        messages.append(reply.choices[0].message)
    return 1.0


def closes_its_client(client: Any, task: dict) -> float:
    """Calls, then closes its client (the others' share its connection pool)."""
    client.chat.completions.create(model="m", max_tokens=2,
                                   messages=[{"role": "user", "content": task["question"]}])
    client.close()
    return 1.0


def always_raises(client: Any, task: dict) -> float:
    raise RuntimeError("no agent today")


class Recording:
    """A real engine, and the requests and outputs of each of its generate calls."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.calls: list[tuple[list[GenRequest], SamplingParams, list[GenOutput]]] = []

    @property
    def version(self) -> int:
        return int(self.engine.version)

    @property
    def policy(self) -> Policy:
        return self.engine.policy

    def encode(self, text: str) -> list[int]:
        return self.engine.encode(text)

    def decode(self, ids: list[int]) -> str:
        return self.engine.decode(ids)

    def generate(self, requests: list[GenRequest], params: SamplingParams,
                 on_segment: SegmentHook | None = None) -> list[GenOutput]:
        outputs = self.engine.generate(requests, params, on_segment)
        self.calls.append((requests, params, outputs))
        return outputs

    def update_weights(self, state: Any | None = None) -> int:
        return int(self.engine.update_weights(state))

    def forced_logprobs(self, prompt_ids: list[int], ids: list[int], t: float) -> list[float]:
        return self.engine.forced_logprobs(prompt_ids, ids, t)


def taught(policy: Policy, prompt_ids: list[int], target: list[int], *, steps: int = 400
           ) -> int:
    """Train ``policy.model`` in place until greedy decoding after ``prompt_ids`` gives
    ``target``; returns the steps it took (AssertionError when it never does)."""
    import torch

    model = policy.model
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    ids = torch.tensor([prompt_ids + target])
    start = len(prompt_ids)
    for step in range(steps):
        model.train()
        logits = model(input_ids=ids).logits[0, start - 1:-1]
        loss = torch.nn.functional.cross_entropy(logits, ids[0, start:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 20 == 19 and bool((logits.argmax(-1) == ids[0, start:]).all()):
            model.eval()
            return step + 1
    raise AssertionError(f"the policy did not learn the target in {steps} steps "
                         f"(loss {float(loss):.3f})")


HOSTILE = {
    "huge": [{"role": "user", "content": "1+" * 150_000}],
    "long": [{"role": "user", "content": "1+" * 200}],
    "null": [{"role": "user", "content": [None, 1]}],
    "empty": [{"role": "user", "content": [{"type": "text", "text": ""}]}],
    "poison": [{"role": "user", "content": "poison"}],
}
"""What :func:`hostile` sends for each prompt (any other prompt: one ordinary question)."""


def hostile(client: Any, task: dict) -> float:
    """One call with the messages :data:`HOSTILE` names for its prompt (drills A1, A2,
    A9), else an ordinary one; 1.0 when answered (a refusal raises, and is recorded)."""
    messages = HOSTILE.get(task["question"], [{"role": "user", "content": task["question"]}])
    client.chat.completions.create(model="m", max_tokens=2, messages=messages)
    return 1.0


class Poisoned(Recording):
    """A real engine that raises for a whole call when one of its requests decodes to
    "poison" (an engine fault one request causes, as A2's empty prompt did)."""

    def generate(self, requests: list[GenRequest], params: SamplingParams,
                 on_segment: SegmentHook | None = None) -> list[GenOutput]:
        if any(self.decode(r.prompt_ids).endswith("poison") for r in requests):
            self.calls.append((requests, params, []))
            raise ValueError(f"request poisoned the call of {len(requests)}")
        return super().generate(requests, params, on_segment)


_LONG_SENT = threading.Lock()
_LONG = {"sent": False}


def one_long(client: Any, task: dict) -> float:
    """The first episode to call sends a message longer than the fleet servers' context
    (400 characters: over their ``--max-model-len 256``, drill A9); every other one asks
    its question. Reset :data:`_LONG` between runs (:func:`reset_one_long`)."""
    with _LONG_SENT:
        long, _LONG["sent"] = not _LONG["sent"], True
    text = "1+" * 200 if long else task["question"]
    client.chat.completions.create(model="m", max_tokens=2,
                                   messages=[{"role": "user", "content": text}])
    return 1.0


def reset_one_long() -> None:
    with _LONG_SENT:
        _LONG["sent"] = False
