"""Engine workers (gfcr.remote): a run's generate stage on two `gfcr engine-worker`
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
from gfcr.remote.call import GenerateCall, Refused, code_hash
from gfcr.remote.dispatch import GeneratePool, NoEngineWorker
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
def engine_workers(prefect_server: Any, tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[list[subprocess.Popen]]:
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
    remote = execute(pipeline, root=tmp_path / "remote", executor="prefect",
                     generate_pool=GeneratePool(pool=POOL, timeout_s=240, warn_s=120))
    a, b = _rows(tmp_path / "local", local.run_id), _rows(tmp_path / "remote", remote.run_id)
    assert len(a) == 3 * 16 and a == b
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

    from gfcr.remote.scoring import RemoteScore
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
        tmp_path: Path, prefect_server: Any) -> None:
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
    from gfcr.remote.worker import run_call

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
    sent: dict[int, int] = {}
    staging = tmp_path / "staging" / "d5" / "remote"

    class Watch:
        def on_warning(self, *, message: str, **_: Any) -> None:
            warnings.append(message)

        def on_step(self, *, step: int, **_: Any) -> None:
            sent[step] = len(list(staging.glob(f"{step}-0-*-plan.parquet")))

    pipeline = tiny_pipeline(task=Digits(), steps=3, max_staleness=1, stages=[
        VADE(batch=4, rollouts=4), GroupSample(n=4, max_tokens=1), Verify(), GRPO(lr=1e-2)])
    summary = execute(pipeline, root=tmp_path, executor="local", run_id="d5", hooks=[Watch()],
                      generate_pool=GeneratePool(pool=POOL, timeout_s=240, warn_s=120))
    assert not [w for w in warnings if "differs" in w], warnings
    assert sent == {0: 1, 1: 1, 2: 1}  # each step's batch was sent once
    assert [m["staleness/max"] for m in summary.history] == [0.0, 1.0, 1.0]


def test_a_run_stopped_with_a_batch_in_flight_resumes_as_the_uninterrupted_run(
        tmp_path: Path, engine_workers: list[subprocess.Popen]) -> None:
    # stopped after step 1 (SIGTERM's path: a stop at the step boundary), while step 2's
    # batch, sent ahead during step 1, is in flight; resumed: the in-flight batch is sent
    # again with the weights version it was sent with, so every row equals the
    # uninterrupted run's, and each step and rollout is stored once
    from gfcr.cancel import RunCancelled, Stop

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
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env["PREFECT_HOME"] = str(tmp_path)  # no profile that names a server
    worker = [sys.executable, "-c", "from gfcr.cli import main; main()", "engine-worker"]
    bad = subprocess.run([*worker, "--pool", "a.b"], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "engine pool name 'a.b' may hold only" in bad.stderr
    alone = subprocess.run([*worker, "--pool", "gpu"], cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=120)
    assert alone.returncode == 2 and "needs a Prefect API server" in alone.stderr
