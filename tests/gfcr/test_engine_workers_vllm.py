"""Engine workers, continued (gfcr.transport.remote): the vLLM engine on a `gfcr engine-worker`
subprocess (built once, weights loaded by version in place), and the step's History on
a worker (a hook that reads the store prunes there as in-process).

One worker serves this module's pool (vLLM's CPU build in two more processes, each with
its own vLLM, is more than this 2-core machine runs quickly; two workers are covered with
the HF engine in test_engine_workers.py). This process's vLLM engines (the in-process
runs' and the learners') share started LLMs (tests.resources.vllm.LLMPool)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pytest

from gfcr import execute
from gfcr.transport.remote.dispatch import GeneratePool
from store import RolloutStore
from tests.conftest import tiny_pipeline
from tests.resources.digits import Digits
from tests.resources.vllm import VLLM_POLICY, LLMPool, pooled_llms, vllm_engine_spec

POOL = "vllm-engines"
WORKER = "engine-v"
REPO = Path(__file__).resolve().parents[2]
COMPARE = ["step", "prompt", "sample_idx", "status", "completion", "completion_ids",
           "logprobs", "policy_version_start", "reward", "kept", "dropped_by", "advantage"]


@pytest.fixture(scope="module")
def engine_worker(prefect_server: Any, pool_key: Path,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[subprocess.Popen]:
    """One `gfcr engine-worker --pool POOL` process on the test server."""
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    log_path = tmp_path_factory.mktemp("engine-worker") / f"{WORKER}.log"
    env = {**os.environ, "PREFECT_API_URL": str(settings.api.url),
           "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(settings.results.local_storage_path),
           "PREFECT_LOGGING_LEVEL": "INFO"}
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", "from gfcr.cli import main; main()", "engine-worker",
             "--pool", POOL, "--name", WORKER, "--import", "tests.resources.digits"],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def llm_pool() -> Iterator[LLMPool]:
    import stages.engines.vllm as module

    yield from pooled_llms(LLMPool(module._start))


@pytest.fixture
def shared_llms(llm_pool: LLMPool) -> Iterator[LLMPool]:
    yield llm_pool
    llm_pool.release()


def _rows(root: Path, run_id: str) -> list[dict[str, Any]]:
    with RolloutStore.open(root / "store", read_only=True) as s:
        table = s.sql(f"SELECT * FROM rollouts WHERE run_id = '{run_id}' "
                      "ORDER BY step, prompt, sample_idx, status")
    return table.select(COMPARE).to_pylist()


def _pool() -> GeneratePool:
    return GeneratePool(pool=POOL, timeout_s=400, warn_s=300)


def test_vllm_generates_on_a_worker_with_the_in_process_rollouts(
        tmp_path: Path, engine_worker: subprocess.Popen, shared_llms: LLMPool) -> None:
    pipeline = tiny_pipeline(steps=3, task=Digits(), policy=VLLM_POLICY,
                             engine=vllm_engine_spec()).with_overrides(["group.max_tokens=2"])
    local = execute(pipeline, root=tmp_path / "local", executor="local")
    shared_llms.release()  # the learner's vLLM of the next run reuses the first run's
    remote = execute(pipeline, root=tmp_path / "remote", executor="local",
                     generate_pool=_pool())
    a, b = _rows(tmp_path / "local", local.run_id), _rows(tmp_path / "remote", remote.run_id)
    assert len(a) == 3 * 16 and a == b
    versions = [r["policy_version_start"] for r in b]
    assert versions == sorted(versions) and max(versions) >= 1  # a trained version
    assert remote.accuracy_after == local.accuracy_after
    ran = _signed({f"group[step={step}]" for step in range(3)})
    assert ran == {f"group[step={step}]": "COMPLETED" for step in range(3)}


def _signed(names: set[str]) -> dict[str, str]:
    """Call name -> final state of this pool's task runs that WORKER signed."""
    from prefect import get_client
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterName

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(task_run_filter=TaskRunFilter(
            name=TaskRunFilterName(any_=sorted(f"{n} @ {WORKER}" for n in names))))
    return {r.name.split(" @ ")[0]: r.state.type.value if r.state else "NONE" for r in runs
            if r.task_key.startswith(f"gfcr_generate__{POOL}")}


def test_online_pruning_reads_the_runs_history_on_the_worker(
        tmp_path: Path, engine_worker: subprocess.Popen) -> None:
    # ARRoL's OnlinePrune fits its head on the run's stored rollouts (ctx.history): on
    # the worker it reads the run's store, opened read-only at the step's snapshot.
    # Compared with what holds whatever two processes sample (issue 21: comparing the
    # worker's rows with an in-process run's failed on a fresh machine): every pruning
    # decision the worker made, at every segment of every group, is the one OnlinePrune
    # makes here on the same stored history and the same in-flight tokens
    from stages import GRPO, GroupSample, OnlinePrune, UniformSampler, Verify

    prune = OnlinePrune(min_tokens=4, margin=0.0, window=2, min_examples=8)
    pipeline = tiny_pipeline(task=Digits(), steps=3, stages=[
        UniformSampler(batch=4), prune, GroupSample(n=4, max_tokens=16, segment_tokens=4),
        Verify(), GRPO(lr=1e-3)])
    remote = execute(pipeline, root=tmp_path, executor="local", generate_pool=_pool())
    with RolloutStore.open(tmp_path / "store", read_only=True) as s:
        rows = s.sql(f"SELECT * FROM rollouts WHERE run_id = '{remote.run_id}' "
                     "ORDER BY step, group_id, sample_idx").to_pylist()
    pruned = [r for r in rows if r["status"] == "pruned"]
    assert pruned and {r["step"] for r in pruned} == {1, 2}  # pruned from history, twice
    for step, metrics in enumerate(remote.history):
        mine = [r for r in rows if r["step"] == step]
        assert metrics["pruned_frac"] == sum(r["status"] == "pruned" for r in mine) / len(mine)
        assert {r["policy_version_start"] for r in mine} == {metrics["policy_version"] - (
            1 if "train/lr" in metrics else 0)}
    for step in (1, 2):
        _same_pruning(tmp_path, remote.run_id, step, prune,
                      [r for r in rows if r["step"] == step])
    assert set(_signed({f"group[step={step}]" for step in range(3)})) == {
        f"group[step={step}]" for step in range(3)}


def _same_pruning(root: Path, run_id: str, step: int, prune: Any,
                  rows: list[dict[str, Any]]) -> None:
    """Assert that OnlinePrune, fitted here on the run's history as of ``step - 1`` (the
    snapshot the worker read), prunes at every segment exactly the rows the worker did.
    At the segment ending at token L the group's in-flight rows are those longer than L
    and those pruned at L (the HF engine asks its hooks after recording token L)."""
    from gfcr.core.stage import StepContext
    from gfcr.core.storage import backend
    from stages.control.prune import MIN_SURVIVORS, balance_prunes
    from stages.control.quality import features

    store = backend().open(root / "store", read_only=True)
    try:
        ctx = StepContext(run_id=run_id, step=step, seed=0, policy_version=0, task=None,
                          history=backend().history(store, run_id, as_of_step=step - 1))
        head = prune.head(ctx)
    finally:
        store.close()
    assert head is not None
    segment, decided = 4, 0
    for group in sorted({r["group_id"] for r in rows}):
        members = [r for r in rows if r["group_id"] == group]
        length = {r["rollout_id"]: len(r["completion_ids"]) for r in members}
        was_pruned = {r["rollout_id"] for r in members if r["status"] == "pruned"}
        for at in range(segment, 16, segment):
            earlier = sum(1 for k in was_pruned if length[k] < at)
            live = [r for r in members if length[r["rollout_id"]] > at or (
                r["rollout_id"] in was_pruned and length[r["rollout_id"]] == at)]
            if not live:
                continue
            budget = min(int(prune.max_prune * len(members)) - earlier,
                         len(members) - earlier - MIN_SURVIVORS)
            p = head.predict(np.vstack([features(r["logprobs"][:at]) for r in live]))
            chosen = {live[i]["rollout_id"] for i in balance_prunes(p, budget, prune.margin)}
            assert chosen == {k for k in was_pruned if length[k] == at}, (step, group, at)
            decided += len(chosen)
    assert decided == len(was_pruned_in(rows)) > 0


def was_pruned_in(rows: list[dict[str, Any]]) -> list[str]:
    return [r["rollout_id"] for r in rows if r["status"] == "pruned"]


def test_the_workers_vllm_loads_each_version_in_place(
        tmp_path: Path, engine_worker: subprocess.Popen, shared_llms: LLMPool,
        pool_key: Path) -> None:
    # two published versions far apart (v1: every weight tripled); the worker generates the
    # same plan at v0 then v1 with the one vLLM it built (prefix cache full of v0's): each
    # version's logprobs are the policy's own at that version (teacher-forced here) and
    # its rollouts those of a vLLM here on that version's weights
    import torch

    from gfcr.core.rollout import PROMPT_SCHEMA
    from gfcr.core.stage import StepContext
    from gfcr.runner.inprocess import InProcessHandle
    from gfcr.runner.rounds import plan_defaults
    from gfcr.runner.weights import WeightStore, directory
    from gfcr.transport.remote.call import (GenerateCall, code_hash, read_parquet, spec_hash,
                                            write_parquet)
    from gfcr.transport.remote.pool import PoolCalls
    from gfcr.transport.remote.worker import pool_task
    from stages.engines.hf import token_logprobs

    pipeline = tiny_pipeline(task=Digits(), policy=VLLM_POLICY, engine=vllm_engine_spec())
    select, gen = pipeline.stages[0], pipeline.stages[1]
    policies = [VLLM_POLICY.build(seed=0), VLLM_POLICY.build(seed=0)]
    with torch.no_grad():
        for p in policies[1].model.parameters():
            p.mul_(3.0)
    assert policies[0].io is not None
    run_id = f"direct-{tmp_path.name}"  # a run's layout: the worker writes only there
    staging = tmp_path / "staging" / run_id / "remote"
    staging.mkdir(parents=True)
    weights = WeightStore(directory(tmp_path, run_id), policies[0].io)
    for version, policy in enumerate(policies):
        weights.publish(InProcessHandle(policy, version), version, "direct")
    ctx = StepContext(run_id="direct", step=0, seed=0, policy_version=0, task=pipeline.task)
    plan = plan_defaults(select.select(ctx, PROMPT_SCHEMA.empty_table()), gen)
    # prompts of 200+ tokens: vLLM's prefix cache holds whole blocks of 128 tokens, so the
    # v1 call finds v0's KV cached for them unless the reload dropped it (checked here:
    # without the reset the logprobs were 3.0 off)
    long = [(p * 40)[:200] for p in plan.column("prompt").to_pylist()]
    plan = plan.set_column(plan.schema.get_field_index("prompt"), "prompt", pa.array(long))
    write_parquet(staging / "plan.parquet", plan)
    dumps = dict(stage=gen.model_dump(mode="json"), hooks=(),
                 policy=pipeline.policy.model_dump(mode="json"),
                 engine=pipeline.engine.model_dump(mode="json"),
                 task=pipeline.task.model_dump(mode="json"))
    calls = PoolCalls(_pool(), pool_task, print)
    reports, outputs = [], []
    for version, policy in enumerate(policies):
        call = GenerateCall(run_id=run_id, step=0, seed=0,
                            policy_version=version, weights=str(weights.where),
                            plan=str(staging / "plan.parquet"),
                            out=str(staging / f"v{version}.parquet"), code_hash=code_hash(),
                            spec_hash=spec_hash(**dumps), **dumps)
        # sent and awaited as a run does: a bare future.result() right after .delay() can
        # ask before the server has given the task run a state, and Prefect then raises
        reports.append(calls.wait(calls.send(call, plan, 0.0)))
        rows = read_parquet(call.out).to_pylist()
        outputs.append([(r["completion_ids"], r["logprobs"]) for r in rows])
        assert {r["policy_version_start"] for r in rows} == {version}
        assert min(len(r["prompt_ids"]) for r in rows) >= 200
        # here: a fresh context (the stage's seed is drawn from it) and this version's policy
        here = StepContext(run_id="direct", step=0, seed=0, policy_version=0,
                           task=pipeline.task)
        expected = gen.generate(here, read_parquet(staging / "plan.parquet"),
                                pipeline.engine.build(policy, seed=0), None).to_pylist()
        shared_llms.release()
        assert [(r["completion_ids"], r["logprobs"]) for r in expected] == outputs[-1]
        with torch.no_grad():
            for r in rows:
                forced = token_logprobs(policy.model, r["prompt_ids"], r["completion_ids"])
                assert torch.allclose(torch.tensor(r["logprobs"]), forced, atol=1e-4)
    assert outputs[0] != outputs[1]
    assert [r["loaded_version"] for r in reports] == [True, True]
    assert reports[1]["engines_built"] == reports[0]["engines_built"]  # one vLLM, reloaded
