"""Write the dataset the "Your own data" example trains on: examples/data/sums.jsonl.

    python examples/sums_data.py [OUT]

400 two-term sums and differences of numbers below 20 ("What is 7 + 12?"), one JSON
object a line with the columns a user's file would have: ``question``, ``answer``, an
``id`` and a ``difficulty`` (carried into the store's ``meta``). Deterministic: the file
in the repository is what this script writes.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

OUT = Path(__file__).parent / "data" / "sums.jsonl"


def records(n: int = 400, seed: int = 0) -> list[dict[str, object]]:
    """``n`` distinct problems drawn under ``seed``."""
    rng = random.Random(seed)
    seen: set[tuple[int, str, int]] = set()
    while len(seen) < n:
        a, b, op = rng.randrange(20), rng.randrange(20), rng.choice("+-")
        if op == "-" and b > a:
            a, b = b, a
        seen.add((a, op, b))
    out = []
    for i, (a, op, b) in enumerate(sorted(seen)):
        value = a + b if op == "+" else a - b
        out.append({"id": i, "question": f"What is {a} {op} {b}?", "answer": str(value),
                    "difficulty": "easy" if max(a, b) < 10 else "hard"})
    return out


def main(out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r) + "\n" for r in records()))
    print(f"wrote {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
