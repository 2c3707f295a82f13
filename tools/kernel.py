"""How big the kernel is, and how near the house's limits (issue 31, item 5).

Usage: ``python tools/kernel.py [--strict]``. Prints

- the kernel's lines: every module of ``gfcr/core`` and ``gfcr/runner``, what a newcomer
  must hold (the contracts and the loop); target under :data:`KERNEL_LINES`;
- the modules of gfcr, stages and store within 10% of the 400-line cap
  (tools/sizes.py), at :data:`NEAR_CAP` lines or more; target none;
- the lines of gfcr that name ``Any`` (as ``grep -rwn Any gfcr --include=*.py`` counts
  them); target under :data:`ANY_LINES`;
- the class names defined more than once across gfcr, stages and store, with where;
  target none, so that each name means one thing.

The exit status is 1 with ``--strict`` when a figure misses its target.
"""

from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KERNEL = ("gfcr/core", "gfcr/runner")
PACKAGES = ("gfcr", "stages", "store")
KERNEL_LINES = 5000
NEAR_CAP = 360
ANY_LINES = 300
_ANY = re.compile(r"(?<![\w])Any(?![\w])")


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def kernel_lines() -> int:
    return sum(_lines(p) for d in KERNEL for p in (ROOT / d).rglob("*.py"))


def near_cap() -> list[tuple[str, int]]:
    found = [(p.relative_to(ROOT).as_posix(), _lines(p))
             for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]
    return [(name, n) for name, n in found if n >= NEAR_CAP]


def any_lines() -> dict[str, int]:
    """Per module of gfcr, the lines naming ``Any`` (word match, as grep -w)."""
    out = {}
    for p in sorted((ROOT / "gfcr").rglob("*.py")):
        n = sum(1 for line in p.read_text().splitlines() if _ANY.search(line))
        if n:
            out[p.relative_to(ROOT).as_posix()] = n
    return out


def duplicate_classes() -> dict[str, list[str]]:
    where: dict[str, list[str]] = defaultdict(list)
    for pkg in PACKAGES:
        for p in sorted((ROOT / pkg).rglob("*.py")):
            rel = p.relative_to(ROOT).as_posix()
            for node in ast.walk(ast.parse(p.read_text(), rel)):
                if isinstance(node, ast.ClassDef):
                    where[node.name].append(f"{rel}:{node.lineno}")
    return {name: at for name, at in sorted(where.items()) if len(at) > 1}


def main(argv: list[str]) -> int:
    kernel, near, anys, dups = kernel_lines(), near_cap(), any_lines(), duplicate_classes()
    any_total = sum(anys.values())
    print(f"kernel ({' + '.join(KERNEL)}): {kernel} lines (target under {KERNEL_LINES})")
    print(f"modules at {NEAR_CAP}+ lines: {len(near)} (target 0)")
    for name, n in near:
        print(f"  {n:4d} {name}")
    print(f"lines of gfcr naming Any: {any_total} (target under {ANY_LINES})")
    for name, n in sorted(anys.items(), key=lambda kv: -kv[1])[:10]:
        print(f"  {n:4d} {name}")
    print(f"class names defined more than once: {len(dups)} (target 0)")
    for name, at in dups.items():
        print(f"  {name}: {', '.join(at)}")
    missed = kernel >= KERNEL_LINES or near or any_total >= ANY_LINES or dups
    return 1 if "--strict" in argv and missed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
