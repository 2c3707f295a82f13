"""Writing an evaluation: its ``evaluations`` row and its completions
(``eval_completions``), replacing those of the same run, label and set in one
transaction, so a resumed run that evaluates again stores each once."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import duckdb
import pyarrow as pa

from gfcr.evaluation.columns import HELDOUT

from ._tables import EVAL_COMPLETIONS_SCHEMA, EVALUATIONS_SCHEMA


def evaluation_row(run_id: str, step: int, label: str, now: datetime, *, accuracy: float,
                   n_prompts: int, temperature: float, max_tokens: int,
                   eval_set: str = HELDOUT, sampled: dict[str, Any] | None = None) -> pa.Table:
    """The ``evaluations`` row; ``sampled`` holds ``samples``, ``temperature``,
    ``mean_reward`` and ``pass_at`` ({k: value}) of a sampled evaluation."""
    more = sampled or {}
    pass_at = more.get("pass_at")
    return pa.table({
        "run_id": [run_id], "step": [step], "label": [label], "accuracy": [float(accuracy)],
        "n_prompts": [n_prompts], "temperature": [float(temperature)],
        "max_tokens": [max_tokens], "evaluated_at": [now], "eval_set": [eval_set],
        "samples": [more.get("samples")], "sample_temperature": [more.get("temperature")],
        "mean_reward": [more.get("mean_reward")],
        "pass_at": [None if pass_at is None else sorted(pass_at.items())]},
        schema=EVALUATIONS_SCHEMA)


def completion_rows(run_id: str, step: int, label: str, eval_set: str,
                    completions: pa.Table) -> pa.Table:
    """``completions`` (COMPLETION_SCHEMA) with the evaluation's keys in front."""
    n = completions.num_rows
    keys = {"run_id": [run_id] * n, "step": [step] * n, "label": [label] * n,
            "eval_set": [eval_set] * n}
    columns = {**keys, **{name: completions.column(name) for name in completions.column_names}}
    return pa.table(columns, schema=EVAL_COMPLETIONS_SCHEMA)


def replace_evaluation(con: duckdb.DuckDBPyConnection, row: pa.Table,
                       completions: pa.Table | None) -> None:
    """In the caller's transaction: drop the run's rows of the same label and set (rows
    stored before sets existed have a null set: the held-out one), insert the new ones."""
    run_id, label, eval_set = (row.column(c)[0].as_py() for c in ("run_id", "label", "eval_set"))
    same = "run_id = ? AND label = ? AND coalesce(eval_set, ?) = ?"
    con.execute(f"DELETE FROM lake.evaluations WHERE {same}", [run_id, label, HELDOUT, eval_set])
    con.execute(f"DELETE FROM lake.eval_completions WHERE {same}",
                [run_id, label, HELDOUT, eval_set])
    con.register("_gfcr_run", row)  # unregistered by the store's _transaction
    con.execute("INSERT INTO lake.evaluations BY NAME SELECT * FROM _gfcr_run")
    if completions is not None and completions.num_rows:
        con.register("_gfcr_batch", completions)
        con.execute("INSERT INTO lake.eval_completions BY NAME SELECT * FROM _gfcr_batch")
