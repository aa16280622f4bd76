"""A class on a real JupyterHub: the teacher's class page, the scope it reads by, the limits.

One hub for the module (tests/hubhost.py): a teacher in the group ``teachers``, two students, alice
and bob, in ``class-2026``, tfmagic's service configured with ``tfmagic.hub.configure`` and limits
with ``tfmagic.hub.limits``, exactly as a hub's admin writes them.  Each student's server is spawned
by the hub; a real kernel of each starts a paced cluster and trains; the teacher logs in through the
hub's own login page in headless Chromium and reads the class page.  Then both students run the
class experiment and the page's table gathers them.  Tokens the hub makes for each user check the
privacy rules from outside.  Stopping the hub must end everything.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tfmagic.errors import BadArgument
from tfmagic.network.ports import free_port

from .conftest import GRAPH_PROBE, assert_gone, chromium_at_lane_priority, poll_for, ran_again
from .hubhost import Hub, available
from .jupyterutil import Kernel

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts" / "hub"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
EXPERIMENT = "staleness"  # the shortest of the class experiments (about 15 s here)
MAX_TASKS = 7  # the experiment's 5 tasks beside a training cluster's 2

CONFIG = f"""
import tfmagic.hub
c.JupyterHub.load_groups = {{
    "teachers": {{"users": ["teacher"]}},
    "class-2026": {{"users": ["alice", "bob"]}},
}}
tfmagic.hub.configure(c, teachers="teachers", students="class-2026", experiment={EXPERIMENT!r})
tfmagic.hub.limits(c, max_tasks={MAX_TASKS}, set_by="the course's hub admin")
"""


def on_the_hub(test):
    """The tiers of a test on the module's hub: a server (the hub's), kernels, clusters."""
    return pytest.mark.server(pytest.mark.kernel(pytest.mark.cluster(test)))


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    why = available()
    if why:
        pytest.skip(why)
    h = Hub(tmp_path_factory.mktemp("hub"), CONFIG)
    try:
        yield h
    finally:
        h.stop()


@pytest.fixture(scope="module")
def students(hub):
    """alice's and bob's kernels, each with a paced 1 ps + 1 worker cluster training async."""
    kernels = {}
    try:
        for name in ("alice", "bob"):
            kernels[name] = Kernel(hub.start_server(name), notebook=f"{name}.ipynb")
        for k in kernels.values():
            k.run("%load_ext tfmagic\nimport tfmagic")
            out = k.run("%tf_cluster start --ps 1 --workers 1 --pace 30ms")
            assert "running" in k.run("print(tfmagic.current_cluster() and 'running')"), out
            k.cluster = k.run("print(tfmagic.current_cluster().name)").split()[-1]
            k.run(
                "import tfmagic\nrun = tfmagic.train(tfmagic.current_cluster(), mode='async', model='digits', "
                "steps=100000, lr=0.05, block=False)"
            )
        yield kernels
    finally:
        for k in kernels.values():
            try:
                k.run("run.stop(); %tf_cluster stop", timeout=60)
            except Exception:  # noqa: BLE001 - the hub's stop ends the kernel anyway (checked there)
                pass
            k.close()


@pytest.fixture(scope="module")
def teacher_page(hub):
    """Chromium logged in as the teacher through the hub's login page, on the class page."""
    if not os.path.exists(CHROMIUM):
        pytest.skip("Debian's chromium is not installed (.ci/run installs it)")
    from playwright.sync_api import sync_playwright

    pw = sync_playwright().start()
    browser = pw.chromium.launch(
        executable_path=chromium_at_lane_priority(CHROMIUM),
        args=["--headless", "--no-sandbox"],
        headless=True,
    )
    try:
        page = browser.new_page(viewport={"width": 1300, "height": 1000})
        page.goto(f"{hub.url}hub/login?next=/services/tfmagic/")
        page.fill("#username_input", "teacher")
        page.fill("#password_input", "class-password")
        page.click("#login_submit")
        page.wait_for_url("**/services/tfmagic/**", timeout=60_000)
        yield page
    finally:
        browser.close()
        pw.stop()


def _class(page, check, timeout: float = 60):
    """Poll the class page's own data until ``check(data)`` holds; returns the data."""

    def look():
        status, text = page.evaluate(
            "async () => { const r = await fetch('api/class', {cache: 'no-store', headers: {'X-XSRFToken': XSRF}});"
            " return [r.status, await r.text()]; }"
        )
        assert status == 200, (page.url, status, text[:500])
        data = json.loads(text)
        return data if check(data) else None

    return poll_for(look, timeout, interval=1.0, what="the class page's data")


@pytest.mark.browser
@on_the_hub
def test_the_teacher_sees_every_students_cluster_while_they_train(hub, students, teacher_page):
    page = teacher_page

    def training(data):
        rows = {s["name"]: s for s in data["students"]}
        return all(
            any(c["state"] == "running" and (c.get("run_steps") or 0) > 0 for c in rows[n]["clusters"])
            for n in ("alice", "bob")
        )

    data = _class(page, training, timeout=120)
    for name in ("alice", "bob"):
        row = page.locator(f"#tfmagic-students tr[data-student='{name}'][data-cluster]").first
        row.wait_for(timeout=30_000)
        # the page refreshes every 2 s: its rows catch up with the data read above
        text = poll_for(lambda row=row: "updates/s" in (t := row.inner_text()) and t, 30, interval=0.5)
        assert students[name].cluster in text and "1 ps, 1 worker" in text and "running" in text, text
        assert "updates/s" in text and f"of {MAX_TASKS} tasks" in text, text
    usage = {s["name"]: s["usage"] for s in data["students"]}
    assert usage["alice"]["tasks"] == 2 and usage["alice"]["max_tasks"] == MAX_TASKS, usage
    # a student's dashboard, read-only, its frames relayed from the student's server
    page.locator("#tfmagic-students tr[data-student='alice'] a").first.click()
    page.wait_for_url("**/student/alice/cluster/**")
    first = int(poll_for(lambda: int(page.get_attribute("#tfmagic-frame", "data-frame") or 0) or None, 60))
    poll_for(
        lambda: int(page.get_attribute("#tfmagic-frame", "data-frame") or 0) > first, 30, what="a newer frame"
    )
    width = "document.getElementById('tfmagic-frame').naturalWidth"
    poll_for(lambda: page.evaluate(width) > 100, 30, interval=0.5, what="the relayed picture")
    page.go_back()


@pytest.mark.browser
@on_the_hub
def test_a_students_hang_shows_on_the_class_page_with_the_doctors_words(hub, students, teacher_page):
    page = teacher_page
    page.goto(f"{hub.url}services/tfmagic/")
    ps = int(students["bob"].run("print(tfmagic.current_cluster().procs['ps:0'].task_pid)").split()[-1])
    os.kill(ps, signal.SIGSTOP)  # bob's ps stops answering: his async run waits on it
    try:
        hang = page.locator("#tfmagic-students tr[data-student='bob'] .tfmagic-hang").first
        hang.wait_for(timeout=60_000)
        # the doctor's line, refreshed with the page: it comes to name the stopped ps
        said = poll_for(
            lambda: "ps:0" in (t := hang.inner_text()) and t, 30, interval=0.5, what=hang.inner_text
        )
        assert "SIGSTOP" in said or "stopped" in said, said
        assert not page.locator("#tfmagic-students tr[data-student='alice'] .tfmagic-hang").count()
    finally:
        os.kill(ps, signal.SIGCONT)
    page.wait_for_function(
        "!document.querySelector(\"#tfmagic-students tr[data-student='bob'] .tfmagic-hang\")", timeout=60_000
    )


@on_the_hub
def test_scopes_keep_students_apart_and_teachers_read_only(hub, students):
    bob, teacher = hub.token("bob"), hub.token("teacher")
    # a student: not the class page, not another student's tfmagic, not their server
    assert hub.call("GET", "services/tfmagic/api/class", token=bob)[0] == 403
    assert hub.call("GET", "user/alice/tfmagic/api/class", token=bob)[0] == 403
    assert hub.call("GET", "user/alice/tfmagic/api/clusters", token=bob)[0] == 403
    assert hub.call("GET", "user/alice/tfmagic/api/class")[0] == 403  # the admin service holds no such scope
    # a student's own class API: also 403 (the scope is a teacher's, not everyone's on themselves)
    status, body = hub.call("GET", "user/bob/tfmagic/api/class", token=bob)
    assert status == 403 and "custom:tfmagic:read" in body["message"], body
    # the teacher: alice's tfmagic by scope, and nothing else of her server
    status, body = hub.call("GET", "user/alice/tfmagic/api/class", token=teacher)
    assert status == 200 and body["user"] == "alice", (status, body)
    assert any(c["cluster"] == students["alice"].cluster for c in body["clusters"]), body
    for path in ("api/contents", "api/kernels", "tfmagic/api/clusters", "tfmagic/"):
        assert hub.call("GET", f"user/alice/{path}", token=teacher)[0] in (302, 403), path
    # no token, or one the hub never made
    assert hub.call("GET", "user/alice/tfmagic/api/class", token="not-a-token")[0] == 403


def _targets(kernel) -> dict[str, str]:
    """Where a student's tasks and kernel serve TensorFlow, as ``grpc://`` targets."""
    said = kernel.run(
        "import json\nfrom tfmagic import client\n_c = tfmagic.current_cluster()\n"
        "_jobs = _c.spec.as_dict()\n"
        "print(json.dumps({'ps:0': _jobs['ps'][0], 'worker:0': _jobs['worker'][0], "
        "'kernel': f'127.0.0.1:{client.client_port()}'}))"
    )
    return {name: f"grpc://{address}" for name, address in json.loads(said.strip().splitlines()[-1]).items()}


@on_the_hub
def test_a_students_graph_is_refused_by_every_task_and_the_kernel_of_another(hub, students):
    """Issue 24 item 0 on the hub itself, with the students as the Unix users a hub gives them: a
    graph bob's kernel sends (from a process of his, as a student's own code would) to each of alice's
    tasks and to her kernel's own TensorFlow server is never run there, while the same graph sent to
    bob's own tasks and kernel returns 42, so the check can fail."""
    import pwd

    import psutil

    if not hub.as_users:
        pytest.skip("the hub's users are not Unix users of their own here (needs root, unshare, setpriv)")
    alice, bob = _targets(students["alice"]), _targets(students["bob"])
    args = [f"alice/{n}={t}" for n, t in alice.items()] + [f"bob/{n}={t}" for n, t in bob.items()]
    said = students["bob"].run(
        "import subprocess, sys\n"
        f"_p = subprocess.run([sys.executable, '-c', {GRAPH_PROBE!r}, *{args!r}], capture_output=True, text=True, timeout=150)\n"
        "print(_p.stdout.strip().splitlines()[-1] if _p.stdout.strip() else 'no output: ' + _p.stderr[-800:])",
        timeout=180,
    )
    results = json.loads(said.strip().splitlines()[-1])
    assert results["uid"] == pwd.getpwnam("tfmagic-test-bob").pw_uid, results
    for name in alice:
        assert results[f"bob/{name}"] == 42.0, results
        assert results[f"alice/{name}"] in ("UnavailableError", "DeadlineExceededError"), results
    # and alice's tasks are hers: processes of her own Unix user
    ps = int(students["alice"].run("print(tfmagic.current_cluster().procs['ps:0'].task_pid)").split()[-1])
    assert psutil.Process(ps).username() == "tfmagic-test-alice"


@on_the_hub
def test_a_start_beyond_the_hubs_limit_is_refused_in_one_line(hub, students):
    out = students["alice"].run("%tf_cluster add worker --count 6")
    lines = [ln for ln in out.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and f"over the {MAX_TASKS} tasks" in lines[0], out
    assert "the course's hub admin" in lines[0], out
    assert "Traceback" not in out


@pytest.mark.browser
@on_the_hub
def test_the_class_experiment_becomes_one_table(hub, students, teacher_page):
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page = teacher_page
    page.goto(f"{hub.url}services/tfmagic/")
    # each student runs it with a seed of their own, their training stopped first, one after the other:
    # two paced experiments at once beside the other lane missed their pace in two clean-clone runs
    # (200 ms: 20-26 % of the steps late, at a load of 6 per core)
    for k in students.values():
        k.run("run.stop()")
    printed = {}
    for i, (name, k) in enumerate(students.items()):
        printed[name] = k.run(
            f"r = %tf_experiment {EXPERIMENT} --seed {i + 1}\nprint(r.verdict)", timeout=300
        )
    data = _class(page, lambda d: d["table"]["ran"] == 2, timeout=60)
    table = data["table"]
    measured = lambda t: sum(1 for r in t["rows"] for c in r["checks"] if c["value"] is not None)  # noqa: E731
    if measured(table) == 0 and all("could not keep" in (r["why"] or "") for r in table["rows"]):
        # both missed their pace: each said so, and what it tells a student is to run it again; alice
        # does, so the page has figures to draw
        ran_again("the class experiment", "; ".join(f"{r['name']}: {r['why']}" for r in table["rows"]))
        printed["alice"] = students["alice"].run(
            f"r = %tf_experiment {EXPERIMENT} --seed 1\nprint(r.verdict)", timeout=300
        )
        try:
            data = _class(page, lambda d: measured(d["table"]) > 0, timeout=60)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; alice's second run printed: {printed['alice'][-600:]}") from None
        table = data["table"]
    assert table["experiment"] == EXPERIMENT and table["students"] == 2
    assert {r["name"]: r["seed"] for r in table["rows"]} == {"alice": 1, "bob": 2}
    page.wait_for_function(
        "document.querySelectorAll('#tfmagic-results tbody tr').length == 2", timeout=30_000
    )
    verdict = page.inner_text("#tfmagic-verdict")
    assert verdict.startswith(f"{table['held']} of 2 students' runs hold"), verdict
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "class.png"), full_page=True)
    checks = measured(table)
    with contextlib.suppress(PlaywrightTimeout):  # the page draws the figures on its next poll
        page.wait_for_function(
            f"document.querySelectorAll('#tfmagic-strips circle.tfmagic-dot').length == {checks}",
            timeout=15_000,
        )
    dots = page.locator("#tfmagic-strips circle.tfmagic-dot").count()
    assert dots == checks > 0, (dots, [(r["name"], r["why"]) for r in table["rows"]])
    # each row says what that student's kernel printed
    for name, k in students.items():
        printed = k.run("print(r.verdict, r.seed)").split()
        row = next(r for r in table["rows"] if r["name"] == name)
        assert printed[-1] == str(row["seed"]) and (row["holds"] == (printed[0] == "holds")), (printed, row)


def _in_thread(coroutine):
    """Run ``coroutine`` on an event loop of its own (Playwright's sync API holds this thread's)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result(60)


@pytest.mark.server
def test_a_missing_or_empty_group_is_one_line_in_the_hubs_log(hub):
    from tfmagic.hub.service import check_groups

    assert hub.call("POST", "hub/api/groups/nobody-yet")[0] == 201  # a group with no members
    api = f"{hub.url}hub/api"
    cfg = {"teachers": "no-such-group", "students": "nobody-yet"}
    teachers, students = _in_thread(check_groups(cfg, api, hub.admin_token))
    assert "'no-such-group' does not exist on this hub" in teachers, teachers
    assert "'nobody-yet' has no members" in students, students
    ok = _in_thread(check_groups({"teachers": "teachers", "students": "class-2026"}, api, hub.admin_token))
    assert ok == []
    # the service said nothing at its start: both of its groups have members
    assert "tfmagic.hub: the" not in hub.log_path.read_text().replace("tfmagic.hub: the class page", "")


@pytest.mark.cluster
def test_the_service_ends_when_the_hub_that_started_it_is_killed(tmp_path):
    """A hub killed with -9 stops no service: the class page's process sees its parent go and ends."""
    pytest.importorskip("jupyterhub")
    env = dict(
        os.environ,
        TFMAGIC_HUB_TEACHERS="teachers",
        TFMAGIC_HUB_STUDENTS="class-2026",
        TFMAGIC_HUB_PROXY="http://127.0.0.1:1",
        JUPYTERHUB_SERVICE_URL=f"http://127.0.0.1:{free_port()}",
        JUPYTERHUB_API_TOKEN="unused",
        JUPYTERHUB_API_URL="http://127.0.0.1:1/hub/api",
    )
    log = tmp_path / "service.log"
    # a stand-in hub: a shell whose child is the service, killed -9 as a crashed hub would be
    hub = subprocess.Popen(
        ["bash", "-c", f"{sys.executable} -m tfmagic.hub >{log} 2>&1 & echo $!; wait"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    service = int(hub.stdout.readline())
    poll_for(
        lambda: log.exists() and "the class page of class-2026" in log.read_text(),
        60,
        what="the service start",
    )
    hub.kill()
    hub.wait(10)
    assert_gone([service], timeout=15)
    assert "the hub that started this service is gone" in log.read_text()


# -- the hub's configuration: one line for what is wrong ---------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"teachers": "class", "students": "class"}, "must be another group"),
        ({"teachers": "t", "students": "s", "experiment": "nope"}, "not an experiment"),
        ({"teachers": "", "students": "s"}, "name of a JupyterHub group"),
        ({"teachers": "t/x", "students": "s"}, "name of a JupyterHub group"),
        ({"teachers": "t", "students": "s", "hub_url": "ftp://x"}, "http(s)://host:port"),
    ],
)
def test_a_bad_class_configuration_is_one_line(kwargs, words):
    from traitlets.config import Config

    import tfmagic.hub

    c = Config()
    with pytest.raises(BadArgument, match=words.replace("(", r"\(").replace(")", r"\)")):
        tfmagic.hub.configure(c, **kwargs)
    assert "services" not in c.JupyterHub, "nothing configured"


@pytest.mark.unit
def test_configure_gives_the_teachers_the_scope_filtered_to_the_class_and_no_access():
    from traitlets.config import Config

    import tfmagic.hub

    c = Config()
    c.JupyterHub.bind_url = "http://:8123/"
    service = tfmagic.hub.configure(c, teachers="teachers", students="class-2026")
    assert service["environment"]["TFMAGIC_HUB_PROXY"] == "http://127.0.0.1:8123"
    (role,) = [r for r in c.JupyterHub.load_roles if r.get("groups") == ["teachers"]]
    assert "custom:tfmagic:read!group=class-2026" in role["scopes"]
    assert not [s for s in role["scopes"] if s.startswith(("access:servers", "admin", "servers", "users"))], (
        role
    )
    assert json.dumps(c.JupyterHub.custom_scopes)  # the scope is defined for the hub
    assert c.Spawner.environment["TFMAGIC_HUB_SERVICE"] == "tfmagic"
    # the server's class API reads the same names the hub's configuration writes (separate layers)
    from tfmagic.server import classapi

    assert (classapi.SCOPE, classapi.ENV_SERVICE) == (tfmagic.hub.SCOPE, tfmagic.hub.ENV_SERVICE)


@pytest.mark.unit
def test_a_students_frame_reaches_the_teacher_without_script_or_attributes():
    pytest.importorskip("jupyterhub")
    from tfmagic.hub.service import safe_frame

    body = json.dumps(
        {
            "frame": 7,
            "time": 1.5,
            "state": "running",
            "header_html": "<div onclick='steal()'>run <b>async</b></div><script>fetch('/hub/token')</script>",
            "table_html": "<table><tr><td style='x'><a href='javascript:x'>ps:0</a></td></tr></table>",
            "extra": "<img src=x onerror=alert(1)>",
        }
    ).encode()
    frame = safe_frame(body)
    assert frame["frame"] == 7 and frame["time"] == 1.5 and frame["state"] == "running"
    assert "extra" not in frame
    text = frame["header_html"] + frame["table_html"]
    assert "<script" not in text and "onclick" not in text and "style" not in text and "href" not in text, (
        text
    )
    assert frame["table_html"] == "<table><tr><td>ps:0</td></tr></table>"
    assert safe_frame(b"not json") == {"frame": 0, "header_html": "", "table_html": ""}
