"""Print the import graph of gfcr, store and stages, and fail on a cycle.

Usage: ``python tools/imports.py [--modules] [--strict]``. Every import counts:
top-level ones, lazy ones inside functions, and those under ``TYPE_CHECKING``, since each
is a dependency a reader has to follow. So does a string that names a module of the
project (``"stages.train.fsdp_rank"``, ``"pkg.module.Class"``, ``"pkg.module:function"``):
a module run by name (``python -m``) or imported by another program (vLLM's
``--worker-extension-cls``) is a dependency the import statements do not show. The graph is printed between packages (each
``gfcr.<subpackage>`` or top-level module of gfcr, ``store``, each ``stages.<kind>`` and
the shared ``stages.<module>``), or between modules with ``--modules``. Cycles are
searched among modules (Tarjan's strongly connected components) and among packages, and
listed. The exit status is 1 on a module cycle, and
with ``--strict`` on a package cycle too. CI runs it (.ci/run).
"""

from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("gfcr", "store", "stages")
_DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+(:[A-Za-z_]\w*)?")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path, modules: set[str]) -> set[str]:
    """The project modules ``path`` imports, wherever the import statement stands."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            targets = named_module(node.value, modules)
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def named_module(text: str, modules: set[str]) -> list[str]:
    """The project module a string names, whole: ``"a.b"`` (a module), ``"a.b.Name"``
    or ``"a.b:name"`` (a module's attribute; not of a top-level package, so the entry
    point group ``"gfcr.store"`` is no edge); [] for anything else (prose, a path)."""
    if not _DOTTED.fullmatch(text):
        return []
    module = text.partition(":")[0]
    if module in modules:
        return [module]
    parent = module.rpartition(".")[0]
    return [parent] if parent in modules and "." in parent and ":" not in text else []


def graph() -> dict[str, set[str]]:
    files = [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]
    modules = {module_name(p) for p in files}
    edges = {module_name(p): imports(p, modules) for p in files}
    # a package's __init__ re-exporting its modules is not a dependency of those modules
    for name in edges:
        edges[name] = {t for t in edges[name] if not name.startswith(t + ".")}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def group(name: str) -> str:
    parts = name.split(".")
    if parts[0] in ("stages", "gfcr") and len(parts) > 1:
        return ".".join(parts[:2])
    return parts[0]


def main(argv: list[str]) -> int:
    edges = graph()
    by = (lambda n: n) if "--modules" in argv else group
    coarse: dict[str, set[str]] = defaultdict(set)
    for source, targets in edges.items():
        coarse[by(source)] |= {by(t) for t in targets if by(t) != by(source)}
    for source in sorted(coarse):
        print(f"{source} -> {', '.join(sorted(coarse[source])) or '(nothing)'}")
    found = cycles(edges)
    layered = [c for c in cycles(dict(coarse)) if by is group]
    for component in found:
        print(f"CYCLE: {' <-> '.join(component)}")
    for component in layered:
        print(f"package cycle: {' <-> '.join(component)} (modules: {_witness(edges, component)})")
    print(f"{len(edges)} modules, {sum(map(len, edges.values()))} imports, "
          f"{len(found)} module cycle(s), {len(layered)} package cycle(s)")
    return 1 if found or ("--strict" in argv and layered) else 0


def _witness(edges: dict[str, set[str]], packages: list[str]) -> str:
    """The module imports that make a package cycle, e.g. ``gfcr.cli -> store``."""
    inside = set(packages)
    hits = sorted(f"{s} -> {t}" for s, ts in edges.items() for t in ts
                  if group(s) in inside and group(t) in inside and group(s) != group(t))
    return ", ".join(hits[:12]) + (", ..." if len(hits) > 12 else "")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
