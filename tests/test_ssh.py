"""SSH backend: tasks started through real sshd, on loopback and on hosts in network namespaces."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import psutil
import pytest

import tfmagic
from tfmagic.errors import ClusterStartError

from . import sshhosts
from .conftest import assert_gone, bytes_moved, poll_for, share, task_processes
from .kernelutil import Kernel

pytestmark = [pytest.mark.cluster]

if sshhosts.skip_reason():
    pytest.skip(sshhosts.skip_reason(), allow_module_level=True)


@pytest.fixture(scope="module")
def loop_host():
    hosts = sshhosts.loopback_host()
    yield hosts
    hosts.close()


@pytest.fixture(scope="module")
def ns_hosts():
    reason = sshhosts.netns_skip_reason()
    if reason:
        pytest.skip(reason)
    hosts = sshhosts.namespace_hosts(2)
    yield hosts
    hosts.close()


@pytest.fixture(scope="module")
def ssh_cluster(ns_hosts):
    """1 ps + 2 workers over ssh on two namespace hosts (ps:0 and worker:1 on node0, worker:0 on node1)."""
    cluster = tfmagic.SSHCluster(
        ns_hosts.aliases, ps=1, workers=2, python=sys.executable, ssh_config=ns_hosts.config, name="ssh"
    )
    seen = []
    cluster.start(progress=lambda task, stage, detail: seen.append((task, stage, detail)))
    cluster.progress_seen = seen
    handle = share(cluster)
    yield cluster
    from .conftest import SHARED

    SHARED.remove(handle)
    pids = [p.task_pid for p in cluster.procs.values()]
    cluster.close()
    assert_gone(pids)


def _remote_pids(cluster) -> list[int]:
    return [p.task_pid for p in cluster.procs.values()]


def test_tasks_run_on_the_hosts_with_progress_status_and_logs(ssh_cluster, ns_hosts):
    addrs = ssh_cluster.cluster_def.as_dict()
    assert addrs["ps"][0].startswith(ns_hosts.addresses["node0"] + ":")
    assert addrs["worker"][0].startswith(ns_hosts.addresses["node1"] + ":")
    assert addrs["worker"][1].startswith(ns_hosts.addresses["node0"] + ":")
    stages = {(t, s) for t, s, _ in ssh_cluster.progress_seen}
    assert {("ps:0", "spawned"), ("worker:0", "up"), ("worker:1", "up")} <= stages
    assert any("on " + ns_hosts.addresses["node1"] in d for _, _, d in ssh_cluster.progress_seen)
    status = ssh_cluster.status()
    rows = {r.task: r for r in status.tasks}
    assert rows["worker:0"].host == "ssh:node1" and rows["ps:0"].host == "ssh:node0"
    # the pid column is the task's own pid on its host, with its memory measured there
    for row in rows.values():
        assert row.state == "running" and row.pss and row.rss and row.pid in task_processes()
    assert "ssh:node1" in str(status) and "node1" in status._repr_html_()
    assert "listen on their spec address only" in " ".join(status.notes)
    log = ssh_cluster.logs("worker:0", tail=200)
    assert "ssh node1" in log and "takes the role worker:0" in log and "serving grpc://" in log


def test_client_ops_and_variables_on_remote_tasks(ssh_cluster):
    import tensorflow as tf

    ssh_cluster.connect()
    with ssh_cluster.device("ps:0"):
        w = tf.Variable(np.arange(4, dtype=np.float32))
    # the worker pulls a tensor the client made: the tasks reach the client on its bridge address
    local = tf.constant(np.ones(4, dtype=np.float32))
    with ssh_cluster.device("worker:0"):
        y = w * 2.0 + local
    assert y.device.endswith("/job:worker/replica:0/task:0/device:CPU:0")
    np.testing.assert_allclose(y.numpy(), [1, 3, 5, 7])
    assert "ps" in w.device


def test_servers_listen_only_on_their_spec_address(ssh_cluster, ns_hosts):
    """From inside node1, worker:0's port is closed on that host's loopback: the bind guard
    kept the server on the address in the spec instead of every interface."""
    host, port = ssh_cluster.address("worker:0").rsplit(":", 1)
    ns = ns_hosts.namespaces[1]
    probe = textwrap.dedent(
        """
        import socket, sys
        for addr in sys.argv[1:]:
            h, p = addr.rsplit(":", 1)
            try:
                socket.create_connection((h, int(p)), timeout=2).close(); print("open")
            except OSError:
                print("closed")
        """
    )
    out = subprocess.run(
        ["ip", "netns", "exec", ns, sys.executable, "-c", probe, f"{host}:{port}", f"127.0.0.1:{port}"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.stdout.split() == ["open", "closed"], out.stdout + out.stderr


_GRPC_PROBE = textwrap.dedent(
    """
    import sys
    from tfmagic.network.ports import grpc_answers
    print(" ".join("answers" if grpc_answers(a, timeout=3) else "silent" for a in sys.argv[1:]))
    """
)


def _probe_from(ns: str | None, *addresses: str) -> list[str]:
    """Whether a gRPC server answers at each address, asked from namespace ``ns`` (None: here)."""
    cmd = [sys.executable, "-c", _GRPC_PROBE, *addresses]
    out = subprocess.run(
        ["ip", "netns", "exec", ns, *cmd] if ns else cmd, capture_output=True, text=True, timeout=60
    )
    return out.stdout.split() or [out.stderr[-2000:]]


_KERNEL_LIKE = textwrap.dedent(
    """
    import sys
    import tensorflow as tf
    import tfmagic
    from tfmagic import client
    cluster = tfmagic.LocalCluster(ps=0, workers=1, name="alone")
    cluster.start()
    try:
        cluster.connect()
        with cluster.device("worker:0"):
            assert float(tf.constant(2.0) * 3) == 6.0
        print("PORT", client._port, flush=True)
        print("NOTE", client.server_note(), flush=True)
        sys.stdin.readline()
    finally:
        cluster.stop()
    """
)


def test_the_clients_tensorflow_server_is_kept_off_the_network(ns_hosts):
    """Issue 22 item 2: connecting made TensorFlow start a server in the kernel on every interface
    (any machine of the network could run a graph in it, as the user).  A fresh process, as a
    kernel, connects to a local cluster: its server answers on 127.0.0.1 and not on this machine's
    address on the hosts' bridge, asked from here and from a namespace host."""
    env = dict(os.environ, TFMAGIC_SPARES="0")
    proc = subprocess.Popen(
        [sys.executable, "-c", _KERNEL_LIKE],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        lines = {}
        for line in proc.stdout:
            key, _, value = line.strip().partition(" ")
            lines[key] = value
            if key == "NOTE":
                break
        assert "PORT" in lines, "the client did not connect"
        port = int(lines["PORT"])
        assert (
            lines["NOTE"]
            == f"this kernel serves TensorFlow on 127.0.0.1 only (port {port}), to your own processes only"
        )
        bridge = f"{sshhosts.SUBNET}.1"
        assert _probe_from(None, f"127.0.0.1:{port}", f"{bridge}:{port}") == ["answers", "silent"]
        assert _probe_from(ns_hosts.namespaces[0], f"{bridge}:{port}") == ["silent"]
    finally:
        proc.stdin.close()
        proc.wait(60)
    # the control: the same probe from the same namespace sees a gRPC server that listens on every
    # interface (grpcio's own, which the guard, limited to TensorFlow's libraries, leaves alone)
    from concurrent.futures import ThreadPoolExecutor

    import grpc

    control = grpc.server(ThreadPoolExecutor(max_workers=1))
    open_port = control.add_insecure_port("[::]:0")
    control.start()
    try:
        assert _probe_from(ns_hosts.namespaces[0], f"{bridge}:{open_port}") == ["answers"]
    finally:
        control.stop(None)


def test_remote_tasks_reach_the_client_through_a_door_that_admits_only_them(ssh_cluster, ns_hosts):
    """The SSH tasks pull tensors the client made from the client's server, at this machine's
    bridge address: a door there admits the cluster's hosts and refuses every other machine."""
    from tfmagic import client
    from tfmagic.network import clientserver

    ssh_cluster.connect()
    port = client._port
    bridge = f"{sshhosts.SUBNET}.1"
    door = clientserver._state.doors[bridge]
    assert set(ns_hosts.addresses.values()) <= door.peers
    stranger = sshhosts.stranger(ns_hosts)
    refused = door.refused
    assert _probe_from(ns_hosts.namespaces[0], f"{bridge}:{port}") == ["answers"]
    assert _probe_from(stranger, f"{bridge}:{port}") == ["silent"]
    assert door.refused > refused
    note = " ".join(ssh_cluster.status().notes)
    assert f"this kernel serves TensorFlow on 127.0.0.1 only (port {port})" in note, note
    assert f"admits {', '.join(sorted(door.peers))} at {bridge}:{port}" in note, note


def test_training_runs_on_ssh_tasks(ssh_cluster, local_cluster):
    """The same run on local tasks, SSH tasks and local again, in one client process.

    Switching the client between a local cluster (tasks reach it at
    ``localhost``) and an SSH one (at its address on the hosts' network)
    once failed with TensorFlow's "remote address ... poisoned"; each run
    must give the same loss (sync, same seed and data).
    """
    kw = dict(mode="sync", model="linear", steps=40, batch_size=16, lr=0.1, seed=0)
    first = tfmagic.train(local_cluster, **kw)
    h = tfmagic.train(ssh_cluster, **kw)
    again = tfmagic.train(local_cluster, **kw)
    assert {r.task for r in h.records} == {"worker:0", "worker:1"}
    assert h.final_loss is not None and h.final_loss < 50
    assert h.final_loss == pytest.approx(first.final_loss, rel=1e-5)
    assert again.final_loss == pytest.approx(first.final_loss, rel=1e-5)


def test_traffic_of_ssh_tasks_is_measured_on_their_hosts(ssh_cluster):
    """Tasks on other hosts read their own TCP counters (the ``sockets`` op over the SSH channel):
    worker <-> ps bytes over a training run match what the model must move, within 30 %, as on
    local tasks (tests/test_inside.py)."""
    from tfmagic.training.models import Digits

    model = Digits(hidden=4096)
    params = 64 * 4096 + 4096 + 4096 * 10 + 10
    before = ssh_cluster.traffic()
    run = tfmagic.train(ssh_cluster, mode="async", steps=40, model=model, seed=2, block=False)
    run.wait()
    after = ssh_cluster.traffic()
    # every step made moved the parameters and a gradient, those past the 40th too (calls queued ahead,
    # masked on the ps: a loaded CI moved 53 steps' bytes for 40 updates); the ps counted each one
    steps = run.params.read_step()
    assert steps >= 40, steps

    expected = steps * params * 4
    up, down = bytes_moved(before, after, "worker", "ps"), bytes_moved(before, after, "ps", "worker")
    print(f"ssh: worker->ps {up / 1e6:.1f} MB, ps->worker {down / 1e6:.1f} MB, model {expected / 1e6:.1f} MB")
    assert 0.7 * expected <= up <= 1.3 * expected, (up, expected, str(after))
    assert 0.7 * expected <= down <= 1.3 * expected, (down, expected, str(after))
    # both workers' links are there, the one on ps:0's host and the one on the other host
    assert {r["src"] for r in after if r["dst"] == "ps:0" and r["bytes"]} >= {"worker:0", "worker:1"}


def test_slow_kill_restart_on_a_remote_task(ssh_cluster):
    import tensorflow as tf

    ssh_cluster.slow("worker:1", 4)
    assert {r.task: r.note for r in ssh_cluster.status().tasks}["worker:1"] == "slowed x4"
    ssh_cluster.slow("worker:1", 1)
    old = ssh_cluster.procs[tfmagic.TaskName("worker", 0)]
    address = ssh_cluster.address("worker:0")
    ssh_cluster.kill("worker:0")
    assert_gone([old.task_pid])
    poll_for(lambda: not old.alive, 10, what="the owner to see the kill")
    outcome = ssh_cluster.restart("worker:0")
    new = ssh_cluster.procs[tfmagic.TaskName("worker", 0)]
    assert new.task_pid != old.task_pid and ssh_cluster.address("worker:0") == address
    assert outcome.kind == "restarted"
    with ssh_cluster.device("worker:0"):
        assert float(tf.reduce_sum(tf.ones(3)).numpy()) == 3.0


def test_a_host_that_cannot_be_reached_says_what_to_do_and_leaves_nothing(loop_host, no_leaks, tmp_path):
    # a name that does not resolve: refused before anything starts (or, with replace, stops)
    with pytest.raises(
        ClusterStartError, match=r"'nosuchhost.invalid' \(nosuchhost.invalid\) does not resolve"
    ):
        tfmagic.SSHCluster(
            ["nosuchhost.invalid"], ps=0, workers=1, python=sys.executable, ssh_config=loop_host.config
        )
    # a name that resolves, where no sshd answers: the start names the task and the command to try
    from tfmagic.network.ports import free_port

    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host closedhost\n  HostName 127.0.0.1\n  Port {free_port()}\n\n"
        + Path(loop_host.config).read_text()
    )
    cluster = tfmagic.SSHCluster(
        ["closedhost"], ps=0, workers=1, python=sys.executable, ssh_config=str(config)
    )
    with pytest.raises(ClusterStartError) as err:
        cluster.start(timeout=60)
    msg = str(err.value)
    assert "worker:0" in msg and "ssh closedhost true" in msg, msg
    assert not cluster.procs


def test_a_missing_python_on_the_host_is_named(loop_host, no_leaks):
    cluster = tfmagic.SSHCluster(
        loop_host.aliases, ps=0, workers=1, python="/nonexistent/python3", ssh_config=loop_host.config
    )
    with pytest.raises(ClusterStartError) as err:
        cluster.start(timeout=60)
    assert "/nonexistent/python3" in str(err.value) and "python=" in str(err.value), str(err.value)


OWNER = textwrap.dedent(
    """
    import json, sys, time
    import tfmagic
    cluster = tfmagic.SSHCluster([sys.argv[1]], ps=1, workers=1, python=sys.executable, ssh_config=sys.argv[2])
    cluster.start()
    print(json.dumps([p.task_pid for p in cluster.procs.values()]), flush=True)
    time.sleep(600)
    """
)


def test_remote_tasks_die_when_their_owner_is_killed(loop_host, no_leaks):
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, loop_host.aliases[0], str(loop_host.config)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = owner.stdout.readline()
        pids = json.loads(line)
        assert len(pids) == 2 and all(psutil.pid_exists(p) for p in pids)
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(10)
        assert_gone(pids, timeout=20)
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()


def test_tunnel_mode_keeps_servers_on_each_hosts_loopback(ns_hosts, local_cluster, no_leaks):
    import tensorflow as tf

    from tfmagic.procs import owner

    cluster = tfmagic.SSHCluster(
        ns_hosts.aliases, ps=1, workers=1, python=sys.executable, ssh_config=ns_hosts.config, tunnel=True
    )
    try:
        cluster.start()
        spec = cluster.cluster_def.as_dict()
        assert all(a.startswith("127.0.0.1:") for addrs in spec.values() for a in addrs), spec
        assert "SSH tunnels" in cluster.launcher.security_note()
        tunnels = [p for p in owner.processes() if type(p).__name__ == "_Tunnel"]
        assert len(tunnels) == 2
        # from node1, the ps (on node0) is not reachable on node0's network address
        ps_port = spec["ps"][0].rsplit(":", 1)[1]
        probe = "import socket,sys\ntry:\n socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2).close(); print('open')\nexcept OSError: print('closed')"
        out = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                ns_hosts.namespaces[1],
                sys.executable,
                "-c",
                probe,
                ns_hosts.addresses["node0"],
                ps_port,
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert out.stdout.strip() == "closed", out.stdout + out.stderr
        cluster.connect()
        with cluster.device("ps:0"):
            v = tf.Variable(2.0)
        with cluster.device("worker:0"):  # the worker on node1 reads the ps on node0 through the tunnels
            assert float((v * tf.constant(3.0)).numpy()) == 6.0
        h = tfmagic.train(cluster, mode="async", model="linear", steps=30, batch_size=8, lr=0.05)
        assert len(h.records) >= 30
        # The client keeps one server on one port for every cluster (tfmagic.client.client_port),
        # so after serving another cluster it comes back through the same tunnels: this used to
        # need a stop and start of the tunnelled cluster (TensorFlow made a new client server per
        # cluster).
        local_cluster.connect()
        with local_cluster.device("worker:0"):
            assert float((tf.constant(2.0) * 2.0).numpy()) == 4.0
        cluster.connect()
        with cluster.device("worker:0"):
            assert float((tf.constant(2.0) * 3.0).numpy()) == 6.0
    finally:
        pids = [p.task_pid for p in cluster.procs.values()]
        cluster.close()
    assert_gone(pids)
    assert not [p for p in owner.processes() if type(p).__name__ == "_Tunnel"]


# -- attach --------------------------------------------------------------------


def test_attach_drives_a_cluster_it_did_not_start_and_leaves_it_running(local_cluster):
    import tensorflow as tf

    spec = local_cluster.cluster_def.as_dict()
    tf_config = json.dumps({"cluster": spec, "task": {"type": "worker", "index": 0}})
    attached = tfmagic.attach(tf_config)
    try:
        assert attached.shape == local_cluster.shape and attached.address("worker:1") == spec["worker"][1]
        with attached.device("ps:0"):
            v = tf.Variable(5.0)
        with attached.device("worker:1"):
            assert float((v * 2).numpy()) == 10.0
        for act in (
            lambda: attached.slow("worker:1"),
            lambda: attached.kill("worker:0"),
            lambda: attached.restart("worker:0"),
        ):
            with pytest.raises(tfmagic.NotOwned, match="did not start"):
                act()
        rows = attached.status().tasks
        assert [r.state for r in rows] == ["running"] * 3
        assert "did not start" in attached.logs("worker:0")
    finally:
        attached.stop()
    assert all(p.alive for p in local_cluster.procs.values())
    local_cluster.connect(force=True)


def test_attach_to_a_dead_address_fails_fast_and_names_it(tmp_path):
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"worker": ["127.0.0.1:9"]}))
    with pytest.raises(ClusterStartError, match=r"worker:0 at 127.0.0.1:9 does not accept connections"):
        tfmagic.attach(str(path), connect_timeout=1)
    with pytest.raises(ClusterStartError, match="evaluator"):
        tfmagic.attach({"worker": ["127.0.0.1:9"], "evaluator": ["127.0.0.1:10"]})
    with pytest.raises(ClusterStartError, match="neither JSON nor a file"):
        tfmagic.attach("no-such-file.json")


# -- magics ----------------------------------------------------------------------


@pytest.mark.kernel
def test_magics_start_ssh_attach_and_say_what_is_wrong(loop_host, local_cluster):
    k = Kernel(env={"TFMAGIC_SPARES": "0"})
    try:
        k.ok("%load_ext tfmagic\nimport tfmagic")
        for line, expect in [
            ("%tf_cluster start --backend ssh", "needs --hosts"),
            ("%tf_cluster start --hosts a,b", "are for --backend ssh"),
            ("%tf_cluster start --backend nfs", "unknown backend 'nfs'"),
            ("%tf_cluster attach", "attach needs the cluster"),
        ]:
            reply = k.run(line)
            assert reply.status == "error" and reply.error["ename"] == "UsageError", reply.text
            assert expect in reply.error["evalue"] and "Traceback" not in reply.text
        reply = k.ok(
            f"%tf_cluster start --backend ssh --hosts {loop_host.aliases[0]} --ps 0 --workers 1 "
            f"--python {sys.executable} --ssh-config {loop_host.config}",
            timeout=180,
        )
        assert "started" in reply.text and "Security: task servers on loop" in reply.text, reply.text
        status = k.ok("%tf_cluster status").text
        assert "ssh:loop" in status, status
        again = k.ok(
            f"%tf_cluster start --backend ssh --hosts {loop_host.aliases[0]} --ps 0 --workers 1 "
            f"--python {sys.executable} --ssh-config {loop_host.config}"
        )
        assert "Reusing" in again.text
        other = k.run("%tf_cluster start --ps 0 --workers 1")
        assert other.status == "error" and "another placement" in other.error["evalue"], other.text
        pids = k.value("[p.task_pid for p in tfmagic.current_cluster().procs.values()]")
        k.ok("%tf_cluster stop")
        assert_gone(pids)
        spec = json.dumps(local_cluster.cluster_def.as_dict())
        reply = k.ok(f"%tf_cluster attach '{spec}'", timeout=60)
        assert "Attached to cluster" in reply.text and "only detaches" in reply.text, reply.text
        k.ok("import tensorflow as tf")
        reply = k.ok("%%tf_device worker:0\nprint(float(tf.reduce_sum(tf.ones(5))))", timeout=60)
        assert "5.0" in reply.text
        kill = k.run("%tf_cluster kill worker:0")
        assert kill.status == "error" and "did not start" in kill.error["evalue"], kill.text
        assert "keep running" in k.ok("%tf_cluster stop").text
        assert all(p.alive for p in local_cluster.procs.values())
    finally:
        k.shutdown()
