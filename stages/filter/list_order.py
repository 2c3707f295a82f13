"""Partial credit for list answers by how much of their order is right.

A sorting, ranking or reordering task whose answer is a list (reasoning-gym's
``number_sorting`` and ``word_sorting``, a ranking of candidates) scored exact-or-nothing
gives a group of samples a signal only when one of them is entirely right: on SmolLM2's
``smol-long`` after its warm start, 7 of 16 groups of 8 samples at temperature 1. Most
wrong answers there hold the right items in an almost-right order, so crediting the share
of item pairs in the right relative order (Kendall's tau, as agreement in [0, 1]) gives
12 of those 16 groups a signal, and the group's advantage points toward the better
orders. A shaped reward, not a potential-based one (Ng et al. 1999), so it can change
what is optimal only below full credit: the exact answer stays the only one worth 1.
Held-out accuracy is always the task's own scorer's.
"""

from __future__ import annotations

import json
import re
from functools import partial
from typing import Any, Callable, Literal

from pydantic import Field

from gfcr.core.stage import Spec, StepContext


class ListOrder(Spec):
    """1.0 for the reference list exactly; ``credit`` times the share of item pairs in the
    reference's relative order for the reference's items in another order; 0.0 for
    anything else (other items, a missing or extra one, text that is no list).

    A list is JSON (``['-49.0', '12.0']``, single quotes allowed) or comma-separated
    (``apple, banana``); items that read as numbers compare as numbers (``12`` is
    ``'12.0'``). The reference is the rollout's ``answer`` (a task without one: the
    ``answer`` key of its JSON ``meta``).

    >>> ListOrder().scorer(None)("['1', '3', '2']", "['1', '2', '3']", None)
    0.3333333333333333
    """

    type: Literal["list_order"] = "list_order"
    credit: float = Field(0.5, ge=0.0, lt=1.0)
    """The scale of a wrong order's reward: ``credit`` times the share of pairs in order,
    which is below 1 for any wrong order (every pair but one right: ``credit`` x (P-1)/P
    of P pairs); below 1 so the exact answer stays the only one worth full reward."""

    def scorer(self, ctx: StepContext | None) -> Callable[[str, Any, Any], float]:
        return partial(order_score, credit=self.credit)


def order_score(completion: str, answer: Any, meta: Any, *, credit: float = 0.5) -> float:
    """:class:`ListOrder`'s reward for one completion (see there)."""
    reference = _reference(answer, meta)
    got, want = parse_list(completion), parse_list(reference)
    if want is None:
        raise ValueError(f"list_order: the reference {reference!r} is not a list")
    if got is None or sorted(got, key=repr) != sorted(want, key=repr):
        return 0.0
    return 1.0 if got == want else credit * pair_agreement(got, want)


def _reference(answer: Any, meta: Any) -> str:
    if answer is not None:
        return answer if isinstance(answer, str) else json.dumps(answer)
    entry = json.loads(meta) if isinstance(meta, str) and meta else (meta or {})
    if not isinstance(entry, dict) or entry.get("answer") is None:
        raise ValueError("list_order: the rollout has no reference answer (answer or "
                         "meta['answer'])")
    return _reference(entry["answer"], None)


def parse_list(text: str) -> list[Any] | None:
    """``text`` as a list of items (numbers as floats), or None when it is no list."""
    text = text.strip()
    if text.startswith("["):
        try:
            items = json.loads(text.replace("'", '"'))
        except json.JSONDecodeError:
            return None
        return [_item(x) for x in items] if isinstance(items, list) else None
    if "," not in text:
        return None
    return [_item(x) for x in re.split(r",\s*", text)]


def _item(value: Any) -> Any:
    if isinstance(value, (int, float)):
        return float(value)
    text = str(value).strip()
    try:
        return float(text)
    except ValueError:
        return text


def pair_agreement(got: list[Any], want: list[Any]) -> float:
    """The share of item pairs of ``got`` (a permutation of ``want``) in ``want``'s
    relative order; repeated items are matched in order of appearance."""
    slots: dict[str, list[int]] = {}
    for i, item in enumerate(want):
        slots.setdefault(repr(item), []).append(i)
    ranks = [slots[repr(item)].pop(0) for item in got]
    pairs = [(a, b) for i, a in enumerate(ranks) for b in ranks[i + 1:]]
    return sum(a < b for a, b in pairs) / len(pairs) if pairs else 1.0
