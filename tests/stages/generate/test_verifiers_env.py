"""VerifiersEnv: environments written for verifiers 0.4.0 (tests/resources/vf_envs: a
single-turn one, a multi-turn one and one with an MCP tool; their datasets built there)
run on the real package through gfcr's endpoint over a real engine. The rows hold the
engine's ids, with logprobs equal to a teacher-forced pass; the reward and its components
are the rubric's when it is called directly on the completions the engine wrote."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Iterator

import pyarrow as pa
import pytest

from gfcr.core.rollout import conform
from gfcr.core.trajectory import loss_mask
from stages import HF, TinyLlama
from stages.envs import _vf
from tests.resources.agents import Recording, taught
from tests.resources.rollouts import context
from tests.resources.verifiers import needs_verifiers

vf = needs_verifiers()

from stages.generate.verifiers_env import VerifiersEnv  # noqa: E402
from stages.tasks.verifiers import VerifiersTask  # noqa: E402

POLICY = TinyLlama(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                   max_position=1024)  # the tool's declaration passes 256 tokens
ENVS = "tests.resources.vf_envs."
TOOL_CALL = '<tool_call>{"name": "calc_multiply", "arguments": {"a": 2, "b": 3}}</tool_call>'


@pytest.fixture
def episodes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Every finished verifiers episode, as the stage scores it."""
    seen: list[Any] = []
    scored = _vf.outcome

    def spy(episode: Any) -> Any:
        seen.append(episode)
        return scored(episode)

    monkeypatch.setattr(_vf, "outcome", spy)
    yield seen


def _generate(module: str, engine: Any, tasks: int = 2, **fields: Any
              ) -> tuple[list[dict[str, Any]], VerifiersEnv]:
    stage = VerifiersEnv(module=ENVS + module, **{"n": 2, "max_tokens": 6, "window": 1.0,
                                                   "max_turns": 3, **fields})
    split = VerifiersTask(module=ENVS + module)
    plan = pa.concat_tables([split.train_prompts(), split.heldout_prompts()]).slice(0, tasks)
    return conform(stage.generate(context(), plan, engine, None)).to_pylist(), stage


def _replies(row: dict[str, Any], engine: Any) -> list[str]:
    return [engine.decode(t["token_ids"]) for t in row["turns"] if t["source"] == "policy"]


def _rubric(task: Any, recorded: Any, replies: list[str]) -> tuple[float, dict[str, float]]:
    """The task's rubric called directly on a trace of the recorded conversation whose
    assistant messages are ``replies`` (the engine's completions, decoded)."""
    nodes, said = [], iter(replies)
    for node in recorded.nodes:
        message = node.message
        if message.role == "assistant":
            message = vf.AssistantMessage(content=next(said))
        nodes.append(node.model_copy(update={"message": message}))
    trace = vf.Trace(task=recorded.task, agent=recorded.agent, nodes=nodes)
    asyncio.run(task.score(trace))
    return trace.reward, {k: r.score for k, r in trace.rewards.items()}


def _check(rows: list[dict[str, Any]], stage: VerifiersEnv, engine: Any, seen: list[Any],
           forced: Any) -> None:
    """Each row: the engine's ids, teacher-forced logprobs, the rubric's reward."""
    found = {t.data.idx: t for t in _vf.tasks(stage._env)}
    traces = [t for e in seen for t in e.traces]
    for row in rows:
        assert row["score_error"] is None
        replies = _replies(row, engine)
        task = found[json.loads(row["meta"])["vf_idx"]]
        matches = [t for t in traces if t.task.data.idx == task.data.idx and
                       [str(n.message.content or "") for n in t.nodes
                        if n.message.role == "assistant" and not n.message.tool_calls]
                       == [r for r in replies if not r.startswith("<tool_call>")]]
        assert matches  # the environment saw the engine's completions (greedy twins: 2)
        reward, parts = _rubric(task, matches[0], replies)
        assert row["reward"] == pytest.approx(reward)
        assert dict(row["rewards"]) == pytest.approx(parts)
        mask = loss_mask(row["turns"])
        want = forced(row["prompt_ids"], row["completion_ids"])
        assert [g for g, m in zip(row["logprobs"], mask) if m] == pytest.approx(
            [w for w, m in zip(want, mask) if m], abs=1e-4)


def _hf(policy: Any = None) -> Recording:
    return Recording(HF(device="cpu").build(policy or POLICY.build(seed=0), seed=0))


def _forced(engine: Recording) -> Any:
    return lambda prompt, ids: engine.forced_logprobs(prompt, ids, 1.0)


def test_a_single_turn_environment_is_scored_by_its_rubric(episodes: list[Any]) -> None:
    engine = _hf()
    rows, stage = _generate("single", engine)
    assert len(rows) == 4 and {len(r["turns"]) for r in rows} == {2}
    assert all({k for k, _ in r["rewards"]} == {"contains", "brief"} for r in rows)
    _check(rows, stage, engine, episodes, _forced(engine))


def test_a_multi_turn_environment_answers_each_turn_in_one_row(episodes: list[Any]) -> None:
    engine = _hf()
    rows, stage = _generate("multi", engine, tasks=3)
    assert len(rows) == 6 and all(r["parent_id"] is None for r in rows)
    turns = [[t["source"] for t in r["turns"]] for r in rows]
    assert ["environment", "policy"] * 3 in turns  # the environment answered twice
    for row in rows:
        guesses = dict(row["rewards"])["guesses"]
        assert turns[rows.index(row)] == ["environment", "policy"] * int(guesses)
    _check(rows, stage, engine, episodes, _forced(engine))


def test_a_tool_call_reaches_the_environments_tool_and_its_turn_is_masked(
        episodes: list[Any]) -> None:
    policy = POLICY.build(seed=0)
    engine = _hf(policy)
    _generate("tools", engine, tasks=1, n=1)  # the first call's prompt, tools declared
    first = engine.calls[0][0][0].prompt_ids
    assert '"name": "calc_multiply"' in engine.decode(first)
    taught(policy, first, engine.encode(TOOL_CALL) + [policy.tokenizer.eos_token_id])
    engine = _hf(policy)
    episodes.clear()
    rows, stage = _generate("tools", engine, tasks=1, n=2, temperature=0.0,
                            max_tokens=len(TOOL_CALL) + 1)
    for row in rows:
        assert [(t["role"], t["source"]) for t in row["turns"]] == [
            ("user", "environment"), ("assistant", "policy"), ("tool", "tool"),
            ("assistant", "policy")]
        tool = row["turns"][2]
        assert tool["tool_name"] == "calc_multiply" and tool["mask"] is None
        assert "<tool_response>6</tool_response>" in engine.decode(tool["token_ids"])
    _check(rows, stage, engine, episodes, _forced(engine))


def test_the_environments_tasks_are_the_prompts_and_a_held_out_split() -> None:
    task = VerifiersTask(module=ENVS + "single", args={"num_tasks": 20}, heldout_fraction=0.25)
    train, held = task.train_prompts().to_pylist(), task.heldout_prompts().to_pylist()
    assert (len(train), len(held)) == (15, 5)
    idx = [json.loads(r["meta"])["vf_idx"] for r in train + held]
    assert sorted(idx) == list(range(20))
    assert held[0]["prompt"].startswith("Say the digit") and held[0]["answer"] is not None


def test_a_module_whose_load_environment_returns_an_env_is_loaded_with_its_args() -> None:
    task = VerifiersTask(module=ENVS + "loader", args={"num_tasks": 5})
    assert task.prompt_counts() == {"train": 4, "heldout": 1}
    stage = VerifiersEnv(module=ENVS + "loader", args={"num_tasks": 5}, max_turns=2)
    (seat,) = [stage._env.config.agent]
    assert (seat.harness.id, seat.runtime.type, seat.max_turns) == (
        "gfcr_chat", "subprocess", 2)


def test_a_row_of_another_task_becomes_the_environments_task(episodes: list[Any]) -> None:
    from tests.resources.agents import plan

    engine = _hf()
    stage = VerifiersEnv(module=ENVS + "single", n=1, max_tokens=4, window=1.0)
    rows = conform(stage.generate(context(), plan("Say 7.", answer="7"), engine,
                                  None)).to_pylist()
    (episode,) = episodes
    assert episode.task.data.prompt == "Say 7." and episode.task.data.answer == "7"
    assert rows[0]["score_error"] is None and dict(rows[0]["rewards"]).keys() == {
        "contains", "brief"}


def test_an_environment_that_cannot_load_is_refused_when_the_stage_is_built() -> None:
    with pytest.raises(ValueError, match="no_such_env_mod.*no such module"):
        VerifiersEnv(module="no_such_env_mod")
    with pytest.raises(ValueError, match=r"loader_raises.*RuntimeError: cannot load"):
        VerifiersEnv(module=ENVS + "loader_raises", args={"k": 1})
    with pytest.raises(ValueError, match="no_such_env_mod"):
        VerifiersTask(module="no_such_env_mod")


def test_a_rubric_that_raises_or_returns_nan_is_that_episodes_error() -> None:
    rows, _ = _generate("broken", _hf(), tasks=4, n=1)
    errors = {json.loads(r["meta"])["vf_idx"]: r["score_error"] for r in rows}
    assert errors[0] is None and errors[3] is None
    assert "the rubric broke on task 1" in errors[1]
    assert "'shaky' returned nan, not a finite number" in errors[2]
    assert [r["reward"] for r in rows if r["score_error"]] == [0.0, 0.0]


def pipeline(module: str, policy: Any, engine: Any) -> Any:
    """Two GRPO steps of the environment from scratch, on ``engine``."""
    from gfcr import Evaluation, Pipeline
    from stages import GRPO, UniformSampler

    return Pipeline(name="vf", seed=0, steps=2, policy=policy, engine=engine,
                    task=VerifiersTask(module=ENVS + module, heldout_fraction=0.3),
                    evaluation=Evaluation(size=2, max_tokens=4),
                    stages=[UniformSampler(batch=2),
                            VerifiersEnv(module=ENVS + module, n=2, max_tokens=6,
                                         window=1.0, max_turns=3),
                            GRPO(lr=1e-4)])


def trained_two_steps(p: Any, root: Any) -> list[dict[str, Any]]:
    """Runs ``p`` and returns its stored rows, checked: two steps, each row scored by the
    rubric (its components stored) and taken by the learner."""
    from gfcr.launch.run import execute
    from store import RolloutStore

    summary = execute(p, root=root, executor="local")
    assert summary.steps == 2
    with RolloutStore.open(root / "store", read_only=True) as s:
        rows = s.sql(f"SELECT step, reward, rewards, score_error, consumed_at_step, turns, "
                     f"prompt_ids, completion_ids FROM rollouts WHERE run_id = "
                     f"'{summary.run_id}' ORDER BY step").to_pylist()
    assert sorted({r["step"] for r in rows}) == [0, 1]
    for r in rows:
        assert r["score_error"] is None and r["rewards"]
        assert r["consumed_at_step"] == r["step"]
        assert r["turns"][0]["token_ids"] == r["prompt_ids"]
        assert [t for turn in r["turns"][1:] for t in turn["token_ids"]] == r["completion_ids"]
    return rows


@pytest.mark.parametrize("module", ["single", "multi", "tools"])
def test_an_environment_trains_two_steps_on_hf(module: str, tmp_path: Any) -> None:
    trained_two_steps(pipeline(module, POLICY, HF(device="cpu")), tmp_path)
