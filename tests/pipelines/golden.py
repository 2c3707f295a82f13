"""Golden rows: what each ready pipeline stores in a short run under a fixed seed, kept as
JSON under tests/pipelines/golden/<engine>/<pipeline>.json, so a change to the schema, the
store or the loop that alters a stored row (its tokens, log-probabilities, rewards,
advantages or policy versions) fails the pipeline tests that compare against them.

The files were written by the code before the versioned-schema change (issue 21, item 5)
and are only rewritten on purpose: ``GFCR_WRITE_GOLDEN=1 pytest tests/pipelines``. The
``dots_rr`` files were rewritten (Nov 28) when DOTS's choice stopped depending on the CPU's
rounding (float64 similarities, ties to 9 decimals in ``stages.replay._beliefs.pick``):
before, another OpenBLAS kernel drew other prompts at step 1. Checked since: every HF
golden passes under ``OPENBLAS_CORETYPE`` Haswell, Zen, Sandybridge, SkylakeX and Prescott
and ``ATEN_CPU_CAPABILITY`` avx2 and default.

What is compared, and how: every row of the run, ordered by (step, rollout id); ids,
token ids, versions, status and counts exactly; ``logprobs`` per token within
:data:`LOGPROB_ATOL` and ``reward``/``advantage`` within :data:`VALUE_ATOL` (the HF
engine is deterministic under a fixed seed in one process, but a machine with other SIMD
kernels may round the last bits of a float32 log-probability differently).

vLLM (its CPU build here) samples with per-request seeds from the engine's own generator,
so its rows are reproducible too for one engine configuration and batch composition
(each test builds its pipeline's engine the same way; the pooled LLMs of
tests.resources.vllm reload the weights and drop the prefix cache before reuse): the
same columns are compared, with the same tolerances. Checked: the files of both engines,
written in one process by the code before the versioned-schema change, match the rows of
runs in other processes after it (and, for HF, before it). Should a vLLM build break that (GPU kernels that are not
batch-invariant), compare only the invariants: ids, versions and token counts.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

GOLDEN = Path(__file__).parent / "golden"
RUN_ID = "golden"
"""The run id of every golden run (rollout ids are hashes that include it)."""
STEPS = 3
LOGPROB_ATOL = 2e-3
VALUE_ATOL = 1e-4

COLUMNS = ("step", "rollout_id", "parent_id", "group_id", "sample_idx", "prompt_id",
           "completion_ids", "logprobs", "reward", "advantage", "policy_version_start",
           "policy_version_end", "finish_reason", "status", "kept", "consumed_at_step",
           "replay_count")
OPTIONAL = ("hint_tokens",)
"""Extra columns compared where the run's store has them (forced-prefix tokens)."""
FLOATS = {"reward", "advantage"}


def stored_rows(store_path: Path) -> list[dict[str, Any]]:
    """The compared columns of every row of the golden run, by (step, rollout id)."""
    from store import RolloutStore

    with RolloutStore.open(store_path, read_only=True) as store:
        have = store.sql("SELECT * FROM rollouts LIMIT 0").column_names
        names = ", ".join([*COLUMNS, *(c for c in OPTIONAL if c in have)])
        table = store.sql(f"SELECT {names} FROM rollouts WHERE run_id = '{RUN_ID}' "
                          f"ORDER BY step, rollout_id")
    return table.to_pylist()


def flat_from_turns(store_path: Path) -> list[str]:
    """Each stored row of the run whose flat token columns are not what its stored turns
    give (gfcr.core.trajectory.flat, the one rule), or whose ``hint_tokens`` is not
    its forced turn's length: the turns are the rollout's body, the flat columns derived."""
    from gfcr.core.trajectory import flat
    from store import RolloutStore

    with RolloutStore.open(store_path, read_only=True) as store:
        have = store.sql("SELECT * FROM rollouts LIMIT 0").column_names
        hints = ", hint_tokens" if "hint_tokens" in have else ""
        rows = store.sql(f"SELECT rollout_id, prompt_ids, completion_ids, logprobs, turns"
                         f"{hints} FROM rollouts WHERE run_id = '{RUN_ID}'").to_pylist()
    out = []
    for row in rows:
        derived = flat(row["turns"] or [])
        forced = sum(len(t["token_ids"]) for t in row["turns"] or [] if t["source"] == "forced")
        if (row["turns"] is None or derived.prompt_ids != row["prompt_ids"]
                or derived.completion_ids != row["completion_ids"]
                or not _same("logprobs", derived.logprobs, row["logprobs"])
                or (row.get("hint_tokens") or 0) != forced):
            out.append(f"{row['rollout_id']}: its flat columns are not its turns'")
    return out


def check(engine: str, pipeline: str, store_path: Path) -> None:
    """Compare the run's stored rows with the golden file (or write it, on request), and
    check that their flat columns are their turns' (:func:`flat_from_turns`)."""
    path = GOLDEN / engine / f"{pipeline}.json"
    apart = flat_from_turns(store_path)
    assert not apart, f"{engine}/{pipeline}: " + "; ".join(apart[:5])
    rows = stored_rows(store_path)
    if os.environ.get("GFCR_WRITE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_dump(rows))
        return
    assert path.exists(), f"no golden rows at {path}; write them with GFCR_WRITE_GOLDEN=1"
    want = json.loads(path.read_text())
    problems = differences(want, rows)
    assert not problems, (f"{engine}/{pipeline}: the stored rows differ from {path.name} "
                          f"({len(problems)} difference(s)):\n" + "\n".join(problems[:12]))


def differences(want: list[dict[str, Any]], got: list[dict[str, Any]]) -> list[str]:
    """Each column of each row that differs, as a line naming the row and both values."""
    if len(want) != len(got):
        return [f"{len(got)} rows stored, {len(want)} golden"]
    out = []
    for i, (w, g) in enumerate(zip(want, got)):
        for name in [*COLUMNS, *(c for c in OPTIONAL if c in w or c in g)]:
            if not _same(name, w.get(name), g.get(name)):
                out.append(f"row {i} ({w['rollout_id']}, step {w['step']}): {name} is "
                           f"{_short(g[name])}, golden {_short(w[name])}")
    return out


def _same(name: str, want: Any, got: Any) -> bool:
    if name == "logprobs":
        return (want is None) == (got is None) and (want is None or (
            len(want) == len(got) and all(math.isclose(a, b, abs_tol=LOGPROB_ATOL)
                                          for a, b in zip(want, got))))
    if name in FLOATS and want is not None and got is not None:
        return math.isclose(want, got, abs_tol=VALUE_ATOL)
    return bool(want == got)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _dump(rows: list[dict[str, Any]]) -> str:
    """One row a line, log-probabilities rounded to 5 decimals (small, diffable)."""
    lines = []
    for row in rows:
        row = dict(row)
        if row["logprobs"] is not None:
            row["logprobs"] = [round(v, 5) for v in row["logprobs"]]
        lines.append(json.dumps(row, separators=(",", ":")))
    return "[\n" + ",\n".join(lines) + "\n]\n"
