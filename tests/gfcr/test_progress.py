"""Progress and milestones: counted phases report done/total as they go, the console
draws a bar per phase with counts, Prefect's run log carries the same milestones, and
every held-out evaluation lands once in the store's ``evaluations`` table."""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.console import Console

from gfcr import execute
from gfcr.transport.progress import ProgressBars
from stages import SFT
from store import RolloutStore
from tests.conftest import tiny_pipeline


class Recorder:
    """A hook that keeps every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def __getattr__(self, method: str) -> Any:
        if not method.startswith("on_"):
            raise AttributeError(method)
        return lambda **kw: self.calls.append((method, kw))

    def progress(self, phase: str) -> list[tuple[int, int]]:
        return [(kw["done"], kw["total"]) for m, kw in self.calls
                if m == "on_progress" and kw["phase"] == phase]


def test_warm_start_and_evaluation_report_counts(tmp_path):
    rec = Recorder()
    text = io.StringIO()
    bars = ProgressBars(2, console=Console(file=text, width=120, force_terminal=False),
                        quiet=False)
    pipeline = tiny_pipeline(warmstart=SFT(steps=4, batch_size=4))
    execute(pipeline, root=tmp_path, executor="local", hooks=[rec, bars])
    assert rec.progress("warmstart") == [(0, 4), (1, 4), (2, 4), (3, 4), (4, 4)]
    for label in ("initial", "step=0", "step=2"):
        counts = rec.progress(f"evaluate[{label}]")
        assert counts[0] == (0, 8) and counts[-1] == (8, 8), counts
    phases = [kw["phase"] for m, kw in rec.calls if m == "on_phase"]
    assert phases[:3] == ["building the policy and the task", "evaluate[initial]", "warmstart"]
    shown = text.getvalue()
    assert "warmstart" in shown and "4/4" in shown and "evaluate[step=0]" in shown


def test_evaluations_table_holds_each_evaluation_once_across_a_resume(tmp_path):
    first = execute(tiny_pipeline(steps=1), root=tmp_path, executor="local", run_id="ev")
    again = execute(tiny_pipeline(steps=2), root=tmp_path, executor="local", run_id="ev")
    with RolloutStore.open(tmp_path / "store", read_only=True) as store:
        rows = store.sql("SELECT step, label, accuracy, n_prompts, max_tokens "
                         "FROM evaluations WHERE run_id = 'ev' ORDER BY step").to_pylist()
    assert [(r["step"], r["label"]) for r in rows] == [(0, "step=0"), (1, "step=1"),
                                                       (2, "step=2")]
    assert rows[0]["accuracy"] == first.accuracy_before
    assert rows[1]["accuracy"] == first.accuracy_after
    assert rows[2]["accuracy"] == again.accuracy_after
    assert {(r["n_prompts"], r["max_tokens"]) for r in rows} == {(8, 6)}


def test_recording_an_evaluation_again_replaces_it(tmp_path):
    with RolloutStore.open(tmp_path / "store") as store:
        for accuracy in (0.25, 0.5):
            store.record_evaluation("r", 3, "step=3", accuracy=accuracy, n_prompts=4,
                                    temperature=0.0, max_tokens=8)
        rows = store.sql("SELECT accuracy FROM evaluations").to_pylist()
    assert rows == [{"accuracy": 0.5}]


def test_prefect_run_log_carries_the_milestones(tmp_path, prefect_server):
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, LogFilter
    from prefect.logging.handlers import APILogHandler

    # the tests run Prefect with PREFECT_LOGGING_LEVEL=WARNING: milestones pass anyway
    pipeline = tiny_pipeline(steps=1, warmstart=SFT(steps=4, batch_size=4))
    summary = execute(pipeline, root=tmp_path, executor="prefect", run_id="milestones")
    APILogHandler().flush()
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            name={"any_": [summary.run_id]}))
        logs = client.read_logs(log_filter=LogFilter(flow_run_id={"any_": [runs[0].id]}))
    messages = [log.message for log in logs]
    for expected in ("warmstart: started", "warmstart: 4/4", "evaluate[step=0]: 8/8",
                     f"evaluate[step=0]: held-out accuracy {summary.accuracy_warmstart:.1%}"):
        assert expected in messages, messages
    assert any(m.startswith("step 0: reward_mean ") for m in messages), messages


def test_a_repeated_scorer_error_is_reported_once_with_its_count(tmp_path):
    import re

    from stages import GroupSample, UniformSampler, Verify

    text = io.StringIO()
    bars = ProgressBars(2, console=Console(file=text, width=200), quiet=False)
    pipeline = tiny_pipeline(stages=[UniformSampler(batch=4), GroupSample(n=4, max_tokens=6),
                                     Verify(scorer="tests.resources.scorers:fails_on_odd")])
    execute(pipeline, root=tmp_path, executor="local", hooks=[bars])
    shown = text.getvalue()
    message = "a scorer raised on rollouts (kept as score_error): ValueError: odd-length completion"
    first = re.findall(rf"warning: {re.escape(message)}(?: \((\d+)x\))?", shown)
    total = re.findall(rf"warning (\d+)x in all: {re.escape(message)}", shown)
    assert len(first) == 1 and len(total) == 1, shown  # once when first seen, then the total
    with RolloutStore.open(tmp_path / "store", read_only=True) as store:
        errors = store.sql("SELECT count(*) AS n FROM rollouts WHERE score_error IS NOT NULL")
    assert int(total[0]) == errors.column("n")[0].as_py() > int(first[0] or 1) - 1
