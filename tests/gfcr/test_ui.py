"""gfcr ui in a real headless Chromium (Debian's package, driven by Playwright): a real
short run and runs committed here through the store's commit path, watched live; every
page's screenshot is kept under test-artifacts/ui (docs/ui holds a copy)."""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gfcr.ui import serve
from store import RolloutStore
from tests.conftest import tiny_pipeline
from tests.resources.agentic import committed_run, episodes, turn
from tests.resources.rollouts import rollouts
from tests.resources.runs import run

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "ui"
WAIT_MS = 60_000
"""How long a live update may take before a test fails: the page's target is 2 s (bench/ui.py
measures it); a loaded 2-core CI machine gets far more."""


def _encode(text: str) -> list[int]:
    from stages.engines.tokenizers import CharTokenizer

    return CharTokenizer().encode(text)


def _agent_steps() -> list[Any]:
    """Two steps of multi-turn episodes in the tiny pipeline's character ids: a tool call,
    its result, a tool error, a partly masked policy turn; rewards spread over [0, 1] and
    one dropped row."""
    call = turn("policy", _encode("call python: print(6*7)"), tool_name=None,
                mask=[True] * 12 + [False] * 11, logprob=-0.2)
    tool = turn("tool", _encode("42"), tool_name="python")
    bad = turn("tool", _encode("oops"), tool_name="python", tool_error="NameError: name 'x' is not defined")
    answer = turn("policy", _encode("The answer is 42"), reward=1.0, logprob=-1.5)
    prompt = turn("environment", _encode("What is 6*7? Use the tool."))
    trajectories = [[prompt, call, tool, answer], [prompt, call, bad, answer], [prompt, answer],
                    [prompt, call, tool, answer]]
    steps = []
    for rewards in ([0.0, 0.25, 0.5, 1.0], [1.0, 0.75, 0.0, 1.0]):
        table = episodes(trajectories, groups=["a", "a", "b", "b"], rewards=rewards,
                         kept=[True, True, False, True], dropped_by=[None, None, "max_len", None],
                         drop_reason=[None, None, "longer than 8 tokens", None],
                         advantage=[-0.5, 0.1, None, 0.4])
        steps.append(table)
    return steps


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("ui")
    summary = run(tiny_pipeline(name="real", steps=2), root)
    store = RolloutStore.open(root / "store")
    committed_run(store, "agent", _agent_steps())
    spec = tiny_pipeline(name="live")
    store.start_run("live", pipeline="live", spec_yaml=spec.to_yaml(), spec_hash=spec.spec_hash(),
                    code_version="test")
    store.commit_step("live", 0, _live_rows(0), policy_version=0, metrics={"reward_mean": 0.2})
    server = serve(str(root / "store"), port=0)
    try:
        yield {"root": root, "url": server.url.rstrip("/"), "store": store, "real": summary.run_id,
               "server": server}
    finally:
        server.shutdown()
        server.server_close()
        store.close()


def _live_rows(step: int) -> Any:
    table = rollouts(["g", "g"], [0.0, 1.0], run_id=["live"] * 2, step=[step] * 2,
                     rollout_id=[f"live/{step}/0", f"live/{step}/1"])
    return table


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not os.path.exists(CHROMIUM):
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing; .ci/run installs Debian's chromium package")
        pytest.skip("chromium is not installed here (.ci/run installs it)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1300, "height": 900})
    tab = context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda e: errors.append(str(e)))
    tab.on("console", lambda m: errors.append(f"{m.text} {m.location}") if m.type == "error" else None)
    tab.errors = errors
    yield tab
    context.close()


def _shot(tab: Any, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    tab.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def test_a_run_started_here_appears_in_the_runs_list_live(served: dict[str, Any], page: Any) -> None:
    page.goto(served["url"] + "/")
    rows = page.locator("#runs-body tr")
    assert {"real", "agent", "live"} <= set(page.locator("#runs-body tr td:nth-child(2)").all_inner_texts())
    assert "finished" in rows.filter(has_text="real").inner_text()
    _shot(page, "runs")
    spec = tiny_pipeline(name="late")
    served["store"].start_run("late", pipeline="late", spec_yaml=spec.to_yaml(),
                              spec_hash=spec.spec_hash(), code_version="test")
    page.wait_for_selector("#runs-body a[href='/runs/late']", timeout=WAIT_MS)  # no reload
    page.fill("#run-filter", "agent")
    assert page.locator("#runs-body tr:visible").count() == 1
    page.fill("#run-filter", "")
    page.check("input.pick[value='real']")
    page.check("input.pick[value='agent']")
    page.click("#overlay")
    page.wait_for_selector(".chart svg polyline", state="attached", timeout=WAIT_MS)
    assert page.url.split("?")[1] in ("runs=real,agent", "runs=agent,real")
    assert not page.errors, (page.errors, served["server"].failures)


def test_a_running_runs_page_follows_its_steps_and_says_how_it_ended(served: dict[str, Any], page: Any) -> None:
    store = served["store"]
    page.goto(served["url"] + "/runs/live")
    page.wait_for_selector("#charts .chart", timeout=WAIT_MS)
    assert page.inner_text("#run-last") == "0" and page.locator("#run-end").count() == 0
    page.wait_for_function("document.getElementById('live').textContent.includes('running')", timeout=WAIT_MS)
    store.commit_step("live", 1, _live_rows(1), policy_version=1, metrics={"reward_mean": 0.6})
    committed = time.monotonic()
    page.wait_for_function("document.getElementById('run-last').textContent === '1'", timeout=WAIT_MS)
    print(f"live update {time.monotonic() - committed:.2f} s after the commit")
    page.wait_for_function("document.getElementById('charts').dataset.steps === '2'", timeout=WAIT_MS)
    # the steps table is its own fragment, fetched beside the charts: wait for it too (a
    # chart redrawn by the page's first load can show step 1 before the table does)
    page.wait_for_function("document.querySelectorAll('#run-steps tbody tr').length === 2",
                           timeout=WAIT_MS)
    store.finish_run("live", "failed", error="RuntimeError: the scorer went away")
    page.wait_for_selector("#run-end", timeout=WAIT_MS)
    assert "failed" in page.inner_text("#run-end") and "scorer went away" in page.inner_text("#run-end")
    assert not page.errors, (page.errors, served["server"].failures)


def test_the_run_page_shows_pipeline_charts_phases_and_findings(served: dict[str, Any], page: Any) -> None:
    page.goto(served["url"] + "/runs/real")
    page.wait_for_selector("#charts .chart svg circle.point", timeout=WAIT_MS)
    page.wait_for_selector("#doctor:not(.lazy)", timeout=WAIT_MS)
    page.wait_for_function("document.getElementById('charts').dataset.source === 'all'", timeout=WAIT_MS)
    assert page.locator("#charts .chart[data-metric='store/kept_share']").count() == 1  # the report's figures
    assert "uniform" in page.inner_text("main") and "Phase times" in page.inner_text("#doctor")
    _shot(page, "run")
    page.locator("#charts .chart circle.point").first.click()
    page.wait_for_selector("#rollout-rows tr")
    assert "step=" in page.url
    assert not page.errors, (page.errors, served["server"].failures)


def test_a_dropped_rollout_shows_its_reason(served: dict[str, Any], page: Any) -> None:
    with RolloutStore.open(served["root"] / "store", read_only=True) as s:
        dropped = s.sql("SELECT rollout_id, dropped_by, drop_reason FROM rollouts WHERE run_id = 'real' "
                        "AND NOT kept LIMIT 1").to_pylist()
    for run_id, row in [("agent", {"dropped_by": "max_len", "drop_reason": "longer than 8 tokens"})] + \
            [("real", r) for r in dropped]:
        page.goto(served["url"] + f"/runs/{run_id}/rollouts?kept=false")
        page.locator("#rollout-rows tr td:first-child a").first.click()
        reason = page.inner_text("#drop-reason")
        assert row["dropped_by"] in reason and row["drop_reason"] in reason, reason


def test_the_histogram_filter_narrows_the_table(served: dict[str, Any], page: Any) -> None:
    page.goto(served["url"] + "/runs/agent/rollouts")
    everything = page.inner_text("#count")
    assert everything.startswith("8 rollouts match")
    _shot(page, "rollouts")
    page.locator("#histogram a.hbar").last.click()  # the top reward bin
    page.wait_for_url("**reward_min=**")
    assert page.inner_text("#count").startswith("3 rollouts match")
    rewards = page.locator("#rollout-rows tr td:nth-child(6)").all_inner_texts()
    assert rewards == ["1"] * 3
    page.goto(served["url"] + "/runs/agent/rollouts?step=1&reward_max=0.5")
    assert page.inner_text("#count").startswith("1 rollouts match")


def test_a_multi_turn_rollout_reads_as_a_chat_with_its_tool_call_and_loss_mask(served: dict[str, Any],
                                                                                page: Any) -> None:
    page.goto(served["url"] + "/runs/agent/rollouts/agent%2F0%2F1")
    turns = page.locator("#timeline .turn")
    assert turns.count() == 4
    assert "tool call: python" in turns.nth(2).inner_text()
    assert "NameError" in turns.nth(2).locator(".tool-error").inner_text()
    assert turns.nth(1).locator(".text").inner_text() == "call python: print(6*7)"  # text, not ids
    assert turns.nth(3).locator(".text").inner_text() == "The answer is 42"
    assert turns.nth(1).locator(".tok.in").count() == 12 and turns.nth(1).locator(".tok.out").count() == 11
    assert "rgb(" in turns.nth(1).locator(".tok").first.evaluate("e => getComputedStyle(e).backgroundColor")
    assert "turn reward 1" in turns.nth(3).inner_text()
    _shot(page, "rollout")
    page.goto(served["url"] + "/runs/agent/groups/agent%2F0%2Fa")
    assert page.locator(".card").count() == 2
    _shot(page, "group")
    page.locator("a", has_text="across steps").click()
    assert page.locator(".across .col").count() == 2  # steps 0 and 1
    _shot(page, "prompt")


def test_bad_input_reads_as_a_message_and_writes_nothing(served: dict[str, Any], page: Any,
                                                         tmp_path: Path) -> None:
    catalog = served["root"] / "store" / "catalog.sqlite"
    before = hashlib.sha256(catalog.read_bytes()).hexdigest()
    url = served["url"]
    for path, message in [
        ("/runs/nope", "no run 'nope'"), ("/runs/agent/rollouts/nope", "no rollout 'nope'"),
        ("/runs/agent/rollouts?step=abc", "step='abc' is not a whole number"),
        ("/runs/agent/rollouts?reward_min=2&reward_max=1", "reward_min=2.0 is above reward_max=1.0"),
        ("/runs/agent/rollouts?kept=maybe", "kept='maybe' must be true or false"),
        ("/runs/agent/rollouts?server=s1", "records no server"),
        ("/runs/agent/groups/zzz", "no group 'zzz'"), ("/compare?runs=agent", "pick 2 to 4"),
        ("/no/such/page", "no page at"),
    ]:
        response = page.goto(url + path)
        assert response.status in (400, 404), path
        text = page.inner_text("#error")
        assert message in text and "Traceback" not in page.content(), (path, text)
    _shot(page, "error")
    assert hashlib.sha256(catalog.read_bytes()).hexdigest() == before


def test_a_store_of_a_newer_schema_is_a_message_on_the_page(tmp_path: Path, page: Any) -> None:
    from store._versions import SCHEMA_VERSION

    folder = tmp_path / "s"
    with RolloutStore.open(folder) as s:
        s._transaction(lambda con: con.execute(
            f"INSERT INTO lake.schema_versions VALUES ({SCHEMA_VERSION + 1}, now(), 'gfcr 9')"))
    catalog = (folder / "catalog.sqlite").read_bytes()
    server = serve(str(folder), port=0)
    try:
        response = page.goto(server.url)
        assert response.status == 503
        assert f"rollout schema version {SCHEMA_VERSION + 1}" in page.inner_text("#error")
    finally:
        server.shutdown()
        server.server_close()
    assert (folder / "catalog.sqlite").read_bytes() == catalog
