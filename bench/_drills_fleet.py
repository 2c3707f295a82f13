"""The fleet drills of bench/drills_agent.py (A9, D6b): they need two ``gfcr engine
serve`` servers of the tiny vLLM policy with ``--max-model-len 256`` (``--start-fleet``
starts them as the tests do, tests/resources/fleet.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = str(Path(__file__).resolve().parent.parent)


def a9(urls: list[str]) -> dict[str, Any]:
    from stages import GRPO, AgentEnv, TinyLlama, UniformSampler
    from gfcr.launch.placement import Placement
    from gfcr.launch.run import execute
    from gfcr.transport.fleet import Fleet
    from tests.conftest import tiny_pipeline
    from tests.resources import agents
    from tests.resources.vllm import vllm_engine_spec

    agents.reset_one_long()
    policy = TinyLlama(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128,
                       max_position=512)
    p = tiny_pipeline(steps=1, policy=policy, engine=vllm_engine_spec(), stages=[
        UniformSampler(batch=2), AgentEnv(agent="tests.resources.agents:one_long", n=4,
                                          max_tokens=4, window=5.0), GRPO(lr=1e-2)]
    ).with_overrides(["evaluation.size=4", "evaluation.max_tokens=4"])
    with tempfile.TemporaryDirectory() as root:
        try:
            execute(p, root=Path(root), executor="local", run_id="a9",
                    placement=Placement(generator=Fleet(urls=tuple(urls))))
        except BaseException as err:  # noqa: BLE001 - what the drill measures
            return {"drill": "A9 over-long conversation on a fleet", "ended_run": True,
                    "error": f"{type(err).__name__}: {str(err)[:200]}"}
        from store import RolloutStore

        with RolloutStore.open(Path(root) / "store", read_only=True) as s:
            rows = s.sql("SELECT score_error FROM rollouts").to_pylist()
    failed = [r["score_error"] for r in rows if r["score_error"] is not None]
    return {"drill": "A9 over-long conversation on a fleet", "ended_run": False,
            "rows": len(rows), "neighbours_failed": len(failed) - 1,
            "bad_request": (failed[0] if failed else "")[:160]}


def fleet_pipeline(steps: int) -> Any:
    """The tiny vLLM policy's GRPO pipeline, a checkpoint every 3 steps."""
    from stages import GRPO, GroupSample, UniformSampler, Verify
    from tests.conftest import tiny_pipeline
    from tests.resources.vllm import VLLM_POLICY, vllm_engine_spec

    return tiny_pipeline(
        steps=steps, policy=VLLM_POLICY, engine=vllm_engine_spec(),
        stages=[UniformSampler(batch=4), GroupSample(n=4, max_tokens=8), Verify(),
                GRPO(lr=1e-2)]
    ).with_overrides(["evaluation.size=4", "evaluation.max_tokens=4", "checkpoint.every=3"])



def _kill_past_checkpoint(root: Path, urls: list[str]) -> int:
    """Start a fleet run in a process of its own and ``kill -9`` it once steps past its
    newest checkpoint are committed; returns the last committed step."""
    from gfcr.checkpoints import checkpoint
    from store import RolloutStore

    code = ("import runpy, sys; from pathlib import Path; from gfcr.launch.run import "
            "execute, Placement; from gfcr.transport.fleet import Fleet; pipe = runpy.run_path("
            "sys.argv[1])['fleet_pipeline']; execute(pipe(8), root=Path(sys.argv[2]), "
            "executor='local', run_id='d6b', placement=Placement(generator=Fleet(urls=tuple(sys.argv[3:]))))")
    child = subprocess.Popen([sys.executable, "-c", code, __file__, str(root), *urls],
                             start_new_session=True, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, cwd=REPO,
                             env={**os.environ, "PYTHONPATH": REPO})
    where, last = checkpoint.directory(root, "d6b"), -1
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline and child.poll() is None:
        newest = checkpoint.latest(where) if where.exists() else None
        if newest is not None:
            try:
                with RolloutStore.open(root / "store", read_only=True) as s:
                    got = s.last_step("d6b")
                last = -1 if got is None else got
            except Exception:  # noqa: BLE001 - the store is being written: look again
                pass
            if last >= newest.step + 2 or (newest.step > 2 and last > newest.step):
                break  # committed steps past the checkpoint: the resume replays them
        time.sleep(0.2)
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    return last


def d6b(urls: list[str]) -> dict[str, Any]:
    """kill -9 of a fleet run after it committed steps past its last checkpoint, then a
    resume: the rows each replayed step trained on against the rows the store holds."""
    from gfcr.launch.placement import Placement
    from gfcr.launch.run import execute
    from gfcr.runner.inprocess import LocalLearner
    from gfcr.transport.fleet import Fleet
    from store import RolloutStore

    root = Path(tempfile.mkdtemp(prefix="gfcr-d6b-"))
    last = _kill_past_checkpoint(root, urls)
    trained: dict[int, list[Any]] = {}
    update = LocalLearner.update

    def recording(self: Any, ctx: Any, batch: Any) -> Any:
        trained[ctx.step] = sorted(batch.select(["rollout_id", "completion_ids"]).to_pylist(),
                                   key=lambda r: r["rollout_id"])
        return update(self, ctx, batch)

    LocalLearner.update = recording  # type: ignore[method-assign]
    try:
        summary = execute(fleet_pipeline(8), root=root, executor="local", run_id="d6b",
                          placement=Placement(generator=Fleet(urls=tuple(urls))))
    finally:
        LocalLearner.update = update  # type: ignore[method-assign]
    with RolloutStore.open(root / "store", read_only=True) as s:
        rows = s.sql("SELECT step, rollout_id, completion_ids, kept FROM rollouts "
                     "WHERE run_id = 'd6b'").to_pylist()
    first = -1 if summary.resumed_from is None else summary.resumed_from
    replayed = list(range(first + 1, last + 1))
    differ = sum(sorted(({"rollout_id": r["rollout_id"], "completion_ids": r["completion_ids"]}
                         for r in rows if r["step"] == st and r["kept"]),
                        key=lambda r: r["rollout_id"]) != trained.get(st) for st in replayed)
    ids = [r["rollout_id"] for r in rows]
    return {"drill": "D6b kill -9 and resume on a two-server fleet",
            "killed_after_step": last, "resumed_from": summary.resumed_from,
            "replayed_steps": replayed, "regenerated_differently": sum(
                summary.history[st].get("resume/replay_mismatch", 0) > 0 for st in replayed),
            "steps_trained_on_other_rows_than_stored": differ, "rows": len(rows),
            "duplicates": len(ids) - len(set(ids))}
