"""The :class:`gfcr.core.services.Services` built for a run, once, from its settled
:class:`gfcr.launch.placement.Placement`:

- in-process (no fleet): the engine shares the learner's policy; with
  ``max_staleness > 0`` it gets a policy of its own and a thread to generate on while
  the learner updates (gfcr.runner.inprocess.LocalGenerator);
- a fleet (gfcr.transport.fleet.Fleet): the inference engine's own servers generate and
  evaluate, weights reach them by version; no engine is built in this process (the only
  way generation leaves the run's process);
- a score pool: the scoring filter stages run on a pool's workers
  (gfcr.transport.remote.scoring);
- a sharded learner (``learner.ranks > 0``): the train stage's learner runs on FSDP2
  processes (gfcr.transport.sharded); the run's policy is then the engine's own, loaded from the
  versions the ranks publish.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from gfcr.core.capabilities import EngineSpec
from gfcr.core.policy import Policy
from gfcr.core.pipeline import Pipeline
from gfcr.core.services import Generator, Learner, Services
from gfcr.core.stage import TRAIN
from gfcr.core.storage import RunStore
from gfcr.launch.placement import Placement
from gfcr.launch.tokencheck import check_task
from gfcr.runner.commits import BackgroundCommits, pinned_history, recording
from gfcr.runner.inprocess import LocalGenerator, LocalLearner, LocalScorer
from gfcr.runner.runtime import Record, Runtime, Stash
from gfcr.transport.fleet import Fleet, for_run as fleet_for_run
from gfcr.transport.remote import scoring
from gfcr.transport.sharded import Setup, ShardedLearner



def build(pipeline: Pipeline, placement: Placement, run_id: str, root: Path, stash: Stash,
          store: RunStore, commits: BackgroundCommits,
          notify: Callable[[str], None]) -> tuple[Runtime, Policy]:
    """The run's runtime and the learner's policy: built once, kept for the whole run,
    with each service where ``placement`` (settled: gfcr.launch.placement) puts it."""
    policy = pipeline.policy.build(seed=pipeline.seed)
    check_task(pipeline.task, policy.tokenizer, policy.remedy)  # before any work, once
    learner = _learner(pipeline, policy, run_id, root)
    try:
        return _runtime(pipeline, placement, run_id, root, stash, store, commits, notify,
                        policy, learner), policy
    except BaseException:
        learner.close()  # a sharded learner's processes
        raise


def _runtime(pipeline: Pipeline, placement: Placement, run_id: str, root: Path,
             stash: Stash, store: RunStore, commits: BackgroundCommits,
             notify: Callable[[str], None], policy: Policy, learner: Learner) -> Runtime:
    if placement.generator is not None and policy.adapter is not None:
        raise ValueError(
            "train stage: lora is set and the run generates on a fleet of servers, which "
            "load whole published weights; a LoRA learner publishes its adapter alone "
            "(gfcr.weights.versions), which the servers do not load yet. Generate in-process "
            "(no fleet) or drop lora.")
    generator = _generator(pipeline, run_id, root, policy, learner, placement.generator,
                           notify)
    scorer = scoring.for_run(placement.scorer, pipeline, run_id, root, notify) or LocalScorer()
    snapshots: dict[int, int] = {}
    record = Record(commit=recording(store.commit_step, snapshots),
                    history_at=pinned_history(store, run_id, snapshots, commits),
                    background=commits)
    services = Services(generator=generator, learner=learner, scorer=scorer)
    return Runtime(pipeline=pipeline, task=pipeline.task, services=services, stash=stash,
                   record=record)


def _generator(pipeline: Pipeline, run_id: str, root: Path, policy: Policy, learner: Learner,
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


def _learner(pipeline: Pipeline, policy: Policy, run_id: str, root: Path) -> Learner:
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


def _local(pipeline: Pipeline, policy: Policy, *, background: bool,
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
