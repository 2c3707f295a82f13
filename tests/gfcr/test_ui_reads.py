"""gfcr ui without a browser: a store written by an older gfcr served read-only as it is
(and ``gfcr report`` on it), a run read while a step commits between two of its reads,
the token asked off the loopback address, and bad URL parameters named."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gfcr.cli import app
from gfcr.core.browse import RolloutQuery
from gfcr.report import data as report_data
from gfcr.ui import UiServer, serve
from gfcr.ui.context import UiError
from gfcr.ui.params import rollout_query
from store import RolloutStore
from store.browse import LakeBrowseReads
from tests.resources import old_store
from tests.resources.runs import synthetic_run
from tests.resources.web import get


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()


def test_an_old_store_is_served_and_reported_as_it_is(tmp_path: Path) -> None:
    root = old_store.copy(tmp_path / "v1")
    before = _digest(root / "store")
    old_store.check_pages(str(root / "store"), old_store.PAGES)
    result = CliRunner().invoke(app, ["report", old_store.RUN_ID, "--store", str(root / "store"),
                                      "--out", str(tmp_path / "r.html")])
    assert result.exit_code == 0, result.output  # not "Referenced column turns not found"
    assert _digest(root / "store") == before


def test_a_step_committed_between_two_reads_is_left_for_the_next(tmp_path: Path, monkeypatch) -> None:
    with RolloutStore.open(tmp_path / "s") as s:
        synthetic_run(s, "r", [{}, {}])
        reads = report_data.reads(s)
        first_only = reads.steps("r").slice(0, 1)  # as read before step 1 committed
        monkeypatch.setattr(type(reads), "steps", lambda self, run_id, after=None: first_only)
        run = report_data.load_run(s, "r", samples=False)
    assert run.steps == [0] and all(len(v) == 1 for v in run.drops.values())


def test_off_the_loopback_address_the_token_is_asked(tmp_path: Path) -> None:
    with RolloutStore.open(tmp_path / "s") as s:
        synthetic_run(s, "r", [{}])
    server = UiServer(str(tmp_path / "s"), host="0.0.0.0", port=0)
    assert server.token and f"?token={server.token}" in server.url
    import threading
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        status, body = get(f"http://127.0.0.1:{port}/")
        assert status == 403 and "token" in body
        assert get(f"http://127.0.0.1:{port}/?token=wrong")[0] == 403
        assert get(f"http://127.0.0.1:{port}/?token={server.token}")[0] == 200
    finally:
        server.shutdown()
        server.server_close()
    assert UiServer(str(tmp_path / "s"), port=0).token is None  # 127.0.0.1: none


def test_bad_parameters_are_named() -> None:
    assert rollout_query({"step": "3", "kept": "false", "q": "x", "token": "t"}) == RolloutQuery(step=3, kept=False, q="x")
    for params, message in [({"step": "1.5"}, "step='1.5' is not a whole number"),
                            ({"reward_min": "nan"}, "reward_min='nan' is not a finite number"),
                            ({"limit": "100000"}, "limit=100000 must be between 1 and 500"),
                            ({"offset": "-1"}, "offset=-1 must not be negative"),
                            ({"q": "x" * 501}, "q is 501 characters long")]:
        with pytest.raises(UiError) as err:
            rollout_query(params)
        assert err.value.status == 400 and message in err.value.message


def test_gfcr_ui_names_a_port_in_use(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        result = CliRunner().invoke(app, ["ui", "--store", str(tmp_path / "none"), "--port",
                                          str(taken.getsockname()[1])])
    assert result.exit_code == 2 and "cannot listen on 127.0.0.1:" in result.output


def test_gfcr_run_ui_serves_beside_the_run(tmp_path: Path, capsys) -> None:
    """``gfcr run --ui``: the server starts before the run has made its store, prints the
    run page's URL, and shows the run once it exists."""
    from gfcr.cli import _start_ui

    server = _start_ui(tmp_path / "store", 0, "r")
    try:
        url = capsys.readouterr().err.split("gfcr ui: ")[1].split()[0]
        assert url.endswith("/runs/r") and url.startswith("http://127.0.0.1:")
        assert get(url)[0] == 503  # no store yet: a message, not a crash
        server.ctx.close()
        with RolloutStore.open(tmp_path / "store") as s:
            synthetic_run(s, "r", [{}])
        status, body = get(url)
        assert status == 200 and "Run r" in body
    finally:
        server.shutdown()
        server.server_close()


def _evaluated(store: RolloutStore, label: str, step: int, correct: list[bool]) -> None:
    import pyarrow as pa

    from gfcr.evaluation.columns import COMPLETION_SCHEMA

    n = len(correct)
    completions = pa.table({
        "prompt_id": [f"p{i}" for i in range(n)], "sample": [0] * n, "temperature": [0.0] * n,
        "prompt": [f"{i} + {i} =" for i in range(n)], "answer": [str(2 * i) for i in range(n)],
        "completion": [f"{label} says {2 * i if ok else -1}" for i, ok in enumerate(correct)],
        "n_tokens": [3] * n, "finish_reason": ["stop"] * n,
        "reward": [float(ok) for ok in correct], "correct": correct, "error": [None] * n},
        schema=COMPLETION_SCHEMA)
    store.record_evaluation("r", step, label, accuracy=sum(correct) / n, n_prompts=n,
                            temperature=0.0, max_tokens=8, completions=completions)


def test_the_evaluations_page_shows_which_prompts_a_run_flipped(tmp_path: Path) -> None:
    with RolloutStore.open(tmp_path / "s") as s:
        synthetic_run(s, "r", [{}, {}])
        _evaluated(s, "initial", 0, [False, False, True, True])
        _evaluated(s, "step=2", 2, [True, False, True, False])
    server = serve(str(tmp_path / "s"), port=0)
    try:
        base = server.url.rstrip("/")
        status, run_page = get(base + "/runs/r")
        assert status == 200 and "/runs/r/evaluations?from=initial&amp;to=step%3D2" in run_page
        status, body = get(base + "/runs/r/evaluations")
        assert status == 200, body[-500:]
        assert "4 prompts · correct at initial: 2 · at step=2: 2 · <b>1 fixed</b>, <b>1 broken</b>" in body
        rows = body.split('id="eval-rows"')[1].split("</tbody>")[0].split("<tr>")[1:]
        assert [r.split("<td>")[1].split("</td>")[0] for r in rows] == ["broken", "fixed", "", ""]
        assert "step=2 says 0" in rows[1] and "initial says -1" in rows[1]  # p0: wrong, then right
        _, flipped = get(base + "/runs/r/evaluations?flipped=1")
        assert flipped.split('id="eval-rows"')[1].count("<tr>") == 2
        status, bad = get(base + "/runs/r/evaluations?from=step%3D9")
        assert status == 400 and "step=9" in bad and "is not an evaluation" in bad
        assert "Traceback" not in bad
        assert server.failures == []
    finally:
        server.shutdown()
        server.server_close()


def test_a_free_text_page_stops_at_its_cap_with_the_rows_of_a_full_scan(tmp_path: Path, monkeypatch) -> None:
    store = RolloutStore.open(tmp_path / "store")
    try:
        synthetic_run(store, "text", [{"reward_mean": 0.5}] * 6)  # 6 steps of 32, every prompt "1 + 1 ="
        browse = LakeBrowseReads(store)
        for query in (RolloutQuery(q="1 + 1"), RolloutQuery(q="1 + 1", offset=50),
                      RolloutQuery(q="1 + 1", reward_min=1.0)):
            exact = browse.page("text", query, 20, cap=None)
            capped = browse.page("text", query, 20, cap=40)
            assert capped.rows.to_pylist() == exact.rows.to_pylist() == browse.rollouts("text", query).to_pylist()
            assert exact.complete and exact.total == browse.histogram("text", query, 20)[0]
            assert not capped.complete and 40 <= capped.total < exact.total, (query, capped.total, exact.total)
            assert capped.steps is not None and capped.steps[1] == 5 and capped.steps[0] > 0
        first = browse.page("text", RolloutQuery(q="1 + 1"), 20, cap=40)
        assert (first.total, first.steps) == (64, (4, 5))  # step 5's 32 matches said one step more was enough
        whole = browse.page("text", RolloutQuery(q="1 + 1"), 20, cap=10_000)
        assert whole.complete and whole.total == 6 * 32
        assert whole.bars.to_pylist() == browse.histogram("text", RolloutQuery(q="1 + 1"), 20)[1].to_pylist()
    finally:
        store.close()
    monkeypatch.setattr("gfcr.ui.pages_rollouts.TEXT_CAP", 40)
    server = serve(str(tmp_path / "store"), port=0)
    try:
        base = server.url.rstrip("/") + "/runs/text/rollouts?q=1+%2B+1"
        status, capped_page = get(base)
        assert status == 200 and "64+ rollouts match" in capped_page, capped_page[-800:]
        assert "over the newest steps 4–5" in capped_page and "count=all" in capped_page
        status, every = get(base + "&count=all")
        assert status == 200 and "192 rollouts match" in every and 'id="partial"' not in every
    finally:
        server.shutdown()
        server.server_close()
