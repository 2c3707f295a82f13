"""Demonstration episodes of the Python tool, for the supervised warm start.

A small chat model asked to add two 4-digit numbers gets them wrong in its head; with
the tool it only has to copy the expression into a call and the tool's output into its
answer. :func:`python_call` writes that episode for a task row (the ``python_tool``
environment's system message, the question, a call ``print(<expression>)``, the tool's
output, the answer), so ``SFT(demonstrations="stages.envs.python_demos:python_call")``
teaches the call format (:data:`stages.envs.tools.CALL`) and the round trip before GRPO.

The tool's output in a demonstration is the reference answer: for reasoning-gym's
integer ``chain_sum`` and ``basic_arithmetic`` questions ``print`` of the expression
prints exactly it, and no sandbox runs at warm-start time.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from gfcr.core.environment import Message
from stages.envs.python_tool import INSTRUCTIONS
from stages.envs.tools import PYTHON
from stages.train.sft_demos import Demonstration

_EXPRESSION = re.compile(r"([-\d\s+*/().]+?)\s*=\s*\??\s*$")
"""The arithmetic before a trailing ``=`` in a question ("... problem: 41 - 7 =")."""


def expression(row: dict[str, Any]) -> str:
    """The row's arithmetic expression: reasoning-gym's ``metadata.expression`` where the
    row's ``meta`` has it, else the text before the question's trailing ``=``."""
    meta = row.get("meta")
    try:
        parsed = json.loads(meta) if isinstance(meta, str) else (meta or {})
    except json.JSONDecodeError:
        parsed = {}
    found = (parsed.get("metadata") or {}).get("expression") if isinstance(parsed, dict) else None
    if isinstance(found, str) and found.strip():
        return found.strip()
    match = _EXPRESSION.search(str(row["prompt"]))
    if match is None or not match.group(1).strip():
        raise ValueError(f"python_demos: no arithmetic expression in {row['prompt']!r}")
    return match.group(1).strip()


def call_text(code: str) -> str:
    """The policy's text of one Python tool call running ``code``."""
    body = json.dumps({"name": PYTHON.name, "arguments": {"code": code}})
    return f"<tool_call>{body}</tool_call>"


def python_call(row: dict[str, Any]) -> Demonstration:
    """The episode: system and question, ``print(<expression>)`` as a tool call, the
    answer as the tool's output, the answer as the final reply."""
    answer = str(row["answer"]).strip()
    return Demonstration([
        Message("system", INSTRUCTIONS),
        Message("user", str(row["prompt"])),
        Message("assistant", call_text(f"print({expression(row)})")),
        Message("tool", answer, name=PYTHON.name),
        Message("assistant", answer),
    ], [PYTHON])


def python_half(row: dict[str, Any]) -> Demonstration:
    """Half the rows (by a hash of the question) as :func:`python_call`, the other half
    answered at once without the tool: a warm start that calls the tool about half the
    time, so GRPO has a choice to learn (in-head answers to 3-4 digit sums are mostly
    wrong, calls mostly right) rather than a call rate already at 1."""
    if int(hashlib.sha256(str(row["prompt"]).encode()).hexdigest()[:8], 16) % 2 == 0:
        return python_call(row)
    return Demonstration([Message("system", INSTRUCTIONS), Message("user", str(row["prompt"])),
                          Message("assistant", str(row["answer"]).strip())], [PYTHON])
