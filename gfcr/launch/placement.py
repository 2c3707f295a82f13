"""Where a run's work runs: the :class:`gfcr.core.services.Services` built for a run.

- in-process (no pool): the engine shares the learner's policy; with
  ``max_staleness > 0`` it gets a policy of its own and a thread to generate on while
  the learner updates (gfcr.runner.inprocess.LocalGenerator);
- a fleet (gfcr.transport.fleet.Fleet): the inference engine's own servers generate and
  evaluate, weights reach them by version; no engine is built in this process. The only
  way generation leaves the run's process: the engine-worker generate path
  (``--generate-pool``) was removed in issue 24 (:class:`GeneratePoolRemoved`);
- a score pool: the scoring filter stages run on a pool's workers
  (gfcr.transport.remote.scoring);
- a sharded learner (``learner.ranks > 0``): the train stage's learner runs on FSDP2
  processes (gfcr.transport.sharded); the run's policy is then the engine's own, loaded from the
  versions the ranks publish.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from gfcr.core.capabilities import EngineSpec
from gfcr.core.pipeline import Pipeline
from gfcr.core.services import Generator, Learner, Services
from gfcr.core.stage import TRAIN
from gfcr.runner.commits import BackgroundCommits, pinned_history, recording
from gfcr.runner.inprocess import LocalGenerator, LocalLearner, LocalScorer
from gfcr.runner.runtime import Record, Runtime
from gfcr.runner.tokencheck import check_task
from gfcr.transport.fleet import Fleet, for_run as fleet_for_run
from gfcr.transport.remote import scoring
from gfcr.transport.sharded import Setup, ShardedLearner

REMOVED = ("the engine-worker generate path (--generate-pool, generate_pool=POOL) was removed "
           "(issue 24): generation leaves a run's process only on a fleet of vLLM servers. "
           "Start them with `gfcr engine serve --model DIR` and name them with "
           "`gfcr run --fleet URL` (in Python: execute(..., fleet=Fleet(urls=(URL, ...))), "
           "gfcr.transport.fleet.Fleet); scoring pools (--score-pool) are unchanged")


class GeneratePoolRemoved(ValueError):
    """A run asked to generate on a pool of engine workers, a path that no longer
    exists; the message names the fleet that replaces it."""

    def __init__(self, pool: object) -> None:
        super().__init__(f"generate pool {pool!r}: {REMOVED}")


def generation(fleet: Any, generate_pool: Any) -> Fleet | None:
    """Where a run generates (:func:`gfcr.launch.run.execute`'s ``fleet`` and
    ``generate_pool``): a fleet, or None (this process). ``generate_pool`` is the older
    name of ``fleet`` and takes a Fleet only; a pool name or settings raise
    :class:`GeneratePoolRemoved`."""
    if generate_pool is not None and not isinstance(generate_pool, Fleet):
        raise GeneratePoolRemoved(generate_pool)
    if fleet is not None and generate_pool is not None:
        raise ValueError("give the fleet once: as fleet= (generate_pool= is its older name)")
    chosen = fleet if fleet is not None else generate_pool
    if chosen is not None and not isinstance(chosen, Fleet):
        raise TypeError(f"fleet={chosen!r}: expected a gfcr.transport.fleet.Fleet")
    return chosen


def build(pipeline: Pipeline, run_id: str, root: Path, stash: Any, store: Any,
          commits: BackgroundCommits, pools: tuple[Any, Any],
          notify: Callable[[str], None]) -> tuple[Runtime, Any]:
    """The run's runtime and the learner's policy: built once, kept for the whole run."""
    policy = pipeline.policy.build(seed=pipeline.seed)
    check_task(pipeline.task, policy.tokenizer, policy.remedy)  # before any work, once
    learner = _learner(pipeline, policy, run_id, root)
    try:
        return _runtime(pipeline, run_id, root, stash, store, commits, pools, notify,
                        policy, learner), policy
    except BaseException:
        learner.close()  # a sharded learner's processes
        raise


def _runtime(pipeline: Pipeline, run_id: str, root: Path, stash: Any, store: Any,
             commits: BackgroundCommits, pools: tuple[Any, Any],
             notify: Callable[[str], None], policy: Any, learner: Learner) -> Runtime:
    if pools[0] is not None and policy.adapter is not None:
        raise ValueError(
            "train stage: lora is set and the run generates on a fleet of servers, which "
            "load whole published weights; a LoRA learner publishes its adapter alone "
            "(gfcr.weights.versions), which the servers do not load yet. Generate in-process "
            "(no fleet) or drop lora.")
    generator = _generator(pipeline, run_id, root, policy, learner, pools[0], notify)
    scorer = scoring.for_run(pools[1], pipeline, run_id, root, notify) or LocalScorer()
    snapshots: dict[int, int] = {}
    record = Record(commit=recording(store.commit_step, snapshots),
                    history_at=pinned_history(store, run_id, snapshots, commits),
                    background=commits)
    services = Services(generator=generator, learner=learner, scorer=scorer)
    return Runtime(pipeline=pipeline, task=pipeline.task, services=services, stash=stash,
                   record=record)


def _generator(pipeline: Pipeline, run_id: str, root: Path, policy: Any, learner: Learner,
               fleet: Fleet | None, notify: Callable[[str], None]) -> Generator:
    """The run's generator: a fleet of servers (nothing generates here), or the engine
    in this process."""
    if fleet is not None:
        remote = fleet_for_run(fleet, pipeline, run_id, root, policy, notify)
        remote.load(learner.handle())
        return remote
    local = _local(pipeline, policy, background=bool(pipeline.max_staleness),
                   shared=not pipeline.learner.ranks)
    if not local.shared:
        local.load(learner.handle())  # the engine's own copy starts as the learner's
    return local


def _learner(pipeline: Pipeline, policy: Any, run_id: str, root: Path) -> Learner:
    """The train stage's learner: over ``policy`` in this process, or sharded over
    ``pipeline.learner.ranks`` processes (``policy`` is then the engine's own)."""
    trainers = TRAIN.of(pipeline.stages)
    place = pipeline.learner
    if not place.ranks:
        return LocalLearner(policy, trainers[0].learner(policy, seed=pipeline.seed)
                            if trainers else None)
    if not trainers:
        raise ValueError(f"pipeline {pipeline.name!r}: learner.ranks={place.ranks!r} needs "
                         "a train stage to shard; set learner.ranks=0")
    where = Path(root) / "runs" / run_id / "learner"
    setup = Setup(policy=pipeline.policy, stage=trainers[0], seed=pipeline.seed,
                  run_id=run_id, weights=str(where / "weights"),
                  keep=pipeline.max_staleness + 2, device=place.device,
                  offload=place.offload, timeout_s=place.timeout_s)
    return ShardedLearner(setup, place.ranks, policy, where)


def _local(pipeline: Pipeline, policy: Any, *, background: bool,
           shared: bool = True) -> LocalGenerator:
    """The run's engine: on the learner's policy (``shared``), or on a policy of its
    own: generating in the background while the learner updates, or beside a sharded
    learner (``policy`` is then no learner's)."""
    own = pipeline.policy.build(seed=pipeline.seed) if background and shared else policy
    own.adapter = policy.adapter  # the learner's LoRA, if any: the engine prepares for it
    engine = pipeline.engine.build(own, seed=pipeline.seed)
    spec = pipeline.engine
    capabilities = spec.capabilities if isinstance(spec, EngineSpec) else frozenset()
    return LocalGenerator(engine, own, shared=shared and own is policy,
                          background=background,
                          capabilities=capabilities)
