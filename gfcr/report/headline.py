"""The report's headline: the numbers a reader looks at first (also the Prefect artifact's
and the run page of ``gfcr ui``).

Held-out accuracy is credited phase by phase: the warm start's share (from the evaluation
before it, labelled ``initial``, to the one after it, ``step=0``) and GRPO's (from
``step=0`` to the last), so the RL steps are not credited with the warm start's gain. The
sampled reward's first-vs-last compares the means of the first and last fifth of the
steps (at least one step, at most :data:`SMOOTH_MAX`), not two single noisy steps.
Multi-turn runs get the policy's own tokens per turn, policy turns per episode and success
by the number of turns (the ``turn_figures`` run view), rather than a completion length
that counts the environment's and tools' text; runs with tools, their tool-call and
tool-error rates and success from the first step to the last (``tool/*`` metrics).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gfcr.report.data import RunData
from gfcr.report.rows import Row

SMOOTH_MAX = 10
"""The most steps averaged at either end of the sampled-reward comparison."""


def headline(run: RunData) -> Row:
    """The headline numbers of ``run``, by name."""
    out: Row = {
        "status": run.run["status"], "steps": len(run.steps),
        "rollouts": int(sum(v for v in run.get("store/rows") if math.isfinite(v))),
    }
    out.update(shares(run.accuracy))
    reward = run.get("store/sampled_reward")
    k = ends(len(run.steps))
    out[f"sampled reward (mean of first → last {k} step{'s' if k > 1 else ''})"] = (
        f"{_mean(reward[:k]):.3f} → {_mean(reward[-k:]):.3f}")
    out["sampled pass rate (last step)"] = _pct(_last(run.get("store/sampled_pass_rate")))
    out["kept share (mean)"] = _pct(_mean(run.get("store/kept_share")))
    turns = run.turn_figures
    if any(r["policy_turns"] > 1 for r in turns):
        out.update(multi_turn(turns))
    else:
        out["completion length (mean, last step)"] = f"{_last(run.get('store/length_mean')):.1f} tokens"
    if run.has("tool/call_rate"):
        out.update(tool_use(run))
    return out


def ends(n: int) -> int:
    """Steps averaged at either end of a run of ``n`` steps: a fifth, 1 to SMOOTH_MAX."""
    return max(1, min(SMOOTH_MAX, n // 5))


def shares(accuracy: Sequence[tuple[int, float, str]]) -> dict[str, str]:
    """Held-out accuracy before and after, and each phase's share of the change."""
    if not accuracy:
        return {"held-out accuracy": "–"}
    by = {label: a for _, a, label in accuracy}
    first, last = accuracy[0][1], accuracy[-1][1]
    out = {"held-out accuracy": f"{first:.1%} → {last:.1%}" if len(accuracy) > 1 else f"{first:.1%}"}
    start = by.get("step=0")
    if "initial" in by and start is not None:
        out["warm start's share"] = _share(by["initial"], start)
    if start is not None and len(accuracy) > 1 and accuracy[-1][2] != "step=0":
        key = "GRPO's share (after the warm start)" if "initial" in by else "GRPO's share"
        out[key] = _share(start, last)
    return out


def _share(before: float, after: float) -> str:
    return f"{before:.1%} → {after:.1%} ({100 * (after - before):+.1f} points)"


def multi_turn(rows: Sequence[Row]) -> dict[str, str]:
    """Policy tokens per policy turn, policy turns per episode, success by turns."""
    episodes = sum(r["episodes"] for r in rows)
    turns = sum(r["policy_turns"] * r["episodes"] for r in rows)
    tokens = sum(r["policy_tokens"] or 0 for r in rows)
    by_turns = ", ".join(f"{r['policy_turns']}: {_pct(r['success'] if r['success'] is not None else math.nan)}"
                         f" of {r['episodes']}" for r in rows)
    return {"policy tokens per turn (mean)": f"{tokens / turns:.1f}" if turns else "–",
            "policy turns per episode (mean)": f"{turns / episodes:.2f}" if episodes else "–",
            "success by policy turns": by_turns or "–"}


def tool_use(run: RunData) -> dict[str, str]:
    """Tool-call rate, tool-error rate and success, first step -> last step
    (gfcr.runner.tool_metrics)."""
    def change(name: str) -> str:
        values = [v for v in run.get(name) if math.isfinite(v)]
        return f"{_pct(values[0])} → {_pct(values[-1])}" if values else "–"

    return {"tool-call rate (first → last step)": change("tool/call_rate"),
            "tool-error rate (first → last step)": change("tool/error_rate"),
            "episode success (first → last step)": change("tool/success")}


def _last(values: Sequence[float]) -> float:
    return next((v for v in reversed(values) if math.isfinite(v)), math.nan)


def _mean(values: Sequence[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else math.nan


def _pct(v: float) -> str:
    return "–" if not math.isfinite(v) else f"{v:.1%}"
