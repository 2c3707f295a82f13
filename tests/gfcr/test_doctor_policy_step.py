"""``gfcr doctor``'s policy_step check on the figures of small-sample runs: an NLL jump of a
few standard errors over 32 rows a step (the shipped ``smol`` run's size, approx KL 0.000
at lr 3e-6) is a warning that says how sure it is, not SERIOUS; a jump that stands out
far beyond its noise stays serious."""

from __future__ import annotations

from gfcr.doctor.checks_more import MIN_ROWS, policy_step, z_needed
from gfcr.doctor.facts import Facts
from gfcr.report.data import RunData


def _facts(nll: list[float], rows: float, se: float = 0.15, kl: float | None = 0.0) -> Facts:
    steps = list(range(len(nll)))
    series = {"store/sampled_nll": nll, "store/sampled_nll_se": [se] * len(nll),
              "store/rows": [rows] * len(nll)}
    if kl is not None:
        series["train/approx_kl"] = [kl] * len(nll)
    return Facts(RunData("r", {"status": "finished"}, steps, series))


def test_a_small_steps_nll_jump_of_a_few_standard_errors_is_a_warning() -> None:
    (found,) = policy_step(_facts([0.4, 1.3, 0.5], rows=32, se=0.17))  # 0.9 nats: 3.7 standard errors
    assert found.severity == "warning"
    assert "3.7 standard errors over 32 rows a step (a serious jump there needs 4.2)" in found.evidence
    assert z_needed(16) == 6.0 and z_needed(MIN_ROWS) == z_needed(10 * MIN_ROWS) == 3.0


def test_a_jump_far_beyond_its_noise_or_over_many_rows_stays_serious() -> None:
    (far,) = policy_step(_facts([4.6, 2.3, 2.2], rows=16, se=0.1))  # too_large_lr's shape: z 16
    assert far.severity == "serious" and far.figures["nll_jump"] >= 0.5 and far.figures["z"] > 6
    (many,) = policy_step(_facts([0.4, 1.3, 0.5], rows=4 * MIN_ROWS))
    assert many.severity == "serious"
    (kl,) = policy_step(_facts([0.4, 0.41, 0.42], rows=16, kl=0.5))
    assert kl.severity == "serious"


def test_noise_is_no_finding() -> None:
    assert policy_step(_facts([0.4, 0.6, 0.5], rows=32)) == []  # 0.2 nats: 0.9 standard errors
