"""Where a run's three services run: one typed :class:`Placement`, resolved once at launch.

A run has a generator, a learner and a scorer (gfcr.core.services). Each runs in the
run's own process unless its placement says otherwise:

- ``generator``: a fleet of vLLM servers by URL (:class:`gfcr.transport.fleet.Fleet`,
  started with ``gfcr engine serve``); None: the pipeline's engine in this process;
- ``learner``: sharded with FSDP2 over ``ranks`` processes on this host
  (:class:`gfcr.core.settings.LearnerPlacement`, gfcr.transport.sharded); ``ranks=0``:
  in this process;
- ``scorer``: the scoring filter stages on a score pool's workers
  (:class:`gfcr.transport.remote.pool.WorkerPool`, ``gfcr engine-worker``); None: here.

(The run's own process is placed by Prefect: ``gfcr deploy --pool`` puts the flow on a
work pool's workers, gfcr.launch.deploy.)

A placement can be given from four sources:

1. the pipeline: its ``learner`` field (``--set learner.ranks=2`` included);
2. a placement file: ``gfcr run --placement FILE``, YAML with the fields of
   :class:`Placement`;
3. ``gfcr run``'s flags: ``--fleet URL``, ``--score-pool POOL``, ``--generate-timeout S``
   (the deadline of the fleet's requests and of the pool's calls, wherever those come
   from);
4. Python: ``execute(pipeline, placement=Placement(...))`` or ``RunRequest.placement``.

**Precedence: a setting takes the value of the one source that gives it, and its
default when none does; no source outranks another.** Two sources that give one
setting (``generator.urls``, ``learner.ranks``, ``scorer.timeout_s``...) different
values are refused before the run starts, with :class:`PlacementConflict` naming both
sources and both values; giving the same value twice is fine. :func:`settle` applies
the rule once, and the run's pipeline then carries the settled ``learner`` (it is part
of the spec, so a resume is checked against it).

>>> from gfcr.transport.fleet import Fleet
>>> settled = merge([("the flags", {"generator": {"urls": ("http://gpu-a:8000",)}}),
...                  ("FILE", {"generator": {"timeout_s": 30.0}})])
>>> settled.generator.urls, settled.generator.timeout_s, settled.scorer
(('http://gpu-a:8000',), 30.0, None)
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

from pydantic import BaseModel, ConfigDict, ValidationError

from gfcr.config import yamlfile
from gfcr.core.pipeline import Pipeline
from gfcr.config.problems import format_errors
from gfcr.core.settings import LearnerPlacement
from gfcr.transport.fleet import Fleet
from gfcr.transport.remote.pool import WorkerPool

PARTS = ("generator", "learner", "scorer")
"""The services a placement places, in the order its problems are reported."""

Fields = Mapping[str, object]
"""What a source says of one part: the fields it sets (None for a part it sets to
"this process")."""
Source = tuple[str, Mapping[str, Fields | None]]
"""A source of placement: what it is called in errors, and what it sets by part."""

REMOVED = ("the engine-worker generate path (--generate-pool, generate_pool=POOL) was removed "
           "(issue 24): generation leaves a run's process only on a fleet of vLLM servers. "
           "Start them with `gfcr engine serve --model DIR` and name them with "
           "`gfcr run --fleet URL` (in Python: execute(..., placement=Placement(generator="
           "Fleet(urls=(URL, ...)))), gfcr.launch.placement); scoring pools (--score-pool) "
           "are unchanged")


class GeneratePoolRemoved(ValueError):
    """A run asked to generate on a pool of engine workers, a path that no longer
    exists; the message names the fleet that replaces it."""

    def __init__(self, pool: object) -> None:
        super().__init__(f"generate pool {pool!r}: {REMOVED}")


class PlacementConflict(ValueError):
    """Two sources of placement give one setting different values (see the module)."""


class Placement(BaseModel):
    """Where the run's generator, learner and scorer run (see the module for the sources
    and their one precedence rule). The default places all three in this process."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    generator: Fleet | None = None
    """A fleet of vLLM servers; None: the pipeline's engine in this process."""
    learner: LearnerPlacement = LearnerPlacement()
    """Sharded over ranks, or (``ranks=0``) in this process."""
    scorer: WorkerPool | None = None
    """A score pool's workers; None: this process."""


def explicit(placement: Placement) -> dict[str, Fields | None]:
    """What ``placement`` sets, part by part: the fields given when it was built."""
    out: dict[str, Fields | None] = {}
    for part in PARTS:
        value = getattr(placement, part)
        if part in placement.model_fields_set:
            out[part] = None if value is None else {f: getattr(value, f)
                                                    for f in value.model_fields_set}
    return out


def of_pipeline(pipeline: Pipeline) -> Source:
    """The pipeline as a source: the fields of its ``learner`` that differ from the
    default (a spec stores them all)."""
    default = LearnerPlacement()
    given = {f: getattr(pipeline.learner, f) for f in LearnerPlacement.model_fields
             if getattr(pipeline.learner, f) != getattr(default, f)}
    return ("the pipeline (its learner field)", {"learner": given} if given else {})


def of_file(path: str | Path) -> Source:
    """A placement file as a source (YAML, read bounded); PlacementError naming the file
    when it is not a placement."""
    where = f"placement file {str(path)!r}"
    try:
        data = yamlfile.read(path, where=where)
        placement = Placement.model_validate({} if data is None else data)
    except (OSError, yamlfile.YamlRefused) as err:
        raise PlacementError(f"{where}: {err}") from None
    except ValidationError as err:
        raise PlacementError(f"{where}: " + "; ".join(format_errors(err))) from None
    return (where, explicit(placement))


def of_flags(fleet: Sequence[str], score_pool: str | None, timeout_s: float | None,
             file: Source | None = None) -> Source:
    """``gfcr run``'s flags as a source. ``--generate-timeout`` sets the deadline of the
    fleet and of the pool that a flag or the placement ``file`` names."""
    parts: dict[str, Fields | None] = {}
    named = dict(file[1]) if file is not None else {}
    if fleet:
        parts["generator"] = {"urls": tuple(fleet)}
    if score_pool is not None:
        parts["scorer"] = {"pool": score_pool}
    if timeout_s is not None:
        for part in ("generator", "scorer"):
            if part in parts or named.get(part):
                parts[part] = {**(parts.get(part) or {}), "timeout_s": timeout_s}
    return ("gfcr run's flags (--fleet, --score-pool, --generate-timeout)", parts)


class PlacementError(ValueError):
    """A placement source that is not one (a bad file, a bad value); names the source."""


def merge(sources: Sequence[Source]) -> Placement:
    """The one placement ``sources`` give together (the module's rule); PlacementConflict
    naming both sources when two disagree, PlacementError when the result is invalid."""
    data: dict[str, Fields | None] = {}
    for part in PARTS:
        given = [(name, parts[part]) for name, parts in sources if part in parts]
        if given:
            data[part] = _part(part, given)
    try:
        return Placement.model_validate(data)
    except ValidationError as err:
        named = ", ".join(name for name, parts in sources if parts) or "no source"
        raise PlacementError(f"placement from {named}: " + "; ".join(
            format_errors(err))) from None


def _part(part: str, given: list[tuple[str, Fields | None]]) -> Fields | None:
    """One part's fields from the sources that give it; a conflict is refused."""
    here = [name for name, fields in given if fields is None]
    away = [(name, fields) for name, fields in given if fields is not None]
    if here and away:
        raise PlacementConflict(
            f"placement: {part} is in this process by {here[0]} and elsewhere by "
            f"{away[0][0]} ({dict(away[0][1])!r}); give it in one place")
    if here:
        return None
    out: dict[str, object] = {}
    by: dict[str, str] = {}
    for name, fields in away:
        for key, value in (fields or {}).items():
            if key in out and out[key] != value:
                raise PlacementConflict(
                    f"placement: {part}.{key} is {out[key]!r} by {by[key]} and {value!r} "
                    f"by {name}; give it in one place (no source outranks another)")
            out[key], by[key] = value, name
    return out


def settle(pipeline: Pipeline, sources: Sequence[Source]) -> tuple[Pipeline, Placement]:
    """The run's placement from the pipeline and ``sources``, and the pipeline carrying
    its settled learner: the one place the module's rule is applied."""
    placement = merge([of_pipeline(pipeline), *sources])
    if placement.learner != pipeline.learner:
        pipeline = pipeline.model_copy(update={"learner": placement.learner})
    return pipeline, placement


def refuse_generate_pool(generate_pool: object) -> None:
    """``execute(generate_pool=...)`` and a request's ``generate_pool``: refused, naming
    the fleet that replaced the engine-worker generate path."""
    if generate_pool is not None:
        raise GeneratePoolRemoved(generate_pool)
