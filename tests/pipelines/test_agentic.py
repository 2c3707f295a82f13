"""The agentic pipeline (pipelines/agentic.py): two shrunk steps on the HF engine and on
vLLM (its CPU build, the suite's pooled LLMs) store one row per episode with its turns,
train on them, and the turns view reads them."""

from __future__ import annotations

from typing import Any

import pytest

from gfcr import Pipeline
from gfcr.launch.run import execute
from pipelines.agentic import pipeline as agentic
from store import RolloutStore
from tests.pipelines.test_pipelines import _shrunk
from tests.resources.vllm import VLLM_POLICY, LLMPool, vllm_engine_spec
from tests.resources.vllm import llm_pool  # noqa: F401 (the fixture)


def _check_store(root: Any, run_id: str) -> None:
    with RolloutStore.open(root / "store", read_only=True) as s:
        rows = s.sql(f"SELECT step, turns, episode_end, n_turns, reward, advantage, "
                     f"consumed_at_step, prompt_ids, completion_ids FROM rollouts "
                     f"WHERE run_id = '{run_id}' ORDER BY step, rollout_id").to_pylist()
        view = s.sql(f"SELECT source, count(*) AS n FROM turns WHERE run_id = '{run_id}' "
                     f"GROUP BY source").to_pylist()
    assert {r["step"] for r in rows} == {0, 1} and len(rows) == 2 * 2 * 8
    multi = [r for r in rows if r["n_turns"] == 2]
    assert multi, "an untrained policy is wrong at least once: some episodes take 2 turns"
    for r in rows:
        turns = r["turns"]
        assert [t["source"] for t in turns][:2] == ["environment", "policy"]
        assert r["prompt_ids"] == turns[0]["token_ids"]
        assert r["completion_ids"] == [i for t in turns[1:] for i in t["token_ids"]]
        assert r["episode_end"] == "done" and r["reward"] in (0.0, 1.0)
        assert r["consumed_at_step"] == r["step"]
    for r in multi:
        assert [t["source"] for t in r["turns"]] == ["environment", "policy", "environment",
                                                     "policy"]
        assert "hint:" in _text(r["turns"][2]["token_ids"])
    counts = {v["source"]: v["n"] for v in view}
    assert counts["policy"] == len(rows) + len(multi) and counts["environment"] == len(rows) + len(multi)


def _two_steps(p: Pipeline) -> Pipeline:
    """The test suite's shrunk form of a pipeline (2 questions a step, a 1-layer policy,
    no warm start), for two steps."""
    return Pipeline(**{**_shrunk(p).to_dict(), "steps": 2})


def _text(ids: list[int]) -> str:
    from stages.engines.tokenizers import ByteTokenizer

    return ByteTokenizer().decode(ids)


def test_agentic_pipeline_runs_two_steps_on_hf_and_stores_multi_turn_rows(tmp_path: Any) -> None:
    summary = execute(_two_steps(agentic), root=tmp_path, executor="local", run_id="agentic-hf")
    assert summary.steps == 2
    _check_store(tmp_path, "agentic-hf")


def test_agentic_pipeline_runs_two_steps_on_vllm(tmp_path: Any, llm_pool: LLMPool) -> None:
    data: dict[str, Any] = _two_steps(agentic).to_dict()
    data["policy"] = VLLM_POLICY.model_dump()
    data["engine"] = vllm_engine_spec().model_dump()
    try:
        summary = execute(Pipeline(**data), root=tmp_path, executor="local",
                          run_id="agentic-vllm")
    finally:
        llm_pool.release()
    assert summary.steps == 2
    _check_store(tmp_path, "agentic-vllm")


def test_vllm_episodes_are_token_exact_over_several_turns(llm_pool: LLMPool) -> None:
    from stages import Episodes
    from tests.resources.chat import Recording
    from tests.resources.rollouts import context
    from tests.stages.generate.test_episodes import check_token_exact, plan

    try:
        engine = Recording(vllm_engine_spec().build(VLLM_POLICY.build(seed=0), seed=0))
        stage = Episodes(env="feedback", env_options={"max_tries": 3, "hint": "answer"}, n=3,
                         max_turns=3, max_tokens=4)
        table = stage.generate(context(), plan(), engine, None)
    finally:
        llm_pool.release()
    assert max(table.column("n_turns").to_pylist()) == 3 and len(engine.calls) == 3
    check_token_exact(table, engine, atol=2e-3)  # vLLM's CPU kernels against torch's pass
