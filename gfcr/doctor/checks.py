"""The doctor's checks: each judges a run's :class:`~gfcr.doctor.facts.Facts` against
thresholds and returns findings with the evidence (figures and step range) and what to try.

The pathologies are those the GFCR survey's diagnostic index names (../shared/METHODS.md,
"Diagnostic index"): groups without signal (DAPO's dynamic sampling motivation), entropy
and length collapse, reward hacking through partial credit, mode collapse, off-policy
drift and truncated importance sampling (decoupled PPO), verifier failures, prompts a
curriculum never reaches, and updates too large for the trust region (PPO, Schulman et
al. 2017). Trends compare the first and the last third of the run's steps.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Literal

from gfcr.doctor.facts import Facts
from gfcr.report.rows import Row

Severity = Literal["serious", "warning", "info"]


@dataclass(frozen=True)
class Finding:
    """One diagnosis: what, how bad, the figures behind it, and what to try."""

    check: str
    severity: Severity
    title: str
    evidence: str
    threshold: str
    advice: str
    steps: tuple[int, int]
    figures: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> Row:
        return asdict(self)


def _window(steps: Sequence[int], values: Sequence[float], part: str) -> tuple[float, tuple[int, int]]:
    """Mean of the finite values in the first or last third (at least one step) of the run,
    and that window's step range."""
    n = len(steps)
    k = max(1, n // 3)
    idx = range(0, k) if part == "first" else range(n - k, n) if part == "last" else range(n)
    finite = [values[i] for i in idx if math.isfinite(values[i])]
    return (sum(finite) / len(finite) if finite else math.nan), (steps[idx[0]], steps[idx[-1]])


def _pct(v: float) -> str:
    return f"{v:.0%}" if math.isfinite(v) else "n/a"


def _span(s: tuple[int, int]) -> str:
    return f"step {s[0]}" if s[0] == s[1] else f"steps {s[0]}-{s[1]}"


def signal_starvation(f: Facts) -> list[Finding]:
    steps = f.run.steps
    zero, span = _window(steps, f.group.get("zero_variance", []) or [math.nan] * len(steps), "last")
    kept, _ = _window(steps, f.run.get("store/kept_share"), "last")
    if (math.isfinite(zero) and zero >= 0.9) or (math.isfinite(kept) and kept <= 0.05):
        severity: Severity = "serious"
    elif (math.isfinite(zero) and zero >= 0.6) or (math.isfinite(kept) and kept <= 0.25):
        severity = "warning"
    else:
        return []
    return [Finding(
        "signal_starvation", severity, "most groups carry no learning signal",
        f"zero-variance groups {_pct(zero)}, kept share {_pct(kept)} over {_span(span)}",
        "serious: zero-variance >= 90% or kept <= 5%; warning: >= 60% or <= 25% (last third)",
        "all samples of a group score alike, so GRPO's advantages are 0: raise the group size, "
        "draw prompts of middling pass rate (prompt_gdro, vade, a curriculum sampler), add hints "
        "(hints pipeline), refill dropped groups (DynamicSampling refill, dapo), or check the "
        "filters' drop reasons", span, {"zero_variance_share": zero, "kept_share": kept})]


def _entropy(f: Facts) -> tuple[str, list[float]]:
    if f.run.has("train/entropy"):
        return "learner entropy", f.run.get("train/entropy")
    return "sampled-token NLL (entropy estimate)", f.run.get("store/sampled_nll")


def entropy_collapse(f: Facts) -> list[Finding]:
    name, series = _entropy(f)
    first, s0 = _window(f.run.steps, series, "first")
    last, s1 = _window(f.run.steps, series, "last")
    if not (math.isfinite(first) and math.isfinite(last)) or first <= 0 or len(f.run.steps) < 3:
        return []
    ratio = last / first
    if ratio < 0.2 and last < 0.5:
        severity: Severity = "serious"
    elif ratio < 0.4:
        severity = "warning"
    else:
        return []
    return [Finding(
        "entropy_collapse", severity, "the policy's entropy collapsed",
        f"{name} {first:.3f} nats/token over {_span(s0)} -> {last:.3f} over {_span(s1)} "
        f"({ratio:.0%} of its start)",
        "serious: last third < 20% of the first and < 0.5 nats; warning: < 40%",
        "exploration is gone: add an entropy bonus (GRPO entropy_coef), clip-higher "
        "(clip_high=0.28, DAPO), lower the learning rate, or raise the sampling temperature",
        (s0[0], s1[1]), {"entropy_first": first, "entropy_last": last})]


def length(f: Facts) -> list[Finding]:
    steps, out = f.run.steps, []
    l0, s0 = _window(steps, f.run.get("store/length_mean"), "first")
    l1, s1 = _window(steps, f.run.get("store/length_mean"), "last")
    if math.isfinite(l0) and math.isfinite(l1) and l0 >= 3 and l1 < 0.5 * l0:
        out.append(Finding(
            "length_collapse", "serious" if l1 < 0.3 * l0 else "warning", "completions got much shorter",
            f"mean completion length {l0:.1f} tokens over {_span(s0)} -> {l1:.1f} over {_span(s1)}",
            "serious: last third < 30% of the first third's mean length; warning: < 50%",
            "a reward or filter that pays for brevity (or an overlong penalty too strong): check "
            "the reward's components per length, the overlong filter's settings, and the "
            "aggregation (seq_mean favours short answers; token_mean does not)",
            (s0[0], s1[1]), {"length_first": l0, "length_last": l1}))
    t0, _ = _window(steps, f.run.get("store/truncated_share"), "first")
    t1, _ = _window(steps, f.run.get("store/truncated_share"), "last")
    if math.isfinite(t1) and t1 >= 0.5:
        runaway = math.isfinite(t0) and t1 - t0 >= 0.2
        out.append(Finding(
            "truncation", "serious" if runaway else "warning",
            "truncation is running away" if runaway else "most completions hit max_tokens",
            f"share of completions cut at max_tokens {_pct(t0)} over {_span(s0)} -> {_pct(t1)} "
            f"over {_span(s1)}",
            "serious: >= 50% in the last third and up >= 20 points; warning: >= 50%",
            "truncated completions are scored unfinished: raise max_tokens, add an overlong "
            "penalty (OverlongFilter, dapo), or continue them as partial rollouts (april)",
            (s0[0], s1[1]), {"truncated_first": t0, "truncated_last": t1}))
    return out


def reward_vs_heldout(f: Facts) -> list[Finding]:
    # from the start of RL: an evaluation before the warm start would credit RL with its gain
    acc = [a for a in f.run.accuracy if a[2] != "initial"]
    r0, s0 = _window(f.run.steps, f.run.get("store/sampled_reward"), "first")
    r1, s1 = _window(f.run.steps, f.run.get("store/sampled_reward"), "last")
    if len(acc) < 2 or not (math.isfinite(r0) and math.isfinite(r1)) or r1 - r0 < 0.1:
        return []
    gain = acc[-1][1] - acc[0][1]
    if gain >= 0.02:
        return []
    severity: Severity = "serious" if r1 - r0 >= 0.2 or gain <= -0.05 else "warning"
    return [Finding(
        "reward_vs_heldout", severity, "reward rises while held-out accuracy does not",
        f"sampled reward {r0:.3f} ({_span(s0)}) -> {r1:.3f} ({_span(s1)}); held-out accuracy "
        f"{acc[0][1]:.1%} at step {acc[0][0]} -> {acc[-1][1]:.1%} at step {acc[-1][0]}",
        "reward up >= 0.1 with held-out up < 2 points; serious when reward is up >= 0.2 or "
        "held-out down >= 5 points",
        "the policy learns the reward, not the task: look for exploitable partial credit or "
        "format rewards, compare rewards' components with correctness, or evaluate on more prompts",
        (acc[0][0], acc[-1][0]), {"reward_gain": r1 - r0, "heldout_gain": gain})]


def partial_credit(f: Facts) -> list[Finding]:
    mass, span = _window(f.run.steps, f.partial.get("wrong_reward_mass", []) or [math.nan] * len(f.run.steps), "last")
    share, _ = _window(f.run.steps, f.partial.get("rewarded_wrong", []) or [math.nan] * len(f.run.steps), "last")
    if not (math.isfinite(mass) and mass >= 0.5 and share >= 0.3):
        return []
    sampled = max(int(f.prompts.get("sampled") or 0), 1)
    top = f.repeated_wrong[0] if f.repeated_wrong else None
    reach = (top["prompts"] / sampled) if top else 0.0
    severity: Severity = "serious" if top and top["prompts"] >= 3 and reach >= 0.25 else "warning"
    example = (f"; {top['completion']!r} was paid {top['reward']:.2f} on {top['prompts']} prompts "
               f"({reach:.0%} of those sampled) while wrong") if top else ""
    return [Finding(
        "partial_credit", severity, "wrong answers earn most of the reward",
        f"rows with 0 < reward < 1: {_pct(share)}, holding {_pct(mass)} of the positive reward "
        f"over {_span(span)}{example}",
        "warning: >= 50% of positive reward on wrong rows and >= 30% of rows; serious: one "
        "completion paid on >= 25% of sampled prompts",
        "partial credit the policy can farm: make the reward pay for correctness (Verify with the "
        "task's scorer), cap the partial components, or give them a separate advantage (GDPO)",
        span, {"wrong_reward_mass": mass, "rewarded_wrong_share": share, "top_reach": reach})]


def mode_collapse(f: Facts) -> list[Finding]:
    empty = [math.nan] * len(f.run.steps)
    wrong, span = _window(f.run.steps, f.group.get("identical_wrong", []) or empty, "last")
    dup, _ = _window(f.run.steps, f.group.get("duplicate", []) or empty, "last")
    dup0, s0 = _window(f.run.steps, f.group.get("duplicate", []) or empty, "first")
    if math.isfinite(wrong) and wrong >= 0.3:
        severity: Severity = "serious"
    elif math.isfinite(dup) and dup >= 0.8 and dup - dup0 >= 0.3:
        severity = "warning"
    else:
        return []
    return [Finding(
        "mode_collapse", severity, "groups repeat one completion",
        f"duplicate share within groups {_pct(dup0)} ({_span(s0)}) -> {_pct(dup)} ({_span(span)}); "
        f"groups of one identical wrong completion: {_pct(wrong)}",
        "serious: >= 30% of groups one identical wrong completion (last third); warning: "
        "duplicates >= 80% and up >= 30 points",
        "sampling has collapsed onto one output: raise temperature, use diverse generation "
        "(tree rollouts: latr; hints), an entropy bonus, or a lower learning rate",
        (s0[0], span[1]), {"duplicate_first": dup0, "duplicate_last": dup, "identical_wrong": wrong})]


CHECKS: tuple[Callable[[Facts], list[Finding]], ...] = (
    signal_starvation, entropy_collapse, length, reward_vs_heldout, partial_credit, mode_collapse)
"""Checks of this module; :mod:`gfcr.doctor.checks_more` adds the rest."""
