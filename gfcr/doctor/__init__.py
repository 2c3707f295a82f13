"""``gfcr doctor``: automatic checks for the GFCR survey's rollout pathologies, over the store.

:func:`diagnose` reads one run (read-only) and returns its findings, most serious first;
each names its threshold, its evidence (figures and step range) and what to try. The
checks are in :mod:`gfcr.doctor.checks`, :mod:`gfcr.doctor.checks_more` and
:mod:`gfcr.doctor.checks_agentic`, the figures they judge in :mod:`gfcr.doctor.facts`.
"""

from __future__ import annotations


from gfcr.core.storage import RunStore
from gfcr.doctor.checks import CHECKS, Finding
from gfcr.doctor.checks_agentic import AGENTIC
from gfcr.doctor.checks_more import MORE
from gfcr.doctor.facts import gather
from gfcr.report.data import check_schema

__all__ = ["ALL_CHECKS", "Finding", "diagnose", "serious"]

ALL_CHECKS = CHECKS + MORE + AGENTIC
_ORDER = {"serious": 0, "warning": 1, "info": 2}


def diagnose(store: RunStore, run_id: str) -> list[Finding]:
    """Findings for ``run_id`` in the open ``store``, most serious first (ReportError for
    an older store, an unknown run or one with no committed step)."""
    check_schema(store)
    facts = gather(store, run_id)
    findings = [finding for check in ALL_CHECKS for finding in check(facts)]
    return sorted(findings, key=lambda f: _ORDER[f.severity])


def serious(findings: list[Finding]) -> bool:
    return any(f.severity == "serious" for f in findings)
