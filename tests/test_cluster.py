"""A real local cluster: processes, addresses, client placement, TF1 and TF2 clients."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import psutil
import pytest

import tfmagic
from tfmagic.errors import ClusterStartError, NoCluster, UnknownTask

from .conftest import assert_gone, poll_for

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("no_leaks")]


def test_every_task_accepts_connections_and_is_its_own_process_group(local_cluster):
    defn = local_cluster.cluster_def
    assert defn.shape() == tfmagic.ClusterShape(ps=1, workers=2)
    pids = set()
    for task in defn.tasks():
        host, port = local_cluster.address(task).rsplit(":", 1)
        assert host == "127.0.0.1"
        socket.create_connection((host, int(port)), timeout=5).close()
        proc = local_cluster.procs[task]
        assert os.getpgid(proc.pid) == proc.pid, "each task leads its own process group"
        pids.add(proc.pid)
    assert len(pids) == 3


def test_spec_address_and_tf_config(local_cluster):
    spec = local_cluster.spec
    assert spec.job_tasks("worker") == [local_cluster.address("worker:0"), local_cluster.address("worker:1")]
    assert local_cluster.address("/job:worker/task:1") == local_cluster.address("worker:1")
    assert local_cluster.target("ps:0") == "grpc://" + local_cluster.address("ps:0")
    cfg = local_cluster.tf_config("worker:1")
    assert cfg["task"] == {"type": "worker", "index": 1}
    assert cfg["cluster"] == spec.as_dict()
    with pytest.raises(UnknownTask, match="worker:9 is not in this cluster"):
        local_cluster.address("worker:9")


def test_status_reports_pid_state_cpu_pss_rss_uptime(local_cluster):
    status = local_cluster.status()
    assert [r.task for r in status] == ["ps:0", "worker:0", "worker:1"]
    for row in status:
        assert row.state == "running"
        assert row.pid == local_cluster.procs[tfmagic.TaskName.parse(row.task)].pid
        assert row.rss > 100 * 2**20 and 0 < row.pss <= row.rss
        assert row.cpu_percent is not None and row.uptime_s > 0
    text = str(status)
    assert "worker:1" in text and "PSS" in text and "security:" in text
    html = status._repr_html_()
    assert html.count("<tr>") == 4 and "running" in html


def test_task_environment_ps_cpu_only_and_tf_config(local_cluster):
    ps = local_cluster.procs[tfmagic.TaskName("ps", 0)].request(  # devices: imports TF's whole API (seconds)
        "env", timeout=60, keys=["CUDA_VISIBLE_DEVICES", "TF_CONFIG", "GRPC_FAIL_FAST"], devices=True
    )
    assert ps["env"]["CUDA_VISIBLE_DEVICES"] == ""
    assert ps["env"]["GRPC_FAIL_FAST"] == "use_caller"
    assert json.loads(ps["env"]["TF_CONFIG"])["task"] == {"type": "ps", "index": 0}
    assert not [d for d in ps["devices"] if "GPU" in d]
    w = local_cluster.procs[tfmagic.TaskName("worker", 1)].request("env", keys=["CUDA_VISIBLE_DEVICES"])
    assert w["env"]["CUDA_VISIBLE_DEVICES"] is None, "workers keep the machine's GPUs unless told"


def test_logs_show_the_tasks_own_output(local_cluster):
    text = local_cluster.logs("worker:1", tail=200)
    assert "takes the role worker:1" in text
    assert "serving grpc://" in text
    # TensorFlow's own start-up lines are left out and counted; native=True has them
    raw = local_cluster.logs("worker:1", tail=None, native=True)
    assert "cudart_stub.cc" in raw or "grpc_server_lib.cc" in raw
    assert ".cc:" not in text and "lines of TensorFlow's own log left out" in text.splitlines()[-1]
    assert "device_count {" not in text  # the options dump a client's connection prints
    short = local_cluster.logs("worker:1", tail=2).splitlines()
    assert len(short) == 3 and short[-1].startswith("(") and short[-2] == text.splitlines()[-2]


def test_variables_on_ps_and_ops_on_workers(local_cluster):
    import tensorflow as tf

    local_cluster.connect()
    with local_cluster.device("ps:0"):
        v = tf.Variable([1.0, 2.0])
    with local_cluster.device("/job:worker/task:1"):
        y = v * 3.0
    assert v.device.startswith("/job:ps/replica:0/task:0")
    assert y.device.startswith("/job:worker/replica:0/task:1")
    assert y.numpy().tolist() == [3.0, 6.0]
    remote = [d.name for d in tf.config.list_logical_devices() if "/job:worker" in d.name]
    assert any("task:1" in d for d in remote)


def test_linear_fit_demo_workload(local_cluster):
    from tfmagic.demo import linear_fit

    out = linear_fit(local_cluster, steps=200)
    assert abs(out["w"] - 2.0) < 0.05 and abs(out["b"] - 10.0) < 0.05
    assert out["w_device"].startswith("/job:ps")
    assert out["steps_per_worker"] == {"worker:0": 100, "worker:1": 100}


def test_tf1_session_client_in_another_process(local_cluster):
    """The seeds' client style (004): a TF1 Session on a task's grpc target."""
    code = textwrap.dedent(
        f"""
        import tensorflow as tf
        tf.compat.v1.disable_eager_execution()
        with tf.device("/job:worker/task:0"):
            x = tf.constant([1.0, 2.0, 3.0])
            w = tf.compat.v1.get_variable("w", initializer=0.0)
            b = tf.compat.v1.get_variable("b", initializer=0.0)
            y = 2.0 * x + 10.0
            loss = tf.reduce_mean(tf.square(w * x + b - y))
            train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
        with tf.compat.v1.Session({local_cluster.target("worker:0")!r}) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for _ in range(500):
                sess.run(train)
            print("RESULT", *sess.run([w, b]))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT")]
    assert line, out.stderr[-2000:]
    w, b = map(float, line[0].split()[1:])
    assert abs(w - 2) < 0.05 and abs(b - 10) < 0.05


def test_tf2_parameter_server_strategy_on_resolver(local_cluster):
    """TF2 style: ParameterServerStrategy + ClusterCoordinator on .resolver()."""
    code = textwrap.dedent(
        f"""
        import json, tensorflow as tf
        from tfmagic.spec import ClusterDef
        from tfmagic import client
        resolver = client.resolver(ClusterDef.from_mapping({local_cluster.cluster_def.as_dict()!r}))
        strategy = tf.distribute.ParameterServerStrategy(resolver)
        coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
        with strategy.scope():
            w = tf.Variable(0.0)
        @tf.function
        def step():
            w.assign_add(1.0)
            return w.read_value()
        for _ in range(10):
            coordinator.schedule(step)
        coordinator.join()
        print("RESULT", w.numpy(), w.device)
        """
    )
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(tfmagic.__file__)))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=env)
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT")]
    assert line, out.stderr[-3000:]
    assert line[0].split()[1] == "10.0" and "/job:ps" in line[0]


def test_start_failure_names_the_task_shows_its_log_and_cleans_up():
    # An interpreter that cannot import TensorFlow: a real, common mistake.
    launcher = tfmagic.launchers.LocalLauncher(python=[sys.executable, "-S"], loopback_only=False)
    cluster = tfmagic.Cluster(ps=1, workers=1, launcher=launcher, spares=False)
    with pytest.raises(ClusterStartError) as info:
        cluster.start(timeout=60)
    err = info.value
    assert err.task in ("ps:0", "worker:0")
    assert "TensorFlow could not be imported" in str(err)
    assert "ModuleNotFoundError" in err.log_tail
    assert not cluster.running and not cluster.procs


def test_start_timeout_stops_what_it_started():
    cluster = tfmagic.LocalCluster(ps=1, workers=1, spares=False, loopback_only=False)
    with pytest.raises(ClusterStartError, match="was not up in time") as info:
        cluster.start(timeout=0.5)
    assert info.value.task == "ps:0"
    assert not cluster.procs


def test_port_taken_between_pick_and_bind_is_retried(monkeypatch):
    squatter = socket.socket()
    squatter.bind(("0.0.0.0", 0))
    squatter.listen()
    taken = squatter.getsockname()[1]
    launcher = tfmagic.launchers.LocalLauncher(loopback_only=False)
    real_pick = launcher.pick_port
    calls = []

    def pick(proc=None):
        calls.append(1)
        return taken if len(calls) == 1 else real_pick(proc)

    monkeypatch.setattr(launcher, "pick_port", pick)
    cluster = tfmagic.Cluster(ps=0, workers=1, launcher=launcher, spares=False)
    try:
        outcome = cluster.start(timeout=90)
        assert outcome.attempts == 2
        assert cluster.address("worker:0") != f"127.0.0.1:{taken}"
    finally:
        cluster.close()
        squatter.close()


def test_stop_twice_and_use_after_stop_say_what_to_do():
    cluster = tfmagic.LocalCluster(ps=0, workers=1, spares=False)
    with cluster:
        pid = cluster.procs[tfmagic.TaskName("worker", 0)].pid
    assert_gone([pid])
    with pytest.raises(NoCluster, match="start it first"):
        cluster.address("worker:0")
    with pytest.raises(NoCluster, match="nothing to stop"):
        cluster.stop()


def test_script_killed_with_sigkill_leaves_no_task_behind(tmp_path):
    """Owner death by kill -9: every task sees its channel close and ends itself."""
    script = tmp_path / "owner.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys, time, tfmagic
            c = tfmagic.LocalCluster(ps=1, workers=1, spares=False)
            c.start()
            print("PIDS", *[p.pid for p in c.procs.values()], flush=True)
            time.sleep(600)
            """
        )
    )
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(tfmagic.__file__)))
    owner = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = ""
        while not line.startswith("PIDS"):
            line = owner.stdout.readline()
            assert line, "the owner script died before starting its cluster"
        pids = [int(p) for p in line.split()[1:]]
        assert all(psutil.pid_exists(p) for p in pids)
        owner.kill()
        owner.wait(10)
        assert_gone(pids, timeout=10)
    finally:
        owner.kill()


def test_script_exit_stops_everything(tmp_path):
    script = tmp_path / "owner.py"
    script.write_text(
        "import tfmagic\nc = tfmagic.LocalCluster(ps=0, workers=1, spares=False)\nc.start()\n"
        "print('PIDS', *[p.pid for p in c.procs.values()], flush=True)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(tfmagic.__file__)))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    pids = [int(p) for p in out.stdout.split("PIDS")[1].split()]
    assert_gone(pids, timeout=10)


def _listening(pid: int, port: int) -> list[str]:
    return [
        c.laddr.ip
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == port
    ]


def test_task_servers_listen_on_loopback_only(local_cluster):
    guard = local_cluster.launcher.guard
    assert guard is not None and guard.available, guard
    for task, proc in local_cluster.procs.items():
        port = int(local_cluster.address(task).rsplit(":", 1)[1])
        addrs = _listening(proc.pid, port)
        assert addrs, f"{task} does not listen on {port}"
        assert set(addrs) <= {"127.0.0.1", "::ffff:127.0.0.1"}, (task, addrs)


def test_without_the_guard_servers_listen_everywhere():
    """The opposite case, so the loopback test above can fail."""
    with tfmagic.LocalCluster(ps=0, workers=1, spares=False, loopback_only=False) as cluster:
        proc = cluster.procs[tfmagic.TaskName("worker", 0)]
        port = int(cluster.address("worker:0").rsplit(":", 1)[1])
        assert set(_listening(proc.pid, port)) & {"0.0.0.0", "::"}
        assert "EVERY network interface" in cluster.launcher.security_note()


def test_worker_gpus_reach_each_worker_and_ps_stays_cpu_only():
    with tfmagic.LocalCluster(ps=1, workers=2, spares=False, worker_gpus=["0", "1"]) as cluster:
        seen = {
            str(t): p.request("env", keys=["CUDA_VISIBLE_DEVICES"])["env"]["CUDA_VISIBLE_DEVICES"]
            for t, p in cluster.procs.items()
        }
        growth = cluster.procs[tfmagic.TaskName("worker", 1)].request(
            "env", keys=["TF_FORCE_GPU_ALLOW_GROWTH"]
        )
    assert seen == {"ps:0": "", "worker:0": "0", "worker:1": "1"}
    assert growth["env"]["TF_FORCE_GPU_ALLOW_GROWTH"] == "true", (
        "workers sharing a GPU must not each take it all"
    )


def test_warm_start_takes_spares_after_a_stop(monkeypatch):
    """After one start, the pool keeps warm processes: the next start of any
    shape up to that size needs no TensorFlow import."""
    monkeypatch.setenv("TFMAGIC_SPARES", "1")
    from tfmagic.pool import SparePool

    pool = SparePool(budget="4GB")
    first = tfmagic.LocalCluster(ps=1, workers=2, pool=pool)
    try:
        assert first.start().cold == 3
        poll_for(lambda: len([p for p in pool.processes() if p.warm_at]) == 3, 120, what="3 warm spares")
        first.stop()
        status_spares = first.status().spares
        assert len(status_spares) == 3 and all(r.state == "spare" for r in status_spares)
        second = tfmagic.LocalCluster(ps=0, workers=3, pool=pool)
        try:
            outcome = second.start()
            assert (outcome.warm, outcome.cold) == (3, 0)
            log = second.logs("worker:2", tail=None)
            assert log.count("takes the role worker:2") == 1
            assert log.index("imported TensorFlow") < log.index("takes the role"), (
                "the spare's import log is kept"
            )
        finally:
            second.close()
        # a smaller cluster next: the pool still refills to the largest size seen (3), so a
        # class going back to the bigger shape finds it warm
        poll_for(lambda: len([p for p in pool.processes() if p.warm_at]) == 3, 120, what="3 spares refilled")
        third = tfmagic.LocalCluster(ps=0, workers=1, pool=pool)
        try:
            assert third.start().warm == 1
            poll_for(lambda: len([p for p in pool.processes() if p.warm_at]) == 3, 120, what="3 spares again")
        finally:
            third.close()
        fourth = tfmagic.LocalCluster(ps=1, workers=2, pool=pool)
        try:
            outcome = fourth.start()
            assert (outcome.warm, outcome.cold) == (3, 0)
        finally:
            fourth.close()
    finally:
        first.close()
        pool.shutdown()


def test_spare_budget_zero_keeps_no_spares(monkeypatch):
    monkeypatch.setenv("TFMAGIC_SPARES", "1")
    from tfmagic.pool import SparePool

    pool = SparePool(budget=0)
    with tfmagic.LocalCluster(ps=0, workers=1, pool=pool) as cluster:
        cluster.pool.fill(cluster.launcher, 2)
        assert pool.processes() == []


def test_replacing_a_cluster_does_not_spill_stale_handle_errors(tmp_path):
    """Old remote variables die with their cluster; their failed deletion is
    TensorFlow's bookkeeping, not the user's problem, and stays out of stderr."""
    script = tmp_path / "replace.py"
    script.write_text(
        textwrap.dedent(
            """
            import tensorflow as tf, tfmagic
            a = tfmagic.LocalCluster(ps=1, workers=1, spares=False)
            a.start()
            with a.device("ps:0"):
                old = tf.Variable(1.0)
                q = tf.queue.FIFOQueue(1, tf.float32)
            a.stop()
            b = tfmagic.LocalCluster(ps=0, workers=1, spares=False)
            b.start()
            with b.device("worker:0"):
                print("RESULT", (tf.constant(2.0) * 2).numpy(), flush=True)
            b.stop()
            """
        )
    )
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(tfmagic.__file__)))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=180)
    assert "RESULT 4.0" in out.stdout, out.stderr[-2000:]
    assert "Exception ignored" not in out.stderr, out.stderr[-2000:]


def test_main_job_tfmagic_demo_runs_end_to_end():
    # strict: the picture it writes is checked as it is made (no text clipped or overlapping, axes labelled)
    env = dict(
        os.environ,
        PYTHONPATH=os.path.dirname(os.path.dirname(tfmagic.__file__)),
        TFMAGIC_LESSON_STRICT="1",
    )
    out = subprocess.run(
        [sys.executable, "-m", "tfmagic.cli", "demo"], capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]
    assert "w = 1.99" in out.stdout or "w = 2.00" in out.stdout
    assert "processes left behind: 0" in out.stdout
    assert "E0000" not in out.stderr, "TensorFlow's native noise is kept out of the demo's output"


# -- another user of this machine (issue 24 item 0: students on one hub) -------------------------
_HTTP2_PREFACE = r"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def bytes_answered(port: int, user: int | None = None) -> int:
    """How many bytes a gRPC server at 127.0.0.1:``port`` answers to HTTP/2's preface (its first
    SETTINGS frame: about 46), sent by ``user`` (a uid; None: this process's user) through bash's
    /dev/tcp (this Python lives where another user may not run it). 0: the connection was closed
    before the server saw a byte."""
    script = f"exec 3<>/dev/tcp/127.0.0.1/{port}; printf '{_HTTP2_PREFACE}' >&3; timeout 5 cat <&3 | wc -c"
    done = subprocess.run(
        ["/bin/bash", "-c", script], user=user, cwd="/", capture_output=True, text=True, timeout=30
    )
    return int(done.stdout.strip() or 0)


@pytest.mark.skipif(os.getuid() != 0, reason="connecting as another user needs root")
def test_another_user_of_the_machine_reaches_no_task_and_not_the_kernel(local_cluster):
    """Every task server and this client's own TensorFlow server close another user's connection
    before gRPC reads a byte (the bind library's peer check); this user's connections are served."""
    import pwd

    import tensorflow as tf

    from tfmagic.client import client_port
    from tfmagic.network import clientserver

    local_cluster.connect()
    with local_cluster.device("worker:0"):
        assert (tf.constant(1.0) + 1.0).numpy() == 2.0
    poll_for(lambda: clientserver.listening(client_port()), 20, what="the client's own server to listen")
    nobody = pwd.getpwnam("nobody").pw_uid
    tasks = local_cluster.cluster_def.tasks()
    ports = {str(t): int(local_cluster.address(t).rsplit(":", 1)[1]) for t in tasks}
    ports["the client"] = client_port()
    for name, port in ports.items():
        assert bytes_answered(port) > 0, f"{name} does not answer this user"
        assert bytes_answered(port, user=nobody) == 0, f"{name} answered another user"
    log = local_cluster.logs("worker:0", tail=None, native=True)
    assert "refused a connection from this machine's port" in log and "another user's process" in log
    assert "admit your own processes only" in local_cluster.launcher.security_note()
    note = " ".join(local_cluster.status().notes)
    assert "to your own processes only" in note, note


def test_a_task_polls_four_grpc_completion_queues_not_sixty_four(local_cluster):
    """TensorFlow's default of 64 queues, a thread each, made a fresh task of 99 to 107 threads
    (bench/grpc_queues.py); with 4, 47, and 66 after the shared cluster's cells imported all of
    TensorFlow in it."""
    for task, proc in local_cluster.procs.items():
        with open(f"/proc/{proc.pid}/environ", "rb") as f:
            assert b"TF_GRPC_WORKER_CACHE_QUEUES=4\0" in f.read(), task
        assert psutil.Process(proc.pid).num_threads() < 90, task
