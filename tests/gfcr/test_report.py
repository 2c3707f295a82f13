"""gfcr report: the page of a real short run in a real headless Chromium, the end-of-run
artifacts (page file, MLflow artifact, Prefect markdown artifact), comparing runs, and
bad input (unknown run, empty run, older-schema store) without writing to the store."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gfcr.cli import app
from gfcr.report import ReportError, report_html
from gfcr.report.data import accuracies
from store import RolloutStore
from tests.resources.runs import healthy_pipeline, pathology_pipeline, run

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
"""Where the browser test keeps its screenshot (ignored by git)."""


@pytest.fixture(scope="module")
def prefect_run(prefect_server: None, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    """The healthy run under Prefect with MLflow tracking, and a second run to compare."""
    from gfcr.tracking.mlflow_hook import MlflowHook

    root = tmp_path_factory.mktemp("report")
    summary = run(healthy_pipeline(steps=8), root, executor="prefect", hooks=[MlflowHook()])
    run(pathology_pipeline("other", steps=3), root)
    return root, summary


def _chromium(url: str, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    if not os.path.exists(CHROMIUM):
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing; .ci/run installs Debian's chromium package")
        pytest.skip("chromium is not installed here (.ci/run installs it)")
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--enable-logging=stderr",
         "--v=0", f"--user-data-dir={tmp / 'profile'}", "--virtual-time-budget=3000", *args, url],
        capture_output=True, text=True, timeout=120)


def _page_errors(stderr: str) -> list[str]:
    """Console errors, uncaught exceptions and blocked loads in Chromium's log."""
    return [line for line in stderr.splitlines()
            if re.search(r"CONSOLE|Uncaught|Refused to|net::ERR_", line)]


def test_a_page_with_a_script_error_is_caught(tmp_path: Path) -> None:
    """The check below is not vacuous: a page that throws is reported."""
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><script>undefinedFunction()</script></body></html>")
    result = _chromium(bad.as_uri(), tmp_path, "--dump-dom")
    assert _page_errors(result.stderr), result.stderr[-2000:]


def test_report_of_a_real_run_in_headless_chromium(prefect_run: tuple[Path, object], tmp_path: Path) -> None:
    root, summary = prefect_run
    page = tmp_path / "report.html"
    result = CliRunner().invoke(app, ["report", summary.run_id, "--root", str(root), "--out", str(page)])
    assert result.exit_code == 0, result.output
    dom = _chromium(page.as_uri(), tmp_path, "--dump-dom")
    assert dom.returncode == 0 and not _page_errors(dom.stderr), dom.stderr[-3000:]
    plots = re.findall(r'<svg class="plot".*?</svg>', dom.stdout, flags=re.S)
    assert len(plots) >= 15
    with RolloutStore.open(root / "store", read_only=True) as s:
        stored_accuracy = accuracies(s, summary.run_id)
    for plot in plots:
        title = re.search(r"<title>(.*?)</title>", plot).group(1)
        if title == "held-out accuracy" and not stored_accuracy:
            continue  # this store keeps no evaluation of a run yet (issue 18 adds them)
        assert 'class="data"' in plot and 'class="empty"' not in plot, f"plot {title!r} has no data"
    kinds = set(re.findall(r'<td class="(right|wrong|dropped)">', dom.stdout))
    assert "Sampled completions" in dom.stdout and {"wrong", "dropped"} <= kinds, kinds
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "report.png"
    taken = _chromium(page.as_uri(), tmp_path, "--window-size=1400,2200", f"--screenshot={shot}",
                      "--hide-scrollbars")
    assert taken.returncode == 0 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert shot.stat().st_size > 50_000  # a page of charts, not a blank one


def test_every_run_ends_with_its_page_in_mlflow_and_prefect(prefect_run: tuple[Path, object]) -> None:
    import mlflow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    root, summary = prefect_run
    assert summary.report == str(root / "runs" / summary.run_id / "report.html")
    assert "<svg" in Path(summary.report).read_text()
    client = mlflow.tracking.MlflowClient(summary.mlflow)
    found = client.search_runs([client.get_experiment_by_name("healthy").experiment_id],
                               f"tags.`gfcr.run_id` = '{summary.run_id}'")
    assert "report.html" in [a.path for a in client.list_artifacts(found[0].info.run_id)]
    with get_client(sync_client=True) as prefect:
        artifacts = prefect.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=["gfcr-run-summary"])))
    mine = [a for a in artifacts if summary.run_id in (a.data or "")]
    assert mine and mine[0].type == "markdown"
    assert summary.report in mine[0].data and f"{summary.accuracy_after:.1%}" in mine[0].data


def test_two_runs_on_one_page(prefect_run: tuple[Path, object]) -> None:
    root, summary = prefect_run
    with RolloutStore.open(root / "store", read_only=True) as s:
        html = report_html(s, [summary.run_id, "other"])
    assert html.count('<h3>') == 2 and "other" in html and summary.run_id in html
    assert '<tr class="diff"><th>name</th>' in html  # the specs' differences are marked


def _fingerprint(store: Path) -> tuple[int, str]:
    with RolloutStore.open(store, read_only=True) as s:
        snapshots = s.snapshots().num_rows
    files = sorted(p for p in store.rglob("*") if p.is_file() and not p.name.endswith(("-wal", "-shm")))
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in files)).hexdigest()
    return snapshots, digest


def test_bad_input_gets_clear_messages_and_the_store_is_untouched(
        prefect_run: tuple[Path, object], tmp_path: Path) -> None:
    root, summary = prefect_run
    cli = CliRunner()
    before = _fingerprint(root / "store")
    unknown = cli.invoke(app, ["report", "nope", "--root", str(root), "--out", str(tmp_path / "x.html")])
    assert unknown.exit_code == 2 and "no run 'nope'" in unknown.output and summary.run_id in unknown.output
    ok = cli.invoke(app, ["report", summary.run_id, "--root", str(root), "--out", str(tmp_path / "y.html")])
    assert ok.exit_code == 0
    assert _fingerprint(root / "store") == before  # reporting wrote nothing to the store
    with RolloutStore.open(tmp_path / "store") as s:  # a run that committed no step
        s.start_run("empty", pipeline="p", spec_yaml="name: p\n", spec_hash="h", code_version="v")
        with pytest.raises(ReportError, match="run 'empty' .* has no committed step"):
            report_html(s, ["empty"])


def test_a_store_lacking_columns_the_report_reads_is_reported_read_only(tmp_path: Path) -> None:
    """A store whose tables predate columns the report reads (made with DuckDB directly,
    leaner than any gfcr ever wrote): store._compat reads the absent columns as null, so
    the report and the doctor work on it, and neither writes to it."""
    import duckdb

    from store._duck import extension_path

    folder = tmp_path / "old"
    (folder / "data").mkdir(parents=True)
    con = duckdb.connect()
    con.execute(f"LOAD '{extension_path('ducklake')}'; LOAD '{extension_path('sqlite')}'")
    con.execute(f"ATTACH 'ducklake:sqlite:{folder}/catalog.sqlite' AS lake (DATA_PATH '{folder}/data/')")
    con.execute("CREATE TABLE lake.rollouts (run_id VARCHAR, step BIGINT, reward DOUBLE)")
    con.execute("CREATE TABLE lake.steps (run_id VARCHAR, step BIGINT, policy_version BIGINT, n_rollouts BIGINT, "
                "n_kept BIGINT, metrics MAP(VARCHAR, DOUBLE), committed_at TIMESTAMPTZ)")
    con.execute("CREATE TABLE lake.runs (run_id VARCHAR, pipeline VARCHAR, spec_yaml VARCHAR, spec_hash VARCHAR, "
                "code_version VARCHAR, status VARCHAR, started_at TIMESTAMPTZ, finished_at TIMESTAMPTZ, store VARCHAR)")
    con.execute("INSERT INTO lake.runs VALUES ('r', 'p', 'name: p', 'h', 'v', 'finished', now(), now(), 's')")
    con.execute("INSERT INTO lake.steps VALUES ('r', 0, 0, 2, 2, MAP {'train/loss': 0.5}, now())")
    con.execute("INSERT INTO lake.rollouts VALUES ('r', 0, 1.0), ('r', 0, 0.0)")
    con.close()
    before = _fingerprint(folder)
    result = CliRunner().invoke(app, ["report", "r", "--store", str(folder), "--out", str(tmp_path / "r.html")])
    assert result.exit_code == 0, result.output
    assert "r" in (tmp_path / "r.html").read_text()
    doctor = CliRunner().invoke(app, ["doctor", "r", "--store", str(folder)])
    assert doctor.exit_code == 0, doctor.output
    missing = CliRunner().invoke(app, ["report", "nope", "--store", str(folder)])
    assert missing.exit_code == 2 and "no run 'nope'" in missing.output
    assert _fingerprint(folder) == before
