"""The agentic operators in real runs: the agentic pipeline (Episodes against the feedback
environment, HF engine, a tiny policy) with GiGPO or IGPO before GRPO, two steps each,
stored in a real store; the stored turn advantages follow the trajectories' turns, IGPO
reaches the learner's teacher forcing through the loop, and the report and the doctor
read the runs."""

from __future__ import annotations

from typing import Any

import pytest

from gfcr import Pipeline
from gfcr.doctor import diagnose
from gfcr.report import report_html
from gfcr.rollout import TURN_ADVANTAGES
from gfcr.run import execute
from pipelines.agentic import pipeline as agentic
from stages import GiGPO, IGPO
from store import RolloutStore
from tests.pipelines.test_agentic import _two_steps


def _with(stage: Any) -> Pipeline:
    data = _two_steps(agentic).to_dict()
    data["stages"].insert(-1, stage.model_dump())
    return Pipeline(**data)


@pytest.mark.parametrize("stage", [GiGPO(gamma=0.9), IGPO(answer_format="{answer}")],
                         ids=["gigpo", "igpo"])
def test_an_agentic_operator_in_a_real_run(tmp_path: Any, stage: Any) -> None:
    run_id = f"agentic-{stage.type}"
    summary = execute(_with(stage), root=tmp_path, executor="local", run_id=run_id)
    assert summary.steps == 2
    with RolloutStore.open(tmp_path / "store", read_only=True) as s:
        rows = s.sql(f"SELECT turns, {TURN_ADVANTAGES}, reward FROM rollouts "
                     f"WHERE run_id = '{run_id}'").to_pylist()
        html = report_html(s, [run_id])
        diagnose(s, run_id)
    assert rows and all(r[TURN_ADVANTAGES] is not None for r in rows)
    for r in rows:
        sources = [t["source"] for t in r["turns"]]
        given = r[TURN_ADVANTAGES]
        assert len(given) == len(sources)
        assert [v is not None for v in given] == [s == "policy" for s in sources]
    if stage.type == "igpo":  # a two-turn episode's first turn earned an information gain
        multi = [r for r in rows if len(r["turns"]) == 4]
        assert multi and all(r["turns"][1]["reward"] is not None for r in multi)
        assert all(r["turns"][3]["reward"] == r["reward"] for r in multi)
    assert ("Sample trajectories" in html) == any(len(r["turns"]) > 3 for r in rows)
