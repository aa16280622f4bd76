"""The Spark backend against a real Spark: local mode, and a standalone master and
worker started here on 127.0.0.1.

One ``local[3]`` cluster (1 ps + 2 workers) is shared by the tests at the top
of the module; the tests run in file order, and ``test_stop_...`` stops it.
The tests after it start their own (smaller) Spark applications, one at a
time: a Spark application with TensorFlow tasks costs about 2 GB and most of
this machine's two cores while it starts.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from tests.conftest import SHARED, assert_gone, card_read, poll_for, share
from tfmagic.network.ports import free_port

try:
    import pyspark  # noqa: F401

    _NO_PYSPARK = None
except ImportError:
    _NO_PYSPARK = "needs pyspark: pip install 'tfmagic[spark]'"

_NO_JAVA = (
    None
    if shutil.which("java")
    or os.path.exists(os.path.join(os.environ.get("JAVA_HOME", "/nonexistent"), "bin", "java"))
    else "needs Java 17+ for Spark (apt-get install default-jre-headless)"
)
_skip = pytest.mark.skipif(bool(_NO_PYSPARK or _NO_JAVA), reason=_NO_PYSPARK or _NO_JAVA or "")


def needs_spark(test):
    """A test that starts a real Spark application and TensorFlow task processes."""
    return pytest.mark.cluster(_skip(test))


def _get_json(url: str, timeout: float = 10.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.load(r)


def _my_task_processes() -> set[int]:
    """tfmagic task processes below this test process (Spark's JVM and workers included).

    Not ``conftest.no_leaks``: that one counts every task process on the
    machine, and other people's clusters come and go on a shared machine.
    """
    found = set()
    for child in psutil.Process().children(recursive=True):
        try:
            if "tfmagic.task_main" in child.cmdline():
                found.add(child.pid)
        except psutil.NoSuchProcess:
            pass
    return found


@pytest.fixture
def no_spark_leaks():
    """Fail a test that leaves task processes of its own behind (shared fixtures excepted)."""
    before = _my_task_processes()
    yield
    shared = set().union(*(f() for f in SHARED)) if SHARED else set()
    try:
        poll_for(lambda: not (_my_task_processes() - before - shared), 15, what="this test's tasks to end")
    except AssertionError:
        left = _my_task_processes() - before - shared
        for pid in left:  # ours (descendants of this process): clean up so one failure does not cascade
            try:
                psutil.Process(pid).kill()
            except psutil.NoSuchProcess:
                pass
        raise AssertionError(f"test left task processes behind: {sorted(left)}")


# -- fast tests: no Spark, no TensorFlow -------------------------------------------------


@pytest.mark.unit
def test_import_does_not_import_pyspark():
    code = "import sys, tfmagic, tfmagic.launchers.spark; assert 'pyspark' not in sys.modules, 'imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.unit
def test_missing_pyspark_says_what_to_install(monkeypatch):
    from tfmagic.errors import ClusterStartError
    from tfmagic.launchers import spark

    monkeypatch.setitem(sys.modules, "pyspark", None)
    with pytest.raises(ClusterStartError, match=r"pip install 'tfmagic\[spark\]'"):
        spark._import_pyspark()


@pytest.mark.unit
def test_too_few_local_slots_fail_before_spark_starts():
    from tfmagic import SparkCluster
    from tfmagic.errors import ClusterStartError

    cluster = SparkCluster("local[2]", ps=1, workers=2)
    with pytest.raises(ClusterStartError, match=r"local\[2\] has 2 task slots.*use master='local\[3\]'"):
        cluster.start()
    assert cluster.launcher._ctx is None  # no JVM was started for nothing


@pytest.mark.unit
def test_handshake_admits_only_the_secret_and_each_slot_once(tmp_path):
    """The listener's authentication, without Spark: the relay's own client code."""
    from tfmagic.launchers import spark_task
    from tfmagic.launchers.spark import Batch, Slot, SparkLauncher

    launcher = SparkLauncher("local[1]")
    host, port = launcher._listen()
    batch = Batch(id="b1", group="g", description="d", barrier=True)
    batch.slots = [Slot(batch, 0, str(tmp_path / "worker-0.log"))]
    launcher._batches["b1"] = batch
    good = {"host": host, "port": port, "secret": launcher._secret.hex(), "batch": "b1"}
    hello = {"batch": "b1", "slot": 0, "relay_pid": 1234, "channel": "control"}
    try:
        # Wrong secret: the driver hangs up without a word and logs the stranger.
        with pytest.raises(ConnectionError):
            spark_task.connect({**good, "secret": os.urandom(32).hex()}, hello)
        poll_for(lambda: len(launcher.refused) == 1, 5, what="the refusal to be recorded")
        assert "secret" in launcher.refused[0][2]
        # The right secret: admitted, and the driver proved it holds the secret too.
        sock, answer = spark_task.connect(good, hello)
        assert answer["ok"], answer
        # A second relay for the same slot (a retried Spark attempt) is turned away.
        sock2, answer2 = spark_task.connect(good, hello)
        assert not answer2["ok"] and "served already" in answer2["why"]
        # A relay that cannot check the driver's proof gives up (an impostor driver).
        impostor = socket.socket()
        impostor.bind(("127.0.0.1", 0))
        impostor.listen(1)

        def fake_driver():
            conn, _ = impostor.accept()
            conn.sendall(spark_task.GREETING + b" " + os.urandom(32).hex().encode() + b"\n")
            spark_task.read_line(conn)
            conn.sendall(b"0" * 64 + b"\n")
            time.sleep(0.5)
            conn.close()

        threading.Thread(target=fake_driver, daemon=True).start()
        with pytest.raises(ConnectionError, match="could not prove"):
            spark_task.connect({**good, "port": impostor.getsockname()[1]}, hello)
        impostor.close()
        for s in (sock, sock2):
            s.close()
    finally:
        launcher.close()


@pytest.mark.unit
def test_silent_strangers_cost_a_bounded_number_of_threads_and_a_relay_still_gets_in(tmp_path, capfd):
    """200 connections that never speak: at most MAX_HANDSHAKES threads for at most
    HANDSHAKE_SECONDS, the rest closed at once; all counted, nothing printed; a relay that
    arrives while strangers hold every handshake tries again and gets in."""
    from tfmagic.launchers import spark_task
    from tfmagic.launchers.spark import HANDSHAKE_SECONDS, MAX_HANDSHAKES, Batch, Slot, SparkLauncher

    launcher = SparkLauncher("local[1]")
    host, port = launcher._listen()
    batch = Batch(id="b1", group="g", description="d", barrier=True)
    batch.slots = [Slot(batch, 0, str(tmp_path / "worker-0.log"))]
    launcher._batches["b1"] = batch
    good = {"host": host, "port": port, "secret": launcher._secret.hex(), "batch": "b1"}
    hello = {"batch": "b1", "slot": 0, "relay_pid": 1234, "channel": "control"}
    capfd.readouterr()
    me = psutil.Process()
    threads_before, os_threads_before = threading.active_count(), me.num_threads()
    strangers: list[socket.socket] = []
    sock = None
    try:
        t0 = time.monotonic()
        strangers = [socket.create_connection((host, port), timeout=5) for _ in range(200)]
        peak, os_peak = threading.active_count(), me.num_threads()
        poll_for(
            lambda: launcher.refused_count >= 200 - MAX_HANDSHAKES, 5, what="the strangers beyond the bound"
        )
        peak, os_peak = max(peak, threading.active_count()), max(os_peak, me.num_threads())
        # Every handshake is held by a stranger now: the relay is turned away and tries again.
        sock, answer = spark_task.connect(good, hello)
        took = time.monotonic() - t0
        assert answer["ok"], answer
        assert took < HANDSHAKE_SECONDS + 5, took
        for stranger in strangers:  # the driver hung up on each one (after its greeting, for 8)
            stranger.settimeout(HANDSHAKE_SECONDS + 5)
            while stranger.recv(4096):
                pass
        # 200 strangers, and the times the relay was turned away before it got in
        assert launcher.refused_count >= 200
        with capfd.disabled():
            print(
                f"\n200 silent strangers: threads {threads_before} -> peak {peak} (OS {os_threads_before} "
                f"-> {os_peak}); the relay got in after {took:.1f} s"
            )
        assert peak <= threads_before + MAX_HANDSHAKES
        assert os_peak < os_threads_before + 20
        reasons = {r.reason for r in launcher.refused}
        assert f"{MAX_HANDSHAKES} handshakes were under way already" in reasons, reasons
        assert f"said nothing within {HANDSHAKE_SECONDS:g} s" in reasons, reasons
        assert len(launcher.refused) <= 20  # the last few kept; all counted
        assert (
            f"{launcher.refused_count} strangers refused, the last from 127.0.0.1:"
            in launcher.security_note()
        )
        poll_for(lambda: threading.active_count() <= threads_before, 5, what="the handshake threads to end")
        captured = capfd.readouterr()
        assert captured.err == "", captured.err
    finally:
        for s in strangers:
            s.close()
        if sock is not None:
            sock.close()
        launcher.close()


# -- a shared local[3] cluster ---------------------------------------------------------------


@pytest.fixture(scope="module")
def spark_cluster():
    if _NO_PYSPARK or _NO_JAVA:
        pytest.skip(_NO_PYSPARK or _NO_JAVA)
    from tfmagic import SparkCluster

    # ps:0 behind a modelled card's relay (no limit until a test sets one)
    cluster = SparkCluster("local[3]", ps=1, workers=2, name="spark", net="ps:0")
    t0 = time.monotonic()
    cluster.start()
    print(f"\nlocal[3], 1 ps + 2 workers, answering after {time.monotonic() - t0:.1f} s")
    handle = share(cluster)
    yield cluster
    SHARED.remove(handle)
    pids = [p.task_pid for p in cluster.procs.values()]
    cluster.close()
    cluster.launcher.close()
    assert_gone(pids)


def _ancestors(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).parents()


@needs_spark
def test_tasks_run_inside_spark_and_the_client_works(spark_cluster):
    import tensorflow as tf

    cluster = spark_cluster
    jvm = cluster.launcher._ctx.jvm.pid
    for task, proc in cluster.procs.items():
        assert proc.state.value == "running", (task, proc.state)
        assert proc.pid == proc.task_pid  # a real pid on this machine (local mode)
        # task process <- relay (a pyspark worker) <- pyspark daemon <- Spark's JVM
        assert jvm in [p.pid for p in _ancestors(proc.task_pid)], f"{task} is not under Spark's JVM"
        assert cluster.address(task).startswith("127.0.0.1:")
    cluster.connect()
    with cluster.device("ps:0"):
        w = tf.Variable(2.0)
    with cluster.device("worker:1"):
        y = w * 3.0 + 1.0
    assert y.numpy() == 7.0
    assert "/job:worker/replica:0/task:1" in y.device


@needs_spark
def test_status_and_logs(spark_cluster):
    status = spark_cluster.status()
    assert [r.task for r in status.tasks] == ["ps:0", "worker:0", "worker:1"]
    for row in status.tasks:
        assert row.state == "running"
        assert row.host == "spark:127.0.0.1"  # the executor's address
        assert row.pss and row.rss and row.pss < row.rss  # measured by the task itself
        assert row.uptime_s and row.uptime_s > 0
    assert any("authenticated" in note for note in status.notes)
    log = spark_cluster.logs("worker:1", tail=None)
    assert "started by a relay" in log
    assert "takes the role worker:1" in log
    assert "imported TensorFlow" in log  # the task's own stderr, carried back to this machine


@needs_spark
def test_cells_run_inside_the_spark_tasks(spark_cluster):
    """``%%tf_px``: code goes down the relayed channel and output streams back."""
    from tfmagic.px import run_px

    run = run_px(spark_cluster, "import os\nprint(job_name, task_index, flush=True)\nos.getppid()")
    outcomes = run.wait(60)
    launcher = spark_cluster.launcher
    for task, proc in spark_cluster.procs.items():
        outcome = outcomes[str(task)]
        assert outcome.status == "ok", outcome
        assert outcome.stdout == f"{task.job} {task.index}\n"
        assert outcome.result == launcher._by_pid[proc.pid].relay_pid  # its parent is the relay


@needs_spark
def test_spark_ui_shows_the_application_and_its_barrier_job(spark_cluster):
    launcher = spark_cluster.launcher
    sc = launcher.context
    tracker = sc.statusTracker()
    jobs = [tracker.getJobInfo(j) for j in tracker.getActiveJobsIds()]
    assert [j.status for j in jobs] == ["RUNNING"]
    stage_id = list(jobs[0].stageIds)[0]
    assert tracker.getStageInfo(stage_id).numTasks == 3
    # The tracker learns of task starts from Spark's listener bus, which runs behind the
    # scheduler on a loaded machine (CI once read 1 of 3 active while all three ran).
    poll_for(
        lambda: tracker.getStageInfo(stage_id).numActiveTasks == 3, 30, what="3 active tasks in the tracker"
    )
    # The UI's REST API, on loopback like the rest of the driver.
    assert launcher.ui_url.startswith("http://127.0.0.1:")
    apps = _get_json(launcher.ui_url + "/api/v1/applications")
    assert [a["name"] for a in apps] == ["tfmagic"]
    ui_jobs = _get_json(f"{launcher.ui_url}/api/v1/applications/{apps[0]['id']}/jobs")
    running = [j for j in ui_jobs if j["status"] == "RUNNING"]
    assert len(running) == 1
    assert running[0]["description"] == "tfmagic: ps:0, worker:0, worker:1 (barrier)"
    assert running[0]["numActiveTasks"] == 3
    # Nothing of the driver listens beyond loopback.
    for conn in psutil.Process(launcher._ctx.jvm.pid).net_connections(kind="inet"):
        if conn.status == psutil.CONN_LISTEN:
            assert conn.laddr.ip in ("127.0.0.1", "::ffff:127.0.0.1"), conn


@needs_spark
def test_a_stranger_on_the_listener_cannot_run_code(spark_cluster, no_spark_leaks, tmp_path):
    launcher = spark_cluster.launcher
    address = launcher._listener.getsockname()
    before = launcher.refused_count
    marker = tmp_path / "pwned"
    op = {"op": "exec", "id": "x", "code": f"open({str(marker)!r}, 'w').write('ran')"}
    attempts = [
        json.dumps(op).encode() + b"\n",  # a task op, straight away
        b"00" * 32 + b" " + b"ab" * 32 + b"\n" + json.dumps(op).encode() + b"\n",  # a made-up proof
        b"GET / HTTP/1.0\r\n\r\n",
        b"",  # says nothing and hangs up
    ]
    for payload in attempts:
        with socket.create_connection(address, timeout=5) as s:
            greeting = s.recv(200)
            assert greeting.startswith(b"TFMAGIC-SPARK/1 ")
            try:
                s.sendall(payload)
                s.shutdown(socket.SHUT_WR)
                answer = s.recv(200)
            except OSError:  # the listener hung up first (with our bytes unread: a reset)
                answer = b""
            assert answer == b"", "the listener answered a stranger"
    poll_for(lambda: launcher.refused_count == before + len(attempts), 5, what="every stranger to be refused")
    time.sleep(0.5)
    assert not marker.exists()
    # The tasks did not notice.
    assert (
        spark_cluster.procs[spark_cluster.check_task("worker:0")].request("ping", timeout=5)["event"]
        == "pong"
    )


@needs_spark
def test_200_strangers_cost_few_threads_print_nothing_and_show_in_status(spark_cluster, capfd):
    """The under-abuse finding: 200 connections that never speak (200 gave the kernel 225 threads,
    and each refusal printed a warning into the cell) and some that send garbage."""
    import tensorflow as tf

    from tfmagic.launchers.spark import HANDSHAKE_SECONDS
    from tfmagic.px import run_px

    cluster = spark_cluster
    launcher = cluster.launcher
    address = launcher._listener.getsockname()
    capfd.readouterr()
    me = psutil.Process()
    before, py_before = me.num_threads(), threading.active_count()
    refused_before = launcher.refused_count
    garbage = [os.urandom(300), b"GET / HTTP/1.0\r\n\r\n", b"\n" * 10, b"x" * 5000, b"{}\n"]
    conns: list[socket.socket] = []
    t0 = time.monotonic()
    try:
        conns = [socket.create_connection(address, timeout=5) for _ in range(200)]
        for i in range(20):
            s = socket.create_connection(address, timeout=5)
            conns.append(s)
            try:
                s.sendall(garbage[i % len(garbage)])
            except OSError:  # refused (closed) already
                pass
        peak, py_peak = me.num_threads(), threading.active_count()
        while (
            launcher.refused_count < refused_before + 220 and time.monotonic() - t0 < HANDSHAKE_SECONDS + 10
        ):
            peak, py_peak = max(peak, me.num_threads()), max(py_peak, threading.active_count())
            time.sleep(0.02)
        took = time.monotonic() - t0
    finally:
        for s in conns:
            s.close()
    with capfd.disabled():
        print(
            f"\n220 strangers: kernel threads {before} -> peak {peak} (Python {py_before} -> {py_peak}); "
            f"all refused after {took:.1f} s"
        )
    assert launcher.refused_count == refused_before + 220
    assert peak < before + 20 and py_peak < py_before + 20
    captured = capfd.readouterr()
    assert captured.err == "", captured.err[-2000:]
    notes = " ".join(cluster.status().notes)
    assert f"{launcher.refused_count} strangers refused" in notes, notes
    # The cluster did not notice: a %%tf_px cell and a computation on its tasks.
    t1 = time.monotonic()
    outcomes = run_px(cluster, "print(job_name, task_index, flush=True)").wait(60)
    assert all(o.status == "ok" for o in outcomes.values()), outcomes
    cluster.connect()
    with cluster.device("ps:0"):
        v = tf.Variable(3.0)
    with cluster.device("worker:0"):
        assert (v * 2.0).numpy() == 6.0
    with capfd.disabled():
        print(f"the cluster answered after the flood in {time.monotonic() - t1:.2f} s")


@needs_spark
def test_slow_kill_and_restart(spark_cluster):
    import tensorflow as tf

    cluster = spark_cluster
    cluster.connect()
    with cluster.device("ps:0"):
        v = tf.Variable(5.0)
    cluster.slow("worker:1", 3)
    row = next(r for r in cluster.status().tasks if r.task == "worker:1")
    assert row.note == "slowed x3"
    assert "running at 1/3 speed" in cluster.logs("worker:1", tail=5)
    cluster.slow("worker:1", 1)

    old = cluster.procs[cluster.check_task("worker:1")]
    others = [p.task_pid for t, p in cluster.procs.items() if str(t) != "worker:1"]
    address = cluster.address("worker:1")
    t0 = time.monotonic()
    cluster.kill("worker:1")
    assert_gone([old.task_pid], timeout=10)
    print(f"\nkill: gone in {time.monotonic() - t0:.2f} s")
    assert all(psutil.pid_exists(p) for p in others)
    assert [e.kind for e in cluster.events if e.task == "worker:1"][-1] == "kill"
    # The barrier job lives on with the other two tasks.
    tracker = cluster.launcher.context.statusTracker()
    assert [tracker.getJobInfo(j).status for j in tracker.getActiveJobsIds()] == ["RUNNING"]

    # A Spark stage cannot grow: the restarted task is a (one-task) Spark job of its own.
    outcome = cluster.restart("worker:1")
    print(f"restart: {outcome.seconds:.1f} s")
    new = cluster.procs[cluster.check_task("worker:1")]
    assert new.alive and new.task_pid != old.task_pid
    assert cluster.address("worker:1") == address
    ui = cluster.launcher.ui_url
    app = _get_json(ui + "/api/v1/applications")[0]["id"]
    running = sorted(
        j["description"]
        for j in _get_json(f"{ui}/api/v1/applications/{app}/jobs")
        if j["status"] == "RUNNING"
    )
    assert running == ["tfmagic: ps:0, worker:0, worker:1 (barrier)", "tfmagic: worker:1 (restart)"]
    with cluster.device("worker:1"):
        assert (v + 1.0).numpy() == 6.0  # the ps kept its variable


@needs_spark
def test_training_engine_on_spark_tasks(spark_cluster):
    import tfmagic

    history = tfmagic.train(spark_cluster, mode="async", model="linear", steps=60, lr=0.05)
    assert history.final_loss is not None
    assert {r.task for r in history.records} >= {"worker:0", "worker:1"}
    history = tfmagic.train(spark_cluster, mode="sync", model="linear", steps=20, lr=0.05)
    assert history.final_loss is not None and history.final_loss == history.final_loss


@needs_spark
def test_a_card_paces_a_spark_ps_and_a_link_names_its_source_task(spark_cluster):
    """Issue 25's modelled network on the scheduler backends: a card on a Spark task's ps paces a read
    from it (2.5 MB at 20 mbit: at least the modelled second), and a link rule from a worker applies to
    that worker's connections: the relay names their source (the worker's bytes cross its link)."""
    import tfmagic

    took, _ = card_read(spark_cluster, "20mbit")
    assert took >= 0.8, f"2.5 MB at 20 mbit took {took:.2f} s: the card was not applied"
    spark_cluster.net("worker:0->ps:0", rate="1gbit")
    try:
        tfmagic.train(spark_cluster, mode="async", model="linear", steps=30)
        link = next(r for r in spark_cluster.net().rows if r["kind"] == "link")
    finally:
        spark_cluster.net("worker:0->ps:0", rate=None)
    assert link["src"] == "worker:0" and link["to_task"] > 0, link


@needs_spark
def test_stop_ends_every_task_and_the_spark_application(spark_cluster):
    """Run last of the shared-cluster tests: it stops the shared cluster."""
    cluster = spark_cluster
    launcher = cluster.launcher
    jvm = launcher._ctx.jvm.pid
    ui = launcher.ui_url
    tasks = [p.task_pid for p in cluster.procs.values()]
    relays = [launcher._by_pid[p.pid].relay_pid for p in cluster.procs.values()]

    def listeners() -> int:
        return len([t for t in threading.enumerate() if t.name == "tfmagic-spark-listen"])

    listening = listeners()
    t0 = time.monotonic()
    cluster.stop()
    assert_gone(tasks + relays, timeout=15)
    print(f"\nstop: tasks gone after {time.monotonic() - t0:.2f} s")
    assert_gone([jvm], timeout=30)  # the Spark application ended with the cluster
    with pytest.raises(OSError):
        urllib.request.urlopen(ui, timeout=2)
    assert launcher._ctx is None and not launcher._batches
    # the driver's listener and its thread are gone too (a stopped cluster keeps nothing open)
    poll_for(lambda: listeners() == listening - 1, 5, what="the listener thread to end")


@needs_spark
def test_a_wrong_master_is_one_line_saying_what_to_do(no_spark_leaks):
    """Runs after the shared cluster stopped (a process holds one SparkContext)."""
    from tfmagic import SparkCluster
    from tfmagic.errors import ClusterStartError

    port = free_port()
    cases = [
        ("spark://nohost:1", r"cannot reach the Spark master spark://nohost:1: there is no host 'nohost'"),
        (
            f"spark://127.0.0.1:{port}",
            rf"cannot reach the Spark master .*nothing answers at 127.0.0.1:{port}",
        ),
        ("bogus", r"Spark cannot use the master 'bogus': Master must .*; use local\[N\], spark://HOST:PORT"),
    ]
    for master, expected in cases:
        cluster = SparkCluster(master, ps=0, workers=1, name="wrong")
        t0 = time.monotonic()
        with pytest.raises(ClusterStartError) as info:
            cluster.start()
        message = str(info.value)
        print(f"\n{master}: after {time.monotonic() - t0:.1f} s: {message}")
        assert "\n" not in message and "at org.apache" not in message, message
        assert re.search(expected, message), message
        if master.startswith("spark://"):
            assert "check that the master is running" in message.lower(), message
        assert cluster.launcher._ctx is None
    assert not [p for p in psutil.Process().children(recursive=True) if p.name() == "java"]


@needs_spark
def test_cancelled_spark_job_ends_the_cluster(no_spark_leaks):
    """Killing the job in Spark (UI or API) ends every task, and the cluster says so."""
    from tfmagic import SparkCluster

    cluster = SparkCluster("local[2]", ps=1, workers=1, name="cancelled")
    cluster.start()
    launcher = cluster.launcher
    jvm = launcher._ctx.jvm.pid
    try:
        tasks = [p.task_pid for p in cluster.procs.values()]
        group = next(iter(launcher._batches.values())).group
        t0 = time.monotonic()
        launcher.context.cancelJobGroup(group)
        assert_gone(tasks, timeout=15)
        print(f"\njob cancelled: tasks gone after {time.monotonic() - t0:.2f} s")
        poll_for(
            lambda: sorted(e.task for e in cluster.events if e.kind == "lost") == ["ps:0", "worker:0"],
            10,
            what="the cluster to report both tasks lost",
        )
        assert not any(p.alive for p in cluster.procs.values())
    finally:
        cluster.close()
        launcher.close()
    assert_gone([jvm], timeout=30)


@needs_spark
def test_stopped_tasks_end_when_killed_or_when_their_relay_dies(no_spark_leaks):
    """A task stopped with SIGSTOP cannot read the end of its channel.  ``kill``: the relay
    ends it once its connection is closed; job cancelled: Spark kills the relay and the
    kernel kills the task with it (TFMAGIC_PDEATHSIG, set by the relay)."""
    from tfmagic import SparkCluster

    cluster = SparkCluster("local[2]", ps=1, workers=1, name="stopped")
    cluster.start()
    launcher = cluster.launcher
    jvm = launcher._ctx.jvm.pid
    procs = {str(t): p for t, p in cluster.procs.items()}
    tasks = {name: p.task_pid for name, p in procs.items()}
    relays = {name: launcher._by_pid[p.pid].relay_pid for name, p in procs.items()}
    try:
        for name, pid in tasks.items():  # set by the relay, for the task's own start-up
            environ = psutil.Process(pid).environ()
            assert environ.get("TFMAGIC_PDEATHSIG") == "1", environ
            assert environ.get("TFMAGIC_OWNER_PID") == str(relays[name]), environ
        for pid in tasks.values():
            os.kill(pid, signal.SIGSTOP)
            poll_for(lambda pid=pid: psutil.Process(pid).status() == psutil.STATUS_STOPPED, 5, what="SIGSTOP")
        t0 = time.monotonic()
        cluster.kill("worker:0")
        assert_gone([tasks["worker:0"]], timeout=5)
        print(f"\nkill of a stopped task: gone after {time.monotonic() - t0:.1f} s")
        group = next(iter(launcher._batches.values())).group
        t0 = time.monotonic()
        launcher.context.cancelJobGroup(group)
        assert_gone([relays["ps:0"]], timeout=30)
        t1 = time.monotonic()
        assert_gone([tasks["ps:0"]], timeout=2)
        poll_for(lambda: not any(p.alive for p in cluster.procs.values()), 10, what="the cluster to see it")
        print(
            f"job cancelled: relay gone after {t1 - t0:.1f} s, the stopped task "
            f"{time.monotonic() - t1:.2f} s later"
        )
    finally:
        for pid in tasks.values():
            try:
                psutil.Process(pid).kill()
            except psutil.NoSuchProcess:
                pass
        cluster.close()
        launcher.close()
    assert_gone([jvm], timeout=30)


@needs_spark
def test_executors_without_tensorflow_are_explained(no_spark_leaks, tmp_path):
    """The executors' Python lacks TensorFlow: the start fails with the task's log and what to do."""
    from tfmagic import SparkCluster
    from tfmagic.errors import ClusterStartError

    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    cluster = SparkCluster("local[1]", ps=0, workers=1, python=python, name="bare")
    with pytest.raises(ClusterStartError) as info:
        cluster.start()
    message = str(info.value)
    assert f"install TensorFlow for {python}" in message, message
    assert "No module named 'tensorflow'" in info.value.log_tail
    assert cluster.launcher._ctx is None  # the failed start ended the Spark application


_DRIVER = textwrap.dedent(
    """
    import json, sys, time
    from tfmagic import SparkCluster
    cluster = SparkCluster("local[2]", ps=1, workers=1, name="doomed")
    cluster.start()
    launcher = cluster.launcher
    print(json.dumps({
        "tasks": [p.task_pid for p in cluster.procs.values()],
        "relays": [launcher._by_pid[p.pid].relay_pid for p in cluster.procs.values()],
        "jvm": launcher._ctx.jvm.pid,
    }), flush=True)
    time.sleep(600)
    """
)


@needs_spark
def test_killed_driver_takes_every_task_with_it(no_spark_leaks, tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(_DRIVER)
    driver = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=open(tmp_path / "driver.err", "wb"),  # noqa: SIM115 - closed with the process
        cwd=str(Path(__file__).resolve().parents[1]),
    )
    info: dict = {}
    try:
        line = driver.stdout.readline()
        assert line, (tmp_path / "driver.err").read_text()[-3000:]
        info = json.loads(line)
        everything = info["tasks"] + info["relays"] + [info["jvm"]]
        assert all(psutil.pid_exists(p) for p in everything)
        t0 = time.monotonic()
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        assert_gone(info["tasks"], timeout=10)
        took = time.monotonic() - t0
        print(f"\ndriver SIGKILLed: its TF tasks gone after {took:.2f} s")
        assert_gone(info["relays"] + [info["jvm"]], timeout=20)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        # Orphans are no longer below this process: end what the driver reported, by pid.
        for pid in info.get("tasks", []) + info.get("relays", []) + [info.get("jvm")]:
            try:
                if pid and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    psutil.Process(pid).kill()
            except psutil.NoSuchProcess:
                pass


# -- a standalone master and worker on 127.0.0.1 -------------------------------------------------


class _Standalone:
    """``spark-class`` Master and Worker processes, ended by their pids."""

    def __init__(self, root: Path, cores: int = 3) -> None:
        from pyspark.find_spark_home import _find_spark_home

        spark_class = os.path.join(_find_spark_home(), "bin", "spark-class")
        self.port, self.ui_port, worker_ui = free_port(), free_port(), free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_WORKER_DIR": str(root / "work")}
        self.procs: list[subprocess.Popen] = []
        self.logs = {name: root / f"{name}.log" for name in ("master", "worker")}
        with open(self.logs["master"], "wb") as out:
            self.procs.append(
                subprocess.Popen(
                    [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                     "--port", str(self.port), "--webui-port", str(self.ui_port)],
                    stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env, start_new_session=True,
                )
            )  # fmt: skip
        poll_for(lambda: self._state().get("status") == "ALIVE", 60, 0.2, what="the Spark master")
        with open(self.logs["worker"], "wb") as out:
            self.procs.append(
                subprocess.Popen(
                    [spark_class, "org.apache.spark.deploy.worker.Worker", self.url, "--host", "127.0.0.1",
                     "--cores", str(cores), "--memory", "4g", "--webui-port", str(worker_ui),
                     "--work-dir", str(root / "work")],
                    stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env, start_new_session=True,
                )
            )  # fmt: skip
        poll_for(
            lambda: [w for w in self._state().get("workers", []) if w.get("state") == "ALIVE"],
            60,
            0.2,
            what="the Spark worker to register",
        )

    def _state(self) -> dict:
        try:
            return _get_json(f"http://127.0.0.1:{self.ui_port}/json/", timeout=2)
        except OSError:
            return {}

    def pids(self) -> list[int]:
        found = []
        for p in self.procs:
            found.append(p.pid)
            try:
                found += [c.pid for c in psutil.Process(p.pid).children(recursive=True)]
            except psutil.NoSuchProcess:
                pass
        return found

    def close(self) -> None:
        everything = self.pids()
        for p in reversed(self.procs):  # the worker first: it ends its executors
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        for pid in everything:  # anything the JVMs left behind
            try:
                psutil.Process(pid).kill()
            except psutil.NoSuchProcess:
                pass
        assert_gone(everything, timeout=15)


@needs_spark
def test_standalone_master_and_worker(no_spark_leaks, tmp_path):
    import tensorflow as tf

    from tfmagic import SparkCluster

    standalone = _Standalone(tmp_path, cores=3)
    try:
        cluster = SparkCluster(standalone.url, ps=1, workers=2, name="standalone")
        t0 = time.monotonic()
        cluster.start()
        print(f"\nstandalone, 1 ps + 2 workers, answering after {time.monotonic() - t0:.1f} s")
        try:
            apps = standalone._state()["activeapps"]
            assert [a["name"] for a in apps] == ["tfmagic"] and apps[0]["cores"] == 3
            executors = {p.pid for p in psutil.Process(standalone.procs[1].pid).children(recursive=True)}
            for proc in cluster.procs.values():
                assert proc.task_pid in executors  # under the worker's executor, not under this process
            cluster.connect()
            with cluster.device("ps:0"):
                w = tf.Variable(4.0)
            with cluster.device("worker:0"):
                assert (w * 2.0).numpy() == 8.0
            tasks = [p.task_pid for p in cluster.procs.values()]
        finally:
            cluster.close()
            cluster.launcher.close()
        assert_gone(tasks, timeout=15)
        poll_for(
            lambda: [a["name"] for a in standalone._state().get("completedapps", [])] == ["tfmagic"],
            30,
            what="the master to list the application as completed",
        )
    finally:
        standalone.close()
