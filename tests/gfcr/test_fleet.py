"""Generation on a fleet of vLLM's own servers (gfcr.transport.fleet, stages.engines.fleet): two
real vLLM CPU servers, started once for the suite with ``gfcr engine serve``.

The fleet's sampling is not the in-process engine's (vLLM batches a server's requests as
they come, and per-request seeds are unreliable on vLLM's CPU build), so rows are checked
against the weights that sampled them instead: every row's version is the step's, and
its logprobs equal a teacher-forced pass of the published version it names."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any, ClassVar, Literal

import pyarrow as pa
import pytest

from gfcr.launch.placement import Placement
from gfcr.core.engine import GenRequest, SamplingParams
from gfcr.core.stage import StageSpec
from gfcr.core.registry import register
from gfcr.launch.run import execute
from gfcr.weights.versions import WeightStore, directory
from gfcr.transport.fleet import Fleet
from stages import GRPO, GroupSample, RecyclePartials, TokenBudget, UniformSampler, Verify
from stages.engines import teacher
from stages.engines._vllm_run import save_policy
from store import RolloutStore
from tests.conftest import tiny_pipeline
from tests.resources import fleet as servers
from tests.resources.vllm import VLLM_POLICY, vllm_engine_spec


@pytest.fixture(scope="module")
def fleet(fleet_servers: list[servers.Started]) -> list[servers.Started]:
    return servers.revive(fleet_servers)  # the suite's two servers (tests/conftest.py)


class Warnings:
    def __init__(self) -> None:
        self.messages: list[str] = []

    def on_warning(self, message: str, count: int) -> None:
        self.messages.append(message)


def _pipeline(steps: int, *control: Any) -> Any:
    return tiny_pipeline(
        steps=steps, policy=VLLM_POLICY, engine=vllm_engine_spec(),
        stages=[RecyclePartials(), UniformSampler(batch=4), *control,
                GroupSample(n=4, max_tokens=8, segment_tokens=2), Verify(), GRPO(lr=1e-2)]
    ).with_overrides(["evaluation.size=4", "evaluation.max_tokens=4"])


def _rows(root: Path) -> pa.Table:
    with RolloutStore.open(root / "store", read_only=True) as s:
        return s.sql("SELECT * FROM rollouts ORDER BY step, rollout_id")


def test_three_steps_split_across_both_servers_at_the_versions_that_sampled_them(
        tmp_path: Path, fleet: list[servers.Started]) -> None:
    # the token budget stops sequences in flight (segments across the fleet), and the
    # stopped ones are continued next step from their stored tokens
    urls = tuple(s.url for s in fleet)
    p = _pipeline(3, TokenBudget(budget=60, split="off", abort="stop"))
    summary = execute(p, root=tmp_path, executor="local", run_id="fleet3",
                      placement=Placement(generator=Fleet(urls=urls, keep=5)))
    assert summary.steps == 3
    rows = _rows(tmp_path).to_pylist()
    updates = [0]  # the learner's version at each step: the updates before it
    for metrics in summary.history:
        updates.append(updates[-1] + ("train/skipped" not in metrics))
    assert updates[-1] >= 1
    for step in range(3):
        generated = [r for r in rows if r["step"] == step and r["server"] is not None]
        assert {r["server"] for r in generated} == set(urls)  # the batch was split
        assert {r["policy_version_end"] for r in generated} == {updates[step]}
    assert any(r["status"] == "partial" for r in rows)  # stopped in flight
    assert any(r["parent_id"] is not None and r["server"] is not None for r in rows)
    store = WeightStore(directory(tmp_path, "fleet3"), VLLM_POLICY.build(seed=0).io)
    policy = VLLM_POLICY.build(seed=0)
    checked = 0
    for r in rows:
        new = r["new_tokens"]
        if r["server"] is None or not new:
            continue  # carried over unchanged
        # the tokens generated in the row's step, by the version it names (a continued
        # row's stored prefix was sampled by an earlier one)
        store.load(policy.model, r["policy_version_end"])
        forced = teacher.forced_logprobs(policy, r["prompt_ids"], r["completion_ids"], 1.0)
        assert forced[-new:] == pytest.approx(r["logprobs"][-new:], abs=2e-4)
        checked += 1
    assert checked >= 40


@register("control")
class _KillServer(StageSpec):
    """Test stage: kill -9 the server process group ``pgid`` at the first segment of
    step ``step`` (mid-step: its requests of the next segments find it gone)."""

    type: Literal["_fleet_kill"] = "_fleet_kill"
    pgid: int
    step: int = 1
    owns: ClassVar[frozenset[str]] = frozenset()

    def on_segment(self, ctx: Any, inflight: Any) -> dict:
        if ctx.step == self.step:
            try:
                os.killpg(self.pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return {}


def test_a_server_killed_mid_step_loses_no_rollout_and_the_run_ends_on_the_other(
        tmp_path: Path, fleet: list[servers.Started]) -> None:
    survivor, victim = fleet
    warnings = Warnings()
    p = _pipeline(3, _KillServer(pgid=victim.proc.pid, step=1))
    summary = execute(p, root=tmp_path, executor="local", hooks=[warnings],
                      placement=Placement(generator=Fleet(urls=(survivor.url, victim.url), timeout_s=60)))
    victim.proc.wait()
    assert summary.steps == 3
    rows = _rows(tmp_path)
    ids = rows.column("rollout_id").to_pylist()
    assert len(ids) == len(set(ids)) == 3 * 16  # every rollout stored, once
    for r in rows.to_pylist():
        if r["step"] == 2:
            assert r["server"] == survivor.url
        if r["step"] == 1 and r["server"] == victim.url:
            assert r["new_tokens"] <= 2  # ended within the segment before the kill
    assert summary.history[1]["fleet/servers_live"] == 1.0
    assert any(victim.url in m and "out of the fleet" in m for m in warnings.messages)


def test_a_server_restarted_with_other_weights_is_reloaded_before_it_is_used(
        tmp_path: Path, fleet: list[servers.Started]) -> None:
    from stages.engines.fleet import FleetEngine

    survivor, victim = fleet
    victim.kill()  # whatever the test before left, it now restarts on other weights
    save_policy(VLLM_POLICY.build(seed=1), tmp_path / "other")
    fleet[1] = servers.start(tmp_path / "other", tmp_path / "restarted.log", victim.key_file,
                             victim.weights_root, port=victim.port)
    policy = VLLM_POLICY.build(seed=0)
    store = WeightStore(tmp_path / "w", policy.io)
    published = store.publish(_Handle(policy), 4, "restart")
    messages: list[str] = []
    engine = FleetEngine(policy, [survivor.url, victim.url], timeout_s=60,
                         notify=messages.append, key=survivor.key())
    engine.load(str(published.path), 4, published.ident)  # the victim is not up yet
    assert victim.url in engine.down
    servers.wait_healthy([fleet[1]])
    prompt = policy.tokenizer.encode("12+34=")
    requests = [GenRequest(key=k, prompt_ids=prompt + [k + 3]) for k in range(8)]
    outs = engine.generate(requests, SamplingParams(max_tokens=6, temperature=1.0))
    with pytest.raises(ValueError, match="the fleet refused request .*HTTP 400"):
        engine.generate([GenRequest(key=0, prompt_ids=[5] * 300)],  # > max_model_len
                        SamplingParams(max_tokens=2))
    assert victim.url not in engine.down  # a bad request takes no server out
    engine.close()
    assert any(f"{victim.url} holds weights 'default'" in m for m in messages)
    assert {o.server for o in outs} == {survivor.url, victim.url}
    for req, out in zip(requests, outs):
        assert out.version_end == 4
        forced = teacher.forced_logprobs(policy, req.prompt_ids, out.completion_ids, 1.0)
        assert forced == pytest.approx(out.logprobs, abs=2e-4)  # the fleet's weights


class _Handle:
    """A handle on ``policy``'s weights (gfcr.core.services.WeightHandle's save)."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy

    def save(self, path: Path, dtype: str | None = None) -> None:
        self.policy.save_weights(path, dtype)


def test_resume_on_a_fleet_trains_on_the_stored_rows(
        tmp_path: Path, fleet: list[servers.Started], monkeypatch: pytest.MonkeyPatch) -> None:
    """Drill D6b: a fleet run stopped after step 2 (its checkpoint after step 1) and
    resumed replays step 2; vLLM across servers does not reproduce its batch, yet the
    learner trains on exactly the rows the store holds for it."""
    from gfcr.runner.inprocess import LocalLearner
    from tests.gfcr.test_resume import Crash, CrashAt

    urls = tuple(s.url for s in fleet)
    p = tiny_pipeline(
        steps=4, policy=VLLM_POLICY, engine=vllm_engine_spec(),
        stages=[UniformSampler(batch=2), GroupSample(n=4, max_tokens=8), Verify(),
                GRPO(lr=1e-2)]
    ).with_overrides(["evaluation.size=4", "evaluation.max_tokens=4", "checkpoint.every=2"])
    with pytest.raises(Crash):
        execute(p, root=tmp_path, executor="local", run_id="fleet-resume",
                placement=Placement(generator=Fleet(urls=urls)), hooks=[CrashAt(2)])
    trained: dict[int, list[Any]] = {}
    update = LocalLearner.update

    def recording(self: Any, ctx: Any, batch: pa.Table) -> Any:
        trained[ctx.step] = batch.select(["rollout_id", "completion_ids", "logprobs"]
                                         ).to_pylist()
        return update(self, ctx, batch)

    monkeypatch.setattr(LocalLearner, "update", recording)
    summary = execute(p, root=tmp_path, executor="local", run_id="fleet-resume",
                      placement=Placement(generator=Fleet(urls=urls)))
    assert summary.resumed_from == 1 and sorted(trained) == [2, 3]
    rows = _rows(tmp_path)
    ids = rows["rollout_id"].to_pylist()
    assert rows.num_rows == 4 * 8 and len(set(ids)) == len(ids)  # each step once
    step2 = [r for r in rows.to_pylist() if r["step"] == 2 and r["kept"]]
    want = sorted(({k: r[k] for k in ("rollout_id", "completion_ids", "logprobs")}
                   for r in step2), key=lambda r: r["rollout_id"])
    assert sorted(trained[2], key=lambda r: r["rollout_id"]) == want
