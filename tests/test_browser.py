"""The dashboard as a person sees it: a real JupyterLab / Notebook 7 / Voila page in headless Chromium.

A notebook starts a cluster and trains in the background with the live
dashboard; the page must show the dashboard, and its picture and numbers
must change between two reads while training runs.  Screenshots go to
test-artifacts/browser/ (look at them: they are what a user sees).
"""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

from .conftest import chromium_at_lane_priority, poll_for
from .jupyterutil import JupyterServer

pytestmark = [pytest.mark.browser, pytest.mark.cluster]
ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts" / "browser"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

NOTEBOOK_CELLS = [
    "%load_ext tfmagic",
    "%tf_cluster start --ps 1 --workers 2",
    "run = %tf_train --mode async --model digits --steps 20000 --lr 0.05",
    # mid-run, as a teacher does it: the dashboard must show the drop
    "import time\nwhile run.history.steps < SLOW_AT:\n    time.sleep(0.1)\n%tf_cluster slow worker:1 --factor 4",
]
SLOW_AT = 1500  # updates before worker:1 is slowed (a few seconds of training)


@pytest.fixture(scope="module", autouse=True)
def fresh_artifacts():
    """Screenshots from an earlier run must not pass for this one's."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for old in ARTIFACTS.glob("*.png"):
        old.unlink()


@pytest.fixture
def server(tmp_path):
    """A Jupyter server (JupyterLab, Notebook 7 and Voila) on a free loopback port."""
    if not os.path.exists(CHROMIUM):
        pytest.skip("Debian's chromium is not installed (.ci/run installs it: apt-get install -y chromium)")
    pytest.importorskip("playwright")
    pytest.importorskip("jupyterlab")
    work = tmp_path / "work"
    work.mkdir()
    cells = [c.replace("SLOW_AT", str(SLOW_AT)) for c in NOTEBOOK_CELLS]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, work / "dash.ipynb")
    settings = tmp_path / "jupyter_config_dir" / "lab" / "user-settings"
    (settings / "@jupyterlab" / "apputils-extension").mkdir(parents=True)
    (settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False})
    )
    srv = JupyterServer(tmp_path, app="lab", env={"JUPYTERLAB_SETTINGS_DIR": str(settings)}, ready_s=60)
    try:
        yield srv.url.rstrip("/"), srv.token
    finally:
        srv.stop(gone_s=20)


def _browser():
    from playwright.sync_api import sync_playwright

    pw = sync_playwright().start()
    browser = pw.chromium.launch(
        executable_path=chromium_at_lane_priority(CHROMIUM), args=FLAGS, headless=True
    )
    return pw, browser


@pytest.mark.browser
def test_the_browser_runs_no_higher_than_the_lane_that_started_it():
    """Chromium run as root raises its own processes' priority (niceness -8 and 0 from a niced
    parent), which let a niced lane's live pages run above the timed lane's paced clusters."""
    import psutil

    pw, browser = _browser()
    try:
        page = browser.new_page()
        page.set_content("<p>priority</p>")
        page.wait_for_timeout(500)
        mine = os.nice(0)
        kids = [p for p in psutil.Process().children(recursive=True) if "chrom" in p.name()]
        assert kids and all(p.nice() >= mine for p in kids), (mine, [(p.name(), p.nice()) for p in kids])
    finally:
        browser.close()
        pw.stop()


def _kernel_idle(page, base: str, token: str, timeout: float = 120) -> None:
    """Wait until the notebook's kernel runs and is idle, as the server sees it.

    On a busy machine the front end sometimes asks which kernel to start
    (its list of kernels was not loaded yet when the page opened); a person
    clicks Select, with Python 3 already chosen, and so does this.
    """

    def idle():
        dialog = page.locator(".jp-Dialog", has_text="Select Kernel")
        if dialog.count() and dialog.first.is_visible():
            dialog.locator(".jp-mod-accept").first.click()
        with urllib.request.urlopen(f"{base}/api/sessions?token={token}", timeout=5) as r:
            sessions = json.load(r)
        return any(
            s.get("path", "").endswith("dash.ipynb")
            and (s.get("kernel") or {}).get("execution_state") == "idle"
            for s in sessions
        )

    poll_for(idle, timeout, interval=0.5, what="the notebook's kernel to start and be idle")


def _read_dashboard(page):
    img = page.locator(".tfmagic-dashboard img").first
    header = page.locator(".tfmagic-header").first
    return img.get_attribute("src"), header.inner_text()


def _updates(header_text: str) -> int:
    import re

    m = re.search(r"(\d+) updates", header_text)
    return int(m.group(1)) if m else -1


def _row(page, task: str) -> list[str]:
    """One task's row of the cluster table, as the page shows it."""
    for row in page.locator(".tfmagic-cluster tr").all():
        cells = [c.inner_text().strip() for c in row.locator("td").all()]
        if cells and cells[0] == task:
            return cells
    return []


def _rate(page, task: str) -> float:
    """The task's steps/s from its 'doing' cell ('training, 85 steps/s'), 0 when idle or absent."""
    import re

    row = _row(page, task)
    m = re.search(r"([\d.]+) steps/s", row[-1]) if row else None
    return float(m.group(1)) if m else 0.0


def _slowed(page, task: str) -> str:
    row = _row(page, task)
    return row[6] if len(row) > 6 else ""


def _check_live(page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    try:
        page.locator(".tfmagic-dashboard img").first.wait_for(timeout=90_000)
    except Exception:
        page.screenshot(path=str(ARTIFACTS / f"{name}-failed.png"), full_page=True)
        raise
    # past the warm-up: a run's first update can be followed by seconds of tracing on a loaded
    # machine, when nothing new is drawn (the CI failure: "1 updates" in both frames)
    poll_for(lambda: _updates(_read_dashboard(page)[1]) > 20, 120, what="training to show in the dashboard")
    src1, head1 = _read_dashboard(page)

    def newer():
        src, head = _read_dashboard(page)
        return (src, head) if src != src1 and _updates(head) > _updates(head1) else None

    # 15 s ran out once at niceness 19 beside a lesson (a clean-clone run); the page is live if it comes
    src2, head2 = poll_for(newer, 60, what="a new frame with more updates")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}-page.png"), full_page=True)
    page.locator(".tfmagic-dashboard").first.screenshot(path=str(ARTIFACTS / f"{name}-dashboard.png"))
    assert src1 != src2, "the dashboard picture did not change while training ran"
    assert _updates(head2) > _updates(head1), (head1, head2)
    assert "worker:1" in page.locator(".tfmagic-cluster").first.inner_text()


def test_dashboard_is_live_in_jupyterlab(server):
    base, token = server
    pw, browser = _browser()
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{base}/lab/tree/dash.ipynb?reset&token={token}")
        _kernel_idle(page, base, token)
        page.locator('.jp-StatusBar-TextItem[title^="Change kernel"]').filter(has_text="Idle").wait_for(
            timeout=120_000
        )
        page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
        page.locator('.lm-Menu-item[data-command="runmenu:run-all"]').click()
        _check_live(page, "jupyterlab")
        # worker:1 is slowed mid-run (after SLOW_AT updates): the page shows its rate drop
        poll_for(lambda: _rate(page, "worker:1") > 0, 60, what="worker:1 training in the table")
        before = _rate(page, "worker:1")
        assert _slowed(page, "worker:1") != "x4", "slowed before its rate was read: raise SLOW_AT"
        poll_for(lambda: _slowed(page, "worker:1") == "x4", 180, what="the slow mark in the table")
        seen = time.monotonic()
        peak = max(before, _rate(page, "worker:1"))  # the rate over the window before it took effect
        poll_for(
            lambda: 0 < _rate(page, "worker:1") < 0.5 * peak,
            30,
            interval=0.2,
            what=f"worker:1's rate to drop below half of {peak:.0f} steps/s",
        )
        print(
            f"worker:1 {peak:.0f} -> {_rate(page, 'worker:1'):.0f} steps/s, "
            f"{time.monotonic() - seen:.1f} s after the page showed the slow mark"
        )
        page.locator(".tfmagic-dashboard").first.screenshot(path=str(ARTIFACTS / "jupyterlab-slowed.png"))
    finally:
        browser.close()
        pw.stop()


def test_dashboard_is_live_in_voila(server):
    pytest.importorskip("voila")
    base, token = server
    pw, browser = _browser()
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{base}/voila/render/dash.ipynb?token={token}", timeout=300_000)
        _check_live(page, "voila")
    finally:
        browser.close()
        pw.stop()


def test_dashboard_is_live_in_notebook7(server):
    pytest.importorskip("notebook")
    base, token = server
    pw, browser = _browser()
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{base}/notebooks/dash.ipynb?token={token}")
        page.locator(".jp-Notebook").wait_for(timeout=120_000)
        _kernel_idle(page, base, token)
        poll_for(
            lambda: (
                "Idle"
                in (page.locator(".jp-Notebook-ExecutionIndicator").first.get_attribute("data-status") or "")
                or page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").count() > 0
            ),
            120,
            what="kernel idle",
        )
        page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
        page.locator('.lm-Menu-item[data-command="runmenu:run-all"]').click()
        _check_live(page, "notebook7")
    finally:
        browser.close()
        pw.stop()
