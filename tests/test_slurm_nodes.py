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

import threading
import time

import pytest

import tfmagic
from tfmagic import client
from tfmagic.network import clientserver

from . import slurmhost
from .conftest import assert_gone, poll_for
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
    """1 ps + 2 workers in one job over both nodes; the relays dial back to this machine's bridge address."""
    cluster = tfmagic.SlurmCluster(
        ps=1, workers=2, address=nodes.address, sbatch=["--nodes=2"], time="10", start_timeout=120
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
    # each task's server is on its node's address, which the kernel and the other tasks reach
    addresses = spread.cluster_def.as_dict()
    for job_name, hosts in addresses.items():
        for index, host in enumerate(hosts):
            assert host.rsplit(":", 1)[0] == nodes.nodes[on[f"{job_name}:{index}"]], (addresses, on)
    run = tfmagic.train(spread, mode="async", model="digits", steps=40, lr=0.05)
    assert run.steps == 40 and set(run.by_task()) == {"worker:0", "worker:1"}
    from tfmagic.px import run_px

    outcomes = run_px(spread, "import socket\nprint(socket.gethostname(), flush=True)").wait(60)
    for task in spread.procs:
        outcome = outcomes[str(task)]
        assert outcome.status == "ok" and outcome.stdout == f"{on[str(task)]}\n", outcome


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
    local_cluster.connect()
    with local_cluster.device("worker:0"):
        assert float(tf.constant(1.0) + 1.0) == 2.0
