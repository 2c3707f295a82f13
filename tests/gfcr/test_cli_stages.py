"""``gfcr stages``: every registered type listed, every field described."""

from __future__ import annotations

import inspect
import typing
from pathlib import Path

from typer.testing import CliRunner

import gfcr
import stages
from gfcr.cli import app
from gfcr.commands.stages import kind_order, type_name
from gfcr.core.stage import Spec
from gfcr.core.registry import REGISTRY, load_plugins

runner = CliRunner()


def _configs() -> dict[str, type[Spec]]:
    """Every shipped registered class and every config class nested in one (Hints,
    Limits, ...)."""
    load_plugins()
    found: dict[str, type[Spec]] = {}

    def walk(cls: type[Spec]) -> None:
        if cls.__qualname__ in found:
            return
        found[cls.__qualname__] = cls
        for info in cls.model_fields.values():
            for t in (info.annotation, *typing.get_args(info.annotation)):
                if isinstance(t, type) and issubclass(t, Spec):
                    walk(t)
    for kind in kind_order():
        for cls in REGISTRY[kind].values():
            if _shipped(cls):
                walk(cls)
    return found


def _shipped(cls: type) -> bool:
    """Defined in the gfcr or stages packages (not by a test or a benchmark)."""
    path = Path(inspect.getfile(cls)).resolve()
    return any(path.is_relative_to(Path(pkg.__file__).parent) for pkg in (gfcr, stages))


def test_every_field_of_every_stage_has_a_description():
    configs = _configs()
    assert len(configs) > 25
    missing = [f"{name}.{field}" for name, cls in configs.items()
               for field, info in cls.model_fields.items()
               if field != "type" and not (info.description or "").strip()]
    assert not missing, f"fields without a description (add an attribute docstring): {missing}"


def test_stages_lists_every_type_with_kind_and_module():
    result = runner.invoke(app, ["stages"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    for kind in kind_order():
        for name, cls in REGISTRY[kind].items():
            row = next(line for line in lines if line.split()[:2] == [name, kind])
            assert cls.__module__ in row


def test_stages_type_prints_each_field():
    result = runner.invoke(app, ["stages", "group"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "group (generate, stages.generate.group.GroupSample)" in out
    n_row = next(line for line in out.splitlines() if line.startswith("n "))
    assert n_row.split()[1:3] == ["int", "8"] and "Samples per prompt" in n_row
    assert "tuple[str, ...]" in out
    bad = runner.invoke(app, ["stages", "no_such_stage"])
    assert bad.exit_code != 0 and "no stage or component type 'no_such_stage'" in bad.output


def test_type_names_are_readable():
    assert type_name(typing.Optional[int]) == "int | None"
    assert type_name(typing.Literal["a", "b"]) == "Literal['a', 'b']"
