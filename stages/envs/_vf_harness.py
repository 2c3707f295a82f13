"""gfcr's harness for verifiers (v1) environments: the agent side of an episode, run in
the run's process.

verifiers 0.4.0 splits an episode into the environment's side (its ``Env.run``, the
taskset's tasks, tools, stop conditions and rubric) and a *harness*, the agent program
whose model calls reach verifiers' interception server. Its own harnesses launch a PEP 723
script through ``uv`` (bootstrapped from the network) or a container, which an offline
training run cannot; the ``Harness`` contract allows a loop in-process "as long as every
model call goes through endpoint + secret". This is that loop: chat completions (no
streaming, which gfcr's endpoint does not serve) until a reply without tool calls, the
task's MCP tools called through verifiers' own MCP client helpers. Each model call goes
interception -> gfcr's endpoint, which records the engine's token ids and logprobs.

verifiers finds a harness by an importable id, so :func:`register` makes this module
importable as ``gfcr_chat`` (an alias in ``sys.modules``; verifiers cannot import a dotted
id).
"""

from __future__ import annotations

import json
import sys
from contextlib import AsyncExitStack
from typing import Any

import verifiers.v1 as vf
from openai import APIStatusError, AsyncOpenAI, NOT_GIVEN
from verifiers.v1.dialects.chat import message_to_wire
from verifiers.v1.harnesses.utils.compaction import is_context_overflow
from verifiers.v1.harnesses.utils.mcp import call_mcp, connect_mcp

HARNESS_ID = "gfcr_chat"
"""The id environments' agents are given (``agent.harness.id``)."""


class ChatHarnessConfig(vf.HarnessConfig):
    """No knobs: limits are the agent's (``max_turns``) and the endpoint's."""


class ChatHarness(vf.Harness[ChatHarnessConfig]):
    """A tool-calling chat loop in-process (see the module docstring)."""

    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_MCP = True
    SUPPORTS_RESUME = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx: Any, trace: Any, runtime: Any, endpoint: str, secret: str,
                     mcp_urls: dict[str, str], data: Any,
                     tool_interception_url: str | None = None) -> Any:
        messages = _opening(*self.resolve_prompt(data))
        client = AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0)
        try:
            async with AsyncExitStack() as stack:
                tools: list[dict[str, Any]] = []
                dispatch: dict[str, Any] = {}
                servers: dict[str, Any] = {}
                if mcp_urls:
                    spec = {"mcpServers": {n: {"url": u} for n, u in mcp_urls.items()}}
                    tools, dispatch, servers = await connect_mcp(spec, stack)
                await _loop(client, ctx.model, messages, tools, dispatch, servers)
        finally:
            await client.close()
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")


def _opening(system: str | None, prompt: Any) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [] if not system else [{"role": "system",
                                                             "content": system}]
    if isinstance(prompt, str):
        messages.append({"role": "user", "content": prompt})
    elif prompt:
        messages += [message_to_wire(m) for m in prompt]
    return messages


async def _loop(client: AsyncOpenAI, model: str, messages: list[dict[str, Any]],
                tools: list[dict[str, Any]], dispatch: dict[str, Any],
                servers: dict[str, Any]) -> None:
    """Model, then the tools it called, until a reply without tool calls; a context
    overflow ends the episode (as verifiers' own chat program does)."""
    while True:
        try:
            completion = await client.chat.completions.create(
                model=model, messages=messages,  # type: ignore[arg-type]
                tools=tools or NOT_GIVEN)  # type: ignore[arg-type]
        except APIStatusError as err:
            if is_context_overflow(err):
                return
            raise
        message = completion.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return
        for call in message.tool_calls:
            name = call.function.name  # type: ignore[union-attr]
            content = await _tool(name, call.function.arguments,  # type: ignore[union-attr]
                                  dispatch, servers)
            messages.append({"role": "tool", "tool_call_id": call.id, "name": name,
                             "content": content})


async def _tool(name: str, arguments: str | None, dispatch: dict[str, Any],
                servers: dict[str, Any]) -> Any:
    """A tool's result, or an error the model reads (bad JSON, unknown tool)."""
    try:
        args = json.loads(arguments or "{}")
    except ValueError as err:
        return f"error: invalid JSON in tool arguments ({err})"
    if not isinstance(args, dict):
        return "error: tool arguments must be a JSON object"
    if name not in dispatch:
        return f"error: unknown tool {name!r}"
    return await call_mcp(servers, dispatch, name, args)


__all__ = ["ChatHarness"]


def register() -> None:
    """Make this module importable under :data:`HARNESS_ID` (see the module docstring)."""
    sys.modules.setdefault(HARNESS_ID, sys.modules[__name__])
