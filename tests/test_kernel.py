"""%tf_cluster and %%tf_device through a real IPython kernel, as a notebook uses them."""

from __future__ import annotations

import os
import signal

import psutil
import pytest

from .conftest import assert_gone
from .kernelutil import Kernel

pytestmark = [pytest.mark.kernel, pytest.mark.cluster]

TASK_PIDS = "sorted(p.pid for p in tfmagic.current_cluster().procs.values())"


@pytest.fixture(scope="module")
def kernel():
    k = Kernel(env={"TFMAGIC_SPARES": "0", "TF_CPP_MIN_LOG_LEVEL": "0"})
    k.ok("%load_ext tfmagic\nimport tfmagic, tensorflow as tf")
    yield k
    pids = k.value("[p.pid for p in __import__('tfmagic').owner.processes()]")
    k.shutdown()
    assert_gone(pids)


@pytest.fixture(scope="module")
def started(kernel):
    reply = kernel.ok("%tf_cluster start --ps 1 --workers 2", timeout=180)
    return reply


def usage_error(reply) -> str:
    assert reply.status == "error", reply.text
    assert reply.error["ename"] == "UsageError", reply.error
    seen = reply.text
    assert "File " not in seen and "Traceback" not in seen, f"a traceback wall reached the user:\n{seen}"
    assert len([ln for ln in reply.stderr.splitlines() if ln.strip()]) == 1, reply.stderr
    return reply.error["evalue"]


def test_start_shows_progress_and_the_security_note(started):
    html = started.html
    assert "worker:1" in html and "up" in html
    assert "is up" in started.text
    assert "Cluster c" in started.stdout and "1 ps, 2 workers" in started.stdout
    assert "Security:" in started.stdout and "127.0.0.1" in started.stdout


def test_same_shape_is_reused_other_shape_says_how_to_replace(kernel, started):
    before = kernel.value(TASK_PIDS)
    assert "Reusing the running cluster" in kernel.ok("%tf_cluster start --ps 1 --workers 2").stdout
    msg = usage_error(kernel.run("%tf_cluster start --workers 3"))
    assert "--replace" in msg and "%tf_cluster stop" in msg
    assert kernel.value(TASK_PIDS) == before


def test_status_is_an_html_table(kernel, started):
    reply = kernel.ok("%tf_cluster status")
    assert "<table>" in reply.html and "worker:1" in reply.html and "PSS" in reply.html
    assert "running" in reply.text


def test_spec_prints_clusterspec_and_tf_config(kernel, started):
    out = kernel.ok("%tf_cluster spec").stdout
    assert "ClusterSpec:" in out and "TF_CONFIG for worker:1:" in out and '"index": 1' in out


def test_logs_of_a_task(kernel, started):
    out = kernel.ok("%tf_cluster logs worker:0 --tail 50").stdout
    assert "takes the role worker:0" in out


def test_tf_device_places_variables_and_ops(kernel, started):
    kernel.ok("%%tf_device ps:0\nv = tf.Variable([1.0, 2.0])")
    assert kernel.value("v.device").startswith("/job:ps/replica:0/task:0")
    kernel.ok("%%tf_device /job:worker/task:1\ny = v * 10.0")
    assert kernel.value("y.device").startswith("/job:worker/replica:0/task:1")
    assert kernel.value("y.numpy().tolist()") == [10.0, 20.0]
    # the last expression of the cell is displayed, as in any cell
    reply = kernel.ok("%%tf_device worker:0\n(v + 1.0).numpy().tolist()")
    assert "[2.0, 3.0]" in reply.text


@pytest.mark.parametrize(
    "line, expect",
    [
        ("%tf_cluster strat", "unknown subcommand 'strat'"),
        ("%tf_cluster start --workers 0 --replace", "at least 1 workers"),
        ("%tf_cluster start --workers -1 --replace", "too small"),
        ("%tf_cluster start --workers two --replace", "not a whole number"),
        ("%tf_cluster start --ps 1.5 --replace", "not a whole number"),
        ("%%tf_device worker:9\nx = 1", "worker:9 is not in this cluster"),
        ("%%tf_device worker-1\nx = 1", "is not a task name"),
        ("%%tf_device\nx = 1", "needs a task"),
        ("%tf_cluster logs", "needs a task"),
        ("%tf_cluster logs wrker:x", "is not a task name"),
    ],
)
def test_bad_input_is_one_line_and_leaves_the_cluster_as_it_was(kernel, started, line, expect):
    before = kernel.value(TASK_PIDS)
    assert expect in usage_error(kernel.run(line))
    assert kernel.value(TASK_PIDS) == before


def test_syntax_error_points_at_the_users_line(kernel, started):
    reply = kernel.run("%%tf_device worker:0\nx = 1\ny = (2 +\n")
    assert reply.status == "error"
    tb = reply.text
    assert "SyntaxError" in tb
    # the user's own line, numbered as in the cell's code: line 2 of the body
    assert "y = (2 +" in tb and "line 2" in tb, tb
    assert "tfmagic" not in tb.replace("%%tf_device", "").lower().replace("(the cell failed", "")


def test_exception_shows_the_users_traceback_not_tfmagic_internals(kernel, started):
    reply = kernel.run("%%tf_device worker:0\ndef f():\n    return 1 / 0\nz = f()")
    assert reply.status == "error"
    tb = reply.text
    assert "ZeroDivisionError" in tb and "return 1 / 0" in tb
    assert "magics.py" not in tb and "cluster.py" not in tb


def test_interrupting_a_blocked_cell_frees_the_kernel(kernel, started):
    kernel.ok("%%tf_device ps:0\nq = tf.queue.FIFOQueue(1, tf.float32)")
    reply = kernel.run("%%tf_device ps:0\nq.dequeue().numpy()", timeout=60, interrupt_after=3)
    assert reply.status == "error"
    assert "Interrupted" in reply.text and "ps:0" in reply.text
    # the kernel is usable and other tasks still answer
    assert kernel.value("1 + 1") == 2
    kernel.ok("%%tf_device worker:1\nr = (tf.constant(3.0) * 2).numpy()")
    assert kernel.value("float(r)") == 6.0


def test_usage_help_is_real(kernel):
    reply = kernel.ok("%tf_cluster?")
    text = reply.text
    assert "--workers" in text and "--ps" in text and "logs" in text


def test_stop_under_a_connected_client_is_quiet_and_no_cluster_cases(kernel, started):
    kernel.ok("%%tf_device ps:0\nold_var = tf.Variable(1.0)")
    pids = kernel.value(TASK_PIDS)
    stop = kernel.ok("%tf_cluster stop")
    assert "Stopped cluster" in stop.stdout
    assert_gone(pids)
    # Reconnecting after servers died under the client makes TensorFlow log
    # CloseContext errors from C++; they go to the kernel's log, not the notebook.
    again = kernel.ok("%tf_cluster start --ps 0 --workers 1", timeout=180)
    used = kernel.ok("%%tf_device worker:0\nprint((tf.constant(2.0) * 2).numpy())")
    after = kernel.run(
        "import gc, os, time\ndel old_var\ngc.collect()\ntime.sleep(2)\nos.write(2, b'fd2-marker\\n')",
        until="fd2-marker",
    )
    assert after.status == "ok" and "4.0" in used.stdout
    for reply in (stop, again, used, after):
        assert "CloseContext" not in reply.text and "E0000" not in reply.text, reply.text
    assert "close remote context" in kernel.ok("%tf_cluster logs kernel --tail 0").stdout
    kernel.ok("%tf_cluster stop")
    assert "nothing to stop" in usage_error(kernel.run("%tf_cluster stop"))
    assert "no cluster is running" in usage_error(kernel.run("%%tf_device worker:0\nx = 1"))
    assert "no cluster is running" in usage_error(kernel.run("%tf_cluster logs worker:0"))


def test_unload_stops_everything():
    k = Kernel(env={"TFMAGIC_SPARES": "0"})
    try:
        k.ok("%load_ext tfmagic\n%tf_cluster start --ps 0 --workers 1", timeout=180)
        pids = k.value("[p.pid for p in __import__('tfmagic').owner.processes()]")
        assert pids
        k.ok("%unload_ext tfmagic")
        assert_gone(pids, timeout=10)
    finally:
        k.shutdown()


def test_kernel_shutdown_stops_everything():
    k = Kernel(env={"TFMAGIC_SPARES": "0"})
    k.ok("%load_ext tfmagic\n%tf_cluster start --ps 0 --workers 1", timeout=180)
    pids = k.value("[p.pid for p in __import__('tfmagic').owner.processes()]")
    k.shutdown()
    assert_gone(pids, timeout=15)


def test_kill_minus_9_of_the_kernel_leaves_nothing(tmp_path):
    """Tasks and warm spares both end when their kernel is SIGKILLed."""
    k = Kernel(env={"TFMAGIC_SPARES": "1", "TFMAGIC_SPARE_BUDGET": "4GB"})
    try:
        k.ok("%load_ext tfmagic\n%tf_cluster start --ps 0 --workers 1", timeout=180)
        k.ok(
            "import time\nfrom tfmagic.pool import default_pool\n"
            "deadline = time.time() + 120\n"
            "while not default_pool().processes() and time.time() < deadline: time.sleep(0.2)"
        )
        pids = k.value("[p.pid for p in __import__('tfmagic').owner.processes()]")
        assert len(pids) >= 2, "a task and at least one spare"
        os.kill(k.pid, signal.SIGKILL)
        assert_gone(pids, timeout=10)
        assert not psutil.pid_exists(k.pid) or psutil.Process(k.pid).status() == psutil.STATUS_ZOMBIE
    finally:
        try:
            k.kc.stop_channels()
            k.km.cleanup_resources()
        except Exception:
            pass


def test_tf_train_in_the_background_and_failure_injection_magics(kernel):
    kernel.ok("%tf_cluster start --ps 1 --workers 2 --replace", timeout=180)
    reply = kernel.ok("run = %tf_train --mode compare --model digits --steps 150\nprint(type(run).__name__)")
    assert "Comparison" in reply.stdout
    # the kernel is free while it trains
    assert kernel.value("1 + 1") == 2
    out = kernel.ok("%tf_cluster slow worker:1 --factor 3").stdout
    assert "1/3 speed" in out
    assert "slowed x3" in kernel.ok("%tf_cluster status").text
    kernel.ok("%tf_cluster slow worker:1 --factor 1")
    kernel.ok("run.wait()", timeout=300)
    table = kernel.ok("print(run.table())").stdout
    assert "sync" in table and "async" in table
    out = kernel.ok("%tf_cluster kill worker:1").stdout
    assert "Killed worker:1" in out
    assert "exited" in kernel.ok("%tf_cluster status").text
    out = kernel.ok("%tf_cluster restart worker:1", timeout=120).stdout
    assert "Restarted worker:1" in out
    kernel.ok("%%tf_device worker:1\nprint((tf.constant(2.0) * 5).numpy())")


@pytest.mark.parametrize(
    "line, expect",
    [
        ("%tf_train --mode sideways", "unknown mode"),
        ("%tf_train --backup-workers 2", "at most 1"),
        ("%tf_train --model resnet", "unknown model"),
        ("%tf_train --steps x", "not a whole number"),
        ("%tf_cluster slow worker:1 --factor 0.5", "factor must be"),
        ("%tf_cluster slow", "needs a task"),
        ("%tf_cluster kill worker:7", "not in this cluster"),
    ],
)
def test_training_bad_input(kernel, line, expect):
    kernel.ok("%tf_cluster start --ps 1 --workers 2")
    before = kernel.value(TASK_PIDS)
    assert expect in usage_error(kernel.run(line))
    assert kernel.value(TASK_PIDS) == before
