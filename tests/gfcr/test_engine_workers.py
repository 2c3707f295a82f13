"""Engine workers (gfcr.transport.remote): a run's generate stage on two `gfcr engine-worker`
subprocesses served through Prefect task workers, against the session's real Prefect
server; the same rollouts as in-process; no worker on a pool; a worker on other code.

The two workers start once for the module (a worker start costs seconds)."""

from __future__ import annotations

import os
import time
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from gfcr import execute
from gfcr.transport.remote.call import GenerateCall, Refused, code_hash
from gfcr.transport.remote.dispatch import GeneratePool, NoEngineWorker
from stages import GRPO, SFT, VADE, GroupSample, UniformSampler, Verify
from store import RolloutStore
from tests.conftest import tiny_pipeline
from tests.resources.digits import DigitAnswers, Digits

POOL = "tiny-engines"
WORKERS = ("engine-a", "engine-b")
REPO = Path(__file__).resolve().parents[2]
COMPARE = ["step", "prompt", "sample_idx", "completion", "completion_ids", "logprobs",
           "policy_version_start", "reward", "kept", "dropped_by", "advantage"]


@pytest.fixture(scope="module")
def engine_workers(prefect_server: Any, pool_key: Path,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[subprocess.Popen]]:
    """Two `gfcr engine-worker --pool POOL` processes on the test server, sharing this
    process's Prefect result storage."""
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    logs = tmp_path_factory.mktemp("engine-workers")
    env = {**os.environ, "PREFECT_API_URL": str(settings.api.url),
           "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(settings.results.local_storage_path),
           "PREFECT_LOGGING_LEVEL": "INFO"}
    procs = []
    for name in WORKERS:
        with open(logs / f"{name}.log", "w") as log:
            procs.append(subprocess.Popen(
                [sys.executable, "-c", "from gfcr.cli import main; main()", "engine-worker",
                 "--pool", POOL, "--name", name, "--import", "tests.resources.digits"], cwd=REPO, env=env, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True))
    try:
        yield procs
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _rows(root: Path, run_id: str, columns: list[str] = COMPARE) -> list[dict[str, Any]]:
    with RolloutStore.open(root / "store", read_only=True) as s:
        table = s.sql(f"SELECT * FROM rollouts WHERE run_id = '{run_id}' "
                      "ORDER BY step, prompt, sample_idx")
    return table.select(columns).to_pylist()


def _ran_on(names: set[str], what: str = "generate") -> dict[str, tuple[str, str]]:
    """Call name -> (engine worker, final state) of the pool's ``what`` task runs: each
    worker renames the task run it takes ``NAME @ WORKER``."""
    from prefect import get_client
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterName

    signed = sorted(f"{n} @ {w}" for n in names for w in WORKERS)
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(task_run_filter=TaskRunFilter(
            name=TaskRunFilterName(any_=signed)))
    return {r.name.split(" @ ")[0]: (r.name.split(" @ ")[1], r.state.type.value)
            for r in runs if r.task_key.startswith(f"gfcr_{what}__{POOL}")}


def test_generate_runs_on_the_workers_with_the_in_process_rollouts(
        tmp_path: Path, engine_workers: list[subprocess.Popen]) -> None:
    # one-token answers to the digits task: some groups are not flat, so a step trains
    # and a later step's call names a new weights version
    pipeline = tiny_pipeline(steps=3, task=Digits()).with_overrides(["group.max_tokens=1"])
    local = execute(pipeline, root=tmp_path / "local", executor="local")
    staged: list[int] = []

    class Staged:  # files left in the run's staging folder after each step (issue 21 D6)
        def on_step(self, *, step: int, **_: Any) -> None:
            staged.append(len(list((tmp_path / "remote" / "staging").glob("*/remote/*"))))

    remote = execute(pipeline, root=tmp_path / "remote", executor="prefect",
                     hooks=[Staged()],
                     generate_pool=GeneratePool(pool=POOL, timeout_s=240, warn_s=120))
    a, b = _rows(tmp_path / "local", local.run_id), _rows(tmp_path / "remote", remote.run_id)
    assert len(a) == 3 * 16 and a == b
    assert staged == [0, 0, 0]
    versions = {r["policy_version_start"] for r in b}
    assert max(versions) >= 1  # the workers loaded a version the learner published
    assert remote.accuracy_after == local.accuracy_after
    names = {f"group[step={step}]" for step in range(3)}
    ran_on = _ran_on(names)
    assert set(ran_on) == names
    assert all(state == "COMPLETED" for _, state in ran_on.values())
    # the published weights: the versions the calls named, the newest kept
    published = sorted(p.name for p in (tmp_path / "remote" / "weights" /
                                         remote.run_id).iterdir())
    assert published == [f"v{v:06d}" for v in sorted(versions)]
    assert not (tmp_path / "remote" / "staging" / remote.run_id).exists()


def test_scoring_runs_on_the_workers_with_the_in_process_scores(
        tmp_path: Path, engine_workers: list[subprocess.Popen]) -> None:
    # Verify (the task's scorer) on a worker of the pool; DynamicSampling, which drops
    # flat groups by the rewards, stays in-process and drops the same rows
    pipeline = tiny_pipeline(steps=2, task=Digits()).with_overrides(["group.max_tokens=1"])
    local = execute(pipeline, root=tmp_path / "local", executor="local")
    remote = execute(pipeline, root=tmp_path / "remote", executor="local",
                     score_pool=GeneratePool(pool=POOL, timeout_s=240, warn_s=120))
    scored = [*COMPARE, "rewards", "score_error", "score_isolation", "drop_reason"]
    a = _rows(tmp_path / "local", local.run_id, scored)
    b = _rows(tmp_path / "remote", remote.run_id, scored)
    assert len(a) == 2 * 16 and a == b
    assert {r["score_isolation"] for r in b} == {"in_process"}
    assert remote.accuracy_after == local.accuracy_after
    names = {f"verify[step={step}]" for step in range(2)}
    ran_on = _ran_on(names, "score")
    assert set(ran_on) == names and all(s == "COMPLETED" for _, s in ran_on.values())
    assert not _ran_on({f"dynamic_sampling[step={step}]" for step in range(2)}, "score")


def test_a_code_verifier_on_a_worker_still_runs_in_the_sandbox(
        tmp_path: Path, engine_workers: list[subprocess.Popen]) -> None:
    import json

    from gfcr.transport.remote.scoring import RemoteScore
    from stages import CodeTests, Sandbox
    from tests.resources.rollouts import context, rollouts

    tests = json.dumps({"tests": ["assert f() == 1"]})
    table = rollouts(["g"] * 2, completion=["def f():\n    return 1", "def f():\n    return 2"],
                     meta=[tests] * 2, answer=[None] * 2)
    stage = Verify(scorer=CodeTests(sandbox=Sandbox(cpu_seconds=1, wall_seconds=3.0,
                                                    memory_mb=256)), timeout=20.0)
    remote = RemoteScore(GeneratePool(pool=POOL, timeout_s=240, warn_s=120),
                         pipeline=tiny_pipeline(), run_id="code", root=tmp_path,
                         notify=print)
    out = remote.score(context(task=tiny_pipeline().task), stage, table)
    assert out is not None
    assert out.column("reward").to_pylist() == [1.0, 0.0]
    assert out.column("score_isolation").to_pylist() == ["namespaces"] * 2
    assert remote.reports[0]["worker"] in WORKERS


def test_in_flight_hooks_run_on_the_workers(tmp_path: Path,
                                             engine_workers: list[subprocess.Popen]) -> None:
    # the token budget stops what is in flight once the step's budget is spent (its
    # on_segment hook, on the worker); the stopped ones come back the next step
    # (RecyclePartials) and continue from their stored tokens
    from stages import (GRPO, GroupSample, RecyclePartials, TokenBudget, UniformSampler,
                        Verify)

    pipeline = tiny_pipeline(steps=2, stages=[
        RecyclePartials(), UniformSampler(batch=6),
        TokenBudget(budget=60, split="off", abort="stop"),
        GroupSample(n=4, max_tokens=8, segment_tokens=2), Verify(), GRPO(lr=1e-3)])
    local = execute(pipeline, root=tmp_path / "local", executor="local")
    remote = execute(pipeline, root=tmp_path / "remote", executor="local",
                     generate_pool=GeneratePool(pool=POOL, timeout_s=240, warn_s=120))
    columns = ["step", "prompt", "sample_idx", "completion", "status", "finish_reason",
               "parent_id", "policy_version_start"]
    with RolloutStore.open(tmp_path / "local" / "store", read_only=True) as s:
        a = s.sql("SELECT * FROM rollouts ORDER BY step, prompt, sample_idx, status")
    with RolloutStore.open(tmp_path / "remote" / "store", read_only=True) as s:
        b = s.sql("SELECT * FROM rollouts ORDER BY step, prompt, sample_idx, status")
    assert "partial" in a.column("status").to_pylist()  # the hook stopped some in flight
    keep = [c for c in columns if c != "parent_id"]  # ids name the run
    step0 = [r for r in a.select(keep).to_pylist() if r["step"] == 0]
    assert step0 == [r for r in b.select(keep).to_pylist() if r["step"] == 0]
    # step 1 continues the stopped ones on the worker; which continuation lands on which
    # prompt follows the order RecyclePartials reads them from each run's own store,
    # which two stores do not share, so only the rows' identities are compared
    continued = [r for r in b.select(columns).to_pylist() if r["parent_id"] is not None]
    assert continued and all(r["step"] == 1 for r in continued)
    ident = ["step", "prompt", "sample_idx", "status"]
    assert sorted(map(str, a.select(ident).to_pylist())) == sorted(
        map(str, b.select(ident).to_pylist()))
    assert remote.accuracy_after == local.accuracy_after


def test_no_worker_on_the_pool_fails_at_the_timeout_naming_it(
        tmp_path: Path, prefect_server: Any, pool_key: Path) -> None:
    warnings: list[str] = []

    class Warned:
        def on_warning(self, *, message: str, count: int, **kw: Any) -> None:
            warnings.append(message)

    with pytest.raises(NoEngineWorker, match=r"group\[step=0\]: no engine worker of pool "
                                             r"'nobody' took the call within 3 s"):
        execute(tiny_pipeline(steps=1), root=tmp_path, executor="prefect", hooks=[Warned()],
                generate_pool=GeneratePool(pool="nobody", timeout_s=3, warn_s=1))
    # said once: the generate task's retries do not wait the timeout again
    assert sum("waiting for an engine worker of pool 'nobody'" in w for w in warnings) == 1
    with RolloutStore.open(tmp_path / "store", read_only=True) as s:
        status = s.sql("SELECT status, error FROM runs").to_pylist()
    assert status[0]["status"] == "failed" and "nobody" in status[0]["error"]


def test_a_worker_on_other_code_refuses_naming_both_hashes(tmp_path: Path) -> None:
    from gfcr.transport.remote.worker import run_call

    p = tiny_pipeline()
    call = GenerateCall(run_id="r", step=0, seed=0, stage=p.stages[1].model_dump(mode="json"),
                        policy=p.policy.model_dump(mode="json"),
                        engine=p.engine.model_dump(mode="json"),
                        task=p.task.model_dump(mode="json"), policy_version=0,
                        weights=str(tmp_path), plan=str(tmp_path / "plan.parquet"),
                        out=str(tmp_path / "out.parquet"), code_hash="0123456789abcdef",
                        spec_hash="fedcba9876543210")
    with pytest.raises(Refused, match=f"worker code {code_hash()}, run code 0123456789abcdef"):
        run_call(call)
    same_code = call.model_copy(update={"code_hash": code_hash()})
    with pytest.raises(Refused, match=r"worker spec [0-9a-f]{16}, run spec fedcba9876543210"):
        run_call(same_code)
    assert not (tmp_path / "out.parquet").exists()


def test_async_steps_generate_ahead_with_weights_at_most_k_versions_old(
        tmp_path: Path, engine_workers: list[subprocess.Popen]) -> None:
    k = 1
    pipeline = tiny_pipeline(steps=4, task=Digits(), max_staleness=k).with_overrides(
        ["group.max_tokens=1"])
    summary = execute(pipeline, root=tmp_path, executor="local",
                      generate_pool=GeneratePool(pool=POOL, timeout_s=240, warn_s=120))
    history = summary.history
    assert len(history) == 4 and summary.rollouts == 4 * 16
    lags = [m["staleness/max"] for m in history]
    assert all(0 <= lag <= k for lag in lags) and max(lags) == k  # a step trained on stale rows
    rows = _rows(tmp_path, summary.run_id)
    for step, metrics in enumerate(history):
        # each row keeps the version it was generated with, at most k behind its step's
        version = metrics["policy_version"] - (1 if "train/lr" in metrics else 0)
        starts = [r["policy_version_start"] for r in rows if r["step"] == step]
        assert all(version - k <= v <= version for v in starts)
    stale = [m for m, lag in zip(history, lags) if lag > 0 and "train/offpolicy_share" in m]
    assert all(m["train/offpolicy_share"] > 0 for m in stale)


def test_an_async_run_with_k_1_learns_over_its_warm_start(
        tmp_path: Path, engine_workers: list[subprocess.Popen]) -> None:
    # a supervised warm start of 4 steps answers half the held-out prompts with four
    # digits; 4 GRPO steps, each generated on a worker one version behind, raise it
    k = 1
    pipeline = tiny_pipeline(
        task=DigitAnswers(), steps=4, max_staleness=k,
        warmstart=SFT(steps=4, batch_size=12, schedule="constant"),
        stages=[UniformSampler(batch=8), GroupSample(n=8, max_tokens=4), Verify(),
                GRPO(lr=1e-2)]).with_overrides(["evaluation.max_tokens=4"])
    summary = execute(pipeline, root=tmp_path, executor="local",
                      generate_pool=GeneratePool(pool=POOL, timeout_s=240, warn_s=120))
    assert summary.accuracy_warmstart is not None
    assert summary.accuracy_after > summary.accuracy_warmstart, summary
    lags = [m["staleness/max"] for m in summary.history]
    assert max(lags) == k  # steps trained on rows one version old
    names = {f"group[step={step}]" for step in range(4)}
    assert set(_ran_on(names)) == names  # every batch was generated on a worker


def test_async_steps_with_a_history_reading_select_generate_each_batch_once(
        tmp_path: Path, engine_workers: list[subprocess.Popen]) -> None:
    # D5: VADE reads the run's history, so a plan drawn again at step s differs from the
    # one drawn at s - 1; the loop draws each plan once and uses it, so every step's batch
    # is generated once, ahead, and never again synchronously with the old weights
    warnings: list[str] = []

    class Watch:
        def on_warning(self, *, message: str, **_: Any) -> None:
            warnings.append(message)

    pipeline = tiny_pipeline(task=Digits(), steps=3, max_staleness=1, stages=[
        VADE(batch=4, rollouts=4), GroupSample(n=4, max_tokens=1), Verify(), GRPO(lr=1e-2)])
    summary = execute(pipeline, root=tmp_path, executor="local", run_id="d5", hooks=[Watch()],
                      generate_pool=GeneratePool(pool=POOL, timeout_s=240, warn_s=120))
    assert not [w for w in warnings if "differs" in w], warnings
    # each step's first-round batch was sent once (a finished call's files are removed
    # as soon as they are read, so the count comes from the calls the run collected)
    assert [m["remote/first_round_calls"] for m in summary.history] == [1.0, 1.0, 1.0]
    assert [m["staleness/max"] for m in summary.history] == [0.0, 1.0, 1.0]


def test_a_run_stopped_with_a_batch_in_flight_resumes_as_the_uninterrupted_run(
        tmp_path: Path, engine_workers: list[subprocess.Popen]) -> None:
    # stopped after step 1 (SIGTERM's path: a stop at the step boundary), while step 2's
    # batch, sent ahead during step 1, is in flight; resumed: the in-flight batch is sent
    # again with the weights version it was sent with, so every row equals the
    # uninterrupted run's, and each step and rollout is stored once
    from gfcr.runner.cancel import RunCancelled, Stop

    pipeline = tiny_pipeline(task=Digits(), steps=4, max_staleness=1, stages=[
        UniformSampler(batch=4), GroupSample(n=4, max_tokens=4), Verify(), GRPO(lr=1e-2)])
    pool = GeneratePool(pool=POOL, timeout_s=240, warn_s=120)
    whole = execute(pipeline, root=tmp_path / "whole", executor="local", run_id="b",
                    generate_pool=pool)
    stop, in_flight = Stop(), list[str]()
    staging = tmp_path / "cut" / "staging" / "b" / "remote"

    class StopAfterStep1:
        def on_step(self, *, step: int, **_: Any) -> None:
            if step == 1:
                in_flight.extend(p.name for p in staging.glob("2-0-*-plan.parquet"))
                stop.request("the test stops after step 1")

    with pytest.raises(RunCancelled):
        execute(pipeline, root=tmp_path / "cut", executor="local", run_id="b",
                hooks=[StopAfterStep1()], stop=stop, generate_pool=pool)
    assert len(in_flight) == 1  # step 2's batch had been sent to the pool
    assert _stored(tmp_path / "cut") == [(0, 16, 16), (1, 16, 16)]  # and was not stored
    resumed = execute(pipeline, root=tmp_path / "cut", executor="local", run_id="b",
                      generate_pool=pool)
    assert resumed.resumed_from == 1
    assert _stored(tmp_path / "cut") == [(step, 16, 16) for step in range(4)]
    assert resumed.history[2]["staleness/max"] == 1  # step 2 still ran on older rows
    same = [*COMPARE, "rollout_id", "group_id"]
    assert _rows(tmp_path / "cut", "b", same) == _rows(tmp_path / "whole", "b", same)
    assert [m["policy_version"] for m in resumed.history] == [
        m["policy_version"] for m in whole.history]
    assert resumed.accuracy_after == whole.accuracy_after


def _stored(root: Path) -> list[tuple[int, int, int]]:
    """(step, rows, distinct rollout ids) of each stored step of run "b"."""
    with RolloutStore.open(root / "store", read_only=True) as s:
        steps = s.sql("SELECT step FROM steps WHERE run_id = 'b'").column("step").to_pylist()
        counts = s.sql("SELECT step, count(*) AS n, count(DISTINCT rollout_id) AS ids "
                       "FROM rollouts WHERE run_id = 'b' GROUP BY step").to_pylist()
    assert sorted(steps) == sorted(c["step"] for c in counts)  # a steps row per step, once
    return sorted((c["step"], c["n"], c["ids"]) for c in counts)


def _score_call(root: Path, run_id: str, stage: Any, table: Any, out: Path | None = None
                ) -> Any:
    """A score call of run ``run_id`` under ``root``, its rows staged as a run stages them."""
    from gfcr.transport.remote.call import ScoreCall, spec_hash, write_parquet

    staging = root / "staging" / run_id / "remote"
    staging.mkdir(parents=True, exist_ok=True)
    write_parquet(staging / "0-0-rows.parquet", table)
    task = tiny_pipeline().task.model_dump(mode="json")
    dumped = stage.model_dump(mode="json")
    return ScoreCall(run_id=run_id, step=0, seed=0, policy_version=0, stage=dumped, task=task,
                     rows=str(staging / "0-0-rows.parquet"),
                     out=str(out or staging / "0-0-scored.parquet"), code_hash=code_hash(),
                     spec_hash=spec_hash(dumped, (), {}, {}, task))


def _final(future: Any) -> Any:
    future.wait(timeout=240)
    return future.state


def test_engine_workers_run_only_calls_their_runs_signed(
        tmp_path: Path, engine_workers: list[subprocess.Popen], pool_key: Path) -> None:
    # issue 26: anyone who reaches the Prefect API could send a score call naming
    # Verify(scorer="builtins:exec"), any run id and any output path; it ran the
    # completion as Python on the worker and overwrote the path
    from gfcr.transport.remote.keys import new_key, sign, load_key
    from gfcr.transport.remote.worker import score_task
    from tests.resources.rollouts import rollouts

    victim, ran = tmp_path / "victim.txt", tmp_path / "ran.txt"
    victim.write_text("mine")
    code = f"open({str(ran)!r}, 'w').write('ran')"
    table = rollouts(["g"], completion=[code], answer=[None])
    forged = _score_call(tmp_path, "forged", Verify(scorer="builtins:exec"), table, victim)
    task = score_task(POOL)
    unsigned = task.delay(name=forged.name, call=forged.model_dump(mode="json"))
    other = load_key(new_key(tmp_path / "other.key"))
    theirs = task.delay(name=forged.name, call=forged.model_dump(mode="json"),
                        mac=sign("score", forged, other))
    # signed with the pool's key, yet naming code off the workers' list, or writing
    # outside its run's staging folder, or a generate call's signature on a score call
    key = load_key(pool_key)
    exec_in_staging = forged.model_copy(update={"out": str(Path(forged.rows).with_name(
        "0-0-scored.parquet"))})
    outside = _score_call(tmp_path, "outside", Verify(), rollouts(["g"]), victim)
    sent = [unsigned, theirs,
            task.delay(name="a", call=exec_in_staging.model_dump(mode="json"),
                       mac=sign("score", exec_in_staging, key)),
            task.delay(name="b", call=outside.model_dump(mode="json"),
                       mac=sign("score", outside, key)),
            task.delay(name="c", call=exec_in_staging.model_dump(mode="json"),
                       mac=sign("generate", exec_in_staging, key))]
    states = [_final(f) for f in sent]
    assert all(s.is_failed() for s in states), states
    messages = [str(s.message) for s in states]
    assert "not signed with this pool's key" in messages[0] + messages[1] + messages[4]
    assert "'builtins:exec' is not on this engine worker's list" in messages[2]
    assert "is not in a run's staging folder" in messages[3]
    assert not ran.exists() and victim.read_text() == "mine"
    assert not Path(exec_in_staging.out).exists()


def test_a_withdrawn_call_runs_nothing_and_a_finished_calls_files_go(
        tmp_path: Path, engine_workers: list[subprocess.Popen], pool_key: Path) -> None:
    # issue 21 D6: a dropped call still ran, and its files (and every finished call's)
    # stayed in the run's staging folder
    from gfcr.transport.remote.pool import PoolCalls, mark_withdrawn
    from gfcr.transport.remote.worker import score_task
    from tests.resources.rollouts import rollouts

    calls = PoolCalls(GeneratePool(pool=POOL, timeout_s=240), score_task, print)
    dropped = _score_call(tmp_path, "drop", Verify(scorer="exact"), rollouts(["g"]))
    mark_withdrawn(dropped)
    report = calls.wait(calls.send(dropped, rollouts(["g"]), 0.0))
    assert report["withdrawn"] and not Path(dropped.out).exists()
    kept = _score_call(tmp_path, "keep", Verify(scorer="exact"), rollouts(["g", "g"]))
    report, table = calls.collect(calls.send(kept, rollouts(["g", "g"]), 0.0))
    assert table.num_rows == 2 and report["worker"] in WORKERS
    assert sorted(p.name for p in Path(kept.out).parent.iterdir()) == []


def test_a_call_prefects_queue_lost_is_sent_again(
        tmp_path: Path, engine_workers: list[subprocess.Popen], pool_key: Path) -> None:
    # issue 21 D4: a Prefect server restart empties its in-memory queue of background
    # task runs; the task run stays Scheduled and no worker ever receives it. Here the
    # lost call is a Scheduled task run the queue never held (created without deferral)
    import uuid

    from prefect import get_client
    from prefect.futures import PrefectDistributedFuture
    from prefect.states import Scheduled

    from gfcr.transport.remote.pool import PoolCalls, _Sent
    from gfcr.transport.remote.worker import score_task
    from tests.resources.rollouts import rollouts

    said: list[str] = []
    calls = PoolCalls(GeneratePool(pool=POOL, timeout_s=240, warn_s=1), score_task,
                      said.append)
    call = _score_call(tmp_path, "lost", Verify(scorer="exact"), rollouts(["g", "g"]))
    with get_client(sync_client=True) as client:
        lost = client.create_task_run(score_task(POOL), flow_run_id=None,
                                      dynamic_key=uuid.uuid4().hex, name=call.name,
                                      state=Scheduled())
    sent = _Sent(call, PrefectDistributedFuture(lost.id), rollouts(["g", "g"]), 0.0, 0.0)
    report, table = calls.collect(sent)
    assert table.num_rows == 2 and report["worker"] in WORKERS
    assert any("never received the call" in m and "sending the call again" in m
               for m in said), said


def test_a_call_that_keeps_losing_its_worker_stops_at_its_attempts_and_deadline(
        tmp_path: Path, prefect_server: Any, pool_key: Path) -> None:
    # issue 21 D2: each attempt is taken and its worker dies at once (what a poison batch
    # does to a supervised pool: the task run stays RUNNING, its heartbeat never comes);
    # the call was sent again without limit and each re-send restarted the timeout
    import threading

    from prefect import get_client
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterTags
    from prefect.states import Running

    from gfcr.transport.remote.dispatch import PoolCalls
    from gfcr.transport.remote.worker import pool_tag, score_task
    from tests.resources.rollouts import rollouts

    def taken_and_lost(stop: threading.Event) -> None:
        with get_client(sync_client=True) as client:
            while not stop.wait(0.2):
                for run in client.read_task_runs(task_run_filter=TaskRunFilter(
                        tags=TaskRunFilterTags(all_=[pool_tag("poison")]))):
                    if run.state is not None and run.state.is_scheduled():
                        client.set_task_run_state(run.id, Running(), force=True)

    def wait(pool: GeneratePool, run_id: str) -> tuple[BaseException | None, list[str]]:
        said: list[str] = []
        call = _score_call(tmp_path, run_id, Verify(scorer="exact"), rollouts(["g"]))
        calls = PoolCalls(pool, score_task, said.append)
        stop, done = threading.Event(), list[BaseException]()
        killer = threading.Thread(target=taken_and_lost, args=(stop,))
        killer.start()

        def waiting() -> None:
            try:
                calls.wait(calls.send(call, rollouts(["g"]), 0.0))
            except BaseException as exc:  # the outcome under test
                done.append(exc)
        waiter = threading.Thread(target=waiting, daemon=True)
        waiter.start()
        waiter.join(timeout=180)
        stop.set()
        killer.join()
        return (done[0] if done else None), said

    capped = GeneratePool(pool="poison", timeout_s=120, warn_s=100, lost_s=1, attempts=3)
    error, said = wait(capped, "capped")
    assert error is not None and "was sent 3 times" in str(error), (error, said)
    assert sum("sending the call again" in m for m in said) == 2
    deadline = GeneratePool(pool="poison", timeout_s=6, warn_s=100, lost_s=1, attempts=100)
    error, said = wait(deadline, "deadline")
    assert isinstance(error, TimeoutError) and "within 6 s" in str(error), (error, said)


def test_the_heartbeat_lasts_until_the_output_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # issue 21 D3: the heartbeat stopped before the output was written, so a write
    # slower than lost_s (a large table on a busy shared filesystem) was declared lost
    # on every attempt. A stand-in for that filesystem: the write waits (up to 60 s)
    # for the heartbeat to change, and records whether it did
    import gfcr.transport.remote.worker as worker
    from tests.resources.rollouts import rollouts

    call = _score_call(tmp_path, "slow", Verify(scorer="exact"), rollouts(["g"]))
    beat, write, beat_moved = Path(call.out + worker.BEAT), worker.write_parquet, []

    def slow_write(path: Any, table: Any, **kw: Any) -> None:
        before, waited = beat.stat().st_mtime_ns, 0.0
        while beat.stat().st_mtime_ns == before and waited < 60:
            time.sleep(0.1)
            waited += 0.1
        beat_moved.append(beat.stat().st_mtime_ns != before)
        write(path, table, **kw)

    monkeypatch.setattr(worker, "write_parquet", slow_write)
    report = worker.run_score(call)
    assert beat_moved == [True] and report["rows"] == 1 and Path(call.out).exists()


def test_kill_a_worker_mid_task_the_call_runs_again_and_every_rollout_is_stored_once(
        tmp_path: Path, engine_workers: list[subprocess.Popen]) -> None:
    """Last in the module: it kills one of the two workers."""
    import signal
    import threading

    # a longer generation (64 samples of 16 tokens) to kill a worker in
    pipeline = tiny_pipeline(steps=2).with_overrides(["uniform.batch=16",
                                                      "group.max_tokens=16"])
    done: dict[str, Any] = {}
    warnings: list[str] = []

    class Warned:
        def on_warning(self, *, message: str, count: int, **kw: Any) -> None:
            warnings.append(message)

    def run() -> None:
        try:
            done["summary"] = execute(pipeline, root=tmp_path, executor="local",
                                      hooks=[Warned()], generate_pool=GeneratePool(
                                          pool=POOL, timeout_s=240, warn_s=120, lost_s=5))
        except BaseException as exc:  # reported below
            done["error"] = exc
    runner = threading.Thread(target=run)
    runner.start()
    # a running call's heartbeat file names its worker: kill that one mid-task
    victim = None
    while victim is None and runner.is_alive():
        for beat in tmp_path.glob("staging/*/remote/0-0-*.beat"):
            name = beat.read_text()
            if name in WORKERS:
                victim = WORKERS.index(name)
        time.sleep(0.02)
    assert victim is not None, done
    engine_workers[victim].send_signal(signal.SIGKILL)
    engine_workers[victim].wait()
    runner.join(timeout=300)
    assert "summary" in done, done
    assert any("stopped signalling" in w and "sending the call again" in w for w in warnings)
    with RolloutStore.open(tmp_path / "store", read_only=True) as s:
        counts = s.sql("SELECT step, count(*) AS n, count(DISTINCT rollout_id) AS ids "
                       "FROM rollouts GROUP BY step ORDER BY step").to_pylist()
    assert counts == [{"step": 0, "n": 64, "ids": 64}, {"step": 1, "n": 64, "ids": 64}]


def test_an_engine_worker_refuses_a_bad_pool_name_or_no_api_server(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PREFECT_") and k != "GFCR_POOL_KEY_FILE"}
    env["PREFECT_HOME"] = str(tmp_path)  # no profile that names a server
    worker = [sys.executable, "-c", "from gfcr.cli import main; main()", "engine-worker"]
    bad = subprocess.run([*worker, "--pool", "a.b"], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "engine pool name 'a.b' may hold only" in bad.stderr
    alone = subprocess.run([*worker, "--pool", "gpu"], cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=120)
    assert alone.returncode == 2 and "needs a Prefect API server" in alone.stderr
    # issue 26: a worker without the pool's key would run anyone's calls; one whose API
    # does not answer printed nothing for 90 s. Both now say so, the second at once
    from gfcr.transport.remote.keys import new_key

    env["PREFECT_API_URL"] = "http://127.0.0.1:9/api"  # nothing listens there
    keyless = subprocess.run([*worker, "--pool", "gpu"], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=120)
    assert keyless.returncode == 2 and "need a pool key" in keyless.stderr, keyless.stderr
    key = new_key(tmp_path / "pool.key")
    unreachable = subprocess.run([*worker, "--pool", "gpu", "--key-file", str(key),
                                  "--api-wait", "0"], cwd=REPO, env=env,
                                 capture_output=True, text=True, timeout=120)
    said = unreachable.stdout + unreachable.stderr
    assert said.index("connecting to the Prefect API at http://127.0.0.1:9/api") < said.index(
        "cannot reach the Prefect API at http://127.0.0.1:9/api")
    assert unreachable.returncode == 2
