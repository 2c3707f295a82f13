"""The doctor's checks on multi-turn episodes (figures: the store's ``RunReads.episode_figures``).

The agentic pathologies the environments issue names: an agent that repeats a tool call
that failed (the recovery Fission-GRPO trains, "Robust Tool Use via Fission-GRPO"),
episodes the turn cap cuts off, tool calls that do not parse (format failures, which
rStar2-Agent and AgentMath filter or penalise), and episodes that leave nothing to train
on. A single-turn run has no episodes, so none of these fire for it.
"""

from __future__ import annotations

from collections.abc import Callable

from gfcr.doctor.checks import Finding, Severity, _pct, _span
from gfcr.doctor.facts import Facts


def _graded(value: float, warning: float, serious: float) -> Severity | None:
    if value >= serious:
        return "serious"
    return "warning" if value >= warning else None


def _steps(f: Facts) -> tuple[int, int]:
    return int(f.turns.get("first_step") or 0), int(f.turns.get("last_step") or 0)


def tool_error_loops(f: Facts) -> list[Finding]:
    tool_rows, loops = f.turns.get("tool_rows", 0), f.turns.get("error_loops", 0)
    share = loops / tool_rows if tool_rows else 0.0
    severity = _graded(share, 0.1, 0.3)
    if severity is None:
        return []
    loop = f.turns.get("loop_error") or {}
    example = (f"; e.g. {loop.get('tool_name') or 'a tool'!s} failing with "
               f"{str(loop.get('tool_error'))[:80]!r} {loop.get('n')} times in one episode"
               if loop else "")
    return [Finding(
        "tool_error_loops", severity, "agents repeat tool calls that failed",
        f"{loops} of {tool_rows} episodes with tool calls ({_pct(share)}) repeat one tool "
        f"error over {_span(_steps(f))}{example}",
        "warning: >= 10% of episodes with tool calls; serious: >= 30%",
        "the policy does not use the error it is shown: train recovery from the error turn "
        "(FissionBranch), penalise a repeated error in the environment's turn reward, or end "
        "an episode after the same error twice", _steps(f), {"loop_share": share})]


def turn_limit(f: Facts) -> list[Finding]:
    ended, hit = f.turns.get("ended", 0), f.turns.get("turn_limit", 0)
    share = hit / ended if ended else 0.0
    severity = _graded(share, 0.3, 0.6)
    if severity is None:
        return []
    return [Finding(
        "turn_limit", severity, "the turn cap ends many episodes",
        f"{hit} of {ended} episodes ({_pct(share)}) ended at the turn limit over "
        f"{_span(_steps(f))}",
        "warning: >= 30% of episodes; serious: >= 60%",
        "truncated episodes carry no outcome: raise the generate stage's max_turns (or "
        "TurnBudget's), check that the environment says done, or reward finishing sooner",
        _steps(f), {"turn_limit_share": share})]


def format_failures(f: Facts) -> list[Finding]:
    episodes, bad = f.turns.get("episodes", 0), f.turns.get("format_rows", 0)
    share = bad / episodes if episodes else 0.0
    severity = _graded(share, 0.05, 0.25)
    if severity is None:
        return []
    return [Finding(
        "format_failures", severity, "tool calls do not parse",
        f"{bad} of {episodes} episodes ({_pct(share)}) hold a tool call that could not be "
        f"read over {_span(_steps(f))}",
        "warning: >= 5% of episodes; serious: >= 25%",
        "warm-start on well-formed calls (SFT), show the call syntax in the first message "
        "(the environment's tools), or give the format a reward of its own",
        _steps(f), {"format_failure_share": share})]


def no_policy_tokens(f: Facts) -> list[Finding]:
    episodes, empty = f.turns.get("episodes", 0), f.turns.get("no_policy_tokens", 0)
    share = empty / episodes if episodes else 0.0
    severity = _graded(share, 1e-9, 0.1)
    if severity is None:
        return []
    return [Finding(
        "no_policy_tokens", severity, "episodes with nothing to train on",
        f"{empty} of {episodes} episodes ({_pct(share)}) have no token in the loss over "
        f"{_span(_steps(f))}",
        "warning: any; serious: >= 10% of episodes",
        "they cost generation and teach nothing: an environment that fails at reset (see "
        "score_errors), a token or turn cap that leaves the policy no room, or branches "
        "whose every turn is masked", _steps(f), {"no_policy_token_share": share})]


AGENTIC: tuple[Callable[[Facts], list[Finding]], ...] = (
    tool_error_loops, turn_limit, format_failures, no_policy_tokens)
