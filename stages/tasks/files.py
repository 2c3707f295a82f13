"""A user's own prompts and answers as a task: :class:`FileTask` over a dataset file.

JSON lines, Parquet, CSV, or a folder written by ``datasets.Dataset.save_to_disk``
(:mod:`stages.tasks._readers`). The prompt column holds text, or chat messages (a list of
``{"role", "content"}``) ending with the user's turn; the answer column the reference
(any value, kept as text; ``answer=None`` for a scorer that needs none). Every other
column (ids, sources, difficulty, ...) is carried into the store in the row's ``meta``,
a JSON object, so ``json_extract(meta, '$.id')`` finds a rollout's record again.

The file is read and checked when the task is built (so a pipeline with a malformed file
fails before any step), and an error names the file, the line (or row) and the column.

The held-out split is either given (``heldout_path``, a second file whose prompts are
removed from training) or drawn under ``seed``: distinct prompts shuffled, the first
``heldout_fraction`` of them held out, so no prompt is in both splits.

>>> FileTask(path="examples/data/sums.jsonl", prompt="question", answer="answer",
...          scorer="exact")  # doctest: +SKIP
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Literal

import math_verify
import numpy as np
import pyarrow as pa
from pydantic import Field, PrivateAttr, field_validator, model_validator

from gfcr.config.refs import REF, resolve
from gfcr.core.rollout import PROMPT_SCHEMA, prompt_id
from gfcr.core.stage import Spec
from gfcr.core.registry import register
from stages.tasks._readers import DataFileError, Format, Row, read

SCORERS = ("exact", "math-verify")
"""Scorers by name; anything else must be a ``module:function``."""


@register("task")
class FileTask(Spec):
    """Prompts (text or chat messages) and reference answers from a dataset file.

    Scorers by name: ``exact`` (1.0 when the stripped completion equals the stripped
    answer), ``math-verify`` (1.0 when the completion's last parsable expression equals
    the answer mathematically; Kydlicek et al., HuggingFace math-verify), or a user's
    ``module:function`` called as ``fn(completion, answer, meta) -> float`` with ``meta``
    the row's other columns as a dict.
    """

    type: Literal["file"] = "file"
    path: str
    """A JSONL, Parquet or CSV file, or a ``save_to_disk`` folder, of training prompts (and
    of held-out ones when no ``heldout_path`` is given)."""
    prompt: str = "question"
    """The column of prompts: text, or a list of chat messages ending with the user's."""
    answer: str | None = "answer"
    """The column of reference answers; None: the scorer needs none."""
    format: Format = "auto"
    """``auto``: from the suffix (a folder: ``hf_disk``)."""
    heldout_path: str | None = None
    """A second file of held-out prompts (same columns); they are removed from training."""
    heldout_fraction: float = Field(0.1, gt=0.0, lt=1.0)
    """Without ``heldout_path``: the share of distinct prompts held out, drawn under ``seed``."""
    seed: int = 0
    """Seed of the held-out draw."""
    scorer: str = "exact"
    """``exact``, ``math-verify`` or ``module:function``."""
    name: str | None = None
    """The ``task`` column's value (None: the file's stem)."""

    _cache: dict[str, Any] = PrivateAttr(default_factory=dict)

    @field_validator("scorer")
    @classmethod
    def _scorer_shape(cls, value: str) -> str:
        if value not in SCORERS and not REF.fullmatch(value):
            raise ValueError(f"scorer must be 'exact', 'math-verify' or 'module:function', "
                             f"got {value!r}")
        return value

    @model_validator(mode="after")
    def _read(self) -> "FileTask":
        """Read and check the file(s) now: a bad row fails the pipeline before any step."""
        if self.scorer not in SCORERS:
            fn = resolve(self.scorer, "scorer")
            if not callable(fn):
                raise ValueError(f"scorer {self.scorer!r} is not callable")
            self._cache["fn"] = fn
        try:
            self._splits()
        except DataFileError as err:
            raise ValueError(str(err)) from None
        return self

    @property
    def label(self) -> str:
        """The ``task`` column: ``name`` or the file's stem."""
        return self.name or Path(self.path).stem

    def prompt_counts(self) -> dict[str, int]:
        """The prompts each split holds (gfcr.core.sizes checks a pipeline's demands)."""
        train, held = self._splits()
        return {"train": train.num_rows, "heldout": held.num_rows}

    def train_prompts(self) -> pa.Table:
        return self._splits()[0]

    def heldout_prompts(self) -> pa.Table:
        return self._splits()[1]

    def score(self, completion: str, answer: str | None, meta: str | None) -> float:
        """The chosen scorer on ``completion`` against the reference ``answer``."""
        if self.scorer == "exact":
            return float(answer is not None and completion.strip() == answer.strip())
        if self.scorer == "math-verify":
            if answer is None:
                raise ValueError(f"file task {self.label!r}: math-verify needs an answer")
            gold = math_verify.parse(answer, parsing_timeout=None)
            pred = math_verify.parse(completion, parsing_timeout=None)
            return float(math_verify.verify(gold, pred, timeout_seconds=None))
        fn: Callable[..., Any] = self._cache["fn"] if "fn" in self._cache else \
            resolve(self.scorer, "scorer")
        return float(fn(completion, answer, json.loads(meta) if meta else {}))

    # ------------------------------------------------------------------ reading

    def _splits(self) -> tuple[pa.Table, pa.Table]:
        if "splits" not in self._cache:
            rows = self._rows(Path(self.path))
            if self.heldout_path is not None:
                heldout = self._rows(Path(self.heldout_path))
                held_ids = {r["prompt_id"] for r in heldout}
                train = [r for r in rows if r["prompt_id"] not in held_ids]
            else:
                order = np.random.default_rng(self.seed).permutation(len(rows))
                cut = max(1, round(self.heldout_fraction * len(rows)))
                if cut >= len(rows):
                    raise DataFileError(f"{self.path}: {len(rows)} distinct prompt(s) cannot "
                                        f"be split by heldout_fraction="
                                        f"{self.heldout_fraction!r}; give more prompts or "
                                        "a heldout_path")
                heldout = [rows[i] for i in sorted(order[:cut])]
                train = [rows[i] for i in sorted(order[cut:])]
            self._cache["splits"] = (pa.Table.from_pylist(train, schema=PROMPT_SCHEMA),
                                     pa.Table.from_pylist(heldout, schema=PROMPT_SCHEMA))
        return self._cache["splits"]

    def _rows(self, path: Path) -> list[dict[str, Any]]:
        """Distinct prompt rows (PROMPT_SCHEMA) of one file, in file order."""
        needed = (self.prompt,) if self.answer is None else (self.prompt, self.answer)
        out: list[dict[str, Any]] = []
        seen: set[str] = set()
        for row in read(path, self.format, needed):
            text = _prompt_text(row, self.prompt)
            answer = None
            if self.answer is not None:
                value = row.values[self.answer]
                if value is None or (isinstance(value, str) and not value.strip()):
                    raise DataFileError(f"{row.where}: column {self.answer!r} is empty")
                answer = value if isinstance(value, str) else json.dumps(value, default=str)
            pid = prompt_id(self.label, text)
            if pid in seen:
                continue
            seen.add(pid)
            rest = {k: v for k, v in row.values.items() if k not in needed}
            out.append({"prompt_id": pid, "task": self.label, "prompt": text,
                        "answer": answer,
                        "meta": json.dumps(rest, default=str) if rest else None})
        return out


def _prompt_text(row: Row, column: str) -> str:
    """The prompt of ``row``: its text, or the user's turn of a chat-message list (a
    JSON text of one in CSV). A conversation the policy's single-turn prompt cannot hold
    (several turns, a system message) is refused, naming where."""
    value = row.values[column]
    if isinstance(value, str) and value.lstrip().startswith("[{"):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            pass  # text that happens to start like JSON
    if isinstance(value, str):
        if not value.strip():
            raise DataFileError(f"{row.where}: column {column!r} is empty")
        return value
    if not isinstance(value, list) or not value:
        raise DataFileError(f"{row.where}: column {column!r} holds "
                            f"{type(value).__name__}, not text or a list of chat messages")
    for i, message in enumerate(value):
        if not (isinstance(message, dict) and isinstance(message.get("role"), str)
                and isinstance(message.get("content"), str)):
            raise DataFileError(f"{row.where}: column {column!r}: message {i} is not a "
                                "{'role': ..., 'content': ...} mapping of text")
    roles = [m["role"] for m in value]
    if roles != ["user"]:
        raise DataFileError(
            f"{row.where}: column {column!r}: roles {roles!r}; a prompt is one user "
            "message (a system message goes in the policy: HFCheckpoint(system=...))")
    content: str = value[0]["content"]
    if not content.strip():
        raise DataFileError(f"{row.where}: column {column!r}: the user message is empty")
    return content
