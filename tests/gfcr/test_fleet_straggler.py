"""A straggler in the fleet (stages.engines.fleet): a server that stays healthy but stops
making progress. The suite's two real vLLM CPU servers (tests/conftest.py
``fleet_servers``), one behind a proxy that holds its generate requests while a test
stage has it stalled (tests/resources/straggler.py). A held request passes its deadline
(``Fleet.timeout_s``), is aborted there and sent to a server it has not tried; with
every server stalled the step fails once its attempts are spent, and stores nothing.

The deadlines are generous (the tiny policy's requests take well under a second) and
the stall is deterministic: a held request is never answered before its deadline."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Iterator, Literal

import httpx
import pyarrow as pa
import pytest

from gfcr.launch.placement import Placement
from gfcr.core.stage import StageSpec
from gfcr.core.registry import register
from gfcr.launch.run import execute
from gfcr.weights.versions import WeightStore, directory
from gfcr.transport.fleet import Fleet
from stages import GRPO, GroupSample, UniformSampler, Verify
from stages.engines import teacher
from stages.engines.fleet import FleetDown
from store import RolloutStore
from tests.conftest import tiny_pipeline
from tests.resources import fleet as servers
from tests.resources.straggler import Straggler
from tests.resources.vllm import VLLM_POLICY, vllm_engine_spec


@pytest.fixture(scope="module")
def fleet(fleet_servers: list[servers.Started]) -> list[servers.Started]:
    return servers.revive(fleet_servers)  # the suite's two servers (tests/conftest.py)


@pytest.fixture
def proxies(fleet: list[servers.Started]) -> Iterator[list[Straggler]]:
    """A straggler proxy in front of each server (moving until a stage stalls it)."""
    started = [Straggler(s.url) for s in fleet]
    yield started
    for proxy in started:
        proxy.close()


@register("control")
class _Straggle(StageSpec):
    """Test stage: stall the proxies at ``urls`` before step ``step`` generates (they
    hold its generate requests), release them before every other step."""

    type: Literal["_fleet_straggle"] = "_fleet_straggle"
    urls: list[str]
    step: int
    owns: ClassVar[frozenset[str]] = frozenset()

    def allocate(self, ctx: Any, plan: pa.Table) -> pa.Table:
        what = "stall" if ctx.step == self.step else "release"
        for url in self.urls:
            httpx.post(f"{url}/straggler/{what}", timeout=30).raise_for_status()
        return plan


def _pipeline(straggle: _Straggle) -> Any:
    """Two steps of 4 prompts x 4 samples (test_fleet's pipeline, less its control)."""
    return tiny_pipeline(
        steps=2, policy=VLLM_POLICY, engine=vllm_engine_spec(),
        stages=[UniformSampler(batch=4), straggle, GroupSample(n=4, max_tokens=8),
                Verify(), GRPO(lr=1e-2)]
    ).with_overrides(["evaluation.size=4", "evaluation.max_tokens=4"])


def _table(root: Path, sql: str, run_id: str) -> list[dict[str, Any]]:
    with RolloutStore.open(root / "store", read_only=True) as s:
        return s.sql(sql, [run_id]).to_pylist()


def test_a_stalled_servers_requests_pass_their_deadline_are_aborted_and_served_elsewhere(
        tmp_path: Path, fleet: list[servers.Started], proxies: list[Straggler]) -> None:
    healthy, straggler = fleet[0], proxies[1]
    p = _pipeline(_Straggle(urls=[straggler.url], step=0))
    summary = execute(p, root=tmp_path, executor="local", run_id="straggler",
                      placement=Placement(generator=Fleet(urls=(straggler.url, healthy.url), timeout_s=30, keep=5)))
    assert summary.steps == 2
    rows = _table(tmp_path, "SELECT * FROM rollouts WHERE run_id = ? "
                            "ORDER BY step, rollout_id", "straggler")
    assert len({r["rollout_id"] for r in rows}) == len(rows) == 2 * 16  # each stored once
    # step 0: the straggler held its share of the first segment; each of those requests
    # passed its deadline, was aborted there and went to the healthy server, with the
    # rest of its segments (first segment, first try: "<tag>-<key>-0-0")
    assert straggler.held and all(h.endswith("-0-0") for h in straggler.held)
    assert sorted(straggler.aborted) == sorted(f"generate-tokens-{h}" for h in straggler.held)
    assert {r["server"] for r in rows if r["step"] == 0} == {healthy.url}
    assert summary.history[0]["fleet/servers_live"] == 2.0  # it stayed healthy: kept
    # step 1: released, the straggler serves its share again
    assert {r["server"] for r in rows if r["step"] == 1} == {healthy.url, straggler.url}
    updated = "train/skipped" not in summary.history[0]
    policy = VLLM_POLICY.build(seed=0)
    assert policy.io is not None
    weights = WeightStore(directory(tmp_path, "straggler"), policy.io)
    for r in rows:
        assert r["policy_version_end"] == (updated if r["step"] == 1 else 0)
        weights.load(policy.model, r["policy_version_end"])
        forced = teacher.forced_logprobs(policy, r["prompt_ids"], r["completion_ids"], 1.0)
        assert forced == pytest.approx(r["logprobs"], abs=2e-4)  # the version named


def test_a_step_no_server_makes_progress_in_fails_naming_the_servers_and_stores_nothing(
        tmp_path: Path, fleet: list[servers.Started], proxies: list[Straggler]) -> None:
    urls = [proxy.url for proxy in proxies]
    p = _pipeline(_Straggle(urls=urls, step=1))
    with pytest.raises(FleetDown) as failed:
        execute(p, root=tmp_path, executor="local", run_id="stalled",
                placement=Placement(generator=Fleet(urls=tuple(urls), timeout_s=20, attempts=2)))
    message = str(failed.value)
    assert message.startswith("the fleet cannot serve stage 'group' at step 1: request ")
    assert "failed 2 times: " in message  # its attempts, one on each server
    for url in urls:
        assert f"vLLM server {url}: /inference/v1/generate failed: ReadTimeout" in message
        assert f"{url}: live" in message  # stalled, not down: both answer their health
    assert all(proxy.held for proxy in proxies)
    steps = _table(tmp_path, "SELECT step FROM steps WHERE run_id = ?", "stalled")
    assert [s["step"] for s in steps] == [0]  # step 1 committed nothing
    rows = _table(tmp_path, "SELECT step FROM rollouts WHERE run_id = ?", "stalled")
    assert len(rows) == 16 and {r["step"] for r in rows} == {0}
    (run,) = _table(tmp_path, "SELECT status, error FROM runs WHERE run_id = ?", "stalled")
    assert run["status"] == "failed" and "failed 2 times" in run["error"]
