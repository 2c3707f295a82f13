"""CONTRIBUTING.md's worked example runs as written: its stage registers, its pipeline
builds and runs a step, and the stage's drops are stored with its reason; its phase
table is the one gfcr.core.stage renders."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow.compute as pc

from gfcr import execute
from gfcr.core.stage import phase_table
from gfcr.core.registry import REGISTRY
from store import RolloutStore

PAGE = Path(__file__).resolve().parents[2] / "CONTRIBUTING.md"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", PAGE.read_text(), flags=re.S)


def test_the_phase_table_on_the_page_is_gfcr_s():
    assert _blocks("text") == [phase_table() + "\n"]


def test_the_worked_stage_and_pipeline_run(tmp_path):
    namespace: dict = {}
    # dont_inherit: run the page as written, not under this file's `from __future__ import annotations`
    exec(compile("\n".join(_blocks("python")), str(PAGE), "exec", dont_inherit=True), namespace)
    try:
        pipeline = namespace["pipeline"]
        assert pipeline.stage("min_tokens").min_tokens == 3
        summary = execute(pipeline, root=tmp_path, executor="local")
        with RolloutStore.open(tmp_path / "store", read_only=True) as s:
            rows = s.sql(f"SELECT n_tokens, kept, dropped_by, drop_reason FROM rollouts "
                         f"WHERE run_id = '{summary.run_id}'")
        assert rows.num_rows == 16
        mine = rows.filter(pc.equal(rows["dropped_by"], "min_tokens"))
        assert mine.num_rows >= 1  # the seed's tiny policy ends one completion early
        assert all(n < 3 for n in mine["n_tokens"].to_pylist())
        assert set(mine["drop_reason"].to_pylist()) <= {"fewer than 3 tokens"}
        short = rows.filter(pc.less(rows["n_tokens"], 3))
        assert not any(short["kept"].to_pylist())
    finally:
        REGISTRY["filter"].pop("min_tokens", None)  # the page's class is not a shipped stage
