"""Score pools (gfcr.transport.remote): a run's scoring filter stages on two
`gfcr engine-worker` subprocesses served through Prefect task workers, against the
session's real Prefect server; the same scores as in-process; no worker on a pool; a
worker on other code; signed calls only; withdrawn, lost and re-sent calls.

The two workers start once for the module (a worker start costs seconds)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from gfcr.launch.placement import Placement
from gfcr import execute
from gfcr.transport.remote.call import CallRefused, code_hash
from gfcr.transport.remote.pool import NoEngineWorker, WorkerPool
from stages import Verify
from store import RolloutStore
from tests.conftest import tiny_pipeline
from tests.resources.digits import Digits

POOL = "tiny-scorers"
WORKERS = ("scorer-a", "scorer-b")
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
                 "--pool", POOL, "--name", name, "--import", "tests.resources.digits"],
                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True))
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


def _ran_on(names: set[str], what: str = "score") -> dict[str, tuple[str, str]]:
    """Call name -> (worker, final state) of the pool's ``what`` task runs: each
    worker renames the task run it takes ``NAME @ WORKER``."""
    from prefect import get_client
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterName

    signed = sorted(f"{n} @ {w}" for n in names for w in WORKERS)
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(task_run_filter=TaskRunFilter(
            name=TaskRunFilterName(any_=signed)))
    return {r.name.split(" @ ")[0]: (r.name.split(" @ ")[1], r.state.type.value)
            for r in runs if r.task_key.startswith(f"gfcr_{what}__{POOL}")}


def test_scoring_runs_on_the_workers_with_the_in_process_scores(
        tmp_path: Path, engine_workers: list[subprocess.Popen]) -> None:
    # Verify (the task's scorer) on a worker of the pool; DynamicSampling, which drops
    # flat groups by the rewards, stays in-process and drops the same rows
    pipeline = tiny_pipeline(steps=2, task=Digits()).with_overrides(["group.max_tokens=1"])
    local = execute(pipeline, root=tmp_path / "local", executor="local")
    remote = execute(pipeline, root=tmp_path / "remote", executor="local",
                     placement=Placement(scorer=WorkerPool(pool=POOL, timeout_s=240, warn_s=120)))
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
    remote = RemoteScore(WorkerPool(pool=POOL, timeout_s=240, warn_s=120),
                         pipeline=tiny_pipeline(), run_id="code", root=tmp_path,
                         notify=print)
    out = remote.score(context(task=tiny_pipeline().task), stage, table)
    assert out is not None
    assert out.column("reward").to_pylist() == [1.0, 0.0]
    assert out.column("score_isolation").to_pylist() == ["namespaces"] * 2
    assert remote.reports[0]["worker"] in WORKERS


def test_no_worker_on_the_pool_fails_at_the_timeout_naming_it(
        tmp_path: Path, prefect_server: Any, pool_key: Path) -> None:
    warnings: list[str] = []

    class Warned:
        def on_warning(self, *, message: str, count: int, **kw: Any) -> None:
            warnings.append(message)

    with pytest.raises(NoEngineWorker, match=r"verify\[step=0\]: no engine worker of pool "
                                             r"'nobody' took the call within 3 s"):
        execute(tiny_pipeline(steps=1), root=tmp_path, executor="prefect", hooks=[Warned()],
                placement=Placement(scorer=WorkerPool(pool="nobody", timeout_s=3, warn_s=1)))
    # said once: the filter task's retries do not wait the timeout again
    assert sum("waiting for an engine worker of pool 'nobody'" in w for w in warnings) == 1
    with RolloutStore.open(tmp_path / "store", read_only=True) as s:
        status = s.sql("SELECT status, error FROM runs").to_pylist()
    assert status[0]["status"] == "failed" and "nobody" in status[0]["error"]


def test_a_worker_on_other_code_refuses_naming_both_hashes(tmp_path: Path) -> None:
    from gfcr.transport.remote.worker import run_score
    from tests.resources.rollouts import rollouts

    right = _score_call(tmp_path, "r", Verify(scorer="exact"), rollouts(["g"]))
    call = right.model_copy(update={"code_hash": "0123456789abcdef",
                                    "spec_hash": "fedcba9876543210"})
    with pytest.raises(CallRefused, match=f"worker code {code_hash()}, run code 0123456789abcdef"):
        run_score(call)
    same_code = call.model_copy(update={"code_hash": code_hash()})
    with pytest.raises(CallRefused, match=r"worker spec [0-9a-f]{16}, run spec fedcba9876543210"):
        run_score(same_code)
    assert not Path(call.out).exists()
    assert run_score(right)["rows"] == 1 and Path(right.out).exists()


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
                     spec_hash=spec_hash(dumped, task))


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
    # outside its run's staging folder, or signed as another kind of call
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

    # warn_s past any pickup: a call a worker is slow to receive is not re-sent, since a
    # re-sent attempt has an output of its own that the withdrawal marker does not name
    calls = PoolCalls(WorkerPool(pool=POOL, timeout_s=240, warn_s=200), score_task, print)
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
    calls = PoolCalls(WorkerPool(pool=POOL, timeout_s=240, warn_s=1), score_task,
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

    from gfcr.transport.remote.pool import PoolCalls
    from gfcr.transport.remote.worker import pool_tag, score_task
    from tests.resources.rollouts import rollouts

    def taken_and_lost(stop: threading.Event) -> None:
        with get_client(sync_client=True) as client:
            while not stop.wait(0.2):
                for run in client.read_task_runs(task_run_filter=TaskRunFilter(
                        tags=TaskRunFilterTags(all_=[pool_tag("poison")]))):
                    if run.state is not None and run.state.is_scheduled():
                        client.set_task_run_state(run.id, Running(), force=True)

    def wait(pool: WorkerPool, run_id: str) -> tuple[BaseException | None, list[str]]:
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

    capped = WorkerPool(pool="poison", timeout_s=120, warn_s=100, lost_s=1, attempts=3)
    error, said = wait(capped, "capped")
    assert error is not None and "was sent 3 times" in str(error), (error, said)
    assert sum("sending the call again" in m for m in said) == 2
    deadline = WorkerPool(pool="poison", timeout_s=6, warn_s=100, lost_s=1, attempts=100)
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


def test_an_engine_worker_refuses_a_bad_pool_name_or_no_api_server(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PREFECT_") and k != "GFCR_POOL_KEY_FILE"}
    env["PREFECT_HOME"] = str(tmp_path)  # no profile that names a server
    worker = [sys.executable, "-c", "from gfcr.cli import main; main()", "engine-worker"]
    bad = subprocess.run([*worker, "--pool", "a.b"], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "pool name 'a.b' may hold only" in bad.stderr
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
