"""The Slurm backend on a Slurm of two nodes (issue 25): each node a network namespace of its own.

tests/slurmhost.py starts slurmctld here and a slurmd per node, each in its own network namespace
and host name (``n0``, ``n1``) on a private bridge, so a job's tasks really land on two machines
that reach each other and this process over a network.  One cluster's tasks spread over both
nodes, train and run a ``%%tf_px`` cell; then node ``n1`` dies during an async run (its link goes
down and everything on it is killed, so nothing it held open says goodbye): Slurm ends the job
(NODE_FAIL), the run ends in one line naming the job and the node soon after, and nothing is left
queued or running.
"""

from __future__ import annotations

import sys
import textwrap
import threading
import time

import pytest

import tfmagic
from tfmagic import client
from tfmagic.errors import ClientBusy
from tfmagic.network import clientserver
from tfmagic.spec import TaskName

from . import slurmhost
from .conftest import assert_gone, card_read, poll_for
from .slurmhost import NODE_TIMEOUT, netns_skip_reason

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def nodes(tmp_path_factory):
    why = netns_skip_reason()
    if why:
        pytest.skip(why)
    with slurmhost.running(tmp_path_factory.mktemp("slurm-nodes"), nodes=2) as private:
        yield private


@pytest.fixture(scope="module")
def spread(nodes):
    """1 ps + 2 workers in one job over both nodes; the relays dial back to this machine's bridge address.
    ps:0 has a modelled card (``net="ps:0"``: a relay here, no limit until a test sets one)."""
    cluster = tfmagic.SlurmCluster(
        ps=1, workers=2, address=nodes.address, sbatch=["--nodes=2"], time="10", start_timeout=120, net="ps:0"
    )
    try:
        cluster.start()
        yield cluster
    finally:
        pids = [p.task_pid for p in cluster.procs.values()]
        cluster.stop()
        poll_for(lambda: not nodes.queue(), 30, what="Slurm's queue to empty after stop")
        assert_gone(pids)


def test_a_jobs_tasks_land_on_both_nodes_and_train_over_the_network(nodes, spread):
    (job,) = spread.launcher.job_ids
    where = {row.task: row.note for row in spread.status().tasks}
    on = {task: note.rsplit(" on ", 1)[-1] for task, note in where.items()}
    assert set(on.values()) == {"n0", "n1"}, where
    assert all(note.startswith(f"Slurm job {job} on ") for note in where.values()), where
    # each task's server is on its node's address, which the kernel and the other tasks reach; ps:0's
    # address is its card's relay, here on this machine's bridge address, which passes on to its node
    addresses = spread.cluster_def.as_dict()
    for job_name, hosts in addresses.items():
        for index, host in enumerate(hosts):
            task = f"{job_name}:{index}"
            where = nodes.address if task == "ps:0" else nodes.nodes[on[task]]
            assert host.rsplit(":", 1)[0] == where, (addresses, on)
    route = spread.shaper.given_routes["ps:0"]
    assert route["target"] == f"{nodes.nodes[on['ps:0']]}:{spread.network.bind_ports[TaskName('ps', 0)]}"
    run = tfmagic.train(spread, mode="async", model="digits", steps=40, lr=0.05)
    assert run.steps == 40 and set(run.by_task()) == {"worker:0", "worker:1"}
    from tfmagic.px import run_px

    outcomes = run_px(spread, "import socket\nprint(socket.gethostname(), flush=True)").wait(60)
    for task in spread.procs:
        outcome = outcomes[str(task)]
        assert outcome.status == "ok" and outcome.stdout == f"{on[str(task)]}\n", outcome


def test_a_card_shapes_a_ps_on_another_node_and_the_relay_admits_only_the_clusters_hosts(nodes, spread):
    """Issue 25: the modelled network on Slurm. ps:0 runs on a node; its card's relay runs here, on the
    address the nodes reach this machine at, and every connection to ps:0 crosses it: a read of 2.5 MB
    from it at 20 mbit takes at least the modelled second (a card not applied would take a fraction),
    and the card's bytes count it. A link rule from the workers names each worker's connections, on
    either node (worker:1's is on the other node: its tasks are asked). The relay listens where other machines reach it, so it admits only
    the cluster's hosts: a connection from another address is closed unread and counted."""
    import socket

    relay_port = int(spread.cluster_def.address("ps:0").rsplit(":", 1)[1])
    took, crossed = card_read(spread, "20mbit")
    assert took >= 0.8, f"2.5 MB at 20 mbit took {took:.2f} s: the card was not applied"
    assert crossed >= 2_500_000
    # a link from a task on another node: the relay asks the tasks on that node which holds the
    # connection (their own socket tables), so the workers' bytes cross their own links
    spread.net("worker:*->ps:0", rate="1gbit")
    try:
        tfmagic.train(spread, mode="async", model="linear", steps=30)
        links = {r["src"]: r for r in spread.net().rows if r["kind"] == "link"}
        seen = spread.shaper.routes()["ps:0"]["links"]
    finally:
        spread.net("worker:*->ps:0", rate=None)
    assert {"worker:0", "worker:1"} <= set(seen), seen
    assert links["worker:*"]["to_task"] > 0, links
    # a stranger: this machine's loopback address is not one of the cluster's hosts
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.settimeout(5)
        s.connect((nodes.address, relay_port))
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        try:
            got = s.recv(100)
        except ConnectionResetError:
            got = b""
    assert got == b"", got
    stats = spread.shaper.routes()["ps:0"]
    assert stats["connections"].get("refused", 0) >= 1, stats


TRAIN_PY = textwrap.dedent(
    """
    # Between-graph replication, TF1 style (the seeds' programs): w on the ps, each worker's own graph.
    import json, os, socket
    import numpy as np
    import tensorflow as tf
    tf1 = tf.compat.v1
    tf1.disable_eager_execution()
    config = json.loads(os.environ["TF_CONFIG"])
    index = config["task"]["index"]
    with tf1.device(tf1.train.replica_device_setter(cluster=tf.train.ClusterSpec(config["cluster"]))):
        step = tf1.train.get_or_create_global_step()
        w = tf1.get_variable("w", initializer=0.0)
        x = tf1.placeholder(tf.float32, [None])
        loss = tf.reduce_mean(tf.square(w * x - 3.0 * x))
        train = tf1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=step)
    hooks = [tf1.train.StopAtStepHook(last_step=200)]
    mine = 0
    rng = np.random.default_rng(index)
    # device filters: a worker talks to the ps and itself only, so one that starts after the other
    # has finished (and its server with it) does not wait for it for ever at session creation
    config = tf1.ConfigProto(device_filters=["/job:ps", f"/job:worker/task:{index}"])
    with tf1.train.MonitoredTrainingSession(
        master=server.target, is_chief=index == 0, hooks=hooks, config=config
    ) as sess:
        while not sess.should_stop():
            sess.run(train, {x: rng.uniform(-1, 1, 32)})
            mine += 1
    print(f"worker {index}: {mine} steps of mine on {socket.gethostname()}", flush=True)
    with tf1.Session(server.target, config=config) as sess:
        print(f"worker {index}: w {sess.run(w):.3f} at global step {sess.run(step)}", flush=True)
    """
)


def test_an_exported_slurm_script_trains_over_both_nodes_when_sbatch_runs_it(nodes, tmp_path):
    """tfmagic export slurm's script, submitted with sbatch to the two nodes, trains between-graph:
    SlurmClusterResolver's addresses are the nodes' names, each task's server on its node."""
    from tfmagic.export import write_export
    from tfmagic.network.ports import free_port
    from tfmagic.spec import ClusterShape

    (tmp_path / "train.py").write_text(TRAIN_PY)
    script = write_export(
        "slurm",
        tmp_path / "job.sbatch",
        ClusterShape(ps=1, workers=2),
        python=sys.executable,
        port=free_port(),
        partition="debug",
        time="10",
        output=str(tmp_path / "job-%j.out"),
    )
    done = nodes.run("sbatch", "--parsable", "--nodes=2", f"--chdir={tmp_path}", str(script))
    assert done.returncode == 0, done.stdout + done.stderr
    # (not sbatch --wait: it kept polling for a job Slurm had already forgotten, MinJobAge=2 here)
    job = done.stdout.strip()

    def queued() -> bool:  # this job (the module's cluster has its own)
        return any(line.split()[0] == job for line in nodes.queue())

    poll_for(
        lambda: not queued(),
        240,
        interval=0.5,
        what=lambda: f"Slurm job {job} to end ({nodes.describe()})",
    )
    out = "".join(p.read_text() for p in tmp_path.glob("job-*.out"))
    finals = [line for line in out.splitlines() if " w " in line and "global step" in line]
    mine = [int(line.split(": ")[1].split()[0]) for line in out.splitlines() if "steps of mine" in line]
    assert len(finals) == 2 and len(mine) == 2 and sum(mine) >= 200, out[-3000:]
    hosts = {line.rsplit(" on ", 1)[1] for line in out.splitlines() if "steps of mine" in line}
    assert hosts == {"n0", "n1"}, out[-3000:]  # one worker on each node (Slurm's block placement)
    for line in finals:
        w, step = float(line.split(" w ")[1].split()[0]), int(line.rsplit(" ", 1)[1])
        assert abs(w - 3.0) < 0.1 and step >= 200, line


def test_a_node_that_dies_ends_the_run_in_one_line_naming_it_and_leaves_nothing(nodes, spread, local_cluster):
    """Before: the run's threads waited on the dead node's calls a minute, or for ever, after
    Slurm had ended the job (TensorFlow's executor wrapper waiting on the shared executor), and
    the job was requeued (no ``--no-requeue``), so the error never named Slurm.  And TensorFlow's
    call to the dead node waited until TCP gave up (about 15 minutes), holding this process's next
    connection that long; now the kernel's connections give up on a silent peer after
    ``clientserver.DEAD_PEER_S``, and the next connection works with the node still dead."""
    import tensorflow as tf

    def waiting() -> bool:
        return any(t.name == "tfmagic-async-worker:1" and t.is_alive() for t in threading.enumerate())

    (job,) = spread.launcher.job_ids
    run = tfmagic.train(spread, mode="async", model="digits", steps=10**6, lr=0.05, block=False)
    poll_for(lambda: run.history.steps > 20, 60, what="the run's first updates")
    nodes.kill_node("n1")
    killed = time.monotonic()
    # Slurm holds a silent node down after SlurmdTimeout (it pings a third as often) and ends the job
    poll_for(lambda: not nodes.queue(), 10 * NODE_TIMEOUT, what=f"Slurm to end job {job}: {nodes.describe()}")
    gone = time.monotonic()
    with pytest.raises(tfmagic.TrainingError) as info:
        run.wait(30)
    took = time.monotonic() - gone
    waiting_at_end = waiting()
    message = str(info.value)
    assert f"Slurm ended job {job} (" in message and "n1 stopped answering" in message, message
    assert "start the cluster again" in message and "\n" not in message, message
    assert took < 30, f"the run ended {took:.1f} s after Slurm ended the job"
    assert nodes.node_states()["n1"].startswith("down"), nodes.node_states()
    notes = {row.task: row.note for row in spread.status().tasks}
    assert all(f"Slurm ended job {job}" in n for n in notes.values()), notes
    # the dead node's call is left behind, not held against the next connection's gate
    assert not [w for w, _ in client.gate.in_flight() if w == run.who], client.gate.in_flight()
    # the dead node's call, if still waiting when the run ended, was left behind and said so
    left = any(e.kind == "stopped" and "worker:1" in e.detail for e in run.history.events)
    assert left or not waiting_at_end, run.history.events
    poll_for(
        lambda: not waiting(),
        clientserver.DEAD_PEER_S + 30,
        what="the call to the dead node to fail once TCP gives up on it (the node is still dead)",
    )
    # every connection to n1 gives up within DEAD_PEER_S of its last answer; TensorFlow's change of
    # connection may still wait longer on what it closes (a clean-clone run: ClientBusy when tried
    # 35 s after the kill), so the next connection is tried until a minute and a half after it
    deadline = killed + clientserver.DEAD_PEER_S + 60
    while True:
        try:
            local_cluster.connect()
            break
        except ClientBusy:
            assert time.monotonic() < deadline, (
                f"no connection {time.monotonic() - killed:.0f} s after the kill"
            )
            time.sleep(1)
    with local_cluster.device("worker:0"):
        assert float(tf.constant(1.0) + 1.0) == 2.0
