"""Loading a pipeline by name or file: registered names, ``.yaml`` files, and ``.py``
files, which run with every invalid config collected (:mod:`gfcr.config.problems`) so that all
their problems are reported at once."""

from __future__ import annotations

import runpy
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from gfcr.config import problems as collect
from gfcr.config import yamlfile
from gfcr.core.pipeline import Pipeline, PipelineError


def load(ref: str) -> Pipeline:
    """A pipeline from a registered name (``gfcr.pipelines`` entry points), a ``.py``
    file that defines ``pipeline``, or a ``.yaml`` file."""
    path = Path(ref)
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise PipelineError([f"no such file: {ref}"], where=ref)
        try:
            text = yamlfile.read_text(path, where=ref)
        except yamlfile.YamlRefused as err:
            raise PipelineError([str(err)], where=ref) from None
        return Pipeline.from_yaml(text, where=ref)
    if path.suffix == ".py":
        if not path.is_file():
            raise PipelineError([f"no such file: {ref}"], where=ref)
        return _run_file(path, ref)
    named = {ep.name: ep for ep in entry_points(group="gfcr.pipelines")}
    if ref not in named:
        raise PipelineError([f"{ref!r} is neither a .py/.yaml file nor a known pipeline; "
                             f"known: {', '.join(sorted(named)) or 'none'}"], where=ref)
    obj = named[ref].load()
    return _from_module({"pipeline": obj}, ref)


def _run_file(path: Path, ref: str) -> Pipeline:
    """Run a pipeline file, collecting every invalid config in it (gfcr.config.problems)."""
    with collect.collecting(path) as found:
        try:
            pipeline = _from_module(runpy.run_path(str(path.resolve())), ref)
        except PipelineError:
            raise
        except Exception as err:  # the file itself failed: report it with what came before
            raise PipelineError(found.take() + [collect.located(err, str(path))],
                                where=ref) from None
        if found.problems:
            raise PipelineError(found.take(), where=ref)
    return pipeline


def _from_module(namespace: dict[str, Any], where: str) -> Pipeline:
    obj = namespace.get("pipeline")
    if callable(obj) and not isinstance(obj, Pipeline):
        obj = obj()
    if not isinstance(obj, Pipeline):
        found = type(obj).__name__ if obj is not None else "nothing"
        raise PipelineError([f"{where} must define `pipeline = Pipeline(...)` (or a "
                             f"function `pipeline()` returning one); found {found}"],
                            where=where)
    return obj

