"""%tf_cluster and %%tf_device through a real IPython kernel, as a notebook uses them."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from .conftest import assert_gone, poll_for
from .kernelutil import Kernel

pytestmark = [pytest.mark.kernel, pytest.mark.cluster]

TASK_PIDS = "sorted(p.pid for p in tfmagic.current_cluster().procs.values())"


@pytest.fixture(scope="module")
def kernel():
    k = Kernel(env={"TFMAGIC_SPARES": "0", "TF_CPP_MIN_LOG_LEVEL": "0"})
    k.ok("%load_ext tfmagic\nimport tfmagic, tensorflow as tf")
    yield k
    pids = k.value("[p.pid for p in __import__('tfmagic.procs.owner', fromlist=['owner']).processes()]")
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
    reply = kernel.ok("%tf_cluster status   # a comment, as the README writes them, is not an argument")
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


WAIT_FOR_A_SPARE = (
    "import time\nfrom tfmagic.pool import default_pool\n"
    "deadline = time.time() + 120\n"
    "while not [p for p in default_pool().processes() if p.warm_at] and time.time() < deadline: time.sleep(0.2)"
)


def test_unload_stops_everything():
    """Tasks and warm spares end with %unload_ext; the magics go with them and come back with a load."""
    k = Kernel(env={"TFMAGIC_SPARES": "1", "TFMAGIC_SPARE_BUDGET": "2GB"})
    try:
        k.ok("%load_ext tfmagic\n%tf_cluster start --ps 0 --workers 1", timeout=180)
        k.ok(WAIT_FOR_A_SPARE, timeout=180)
        pids = k.value("[p.pid for p in __import__('tfmagic.procs.owner', fromlist=['owner']).processes()]")
        assert len(pids) >= 2, "a task and at least one spare"
        k.ok("%unload_ext tfmagic")
        assert_gone(pids, timeout=10)
        for magic in ("%tf_cluster status", "%%tf_px\nx = 1", "%tf_train async", "%tf_experiment"):
            assert "not found" in usage_error(k.run(magic)), magic
        k.ok("%load_ext tfmagic")
        assert "No cluster is running" in k.ok("%tf_cluster status").text
    finally:
        k.shutdown()


def test_kernel_shutdown_stops_everything():
    """Tasks and warm spares end with a kernel shutdown."""
    k = Kernel(env={"TFMAGIC_SPARES": "1", "TFMAGIC_SPARE_BUDGET": "2GB"})
    k.ok("%load_ext tfmagic\n%tf_cluster start --ps 0 --workers 1", timeout=180)
    k.ok(WAIT_FOR_A_SPARE, timeout=180)
    pids = k.value("[p.pid for p in __import__('tfmagic.procs.owner', fromlist=['owner']).processes()]")
    assert len(pids) >= 2, "a task and at least one spare"
    k.shutdown()
    assert_gone(pids, timeout=15)


def _ended(pid: int, timeout: float) -> bool:
    """True once pid is gone or a zombie: SIGKILL is delivered asynchronously, and a
    kernel with many threads and 0.5 GB to unmap takes a moment to finish exiting."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


def test_kill_minus_9_of_the_kernel_leaves_nothing(tmp_path):
    """Tasks and warm spares both end when their kernel is SIGKILLed."""
    k = Kernel(env={"TFMAGIC_SPARES": "1", "TFMAGIC_SPARE_BUDGET": "4GB"})
    try:
        k.ok("%load_ext tfmagic\n%tf_cluster start --ps 0 --workers 1", timeout=180)
        k.ok(WAIT_FOR_A_SPARE, timeout=180)
        pids = k.value("[p.pid for p in __import__('tfmagic.procs.owner', fromlist=['owner']).processes()]")
        assert len(pids) >= 2, "a task and at least one spare"
        os.kill(k.pid, signal.SIGKILL)
        assert_gone(pids, timeout=10)
        assert _ended(k.pid, timeout=10), "the SIGKILLed kernel itself is still running"
    finally:
        try:
            k.kc.stop_channels()
            k.km.cleanup_resources()
        except Exception:  # noqa: BLE001 - the kernel was killed on purpose; its channels may be gone
            pass
        k.stderr_path.unlink(missing_ok=True)


def test_a_kernel_that_aborts_leaves_its_stacks_and_the_next_kernel_says_where(tmp_path):
    """A kernel that dies of a fatal signal (here abort() in a cell, as TensorFlow's failed checks do)
    writes its threads' stacks into its log before it dies (ipykernel's pipe on fd 2 dies with it);
    the next kernel's %load_ext keeps that log out of the sweep of dead kernels and says where."""
    # a private temporary directory too: a tfmagic process of the other test lane that starts meanwhile
    # sweeps dead kernels' directories in its own temporary directory, and would report this one there
    (tmp_path / "tmp").mkdir()
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "TMPDIR": str(tmp_path / "tmp")}
    first = Kernel(env=env)
    try:
        first.ok("%load_ext tfmagic", timeout=60)
        pid = first.pid
        first.kc.execute("import os\ndef abort_here_on_purpose():\n    os.abort()\nabort_here_on_purpose()")
        assert _ended(pid, timeout=30), "the kernel did not abort"
        first.km.provisioner.process.wait(10)  # reaped, as a Jupyter server reaps its dead kernels
    finally:
        try:
            first.kc.stop_channels()
            first.km.cleanup_resources()
        except Exception:  # noqa: BLE001 - the kernel died on purpose; its channels may be gone
            pass
        first.stderr_path.unlink(missing_ok=True)
    second = Kernel(env=env)
    try:
        said = second.ok("%load_ext tfmagic", timeout=60).text
        assert (
            f"an earlier kernel of yours (pid {pid}) died of a fatal signal (Fatal Python error: Aborted)"
            in said
        )
        kept = list((tmp_path / "cache" / "tfmagic" / "crashes").glob(f"kernel-{pid}-*.log"))
        assert len(kept) == 1 and "abort_here_on_purpose" in kept[0].read_text(), said
    finally:
        second.shutdown()


def test_tf_train_in_the_background_and_failure_injection_magics(kernel):
    said = kernel.value(
        "len(__import__('tfmagic.magics.render', fromlist=['_']).security_once.__globals__['_security_said'])"
    )
    again = kernel.ok("%tf_cluster start --ps 1 --workers 2 --replace", timeout=180)
    # the security paragraph is said once per kernel, not under every start of a lesson
    assert "Cluster c" in again.stdout and ("Security:" in again.stdout) == (said == 0), (said, again.stdout)
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


def test_tf_train_takes_a_keras_model_by_its_variable_name(kernel):
    kernel.ok("%tf_cluster start --ps 1 --workers 2 --replace", timeout=180)
    kernel.ok(
        "import keras, tensorflow as tf\n"
        "def input_fn(shard, shards):\n"
        "    x = tf.random.stateless_normal([2000, 8], seed=(1, 2))\n"
        "    y = tf.cast(tf.reduce_sum(x, axis=1) > 0, tf.int32)\n"
        "    return tf.data.Dataset.from_tensor_slices((x, y)).shard(shards, shard)\n"
        "net = tfmagic.KerasModel(\n"
        "    lambda: keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)]), input_fn=input_fn,\n"
        "    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), classifier=True)",
        timeout=120,
    )
    kernel.ok("run = %tf_train --model net --mode async --steps 200 --wait --no-dashboard", timeout=180)
    assert kernel.value("run.history.steps") == 200
    assert kernel.value("run.history.final_accuracy") > 0.85
    assert "(no eval_fn)" in kernel.value("run.history.summary()")


WIDGET = "application/vnd.jupyter.widget-view+json"


def _dashboard_output(reply) -> tuple[dict, str]:
    for data, display_id in zip(reply.displays, reply.display_ids):
        if WIDGET in data:
            return data, display_id
    raise AssertionError(f"no dashboard widget was displayed: {reply.displays}")


def test_tf_dashboard_refreshes_while_training_then_keeps_and_publishes_its_last_frame(kernel):
    kernel.ok("%tf_cluster start --ps 1 --workers 2 --replace", timeout=180)
    # as long as the frames take to count (1.5 s quiet, a minute in CI's niced lane); then stopped
    kernel.ok("run = %tf_train --mode async --model digits --steps 1000000 --lr 0.05 --no-dashboard")
    reply = kernel.ok("%tf_dashboard")
    data, display_id = _dashboard_output(reply)
    assert display_id, "shown with a display id, so its last frame can be published"
    assert data["image/png"] and "async" in data["text/plain"]  # what a front end without widgets shows
    kernel.ok("dash = tfmagic.Dashboard.latest()")
    assert kernel.value("dash.refresh") == 0.5  # twice a second
    first = kernel.value("dash.frames")
    # the kernel stays free while the dashboard draws in the background
    poll_for(lambda: kernel.value("dash.frames") >= first + 3, 60, interval=0.3, what="three new frames")
    assert kernel.value("dash.refreshing and run.running")
    kernel.ok("run.stop()", timeout=120)
    updates = kernel.value("run.history.steps")
    poll_for(lambda: not kernel.value("dash.refreshing"), 30, interval=0.3, what="the refresh to end")
    frames = kernel.value("dash.frames")
    time.sleep(1.5)
    assert kernel.value("dash.frames") == frames, "it kept drawing after training ended"
    assert kernel.value("dash._image.value == dash.last_png and len(dash.last_png) > 1000"), "last frame kept"
    assert f"{updates} updates" in kernel.value("dash._header.value")
    # re-published with the last frame: what a saved notebook holds without widget state
    finals = kernel.updates_of(display_id)
    assert finals, "the last frame was not published to the notebook"
    assert f"async: {updates} updates" in finals[-1]["text/plain"], finals[-1]["text/plain"]
    assert finals[-1]["image/png"] != data["image/png"]


def test_the_dashboard_stops_with_the_cluster_and_keeps_its_last_frame(kernel):
    kernel.ok("%tf_cluster start --ps 1 --workers 2 --replace", timeout=180)
    reply = kernel.ok("run = %tf_train --mode async --model digits --steps 100000 --lr 0.05")
    _dashboard_output(reply)  # %tf_train shows it
    kernel.ok("dash = tfmagic.Dashboard.latest()\nassert dash is run.dashboard")
    poll_for(lambda: kernel.value("run.history.steps") > 20, 120, interval=0.3, what="training to start")
    kernel.ok("%tf_cluster stop", timeout=120)
    poll_for(lambda: not kernel.value("dash.refreshing"), 30, interval=0.3, what="the refresh to end")
    assert kernel.value("dash._image.value == dash.last_png and len(dash.last_png) > 1000")
    assert "(stopped)" in kernel.value("dash._table.value")
    kernel.ok("%tf_cluster start --ps 1 --workers 2", timeout=180)  # as the next tests expect


def test_tf_dashboard_says_what_to_do_when_there_is_nothing_to_show():
    k = Kernel(env={"TFMAGIC_SPARES": "0"})
    try:
        k.ok("%load_ext tfmagic")
        assert "start a cluster" in usage_error(k.run("%tf_dashboard"))
        assert "--refresh" in usage_error(k.run("%tf_dashboard --refresh 0"))
    finally:
        k.shutdown()


@pytest.mark.parametrize(
    "line, expect",
    [
        ("%tf_train --mode sideways", "unknown mode"),
        ("%tf_train --backup-workers 2", "at most 1"),
        (
            "%tf_train --model resnet",
            "unknown model 'resnet'; use linear, digits, or the name of a tfmagic.KerasModel",
        ),
        ("%tf_train --model tfmagic", "tfmagic is a module, not a model; wrap it as"),
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


def test_terminal_ipython_gets_text_and_a_picture_and_leaves_nothing_with_spares_on(tmp_path):
    """No widget front end: %tf_dashboard prints the numbers and says how to get the picture.

    Spares are on here: when the IPython process exits, its tasks and its warm
    spares end with it.
    """
    import ast
    import subprocess
    import sys

    script = tmp_path / "train.ipy"
    png = tmp_path / "dashboard.png"
    script.write_text(
        "%load_ext tfmagic\n"
        "%tf_cluster start --ps 1 --workers 1\n"
        "run = %tf_train --mode async --model digits --steps 40 --wait\n"
        "%tf_dashboard\n"
        "import tfmagic\n"
        f"tfmagic.Dashboard.latest().save({str(png)!r})\n"
        f"{WAIT_FOR_A_SPARE}\n"
        "print('PIDS', [p.pid for p in __import__('tfmagic.procs.owner', fromlist=['owner']).processes()])\n"
    )
    env = dict(os.environ, TFMAGIC_SPARES="1", TFMAGIC_SPARE_BUDGET="2GB")
    env.pop("PYTEST_CURRENT_TEST", None)
    out = subprocess.run(
        [sys.executable, "-m", "IPython", "--quick", "--no-banner", "--colors=NoColor", str(script)],
        capture_output=True,
        text=True,
        timeout=400,
        env=env,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "async: 40 updates" in out.stdout, out.stdout[-2000:]
    assert "worker:0" in out.stdout and "steps/s" in out.stdout
    assert "Dashboard.latest().save(" in out.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    pids = next(ast.literal_eval(ln[5:]) for ln in out.stdout.splitlines() if ln.startswith("PIDS "))
    assert len(pids) >= 3, f"two tasks and at least one warm spare: {pids}"
    assert_gone(pids, timeout=15)
