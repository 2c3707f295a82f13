"""Reading a final answer out of a reply."""

from __future__ import annotations

import re

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def final_number(text: str) -> str | None:
    """The last number in ``text`` (None: there is none)."""
    found = NUMBER.findall(text)
    return found[-1] if found else None


def same_number(reply: str, answer: str | None) -> bool:
    """Whether the reply's last number is the reference answer's."""
    if answer is None:
        return False
    got, want = final_number(reply), final_number(str(answer))
    return got is not None and want is not None and float(got) == float(want)
