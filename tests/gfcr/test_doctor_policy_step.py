"""``gfcr doctor``'s policy_step check on the figures of a small-sample run: an NLL jump
between steps that sampled different prompts while the learner's approx KL stays near 0
(the shipped ``smol`` run: 0.000 at lr 3e-6) is not the policy moving."""

from __future__ import annotations

import math

from gfcr.doctor.checks_more import KL_STILL, MIN_ROWS, policy_step
from gfcr.doctor.facts import Facts
from gfcr.report.data import RunData


def _facts(nll: list[float], kl: list[float] | None, rows: float) -> Facts:
    steps = list(range(len(nll)))
    series = {"store/sampled_nll": nll, "store/sampled_nll_se": [0.05] * len(nll),
              "store/rows": [rows] * len(nll)}
    if kl is not None:
        series["train/approx_kl"] = kl
    return Facts(RunData("r", {"status": "finished"}, steps, series))


def test_an_nll_jump_with_a_still_policy_is_no_finding() -> None:
    smol = _facts([0.4, 1.1, 0.5], [1e-8, 2e-8, 1e-8], rows=16)  # the smol run's shape
    assert policy_step(smol) == []


def test_a_jump_over_few_rows_is_a_warning_that_says_how_sure_it_is() -> None:
    (found,) = policy_step(_facts([0.4, 1.1, 0.5], None, rows=16))
    assert found.severity == "warning" and "standard errors" in found.evidence
    assert "16 and 16 rows" in found.evidence and "no approx KL" in found.evidence


def test_a_jump_over_many_rows_or_a_large_kl_stays_serious() -> None:
    (many,) = policy_step(_facts([0.4, 1.1, 0.5], None, rows=MIN_ROWS * 4))
    assert many.severity == "serious" and many.figures["nll_jump"] >= 0.5
    (kl,) = policy_step(_facts([0.4, 0.41, 0.42], [0.5, 0.4, 0.3], rows=16))
    assert kl.severity == "serious" and math.isclose(kl.figures["approx_kl_mean"], 0.4)
    assert KL_STILL < 0.05  # a warning's KL is never read as still
