"""Tasks sharing processes (``processes=``): each still a server of its own, trained on, watched,
refused in one line for what one of them cannot do alone, and gone with its owner."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

import tfmagic
from tfmagic.errors import BadArgument, BadClusterShape, PxError, SharedProcess, WillNotFit
from tfmagic.launchers.local import check_processes, process_sizes

from .conftest import magic_refusal, poll_for

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def shared():
    """1 ps + 3 workers in two processes: ps:0, worker:0 in one; worker:1, worker:2 in the other."""
    cluster = tfmagic.LocalCluster(ps=1, workers=3, processes=2, spares=False, name="shared")
    cluster.start()
    yield cluster
    cluster.stop()


def test_tasks_share_two_processes_and_each_serves_and_trains(shared):
    pids = {str(t): p.pid for t, p in shared.procs.items()}
    assert pids["ps:0"] == pids["worker:0"] != pids["worker:1"] == pids["worker:2"], pids
    assert len({a for a in shared.cluster_def.as_dict()["worker"]}) == 3  # an address each
    status = shared.status()
    assert "process of 2 tasks, with worker:0" in status["ps:0"].note, status["ps:0"].note
    by_process = {}
    for row in status.tasks:
        by_process[row.pid] = row.pss
    assert status.total_pss == sum(by_process.values()), "a shared process is counted once"
    shared.connect()
    for mode, steps in (("async", 90), ("sync", 20)):
        history = tfmagic.train(shared, mode=mode, model="digits", steps=steps)
        assert history.steps == steps and history.error is None
        per_worker = {w: len(r) for w, r in history.by_task().items()}
        assert set(per_worker) == {"worker:0", "worker:1", "worker:2"} and min(per_worker.values()) > 0, (
            per_worker
        )
    # every task of a shared process gets an inter-op pool for all of them + 2 (the hang otherwise)
    log = shared.logs("worker:2")
    assert "takes the role worker:2" in log and "takes the role worker:1" in log  # one log, the process's


@pytest.mark.parametrize(
    "action, doing",
    [
        (lambda c: c.remove("worker:2"), "removing"),
        (lambda c: c.slow("worker:2", 4), "throttling"),
    ],
)
def test_what_one_task_cannot_do_alone_is_one_line_and_changes_nothing(shared, action, doing):
    before = {str(t): p.pid for t, p in shared.procs.items()}
    with pytest.raises(SharedProcess) as err:
        action(shared)
    text = str(err.value)
    assert "\n" not in text and f"{doing} it would do the same to them" in text and "processes=" in text, text
    assert {str(t): p.pid for t, p in shared.procs.items()} == before
    assert all(p.alive for p in shared.procs.values())


#: A fresh Python, as a kernel is: TensorFlow's first connection of a process is made lazily, by the
#: first op, and that is the path a task killed between the start and the first run used to hang.
_KILL_ALONE = """
import json, socket, sys, time, psutil, tfmagic
from tfmagic.errors import TrainingError
out = {}
c = tfmagic.LocalCluster(ps=1, workers=3, processes=1, spares=False, name="kill-alone")
c.start()
c.connect()
pid = c.procs["worker:1"].pid
c.kill("worker:1")  # before any op ran in this process
out["killed"] = [c.procs["worker:1"].alive, c.condition("worker:1"), psutil.pid_exists(pid)]
out["notes"] = {row.task: row.note for row in c.status().tasks}
host, port = c.cluster_def.address("worker:1").rsplit(":", 1)
try:
    socket.create_connection((host, int(port)), timeout=2).close()
    out["refused"] = False
except ConnectionRefusedError:
    out["refused"] = True
out["why"] = str(c.why())
taker = socket.socket()  # another program takes the dead server's port
taker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
taker.bind((host, int(port)))
taker.listen()
try:
    c.restart("worker:1")
    out["taken"] = None
except Exception as exc:
    out["taken"] = [type(exc).__name__, str(exc), c.condition("worker:1")]
taker.close()
t = time.monotonic()
h = tfmagic.train(c, mode="async", steps=120, model="digits")
out["dead_run"] = [h.steps, h.error, sorted(h.by_task()), round(time.monotonic() - t, 1)]
r = c.restart("worker:1")
out["restart"] = [c.procs["worker:1"].alive, c.procs["worker:1"].pid == pid, c.condition("worker:1")]
h = tfmagic.train(c, mode="async", steps=120, model="digits")
out["back"] = [h.steps, h.error, sorted(h.by_task())]
run = tfmagic.train(c, mode="async", steps=300, model="digits", checkpoint_every=20, block=False)
while run.history.steps < 60:
    time.sleep(0.05)
c.kill("ps:0")
try:
    run.wait()
    out["ps_lost"] = None
except TrainingError as exc:
    out["ps_lost"] = str(exc)
try:
    tfmagic.train(c, mode="sync", steps=10, model="digits")
    out["dead_ps_run"] = None
except TrainingError as exc:
    out["dead_ps_run"] = str(exc)
c.restart("ps:0")
try:
    run.params.variables[0].numpy()
    out["old_variable"] = "still there"
except Exception as exc:
    out["old_variable"] = type(exc).__name__
run.resume()
out["resumed"] = [run.history.steps, run.error]
out["pids"] = sorted({p.pid for p in c.procs.values()})
c.stop()
out["gone"] = not any(psutil.pid_exists(p) for p in out["pids"])
print("RESULT " + json.dumps(out, default=str), flush=True)
"""


def test_a_shared_task_killed_alone_dies_as_modelled_and_comes_back_empty():
    """Issue 23 item 2: killing one task of a shared process cuts its server off (connections broken,
    its port refusing, as a dead machine's), the process serving the others on; the engine sees a lost
    worker or ps as it does a killed process; a restart serves again in the same process, empty."""
    done = subprocess.run([sys.executable, "-c", _KILL_ALONE], capture_output=True, text=True, timeout=240)
    line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    assert done.returncode == 0 and line, done.stderr[-3000:]
    out = json.loads(line[0][len("RESULT ") :])
    assert out["killed"] == [False, "killed (modelled)", True], out["killed"]
    assert out["refused"], "its port refuses a connection, as a dead process's does"
    notes = out["notes"]
    assert notes["worker:0"] == "process of 4 tasks, with ps:0, worker:2 (1 killed)", notes
    assert notes["worker:1"] == "process of 4 tasks, with ps:0, worker:0, worker:2", notes
    assert "worker:1 it is dead: killed on purpose, its server cut off" in out["why"], out["why"]
    kind, said, condition = out["taken"]
    assert kind == "ClusterStartError" and "could not get its port" in said and "\n" not in said, out["taken"]
    assert condition == "killed (modelled)", "still dead, and restarted below once the port is free"
    steps, error, workers, seconds = out["dead_run"]
    assert steps == 120 and error is None and workers == ["worker:0", "worker:2"], out["dead_run"]
    assert seconds < 60, "the run did not wait on the dead task"
    assert out["restart"] == [True, True, "running"], out["restart"]
    assert out["back"] == [120, None, ["worker:0", "worker:1", "worker:2"]], out["back"]
    assert out["ps_lost"] and "ps:0 was lost" in out["ps_lost"], out["ps_lost"]
    assert out["dead_ps_run"] and "ps:0 does not answer (killed (modelled))" in out["dead_ps_run"]
    assert "\n" not in out["dead_ps_run"]
    assert out["old_variable"] != "still there", "a restarted ps comes back empty"
    assert out["resumed"] == [300, None], out["resumed"]
    assert len(out["pids"]) == 1 and out["gone"], out


def test_a_px_cell_on_a_shared_task_is_refused_in_one_line(shared):
    from tfmagic.px import run_px

    with pytest.raises(PxError, match="needs a process per task"):
        run_px(shared, "print(1)", "worker:1")


def test_a_shared_process_dies_with_its_owner_killed_9(tmp_path):
    """The owner SIGKILLed: every channel of the process reaches its end, and the process goes."""
    program = (
        "import json, sys, time, tfmagic\n"
        "c = tfmagic.LocalCluster(ps=1, workers=2, processes=1, spares=False)\n"
        "c.start()\n"
        "print(json.dumps(sorted({p.pid for p in c.procs.values()})), flush=True)\n"
        "time.sleep(600)\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, text=True)
    try:
        pids = json.loads(owner.stdout.readline())
        assert len(pids) == 1 and psutil.pid_exists(pids[0])
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(10)
        poll_for(lambda: not any(psutil.pid_exists(p) for p in pids), 15, what="the shared process to end")
    finally:
        if owner.poll() is None:
            owner.kill()


def test_two_thousand_workers_in_shared_processes_are_refused_before_anything_starts():
    # 500 (this test's first size) fit a 24 GB machine since a shared task costs about 30 MB
    cluster = tfmagic.LocalCluster(ps=2, workers=2000, processes="auto", spares=False)
    t0 = time.monotonic()
    with pytest.raises(WillNotFit) as err:
        cluster.start()
    assert "\n" not in str(err.value) and time.monotonic() - t0 < 10
    assert re.search(
        r"2002 tasks in \d+ shared processes need about .* about \d+ tasks fit", str(err.value)
    ), err.value
    assert not cluster.procs


@pytest.mark.unit
@pytest.mark.parametrize("bad", [0, -1, 5, "x", True, 1.5, "2.0"])
def test_a_bad_process_count_says_what_to_give(bad):
    with pytest.raises(BadArgument) as err:
        check_processes(bad, 4)
    assert "\n" not in str(err.value)


@pytest.mark.unit
def test_process_counts():
    assert check_processes(4, 4) is None  # a process each: the default
    assert check_processes("2", 4) == 2 and check_processes("auto", 4) == "auto"
    assert process_sizes(34, "auto") == [12, 11, 11] and process_sizes(4, 3) == [2, 1, 1]


@pytest.mark.unit
def test_processes_with_ssh_or_spark_say_it_is_for_local_clusters():
    from tfmagic.backends import ClusterRequest, check

    with pytest.raises(BadArgument, match="local clusters only"):
        tfmagic.SSHCluster(["node1"], processes=2)
    with pytest.raises(BadClusterShape, match="processes is for the local backend"):
        check(ClusterRequest(backend="ssh", hosts=("node1",), processes=2))
    with pytest.raises(BadClusterShape, match="--collective and --gpus need a process per task"):
        check(ClusterRequest(ps=1, workers=2, gpus=("0",), processes=2))
    with pytest.raises(BadArgument, match="1 to 3 processes"):
        check(ClusterRequest(ps=1, workers=2, processes=9))


@pytest.mark.unit
@pytest.mark.parametrize(
    "line, said",
    [
        ("start --ps 1 --workers 2 --processes 0", "1 to 3 processes"),
        ("start --ps 1 --workers 2 --processes many", "whole number of processes or 'auto'"),
        (
            "start --ps 1 --workers 2 --processes 2 --backend ssh --hosts node1",
            "processes is for the local backend",
        ),
        ("start --ps 1 --workers 2 --processes 2 --gpus 0", "need a process per task"),
    ],
)
def test_the_magic_refuses_a_bad_processes_in_one_line_and_starts_nothing(line, said):
    message = magic_refusal(line)
    assert said in message, message
