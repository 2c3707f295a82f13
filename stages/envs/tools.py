"""Tool calls in the policy's text, and the sandboxed Python tool.

The call format is Hermes'/Qwen's, which chat templates with tools expect:
``<tool_call>{"name": "python", "arguments": {"code": "print(3 * 4)"}}</tool_call>``.
:func:`parse_call` finds the first such block in a reply; a block that is not JSON of
that shape is a call that failed to parse (its error is recorded as the turn's
``tool_error``, and an environment may penalise it).

:class:`PythonTool` runs the code of a call in gfcr's code sandbox (:mod:`gfcr.core.codebox`:
bubblewrap namespaces, a memory cgroup, CPU, wall, memory and file-size limits; the
same sandbox the code verifiers use), and caps what it prints. A run that raises or hits
a limit is a tool error named by its verdict (``error: ZeroDivisionError ...``,
``wall_time``, ``memory``, ...); the policy sees the output and the error.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from pydantic import Field

from gfcr.core import codebox
from gfcr.core.environment import Tool
from gfcr.core.stage import Spec

CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
"""A tool call block (an unclosed one runs to the end of the reply)."""


@dataclass(frozen=True)
class ToolCall:
    """A parsed tool call, or the reason it did not parse (``error``)."""

    name: str | None
    arguments: dict[str, Any]
    error: str | None = None


def parse_call(reply: str) -> ToolCall | None:
    """The reply's first tool call; None when it makes none."""
    found = CALL.search(reply)
    if found is None:
        return None
    try:
        data = json.loads(found.group(1).strip())
    except json.JSONDecodeError as err:
        return ToolCall(None, {}, f"parse: the tool call is not JSON ({err.msg})")
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return ToolCall(None, {}, 'parse: a tool call is {"name": ..., "arguments": {...}}')
    arguments = data.get("arguments", {})
    if not isinstance(arguments, dict):
        return ToolCall(data["name"], {}, "parse: the tool call's arguments are not an object")
    return ToolCall(data["name"], arguments)


PYTHON = Tool("python", "Run a Python program in a sandbox and see what it prints.",
              {"type": "object", "properties": {"code": {"type": "string",
                                                         "description": "The program."}},
               "required": ["code"]})
"""The Python tool's declaration (JSON schema of its arguments)."""


class PythonTool(Spec):
    """The sandboxed Python tool's limits."""

    isolation: codebox.Isolation = "namespaces"
    """``"unsafe"``: run without namespaces (explicit opt-in; see stages.sandbox)."""
    cpu_seconds: int = Field(2, ge=1)
    wall_seconds: float = Field(5.0, gt=0.0)
    memory_mb: int = Field(256, ge=64)
    file_mb: int = Field(1, ge=1)
    max_output: int = Field(512, ge=1)
    """Characters of output the policy sees (stdout, then the error's last line)."""

    def run(self, arguments: dict[str, Any]) -> tuple[str, str | None]:
        """Run a call's ``code``: (what the policy sees, the tool error or None)."""
        code = arguments.get("code")
        error: str | None = None
        if not isinstance(code, str):
            error = "arguments: the python tool needs a string argument 'code'"
            return f"error: {error}", error
        out = codebox.run_code(code, isolation=self.isolation, cpu_seconds=self.cpu_seconds,
                               wall_seconds=self.wall_seconds, memory_mb=self.memory_mb,
                               file_mb=self.file_mb)
        shown = out.stdout
        if out.verdict != "ok":
            last = (out.stderr.strip().splitlines() or [""])[-1]
            error = f"{out.verdict}: {last}".strip().rstrip(":")
            shown += f"\n{error}"
        return shown.strip()[: self.max_output], error
