"""tfmagic's pages in a real Jupyter server, seen by a real headless Chromium.

One server per module, as a class would have it: on loopback, base URL
``/user/test/`` (JupyterHub's shape) and a token.  A real kernel, started
through the server's REST API for a notebook, starts a paced cluster and
trains with TensorBoard logs; the browser then reads the cluster list, a
dashboard page whose frame must change while the kernel trains, TensorBoard
through jupyter-server-proxy, and the server must refuse what comes without
the token.  Everything the tests start is ended by its pid and checked gone.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import psutil
import pytest

from .conftest import assert_gone, chromium_at_lane_priority, load_per_core, poll_for
from .jupyterutil import JupyterServer, Kernel

pytestmark = [pytest.mark.server, pytest.mark.kernel, pytest.mark.cluster]
ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts" / "server"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# TensorBoard draws its curves with WebGL: software GL, so the screenshots show them
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--no-first-run",
    "--disable-background-networking",
    "--use-angle=swiftshader",
    "--enable-unsafe-swiftshader",
]
BASE_URL = "/user/test/"
STEPS = 4000  # a paced async run of about a minute here: long enough to watch, short enough to finish


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def _get(url: str, redirect: bool = True) -> tuple[int, dict, bytes]:
    opener = urllib.request.build_opener() if redirect else urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(url, timeout=20) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def _extension_config_installed() -> bool:
    data = Path(sysconfig.get_path("data")) / "etc" / "jupyter" / "jupyter_server_config.d" / "tfmagic.json"
    return data.exists()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A Jupyter server on loopback with base URL /user/test/ and a token; tfmagic's extension as installed."""
    tmp = tmp_path_factory.mktemp("server")
    (tmp / "work").mkdir()
    (tmp / "work" / "class.ipynb").write_text(
        json.dumps(
            {
                "cells": [],
                "metadata": {
                    "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
                },
                "nbformat": 4,
                "nbformat_minor": 5,
            }
        )
    )
    env = {}
    if not _extension_config_installed():
        # An editable install (pip install -e) does not install data files: read the same file
        # from the repository, through the same config mechanism a real install uses.
        env["JUPYTER_CONFIG_PATH"] = str(ROOT / "jupyter-config")
    srv = JupyterServer(
        tmp,
        app="server",
        base_url=BASE_URL,
        env=env,
        drop_env=("TFMAGIC_PUBLISH_DIR", "TENSORBOARD_PROXY_URL"),
    )
    try:
        yield srv
    finally:
        srv.stop()
        assert not list(srv.runtime.glob("tfmagic-pages-*")), "the server left its pages directory behind"


@pytest.fixture(scope="module")
def trained(server, tmp_path_factory):
    """A kernel of class.ipynb with a paced 1 ps + 2 worker cluster, training async with TensorBoard logs."""
    logdir = tmp_path_factory.mktemp("tb")
    kernel = Kernel(server)
    tasks: set[int] = set()
    try:
        kernel.run("%load_ext tfmagic")
        kernel.run("%tf_cluster start --ps 1 --workers 2 --pace 30ms")
        kernel.run(
            "import tfmagic\n"
            f"run = tfmagic.train(tfmagic.current_cluster(), mode='async', model='digits', steps={STEPS}, "
            f"lr=0.05, logdir={str(logdir)!r}, block=False)"
        )
        poll_for(
            lambda: int(kernel.run("print(run.history.steps)").split()[-1]) > 20,
            120,
            interval=0.5,
            what="the run's first updates",
        )
        tasks = {
            int(p)
            for p in kernel.run(
                "print(*[p.task_pid for p in tfmagic.current_cluster().procs.values()])"
            ).split()
        }
        yield kernel, logdir
    finally:
        boards = []
        try:
            kernel.run("run.stop()")
            boards = [
                int(p)
                for p in kernel.run(
                    "print(*[b.pid for b in tfmagic.tensorboard._running.values() if b.alive])"
                ).split()
            ]
        finally:
            pid = int(kernel.pid)
            kernel.close()
        assert_gone([pid, *tasks, *boards], timeout=30)


def _live_cluster(server) -> str:
    clusters = json.loads(_get(f"{server.url}tfmagic/api/clusters?token={server.token}")[2])["clusters"]
    return next(c["id"] for c in clusters if c["state"] == "running")


def _browser():
    from playwright.sync_api import sync_playwright

    pw = sync_playwright().start()
    return pw, pw.chromium.launch(
        executable_path=chromium_at_lane_priority(CHROMIUM), args=FLAGS, headless=True
    )


@pytest.fixture(scope="module")
def page(server):
    """A Chromium page logged in with the token (Jupyter sets its login cookie from ?token=)."""
    if not os.path.exists(CHROMIUM):
        pytest.skip("Debian's chromium is not installed (.ci/run installs it: apt-get install -y chromium)")
    pytest.importorskip("playwright")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    pw, browser = _browser()
    try:
        page = browser.new_page(viewport={"width": 1200, "height": 1000})
        page.goto(f"{server.url}tfmagic/?token={server.token}")
        yield page
    finally:
        browser.close()
        pw.stop()


# -- install ---------------------------------------------------------------------------------------


def test_installing_tfmagic_enables_the_extension(tmp_path):
    """The wheel carries the config file that enables tfmagic.server in etc/jupyter (no manual step)."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("tfmagic-*.whl")
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith("etc/jupyter/jupyter_server_config.d/tfmagic.json"))
        config = json.loads(z.read(name))
    assert config == {"ServerApp": {"jpserver_extensions": {"tfmagic.server": True}}}
    import tfmagic.server

    assert tfmagic.server._jupyter_server_extension_points() == [{"module": "tfmagic.server"}]


# -- pages -----------------------------------------------------------------------------------------


@pytest.mark.browser
def test_the_list_shows_the_notebooks_cluster(server, trained, page):
    page.goto(f"{server.url}tfmagic/")
    row = page.locator("#tfmagic-clusters tr[data-cluster]").first
    row.wait_for(timeout=20_000)
    text = row.inner_text()
    assert "class.ipynb" in text and "1 ps, 2 workers" in text and "running" in text, text
    assert re.search(r"\d+(\.\d+)? [MG]B", text), f"no memory figure in {text!r}"
    page.screenshot(path=str(ARTIFACTS / "list.png"))
    href = row.locator("a").get_attribute("href")
    assert href.startswith("cluster/") and href.endswith("/")


@pytest.mark.browser
def test_the_dashboard_page_is_live_while_the_kernel_trains(server, trained, page):
    kernel, _ = trained
    page.goto(f"{server.url}tfmagic/")
    page.locator("#tfmagic-clusters a").first.click()
    from playwright.sync_api import TimeoutError as PageTimeout

    first_frame = "Number(document.getElementById('tfmagic-frame').dataset.frame) > 0"
    try:
        page.wait_for_function(first_frame, timeout=20_000)
    except PageTimeout as exc:
        # A starved machine (this lane runs at niceness 19, the kernel's paced run beside a lesson):
        # the first frame also builds the kernel's Dashboard (its imports, its figure), so it is
        # given a minute more from a lower load than the later frames are (below); then it fails.
        load = load_per_core()
        if load < 2:
            raise AssertionError(f"no frame in 20 s at a load of {load:.1f} per core") from exc
        page.wait_for_function(first_frame, timeout=60_000)
    img = page.locator("#tfmagic-frame")

    def shot():
        src = img.evaluate(
            "async (el) => { const r = await fetch(el.src); const b = new Uint8Array(await r.arrayBuffer());"
            " let h = 0; for (const x of b) h = (h * 31 + x) >>> 0; return [el.dataset.frame, h, b.length]; }"
        )
        return int(src[0]), src[1], page.locator("#tfmagic-header").inner_text()

    steps0 = int(kernel.run("print(run.history.steps)").split()[-1])
    t0 = time.monotonic()
    first = shot()
    page.wait_for_timeout(5000)
    last = shot()
    load = load_per_core()
    if load >= 3:
        # A starved machine (this lane runs at niceness 19 beside a lesson): the page must still be
        # live, so watch until it has shown three new frames, for at most a minute.
        while last[0] - first[0] < 3 and time.monotonic() - t0 < 60:
            page.wait_for_timeout(1000)
            last = shot()
    elapsed = time.monotonic() - t0
    steps1 = int(kernel.run("print(run.history.steps)").split()[-1])
    page.screenshot(path=str(ARTIFACTS / "dashboard.png"))
    assert steps1 > steps0, "the kernel was not training while the page watched"
    rate = (last[0] - first[0]) / elapsed
    print(f"dashboard page: {rate:.1f} frames/s over {elapsed:.1f} s (load {load:.1f} per core)")
    # A frame costs the kernel 30-60 ms of CPU (a full redraw 350 ms), beside its training threads.
    # With more than 3 runnable processes per core (other test runs on this machine; measured here up
    # to 16 per core) it cannot get that twice a second: then the page must still be live (above).
    if load < 3:
        assert rate >= 2.0, f"the page showed {rate:.1f} frames a second (load {load:.1f} per core); want 2"
    else:
        assert last[0] - first[0] >= 3, (
            f"the page showed {last[0] - first[0]} new frames in {elapsed:.0f} s (load {load:.1f} per core)"
        )
    assert last[1] != first[1], "the picture did not change while the kernel trained"
    assert last[2] != first[2], f"the header did not change: {first[2]!r}"
    table = page.locator("#tfmagic-table").inner_text()
    assert "worker:0" in table and "ps:0" in table, table


@pytest.mark.browser
def test_a_cluster_that_never_existed_or_stopped_is_a_clear_404(server, trained, page):
    status, _, body = _get(f"{server.url}tfmagic/cluster/no-such-cluster/?token={server.token}")
    text = body.decode()
    assert status == 404 and "There is no cluster no-such-cluster on this server" in text
    assert "Traceback" not in text
    assert _get(f"{server.url}tfmagic/cluster/..%2F..%2Fetc/?token={server.token}")[0] == 404
    # a kernel that died without saying so (kill -9): its record says running, the server knows better
    pages = next(server.runtime.glob("tfmagic-pages-*"))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    record = {"id": f"{dead.pid}-c9", "kernel_pid": dead.pid, "kernel_started": "1", "cluster": "c9"}
    record |= {
        "shape": "1 ps, 3 workers",
        "state": "running",
        "started_at": time.time(),
        "updated_at": time.time(),
    }
    (pages / f"{dead.pid}-c9.json").write_text(json.dumps(record))
    page.goto(f"{server.url}tfmagic/")
    row = page.locator(f"tr[data-cluster='{dead.pid}-c9']")
    row.wait_for(timeout=10_000)
    assert "stopped (its kernel ended)" in row.inner_text()
    assert row.locator("a").count() == 0, "a stopped cluster must not link to a live page"
    response = page.goto(f"{server.url}tfmagic/cluster/{dead.pid}-c9/")
    assert response.status == 404
    assert "has stopped (its kernel ended)" in page.locator("#tfmagic-404").inner_text()
    (pages / f"{dead.pid}-c9.json").unlink()


def test_requests_without_the_token_are_refused(server, trained):
    rid = _live_cluster(server)
    for path in ("tfmagic/", f"tfmagic/cluster/{rid}/"):
        status, headers, _ = _get(server.url + path, redirect=False)
        assert status == 302 and "/user/test/login" in headers["Location"], (path, status)
    for path in (
        "tfmagic/api/clusters",
        f"tfmagic/cluster/{rid}/frame.png",
        f"tfmagic/cluster/{rid}/frame.json",
    ):
        assert _get(server.url + path, redirect=False)[0] == 403, path
    assert _get(f"{server.url}tfmagic/api/clusters?token=wrong", redirect=False)[0] == 403


# -- TensorBoard -----------------------------------------------------------------------------------


@pytest.mark.browser
def test_tensorboard_shows_the_runs_scalars_through_the_proxy(server, trained, page):
    kernel, logdir = trained
    # stopped rather than waited for: its logs hold every update so far (a paced 4,000-step run took
    # over 240 s to finish in the niced lane of a loaded clean-clone run, and this test failed waiting)
    kernel.run("run.stop()")
    poll_for(
        lambda: "done" in kernel.run("print('done' if run.history.done else run.history.steps)"),
        60,
        interval=1,
        what="the run to stop",
    )
    # TensorBoard imports TensorFlow to start: a minute or more when other test runs share the machine
    out = kernel.run(f"tb = tfmagic.tensorboard.show({str(logdir)!r}, timeout=240)\ntb", timeout=300)
    m = re.search(r"<iframe src='([^']+)'", out)
    assert m, f"no TensorBoard frame: {out[-800:]}"
    src = m.group(1)
    assert re.fullmatch(r"/user/test/proxy/\d+/", src), src
    board_pid = int(kernel.run("print(tb.pid)").split()[-1])
    assert psutil.Process(board_pid).is_running()
    proxied = f"http://127.0.0.1:{server.url.split(':')[2].split('/')[0]}{src}"
    status, _, body = _get(f"{proxied}data/plugin/scalars/tags?token={server.token}")
    tags = json.loads(body)
    assert status == 200 and {"async/worker-0", "async/worker-1", "async/global"} <= set(tags), tags
    assert {"loss", "step_time_s", "staleness"} <= set(tags["async/worker-0"])
    assert {"loss", "heldout_loss"} <= set(tags["async/global"])
    histograms = json.loads(_get(f"{proxied}data/plugin/histograms/tags?token={server.token}")[2])
    assert {"weights/hidden/kernel", "weights/output/bias"} <= set(histograms["async/global"]), histograms
    # what a person sees: TensorBoard's own page, through the proxy, lists the runs and plots loss
    page.goto(proxied)
    page.get_by_text("async/worker-0").first.wait_for(timeout=60_000)
    page.get_by_text("step_time_s").first.wait_for(timeout=60_000)
    page.wait_for_timeout(3000)  # the charts draw after their data arrives: let the screenshot show them
    page.screenshot(path=str(ARTIFACTS / "tensorboard.png"))
    assert _get(proxied, redirect=False)[0] in (302, 403), "TensorBoard must be behind the server's login"
    assert kernel.run("print(tfmagic.tensorboard.show(" + repr(str(logdir)) + ") is tb)").strip() == "True"


def test_tensorboard_for_a_missing_logdir_says_so_in_one_line(trained):
    kernel, logdir = trained
    out = kernel.run(f"tfmagic.tensorboard.show({str(logdir / 'nope')!r})")
    text = out.split("\nHTML:")[0].strip()
    assert text.startswith("no TensorBoard logs at") and "does not exist" in text and "\n" not in text, text


def test_nobody_watching_costs_no_drawing(server, trained):
    """Once no page has asked for WATCH_FRESH seconds, the kernel stops drawing and drops its dashboard."""
    from tfmagic.publish import WATCH_FRESH

    kernel, _ = trained
    rid = _live_cluster(server)
    pages = next(server.runtime.glob("tfmagic-pages-*"))

    def frame_number(look: bool) -> int:
        if look:  # as a page does: this marks the cluster watched
            return json.loads(_get(f"{server.url}tfmagic/cluster/{rid}/frame.json?token={server.token}")[2])[
                "frame"
            ]
        return json.loads((pages / f"{rid}.frame.json").read_text())["frame"]  # behind the server's back

    first = frame_number(True)
    poll_for(lambda: frame_number(True) > first + 2, 20, interval=0.2, what="the kernel to draw for a page")
    time.sleep(WATCH_FRESH + 1)
    probe = "from tfmagic import publish\nprint(sum(i.dashboard is not None for i in publish._publisher._items.values()))"
    # a frame begun while the page still looked can still be drawing on a loaded machine (CI saw one
    # outlast the check): the dashboard goes at the first tick after it, and nothing is drawn after that
    poll_for(
        lambda: kernel.run(probe).split()[-1] == "0",
        30,
        interval=0.5,
        what="the kernel to drop the dashboard (and its subscriptions) nobody watches",
    )
    stopped_at = frame_number(False)
    time.sleep(2)
    assert frame_number(False) == stopped_at, "the kernel drew frames nobody asked for"


@pytest.mark.browser
def test_tensorboard_displays_inside_a_jupyterlab_notebook(server, trained, page):
    """The one-liner's output in JupyterLab: TensorBoard in a frame, through the proxy, runs listed."""
    _, logdir = trained
    cell = {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None}
    cell["source"] = f"import tfmagic\ntfmagic.tensorboard.show({str(logdir)!r}, timeout=240)"
    nb = {
        "cells": [cell],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    (server.work / "tb.ipynb").write_text(json.dumps(nb))
    server_proc = psutil.Process(server.proc.pid)

    def session():
        return next((s for s in server.api("GET", "api/sessions") if s["path"] == "tb.ipynb"), None)

    def idle():
        dialog = page.locator(".jp-Dialog", has_text="Select Kernel")
        if dialog.count() and dialog.first.is_visible():
            dialog.locator(".jp-mod-accept").first.click()
        s = session()
        return s is not None and (s.get("kernel") or {}).get("execution_state") == "idle"

    kernel_pids: list[int] = []
    try:
        page.goto(f"{server.url}lab/tree/tb.ipynb?reset")
        poll_for(idle, 180, interval=0.5, what="the notebook's kernel to start and be idle")
        kernel_id = session()["kernel"]["id"]
        kernel_pids = [p.pid for p in server_proc.children() if any(kernel_id in a for a in p.cmdline())]
        page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
        page.locator('.lm-Menu-item[data-command="runmenu:run-all"]').click()
        frame = page.frame_locator(".jp-OutputArea-output iframe")
        frame.get_by_text("async/worker-0").first.wait_for(timeout=180_000)
        src = page.locator(".jp-OutputArea-output iframe").first.get_attribute("src")
        assert re.fullmatch(r"/user/test/proxy/\d+/", src), src
        page.wait_for_timeout(2000)
        page.screenshot(path=str(ARTIFACTS / "jupyterlab-tensorboard.png"))
    finally:
        boards = [
            c.pid
            for k in kernel_pids
            for c in psutil.Process(k).children()
            if any(a.startswith("--logdir=") for a in c.cmdline())
        ]
        s = session()
        if s is not None:
            server.api("DELETE", f"api/sessions/{s['id']}")
        assert_gone(kernel_pids + boards, timeout=30)
        page.goto(f"{server.url}tfmagic/")


@pytest.mark.kernel
def test_tensorboards_own_magic_goes_through_the_proxy(server, trained):
    """%tensorboard reads TENSORBOARD_PROXY_URL, which the extension set for its kernels."""
    kernel, logdir = trained
    kernel.run("%load_ext tensorboard")
    for _ in range(3):  # TensorBoard's own magic gives up after 60 s (a loaded machine); again, it reuses
        out = kernel.run(f"%tensorboard --logdir {logdir} --host 127.0.0.1", timeout=300)
        if "Timed out waiting for TensorBoard" not in out:
            break
    pids = kernel.run(
        "import psutil\n"
        "print(*[p.pid for p in psutil.Process().children() if '-c' not in p.cmdline() "
        f"and any('tensorboard' in a for a in p.cmdline()) and {str(logdir)!r} in p.cmdline()])"
    ).split()
    try:
        assert len(pids) == 1, f"expected one TensorBoard started by %tensorboard, found {pids}: {out[-600:]}"
        m = re.search(r'"/user/test/proxy/(\d+)/"', out)
        assert m, f"%tensorboard did not point its frame at the proxy: {out[-600:]}"
        status, _, body = _get(f"{server.url}proxy/{m.group(1)}/data/runs?token={server.token}")
        assert status == 200 and "async/global" in json.loads(body)
    finally:
        for pid in pids:  # TensorBoard's own magic leaves its process to outlive the kernel: end it here
            psutil.Process(int(pid)).kill()
        assert_gone([int(p) for p in pids])


@pytest.mark.unit
def test_a_publish_directory_others_could_write_is_refused(tmp_path, monkeypatch):
    from tfmagic import publish

    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    monkeypatch.setenv(publish.ENV_DIR, str(shared))
    assert publish.directory() is None
    shared.chmod(0o755)  # others may read what training shows: not private either
    assert publish.directory() is None
    link = tmp_path / "link"
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    link.symlink_to(private)
    monkeypatch.setenv(publish.ENV_DIR, str(link))
    assert publish.directory() is None
    monkeypatch.setenv(publish.ENV_DIR, str(private))
    assert publish.directory() == private
    monkeypatch.delenv(publish.ENV_DIR)
    assert publish.announce(object()) is False  # not started by a server: nothing done, nothing paid


@pytest.mark.unit
def test_write_puts_a_finished_history_in_tensorboard_per_task(tmp_path):
    """tfmagic.tensorboard.write for a run trained without logdir= (TensorFlow's writer, no cluster)."""
    pytest.importorskip("tensorflow")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tfmagic import tensorboard
    from tfmagic.metrics import GlobalStep, History, StepRecord

    history = History("sync", run="sync")
    for step in range(5):
        for w in range(2):
            history.add_step(
                StepRecord(
                    f"worker:{w}", step, step, step + 0.1, 1.0 / (step + 1), mode="sync", local_step=step
                )
            )
        history.add_global(GlobalStep(step + 1, step + 0.2, 1.0 / (step + 1)))
    history.add_eval(5, 1.0, 0.25)
    root = tensorboard.write(history, tmp_path)
    assert root == tmp_path / "sync"
    assert sorted(p.name for p in root.iterdir()) == ["global", "worker-0", "worker-1"]
    worker = EventAccumulator(str(root / "worker-1"))
    worker.Reload()
    assert {"loss", "step_time_s", "dropped"} <= set(worker.Tags()["tensors"])
    glob = EventAccumulator(str(root / "global"))
    glob.Reload()
    assert [e.step for e in glob.Tensors("loss")] == [1, 2, 3, 4, 5]
    assert [e.step for e in glob.Tensors("heldout_loss")] == [5]


@pytest.mark.unit
def test_a_killed_servers_directory_and_long_dead_kernels_records_are_removed(tmp_path):
    from tfmagic.publish import process_start
    from tfmagic.server import records

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    stale = tmp_path / f"{records.PREFIX}stale"
    stale.mkdir(mode=0o700)
    (stale / records.OWNER).write_text(f"{gone.pid} 1\n")
    mine = records.make_dir(tmp_path)  # a new server: removes the directories of dead ones
    assert not stale.exists() and mine.exists()
    assert oct(mine.stat().st_mode & 0o777) == "0o700"
    assert (mine / records.OWNER).read_text().split() == [str(os.getpid()), process_start(os.getpid())]
    old = {"id": f"{gone.pid}-c1", "kernel_pid": gone.pid, "kernel_started": "1", "state": "running"}
    (mine / f"{gone.pid}-c1.json").write_text(
        json.dumps(old | {"updated_at": time.time() - records.PRUNE_AFTER - 1})
    )
    (mine / f"{gone.pid}-c1.png").write_bytes(b"png")
    recent = old | {"id": f"{gone.pid}-c2", "updated_at": time.time()}
    (mine / f"{gone.pid}-c2.json").write_text(json.dumps(recent))
    listed = records.read_all(mine)
    assert [r["id"] for r in listed] == [f"{gone.pid}-c2"] and listed[0]["state"] == "stopped"
    assert not (mine / f"{gone.pid}-c1.json").exists() and not (mine / f"{gone.pid}-c1.png").exists()
    assert records.read(mine, "../etc/passwd") is None
