"""%%tf_px: code inside every task (between-graph replication), on real clusters."""

from __future__ import annotations

import os
import queue
import re
import socket
import time

import numpy as np
import psutil
import pytest

import tfmagic
from tfmagic.dashboard import Dashboard
from tfmagic.px import PxError, run_px
from tfmagic.seeds import seed_000
from tfmagic.training.models import Linear

from .conftest import SHARED, assert_gone, poll_for, share
from .kernelutil import Kernel

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("no_leaks")]


@pytest.fixture(scope="module")
def px_cluster():
    cluster = tfmagic.LocalCluster(ps=1, workers=2, name="px", spares=False)
    cluster.start()
    handle = share(cluster)
    yield cluster
    SHARED.remove(handle)
    pids = handle()
    cluster.close()
    assert_gone(pids)


@pytest.mark.parametrize("full", [False, True])
def test_tasks_serve_on_the_server_core_and_complete_the_api_for_a_first_cell(monkeypatch, full):
    """A task imports only TensorFlow's server modules, serves the kernel's ops with them, and
    completes the Python API (tf.keras too) when a first cell needs it, in the same process.
    TFMAGIC_FULL_IMPORT=1 imports everything at start instead."""
    import tensorflow as tf

    if full:
        monkeypatch.setenv("TFMAGIC_FULL_IMPORT", "1")
    with tfmagic.LocalCluster(ps=0, workers=1, spares=False, name="core") as cluster:
        proc = cluster.procs[tfmagic.TaskName("worker", 0)]
        assert proc.api_complete is full
        cluster.connect()
        with cluster.device("worker:0"):
            assert float(tf.reduce_sum(tf.constant([1.0, 2.0]) * 2)) == 6.0
        served = psutil.Process(proc.task_pid).memory_info().rss
        r = run_px(
            cluster,
            "import tensorflow\nprint(tensorflow is tf, tf.__version__, tf.keras.layers.Dense.__name__)",
        )
        assert r.importing == ([] if full else ["worker:0"])
        out = r.wait(120)["worker:0"]
        assert out.status == "ok", out.traceback
        assert out.stdout.strip() == f"True {tf.__version__} Dense"
        completed = psutil.Process(proc.task_pid).memory_info().rss
        if not full:  # the API is most of a task's memory: serving alone did not pay for it
            assert completed - served > 150 * 2**20, (served, completed)
            assert "completed TensorFlow's Python API" in cluster.logs("worker:0", tail=200)
        assert run_px(cluster, "1").importing == []


def test_each_task_finds_its_context_and_keeps_its_namespace(px_cluster):
    r = run_px(
        px_cluster,
        "import json, os\nme = (job_name, task_index)\n"
        "print(server.target, json.loads(os.environ['TF_CONFIG'])['task'], cluster.num_tasks('worker'))",
    )
    out = r.wait(60)
    for task, o in out.items():
        job, index = task.split(":")
        assert o.status == "ok", o.traceback
        assert px_cluster.address(task) in o.stdout
        assert f"'type': '{job}', 'index': {index}" in o.stdout and o.stdout.strip().endswith(" 2")
    r = run_px(px_cluster, "me", targets="worker:*")
    assert r.wait(60) and r.results == {"worker:0": ("worker", 0), "worker:1": ("worker", 1)}


def test_output_streams_live_and_in_order_per_task(px_cluster):
    code = "import time\nfor i in range(4):\n    print('tick', i, flush=True)\n    time.sleep(0.4)\n"
    r = run_px(px_cluster, code, targets="worker:*")
    seen: dict[str, list] = {}
    arrived: dict[str, list] = {}
    while not r.done or not r.events.empty():
        try:
            task, kind, payload = r.events.get(timeout=0.2)
        except queue.Empty:
            continue
        if kind == "stream":
            seen.setdefault(task, []).append(payload[1].strip())
            arrived.setdefault(task, []).append(time.monotonic())
    assert seen == {t: [f"tick {i}" for i in range(4)] for t in ("worker:0", "worker:1")}
    # printed 0.4 s apart: lines that came together at the cell's end would arrive within a blink
    # (measured from the first line, not the cell's start, which may include the task's first import)
    for task, times in arrived.items():
        assert times[-1] - times[0] > 0.8, f"{task}'s lines arrived together, not as printed: {times}"


def test_bytes_written_to_stdout_buffer_reach_the_cell(px_cluster):
    """sys.stdout.buffer did not exist in a cell (programs that write bytes failed)."""
    code = "import sys\nsys.stdout.buffer.write('h\u00e9llo\\n'.encode())\nsys.stdout.buffer.flush()\n"
    out = run_px(px_cluster, code, targets="worker:0").wait(120)["worker:0"]
    assert out.status == "ok", out.traceback
    assert "h\u00e9llo" in out.stdout, out.stdout


def test_what_c_code_and_child_processes_write_to_fd_1_reaches_the_cell(px_cluster):
    """os.write(1, ...) and a child process's output went to the task's log, never to the cell."""
    code = (
        "import os, subprocess, sys\n"
        "os.write(1, b'straight to fd 1\\n')\n"
        "subprocess.run([sys.executable, '-c', 'print(\"from a child process\")'], check=True)\n"
        "print('and a print')\n"
    )
    out = run_px(px_cluster, code, targets="worker:0").wait(120)["worker:0"]
    assert out.status == "ok", out.traceback
    for line in ("straight to fd 1", "from a child process", "and a print"):
        assert line in out.stdout, out.stdout
    after = run_px(px_cluster, "print('next cell')", targets="worker:0").wait(60)["worker:0"]
    assert after.stdout.strip() == "next cell", "nothing of the last cell spills into the next"


def test_a_script_follows_a_cell_as_the_magic_does(px_cluster, capsys):
    """The follow policy (prefixed lines as they come, what went wrong per task) is PxRun.follow(),
    so a script gets what %%tf_px shows."""
    run = run_px(
        px_cluster, "print('hi from', task_index)\nif task_index == 1:\n    1 / 0", targets="worker:*"
    )
    failed = run.follow()
    out = capsys.readouterr()
    assert "[worker:0] hi from 0" in out.out and "[worker:1] hi from 1" in out.out
    assert failed == ["worker:1 raised ZeroDivisionError"] and "[worker:1] ZeroDivisionError" in out.err


def test_a_task_that_raises_shows_its_own_traceback_and_others_finish(px_cluster):
    code = "def f():\n    return 1 / (task_index - 1)\nvalue = f()\nvalue"
    out = run_px(px_cluster, code, targets="worker:*").wait(60)
    assert out["worker:0"].status == "ok" and out["worker:0"].result == -1.0
    bad = out["worker:1"]
    assert bad.status == "error" and bad.ename == "ZeroDivisionError"
    tb = "".join(bad.traceback)
    assert '<tf_px worker:1>", line 2, in f' in tb and "return 1 / (task_index - 1)" in tb
    assert "task_main" not in tb, "tfmagic's own frames are hidden"


def test_syntax_error_points_at_the_line(px_cluster):
    out = run_px(px_cluster, "x = 1\ny = (2 +\n", targets="worker:0").wait(30)
    assert out["worker:0"].ename == "SyntaxError" and "line 2" in "".join(out["worker:0"].traceback)


def test_interrupt_stops_the_cells(px_cluster):
    r = run_px(px_cluster, "import time\nwhile True:\n    time.sleep(0.05)", targets="worker:*")
    time.sleep(1)
    r.interrupt()
    out = r.wait(15)
    assert {o.status for o in out.values()} == {"interrupted"}
    assert run_px(px_cluster, "1 + 1", targets="worker:*").wait(15)["worker:1"].result == 2


def test_a_cell_on_a_task_still_running_an_earlier_one_is_refused_at_once(px_cluster):
    """A task runs its cells one after another: a second cell would wait, silent, behind one that
    goes on in the background. It is refused by name; the other task still takes it."""
    first = run_px(px_cluster, "import time\nwhile True:\n    time.sleep(0.05)", targets="worker:0")
    try:
        with pytest.raises(PxError, match=r"worker:0 is still running an earlier cell \(px") as err:
            run_px(px_cluster, "1 + 1", targets="worker:*")
        assert "\n" not in str(err.value) and "cluster.restart('worker:0', force=True)" in str(err.value)
        assert run_px(px_cluster, "1 + 1", targets="worker:1").wait(15)["worker:1"].result == 2
    finally:
        first.interrupt()
        first.wait(15)
    assert run_px(px_cluster, "2 + 2", targets="worker:*").wait(15)["worker:0"].result == 4


def test_targets_start_the_body_together_after_their_slow_imports(px_cluster, tmp_path):
    """%%tf_px's barrier: a target whose imports take 2 s longer holds the others back, so the
    cell's body starts on every target within a fraction of a second (without the barrier
    worker:0 would start about 2 s before worker:1, and train alone meanwhile)."""
    (tmp_path / "slow_on_one.py").write_text(
        "import json, os, time\n"
        "task = json.loads(os.environ['TF_CONFIG'])['task']\n"
        "time.sleep(2.0 if task == {'type': 'worker', 'index': 1} else 0.0)\n"
    )
    setup = run_px(px_cluster, f"import sys\nsys.path.insert(0, {str(tmp_path)!r})", targets="worker:*")
    assert all(o.status == "ok" for o in setup.wait(60).values())
    r = run_px(
        px_cluster,
        "import time\nimport slow_on_one\nbody_started = time.time()\nbody_started",
        targets="worker:*",
    )
    out = r.wait(60)
    assert all(o.status == "ok" for o in out.values()), {t: o.traceback for t, o in out.items()}
    starts = sorted(o.result for o in out.values())
    assert starts[1] - starts[0] < 0.5, starts
    assert r.started_together_at is not None and abs(r.started_together_at - starts[0]) < 0.5


def test_an_interrupt_reaches_targets_waiting_at_the_barrier(px_cluster, tmp_path):
    """A target waiting for a slower one is interrupted too: nothing of the body runs."""
    (tmp_path / "very_slow_on_one.py").write_text(
        "import json, os, time\n"
        "task = json.loads(os.environ['TF_CONFIG'])['task']\n"
        "time.sleep(3.0 if task == {'type': 'worker', 'index': 1} else 0.0)\n"
    )
    run_px(px_cluster, f"import sys\nsys.path.insert(0, {str(tmp_path)!r})", targets="worker:*").wait(60)
    r = run_px(px_cluster, "import very_slow_on_one\nprint('body ran')", targets="worker:*")
    time.sleep(1.0)
    r.interrupt()
    out = r.wait(30)
    assert all(o.status == "interrupted" for o in out.values()), {t: o.status for t, o in out.items()}
    assert all("body ran" not in o.stdout for o in out.values())


def test_bad_targets(px_cluster):
    with pytest.raises(PxError, match="no job 'chief'"):
        run_px(px_cluster, "1", targets="chief:*")
    with pytest.raises(tfmagic.UnknownTask, match="worker:5 is not in this cluster"):
        run_px(px_cluster, "1", targets="worker:5")


def test_a_task_that_dies_mid_cell_is_reported_and_others_finish(capsys):
    with tfmagic.LocalCluster(ps=0, workers=2, spares=False) as cluster:
        r = run_px(
            cluster,
            "import os, signal, time\nif task_index == 1:\n    os.kill(os.getpid(), signal.SIGKILL)\n"
            "time.sleep(1)\n'alive'",
        )
        assert r.follow() == ["worker:1 died"]
        # a script is told what a script can run (the magic says %tf_cluster logs worker:1)
        assert "see cluster.logs('worker:1')" in capsys.readouterr().err
        out = r.wait(30)
        assert out["worker:0"].status == "ok" and out["worker:0"].result == "alive"
        assert out["worker:1"].status == "died" and "exit code -9" in out["worker:1"].evalue
        assert not cluster.procs[tfmagic.TaskName("worker", 1)].alive
        assert cluster.status()["worker:1"].state.startswith("exited")


def test_a_stranger_cannot_get_code_run(px_cluster, tmp_path):
    """The code channel is a pipe this process holds; the task listens on no other port."""
    marker = tmp_path / "ran"
    for task, proc in px_cluster.procs.items():
        ports = {
            c.laddr.port
            for c in psutil.Process(proc.pid).net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN
        }
        assert ports == {int(px_cluster.address(task).rsplit(":", 1)[1])}, "only TF's own port listens"
        # the code arrives on a pipe whose only write end this process holds (not fd 0: cells
        # and their children get /dev/null there, so they cannot read the channel)
        assert os.readlink(f"/proc/{proc.pid}/fd/0") == "/dev/null"
        ours = os.readlink(f"/proc/self/fd/{proc._to_task.fileno()}")
        theirs = {os.readlink(f"/proc/{proc.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{proc.pid}/fd")}
        assert ours.startswith("pipe:") and ours in theirs, (ours, theirs)
        # a stranger speaking our protocol to the one open port gets nowhere
        with socket.create_connection(("127.0.0.1", min(ports)), timeout=5) as s:
            s.sendall(
                b'{"op": "exec", "id": "x", "code": "open(%r, \\"w\\").write(\\"1\\")"}\n'
                % str(marker).encode()
            )
            time.sleep(0.5)
    assert not marker.exists()
    assert run_px(px_cluster, "1", targets="ps:0").wait(15)["ps:0"].result == 1, "tasks are unharmed"


def test_seed_000_sync_program_reaches_the_engines_loss(px_cluster):
    """Seed 000's between-graph sync program (SyncReplicasOptimizer, replica_device_setter,
    MonitoredTrainingSession) and the kernel-driven sync engine, same data, lr and steps.

    Tolerance: SyncReplicasOptimizer aggregates *any* 2 gradients per step (a fast worker
    may give two), the engine exactly one per worker, so the batches differ; after 150
    updates both sit at the data's noise floor (noise variance 0.01), so their held-out
    losses must agree within 15% of it (0.0015)."""
    steps = 150
    r = run_px(px_cluster, seed_000(issync=True, steps=steps))
    out = r.wait(180)
    assert all(o.status == "ok" for o in out.values()), {t: o.traceback for t, o in out.items()}
    assert "returns at once" in out["ps:0"].stdout
    # seed 002's question, "did the nodes really cooperate?": the workers start together
    # (the cell's barrier), so each computes a fair part of the gradients
    local = {
        t: int(re.search(r"(\d+) local steps", out[t].stdout).group(1)) for t in ("worker:0", "worker:1")
    }
    assert min(local.values()) >= sum(local.values()) / 3, local
    w, b = (
        run_px(px_cluster, "(float(final_w[0][0]), float(final_b[0]))", targets="worker:0")
        .wait(30)["worker:0"]
        .result
    )
    assert len({rec.task for rec in r.history.records}) == 2 and r.history.global_steps[-1].step >= steps - 1
    # the reported steps feed the same dashboard as the engine's runs
    dash = Dashboard(px_cluster, runs=[r])
    assert not dash.active and dash.draw().startswith(b"\x89PNG")
    assert "worker:0" in dash.summary() and "worker:1" in dash.summary(), dash.summary()
    data = Linear().data
    seed_loss = float(np.mean((data.x_test * w + b - data.y_test) ** 2))
    h = tfmagic.train(px_cluster, mode="sync", model=Linear(), steps=steps, batch_size=16, lr=0.1)
    assert abs(seed_loss - h.final_loss) < 0.0015, (seed_loss, h.final_loss)
    assert abs(w - 2) < 0.05 and abs(b - 10) < 0.05


def test_seed_000_async_program(px_cluster):
    out = run_px(px_cluster, seed_000(issync=False, steps=120)).wait(180)
    assert all(o.status == "ok" for o in out.values()), {t: o.traceback for t, o in out.items()}
    local = {
        t: int(re.search(r"(\d+) local steps", out[t].stdout).group(1)) for t in ("worker:0", "worker:1")
    }
    assert min(local.values()) >= sum(local.values()) / 3, local


def test_multi_worker_mirrored_strategy_in_collective_mode():
    with tfmagic.LocalCluster(ps=0, workers=2, spares=False, collective=True) as cluster:
        code = (
            "with strategy.scope():\n    w = tf.Variable(0.0)\n"
            "@tf.function\ndef step():\n"
            "    def replica():\n"
            "        g = tf.distribute.get_replica_context().all_reduce('sum', tf.constant(float(task_index + 1)))\n"
            "        w.assign_add(g)\n"
            "    strategy.run(replica)\n"
            "for _ in range(3):\n    step()\n"
            "(strategy.num_replicas_in_sync, float(w.numpy()))"
        )
        out = run_px(cluster, code).wait(120)
        assert {t: o.result for t, o in out.items()} == {"worker:0": (2, 9.0), "worker:1": (2, 9.0)}, out


def test_tf_px_magic_streams_prefixed_lines_and_binds_results():
    k = Kernel(env={"TFMAGIC_SPARES": "0"})
    try:
        k.ok("%load_ext tfmagic\n%tf_cluster start --ps 1 --workers 2", timeout=180)
        reply = k.ok(
            "%%tf_px --targets worker:* -o where\nprint('hello from', job_name, task_index)\ntask_index * 10"
        )
        assert (
            "[worker:0] hello from worker 0" in reply.stdout
            and "[worker:1] hello from worker 1" in reply.stdout
        )
        assert "(worker:0, worker:1: importing TensorFlow's Python API for a first cell" in reply.stderr
        assert k.value("where") == {"worker:0": 0, "worker:1": 10}
        bad = k.run("%%tf_px --targets worker:1\nraise ValueError('nope')")
        assert bad.status == "error" and "[worker:1] ValueError: nope" in bad.text
        assert "importing TensorFlow" not in bad.text  # once per task
        assert "worker:1 raised ValueError" in bad.text
        intr = k.run(
            "%%tf_px --targets worker:*\nimport time\nwhile True:\n    time.sleep(0.1)",
            timeout=60,
            interrupt_after=3,
        )
        assert intr.status == "error" and "interrupted" in intr.text
        assert k.value("1 + 1") == 2
        k.ok("%%tf_px --noblock --targets ps:0\nimport time\ntime.sleep(1)\n7")
        k.ok("h = __import__('tfmagic').training.last_run()")
        poll_for(lambda: k.value("h.done"), 30, what="the noblock cell")
        assert k.value("h.results") == {"ps:0": 7}
        assert "no job 'chief'" in k.run("%%tf_px --targets chief:*\n1").text
    finally:
        pids = []
        try:
            pids = k.value(
                "[p.pid for p in __import__('tfmagic.procs.owner', fromlist=['owner']).processes()]"
            )
        finally:
            k.shutdown()
        assert_gone(pids)


def test_allreduce_sync_equals_the_kernel_driven_sync_engine(px_cluster):
    """All-reduce (MWMS) averages exactly one gradient per worker per step, as the engine does:
    the same weights, to float tolerance."""
    from tfmagic.seeds import allreduce

    with tfmagic.LocalCluster(ps=0, workers=2, spares=False, collective=True) as cluster:
        assert run_px(cluster, allreduce(steps=40)).wait(120)["worker:0"].status == "ok"
        w, b = (
            run_px(cluster, "(float(final_w[0][0]), float(final_b[0]))", targets="worker:1")
            .wait(30)["worker:1"]
            .result
        )
    run = tfmagic.training.TrainingRun(
        px_cluster, "sync", model=Linear(), steps=40, batch_size=16, lr=0.1
    ).start()
    run.wait()
    assert w == pytest.approx(float(run.final_weights[0].ravel()[0]), abs=1e-5)
    assert b == pytest.approx(float(run.final_weights[1].ravel()[0]), abs=1e-5)
