"""The columns of an evaluated completion, declared once: the runner writes them
(gfcr.evaluation.heldout), the store keeps them in ``eval_completions`` (store/README.md)
and readers (the report, a UI, a user's SQL) read them."""

from __future__ import annotations

import pyarrow as pa

COMPLETION_SCHEMA = pa.schema([
    pa.field("prompt_id", pa.string(), nullable=False),
    pa.field("sample", pa.int64(), nullable=False),
    pa.field("temperature", pa.float64(), nullable=False),
    pa.field("prompt", pa.string()),
    pa.field("answer", pa.string()),
    pa.field("completion", pa.string(), nullable=False),
    pa.field("n_tokens", pa.int64(), nullable=False),
    pa.field("finish_reason", pa.string()),
    pa.field("reward", pa.float64(), nullable=False),
    pa.field("correct", pa.bool_(), nullable=False),
    pa.field("error", pa.string()),
])
"""One evaluated completion: the prompt (``prompt_id`` as in ``rollouts``, its text and
reference answer), which sample of it (0 for the greedy one, whose ``temperature`` is 0;
0..n-1 for the sampled ones), the completion's text and token count, why it ended, its
reward (0 where the scorer raised: ``error``) and whether it got full credit
(``correct``: reward >= 1)."""

HELDOUT = "heldout"
"""The ``eval_set`` of the task's own held-out split."""
