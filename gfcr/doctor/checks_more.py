"""The doctor's checks on off-policy data, the verifier, prompt coverage and step size."""

from __future__ import annotations

import math
from collections.abc import Callable

from gfcr.doctor.checks import Finding, Severity, _pct, _span, _window
from gfcr.doctor.facts import Facts


def off_policy(f: Facts) -> list[Finding]:
    steps, out = f.run.steps, []
    name = "train/offpolicy_share" if f.run.has("train/offpolicy_share") else "store/offpolicy_row_share"
    share, span = _window(steps, f.run.get(name), "all")
    stale = max((v for v in f.run.get("store/staleness_max") if math.isfinite(v)), default=0.0)
    if math.isfinite(share) and (share > 0.5 or stale > 8):
        out.append(Finding(
            "off_policy", "serious" if share > 0.9 else "warning", "much of the batch is off-policy",
            f"off-policy share of trained rows {_pct(share)} (mean over {_span(span)}), "
            f"staleness up to {stale:.0f} policy versions",
            "warning: off-policy share > 50% or staleness > 8 versions; serious: > 90%",
            "stale rows bias the update: cap staleness (max_staleness), replay less (rollout "
            "replay's share), or correct with decoupled PPO and truncated IS (GRPO tis_cap)",
            span, {"offpolicy_share": share, "staleness_max": stale}))
    tis, span = _window(steps, f.run.get("train/is_truncated_share"), "all")
    if math.isfinite(tis) and tis > 0.1:
        out.append(Finding(
            "truncated_is", "serious" if tis > 0.3 else "warning",
            "importance weights are truncated often",
            f"share of off-policy tokens whose IS weight hit tis_cap: {_pct(tis)} (mean over {_span(span)})",
            "warning: > 10%; serious: > 30%",
            "the behaviour policy is far from the current one, so truncated IS biases the "
            "gradient: use fresher rows, a lower learning rate, or a larger tis_cap",
            span, {"is_truncated_share": tis}))
    return out


def score_errors(f: Facts) -> list[Finding]:
    steps, out = f.run.steps, []
    for key, title, what in (("store/score_error_share", "the verifier raises errors", "score_errors"),
                             ("store/score_timeout_share", "the verifier times out", "score_timeouts")):
        share, span = _window(steps, f.run.get(key), "all")
        if not (math.isfinite(share) and share >= 0.01):
            continue
        common = "; ".join(f"{e['error'][:80]!r} x{e['n']}" for e in f.errors
                           if (what == "score_timeouts") == ("timeout" in e["error"].lower()))
        out.append(Finding(
            what, "serious" if share >= 0.2 else "warning", title,
            f"{_pct(share)} of rows over {_span(span)}" + (f"; commonest: {common}" if common else ""),
            "warning: >= 1% of rows; serious: >= 20%",
            "rows with score errors are dropped (or scored 0): fix the scorer for these "
            "completions (the errors are in rollouts.score_error), or raise Verify's timeout",
            span, {"share": share}))
    return out


def prompts(f: Facts) -> list[Finding]:
    p, out, span = f.prompts, [], (f.run.steps[0], f.run.steps[-1])
    train, sampled, draws = p.get("train"), int(p.get("sampled") or 0), int(p.get("draws") or 0)
    if train:
        never = 1 - sampled / train
        if never >= 0.5:
            skewed = draws >= train
            out.append(Finding(
                "never_sampled", "warning" if skewed else "info", "prompts never sampled",
                f"{train - sampled} of {train} training prompts ({never:.0%}) never drawn in "
                f"{draws} draws", "warning: >= 50% never drawn after >= as many draws as prompts; "
                "info: >= 50% in a shorter run",
                "the sampler concentrates on a few prompts: check the replay stage's weights or "
                "mix in uniform draws" if skewed else "the run is short for its training set",
                span, {"never_sampled_share": never, "draws": float(draws)}))
    twice, unsolved = int(p.get("attempted_twice") or 0), int(p.get("never_solved") or 0)
    if twice >= 5 and unsolved / twice >= 0.5:
        out.append(Finding(
            "never_solved", "warning", "prompts never solved",
            f"{unsolved} of {twice} prompts attempted at 2 or more steps ({unsolved / twice:.0%}) "
            "were never solved", "warning: >= 50% of prompts attempted at >= 2 steps",
            "too hard for the policy now: a curriculum (prompt_gdro, vade), hints, or a "
            "warm start; or the verifier rejects right answers (check sampled completions)",
            span, {"never_solved_share": unsolved / twice}))
    return out


def policy_step(f: Facts) -> list[Finding]:
    """Per-step movement of the policy: the change of the sampled-token NLL between
    consecutive steps (nats/token) where it is at least Z_MIN standard errors (of the
    steps' per-row NLL means), and the learner's approx KL where it logs one.

    The NLL change is an indirect measure: consecutive steps sample different prompts,
    and with few rows a step's standard error is itself a rough estimate (heavy-tailed
    per-row NLLs), so a serious jump must stand out by more standard errors the fewer
    rows it rests on (:func:`z_needed`); the finding says how many it is and over how
    many rows. An approx KL of ~0 does not clear a step: with one update per batch the
    learner measures it before its update (the smol run's 0.000)."""
    steps, nll, se = f.run.steps, f.run.get("store/sampled_nll"), f.run.get("store/sampled_nll_se")
    rows = f.run.get("store/rows")
    jumps = []
    for i in range(1, len(steps)):
        if math.isfinite(nll[i]) and math.isfinite(nll[i - 1]):
            size, spread = abs(nll[i] - nll[i - 1]), math.hypot(_finite(se[i]), _finite(se[i - 1]))
            z = size / spread if spread > 0 else math.inf
            n = min(_finite(rows[i]), _finite(rows[i - 1]))
            if z >= Z_MIN:
                jumps.append((size, steps[i - 1], steps[i], z, n))
    kl, span = _window(steps, f.run.get("train/approx_kl"), "all")
    jump = max(jumps, default=(0.0, steps[0], steps[0], 0.0, 0.0))
    if (jump[0] >= 0.5 and jump[3] >= z_needed(jump[4])) or (math.isfinite(kl) and kl > 0.2):
        severity: Severity = "serious"
    elif jump[0] >= 0.25 or (math.isfinite(kl) and kl > 0.05):
        severity = "warning"
    else:
        return []
    evidence = (f"sampled-token NLL moved {jump[0]:.2f} nats/token between steps {jump[1]} and "
                f"{jump[2]}: {jump[3]:.1f} standard errors over {jump[4]:.0f} rows a step (a serious "
                f"jump there needs {z_needed(jump[4]):.1f})" if jumps else "no NLL jump beyond noise")
    kl_text = f"; learner approx KL mean {kl:.3g}" if math.isfinite(kl) else ""
    return [Finding(
        "policy_step", severity, "the policy moves too far per step", evidence + kl_text,
        f"serious: a step-to-step NLL change >= 0.5 nats/token of at least {Z_MIN:g} standard "
        f"errors ({Z_MIN:g} x sqrt({MIN_ROWS}/rows) below {MIN_ROWS} rows a step), or approx KL "
        f"> 0.2; warning: >= 0.25 (>= {Z_MIN:g} standard errors) or approx KL > 0.05",
        "the learning rate is too large for the trust region: lower lr, add warmup "
        "(warmup_steps), tighten max_grad_norm, or add a KL penalty (kl_coef)",
        (jump[1], jump[2]), {"nll_jump": jump[0], "z": jump[3], "rows": jump[4], "approx_kl_mean": kl})]


Z_MIN = 3.0
"""A step-to-step NLL change smaller than this many standard errors is sampling noise."""
MIN_ROWS = 64
"""Rows a step from which Z_MIN standard errors suffice for a serious jump."""


def z_needed(rows: float) -> float:
    """Standard errors a serious NLL jump needs over ``rows`` rows a step: Z_MIN, scaled
    by sqrt(MIN_ROWS / rows) below MIN_ROWS (16 rows: 6; 32: 4.2)."""
    return Z_MIN * math.sqrt(MIN_ROWS / max(1.0, min(rows, MIN_ROWS)))


def _finite(v: float) -> float:
    return v if math.isfinite(v) else 0.0


MORE: tuple[Callable[[Facts], list[Finding]], ...] = (off_policy, score_errors, prompts, policy_step)
