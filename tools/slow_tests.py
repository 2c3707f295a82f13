"""The slow tests, from a timed run of the suite: writes ``tests/slow.txt``, which
``tests/conftest.py`` reads to mark those tests ``slow``, so ``pytest -m "not slow"`` is
the fast subset for development (CI still runs everything).

Usage: ``python -m pytest --durations=0 > LOG; python tools/slow_tests.py LOG``. A test is
slow when its setup, call and teardown took at least ``--seconds`` (default 4) together,
counted per test function (every parametrisation of a slow one is slow), or when it uses
a fixture that starts servers (``tests/conftest.py``'s ``SLOW_FIXTURES``, which conftest
marks by itself, whatever this list says). It prints what the fast subset should take.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINE = re.compile(r"^\s*([\d.]+)s (setup|call|teardown)\s+(\S+)")


def durations(log: str) -> dict[str, float]:
    """Seconds per test function (node id without its parameters) in a --durations log."""
    total: dict[str, float] = defaultdict(float)
    for line in log.splitlines():
        found = LINE.match(line)
        if found:
            total[found.group(3).split("[")[0]] += float(found.group(1))
    return dict(total)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path)
    parser.add_argument("--seconds", type=float, default=4.0)
    args = parser.parse_args()
    times = durations(args.log.read_text(errors="replace"))
    if not times:
        print(f"{args.log}: no --durations lines (run pytest with --durations=0)", file=sys.stderr)
        return 2
    slow = sorted(t for t, s in times.items() if s >= args.seconds)
    fast = sum(s for t, s in times.items() if s < args.seconds)
    header = (f"# tests slower than {args.seconds:g} s (setup + call + teardown) in a timed run;\n"
              f"# written by tools/slow_tests.py, read by tests/conftest.py (pytest -m 'not slow')\n")
    (ROOT / "tests" / "slow.txt").write_text(header + "".join(f"{t}\n" for t in slow))
    print(f"{len(slow)} slow of {len(times)} timed test functions; the rest took {fast:.0f} s "
          f"of {sum(times.values()):.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
