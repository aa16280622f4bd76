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
        (lambda c: c.kill("worker:1"), "killing"),
        (lambda c: c.restart("worker:1", force=True), "restarting"),
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
