"""What ``gfcr envs`` lists beyond the registered environments: TextArena's games and
the installed verifiers environments.

Verifiers environments are found without importing them (importing one loads verifiers,
datasets and their dependencies): an installed distribution that requires ``verifiers``
and has a top-level module whose source defines ``load_environment`` is one
(Prime Intellect's convention: ``load_environment(**kwargs) -> vf.Environment``). They
run through ``VerifiersEnv(module=...)``.
"""

from __future__ import annotations

import re
from importlib.metadata import Distribution, distributions
from pathlib import Path

from gfcr.core.environment import EnvEntry, register_catalogue
from stages.envs import arena

NEEDS_VERIFIERS = re.compile(r"^verifiers\b(?![-_.\w])", re.IGNORECASE)
DEFINES = re.compile(r"^\s*(?:async\s+)?def\s+load_environment\s*\(", re.MULTILINE)


def textarena_games() -> list[EnvEntry]:
    """Every TextArena game id; one entry naming the install command without it."""
    try:
        ids = arena.games()
    except ValueError as err:
        return [EnvEntry("textarena", "(not installed)", "", str(err))]
    return [EnvEntry("textarena", i, f'TextArenaEnv(game="{i}")', "TextArena game")
            for i in ids]


def verifiers_envs() -> list[EnvEntry]:
    """Installed distributions requiring verifiers whose module defines load_environment."""
    out = []
    for dist in distributions():
        name = dist.metadata["Name"] or ""
        if name.lower() == "verifiers" or not any(
                NEEDS_VERIFIERS.match(r) for r in dist.requires or []):
            continue
        for module in _modules(dist):
            source = _source(dist, module)
            if source is not None and DEFINES.search(source):
                summary = (dist.metadata["Summary"] or "").strip()
                out.append(EnvEntry("verifiers", module, f'VerifiersEnv(module="{module}")',
                                    f"{name} {dist.version}" + (f": {summary}" if summary
                                                                 else "")))
    return sorted(out, key=lambda e: e.name)


def _modules(dist: Distribution) -> list[str]:
    """The distribution's top-level modules (top_level.txt, else its files)."""
    listed = dist.read_text("top_level.txt")
    if listed:
        return sorted({m.strip() for m in listed.splitlines() if m.strip()})
    found = set()
    for f in dist.files or []:
        parts = Path(str(f)).parts
        if len(parts) == 1 and parts[0].endswith(".py"):
            found.add(parts[0][:-3])
        elif len(parts) == 2 and parts[1] == "__init__.py":
            found.add(parts[0])
    return sorted(found)


def _source(dist: Distribution, module: str) -> str | None:
    for rel in (f"{module}.py", f"{module}/__init__.py"):
        path = Path(str(dist.locate_file(rel)))
        if path.is_file():
            try:
                return path.read_text(errors="replace")[:1_000_000]
            except OSError:
                return None
    return None


register_catalogue("textarena", textarena_games)
register_catalogue("verifiers", verifiers_envs)
