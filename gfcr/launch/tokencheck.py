"""Before a run trains or evaluates anything: can the policy's tokenizer represent the
task's text?

A tokenizer that cannot encode a character (the tiny policy's ASCII character tokenizer
and an "à"), or that decodes it to something else (an unknown-token id), would fail or
silently corrupt the run minutes in, once per batch. :func:`check_tokenizer` looks at a
sample of the task's prompts and answers instead, when the run starts, and refuses with
one paragraph naming the task, the characters, the field they were found in and what to
change in the pipeline.
"""

from __future__ import annotations

import pyarrow as pa

from gfcr.core.engine import Tokenizer
from gfcr.core.stage import Task

SAMPLE = 5000
"""Rows checked from the start of each split (training and held-out)."""
FIELDS = ("prompt", "answer")


class TokenizerError(ValueError):
    """The policy's tokenizer cannot represent some of the task's text."""


def check_tokenizer(tokenizer: Tokenizer, splits: dict[str, pa.Table], *,
                    task: str, remedy: str = "") -> int:
    """Raise :class:`TokenizerError` if a sampled prompt or answer of ``splits``
    (split name -> PROMPT_SCHEMA table) does not survive ``encode`` then ``decode``
    character for character; return the number of texts checked."""
    verdicts: dict[str, bool] = {}
    bad: dict[str, dict[str, int]] = {f: {} for f in FIELDS}
    first: dict[str, str] = {}
    checked = 0
    for split, table in splits.items():
        for row in table.slice(0, SAMPLE).select(list(FIELDS)).to_pylist():
            for field in FIELDS:
                text = row[field]
                if text is None:
                    continue
                checked += 1
                chars = _unrepresentable(tokenizer, text, verdicts)
                for c in chars:
                    bad[field][c] = bad[field].get(c, 0) + 1
                if chars and field not in first:
                    first[field] = f"{split} {field} {text[:60]!r}"
    if any(bad.values()):
        raise TokenizerError(_message(tokenizer, task, bad, first, remedy))
    return checked


def _unrepresentable(tok: Tokenizer, text: str, verdicts: dict[str, bool]) -> list[str]:
    """The distinct characters of ``text`` that do not round-trip through ``tok``."""
    try:
        if tok.decode(tok.encode(text)) == text:
            return []
    except ValueError:
        pass
    out = []
    for c in dict.fromkeys(text):
        if c not in verdicts:
            verdicts[c] = _round_trips(tok, c)
        if not verdicts[c]:
            out.append(c)
    return out


def _round_trips(tok: Tokenizer, c: str) -> bool:
    try:
        return c in tok.decode(tok.encode(c))
    except ValueError:
        return False


def _message(tok: Tokenizer, task: str, bad: dict[str, dict[str, int]], first: dict[str, str],
             remedy: str) -> str:
    parts = []
    for field, chars in bad.items():
        if not chars:
            continue
        shown = ", ".join(f"{c!r} (U+{ord(c):04X})" for c in list(chars)[:8])
        more = f" and {len(chars) - 8} more" if len(chars) > 8 else ""
        parts.append(f"in the field {field!r}: {shown}{more} (first in the {first[field]})")
    fix = f"To run it, {remedy}." if remedy else ("To run it, use a policy whose tokenizer "
                                                  "covers these characters.")
    return (f"task {task!r}: the policy's tokenizer ({type(tok).__name__}) cannot represent "
            f"characters of the task's text, {'; '.join(parts)}. {fix}")


def task_name(splits: dict[str, pa.Table], default: str) -> str:
    """The ``task`` column's first value (e.g. the reasoning-gym dataset), or ``default``."""
    for table in splits.values():
        if table.num_rows and "task" in table.column_names:
            return str(table.column("task")[0].as_py())
    return default


def check_task(task: Task, tokenizer: Tokenizer, remedy: str = "") -> int:
    """:func:`check_tokenizer` on a task component's training and held-out splits."""
    splits = {"training": task.train_prompts(), "held-out": task.heldout_prompts()}
    return check_tokenizer(tokenizer, splits, task=task_name(splits, "task"), remedy=remedy)
