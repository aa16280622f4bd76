"""The fd-2 filter that keeps TensorFlow's native log lines out of the notebook.

Three layers: the pure line classifier (table of real lines); the filter in a
plain child process, with a real TensorFlow error logged by C++; and the
filter inside a real ipykernel, checking the stream messages a notebook shows.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from tfmagic.logfilter import is_native_log_line

from .conftest import assert_gone, poll_for

ROOT = Path(__file__).resolve().parents[1]

# Independent of the classifier under test: the header of any native line.
NATIVE = re.compile(
    r"^(?:[IWEF]\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ \S+:\d+\]"
    r"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF] "
    r"|WARNING: All log messages before absl)",
    re.MULTILINE,
)

# -- the classifier ----------------------------------------------------------

# Each case is a run of consecutive lines as they reach fd 2, with the
# expected verdict for every line (True = native, goes to the log file).
REAL_RUNS = {
    "absl, port clash": [
        (
            "E0000 00:00:1795346586.466718    7950 add_port.cc:83] Failed to add port to server: "
            "No address added out of total 1 resolved for '0.0.0.0:49537'",
            True,
        ),
        (
            "E0000 00:00:1795346586.466879    7950 grpc_server_lib.cc:618] UNKNOWN: Could not start gRPC server",
            True,
        ),
    ],
    "absl warning before InitializeLog": [
        ("WARNING: All log messages before absl::InitializeLog() is called are written to STDERR", True),
        (
            "I0000 00:00:1795347579.881525    7950 cudart_stub.cc:31] Could not find cuda drivers on your machine, "
            "GPU will not be used.",
            True,
        ),
    ],
    "cpu feature notice, second line unindented": [
        (
            "I0000 00:00:1795347580.052207    7950 cpu_feature_guard.cc:227] This TensorFlow binary is optimized "
            "to use available CPU instructions in performance-critical operations.",
            True,
        ),
        (
            "To enable the following instructions: AVX2 AVX512F AVX512_VNNI FMA, in other operations, rebuild "
            "TensorFlow with the appropriate compiler flags.",
            True,
        ),
    ],
    "CloseContext after the servers stopped": [
        (
            "E0000 00:00:1795347984.831072    9942 context.cc:566] Unable to close remote context with ID "
            "16502030279511628320 for worker: /job:worker/replica:0/task:1 due to failed to connect to all "
            "addresses; last error: UNKNOWN: ipv4:127.0.0.1:58165: Failed to connect to remote host: "
            "Connection refused",
            True,
        ),
        (
            "Additional GRPC error information from remote target /job:worker/replica:0/task:1 while calling "
            "/tensorflow.eager.EagerService/CloseContext:",
            True,
        ),
        (
            ':UNKNOWN:Error received from peer  {grpc_message:"failed to connect to all addresses", grpc_status:14}',
            True,
        ),
        (
            "W0000 00:00:1795347984.831185    9617 context.cc:1769] Unable to destroy server_ object, so releasing "
            "instead. Servers don't support clean shutdown.",
            True,
        ),
    ],
    "older TensorFlow format and gRPC json detail": [
        (
            "2026-11-22 11:20:00.123456: E tensorflow/core/distributed_runtime/eager/"
            "remote_tensor_handle_data.cc:76] Unable to destroy remote tensor handles.",
            True,
        ),
        ("Additional GRPC error information from remote target /job:worker/replica:0/task:0:", True),
        ("This could happen if the remote target has been disconnected from the client.", True),
        (
            ':{"created":"@1795347984.831185","description":"Error received from peer ipv4:127.0.0.1:2222",'
            '"grpc_status":14}',
            True,
        ),
        (
            "2021-03-01 10:00:00.123456: W tensorflow/stream_executor/platform/default/dso_loader.cc:60] "
            "Could not load dynamic library 'libcudart.so.11.0'",
            True,
        ),
        ('{"created":"@1612345678.123","description":"Endpoint read failed"}', True),
        ("\tindented detail of the message", True),
    ],
    "gRPC with nanoseconds, then a source trace": [
        (
            "E1122 11:20:00.123456789   12345 chttp2_transport.cc:1234] ipv4:127.0.0.1:2222: Connection reset",
            True,
        ),
        ("=== Source Location Trace: ===", True),
        ("external/local_tsl/tsl/platform/status.cc:42", True),
    ],
    "a user traceback right after a native line": [
        (
            "E0000 00:00:1795346586.466879    7950 grpc_server_lib.cc:618] UNKNOWN: Could not start gRPC server",
            True,
        ),
        ("Traceback (most recent call last):", False),
        ('  File "<stdin>", line 1, in <module>', False),
        ("tensorflow.python.framework.errors_impl.UnknownError: Could not start gRPC server", False),
    ],
    "user prints with blank lines between": [
        ("hello", False),
        ("", False),
        ("    an indented print", False),
        ("", False),
        ("step 10: loss=0.25", False),
    ],
    "user lines that only look a bit like logs": [
        ("saw E0000 00:00:1795346586.466879    7950 x.cc:1] in the middle", False),
        ("E0000 is the code we got", False),
        (
            "WARNING:tensorflow:5 out of the last 5 calls to <function f> triggered tf.function retracing.",
            False,
        ),
        ("2026-11-22 11:20:00 starting epoch 3", False),
        ("Epoch 1/3", False),
        ('  File "train.py", line 3', False),
        (":not a grpc status", False),
        ("{'created': 1}", False),
        ("To enable the following instructions: no, this is a user line", False),
    ],
}


def _flatten(runs):
    for name, run in runs.items():
        previous = False
        for index, (line, expected) in enumerate(run):
            yield pytest.param(line, previous, expected, id=f"{name}[{index}]")
            previous = expected


@pytest.mark.unit
@pytest.mark.parametrize(("line", "previous_was_native", "expected"), list(_flatten(REAL_RUNS)))
def test_classifies_real_lines(line, previous_was_native, expected):
    assert is_native_log_line(line, previous_was_native) is expected
    assert is_native_log_line(line + "\n", previous_was_native) is expected


@pytest.mark.unit
@pytest.mark.parametrize(
    "line",
    [
        "Traceback (most recent call last):",
        "hello",
        "",
        "  indented",
        '{"created": "by the user"}',
        "Additional GRPC error information, said the user",
        ":UNKNOWN: said nobody",
    ],
)
def test_continuations_need_a_native_line_before(line):
    assert not is_native_log_line(line, False)


@pytest.mark.unit
@pytest.mark.parametrize("line", ["Traceback (most recent call last):", "hello", "", "Epoch 2/3", "0.25"])
def test_user_lines_are_kept_even_right_after_a_native_line(line):
    assert not is_native_log_line(line, True)


# -- helpers for real processes ----------------------------------------------


@pytest.fixture
def no_child_left():
    """Every process the test started (and their children) is gone afterwards."""
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    yield
    left = [p.pid for p in me.children(recursive=True) if p.pid not in before]
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert_gone(left)
    assert not left, f"the test left processes behind: {left}"


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTEST_CURRENT_TEST", None)
    env["TF_CPP_MIN_LOG_LEVEL"] = "0"  # the conftest quiets TF; here we want every native line
    return env


def run_child(code: str, timeout: float = 120.0, stdin: bytes | None = None) -> tuple[int, str, bytes]:
    """Run ``code`` in a fresh Python in the repository root; return (exit code, stdout, stderr bytes)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=child_env(),
        cwd=str(ROOT),
    )
    try:
        out, err = proc.communicate(stdin, timeout=timeout)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
    return proc.returncode, out.decode(), err


def last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


# -- the filter in a plain process -------------------------------------------


@pytest.mark.cluster
@pytest.mark.usefixtures("no_child_left")
def test_bytes_pass_unchanged_native_lines_go_to_the_log_and_nothing_leaks(tmp_path):
    log1, log2 = tmp_path / "first.log", tmp_path / "sub" / "second.log"
    code = f"""
        import json, os, sys, time
        from tfmagic import logfilter

        def wait(predicate):
            deadline = time.monotonic() + 10
            while not predicate():
                assert time.monotonic() < deadline, "reader did not catch up"
                time.sleep(0.01)

        before = sorted(os.listdir("/proc/self/fd"))
        logfilter.uninstall()                       # not installed: nothing happens
        a = logfilter.install({str(log1)!r})
        b = logfilter.install({str(log2)!r})        # same filter, log moved
        assert logfilter.installed() is a
        os.write(2, b"E0000 00:00:1.000000 1 x.cc:1] only in the log\\n")
        wait(lambda: a.filtered_lines == 1)
        a.show = True
        os.write(2, b"W0000 00:00:1.000000 1 x.cc:2] shown and logged\\n")
        wait(lambda: a.filtered_lines == 2)
        a.show = False
        os.write(2, b"I0000 00:00:1.000000 1 x.cc:3] before a pause\\n")
        wait(lambda: a.filtered_lines == 3)
        time.sleep(2 * logfilter.CONTINUATION_WINDOW)  # what the window is about: time
        os.write(2, b"    an indented user line, long after\\n")
        os.write(2, b"caf\\xc3\\xa9 \\xff raw bytes\\r progress 50%\\r progress 100%\\n\\n")
        print("python's sys.stderr", file=sys.stderr)
        logfilter.uninstall()
        logfilter.uninstall()
        os.write(2, b"E0000 00:00:1.000000 1 x.cc:4] after uninstall\\n")
        after = sorted(os.listdir("/proc/self/fd"))
        print(json.dumps(dict(same=a is b, before=before, after=after, filtered=a.filtered_lines,
                              forwarded=a.forwarded_bytes, installed=logfilter.installed() is not None,
                              log=str(a.log_path))))
    """
    rc, out, err = run_child(code, timeout=60)
    assert rc == 0, err.decode(errors="replace")
    result = last_json(out)
    shown = (
        b"W0000 00:00:1.000000 1 x.cc:2] shown and logged\n"
        b"    an indented user line, long after\n"
        b"caf\xc3\xa9 \xff raw bytes\r progress 50%\r progress 100%\n\n"
        b"python's sys.stderr\n"
    )
    assert err == shown + b"E0000 00:00:1.000000 1 x.cc:4] after uninstall\n"
    assert result["same"] and not result["installed"]
    assert result["before"] == result["after"], "file descriptors leaked"
    assert result["filtered"] == 3 and result["forwarded"] == len(shown)
    assert result["log"] == str(log2) and log1.exists()
    assert log2.read_bytes() == (
        b"E0000 00:00:1.000000 1 x.cc:1] only in the log\n"
        b"W0000 00:00:1.000000 1 x.cc:2] shown and logged\n"
        b"I0000 00:00:1.000000 1 x.cc:3] before a pause\n"
    )


@pytest.mark.cluster
@pytest.mark.usefixtures("no_child_left")
def test_a_prompt_without_newline_is_not_held_back(tmp_path):
    code = f"""
        import os, sys
        from tfmagic import logfilter
        logfilter.install({str(tmp_path / "native.log")!r})
        os.write(2, b"Your name? ")
        name = sys.stdin.readline().strip()      # answered only once the prompt was seen
        os.write(2, b"hello " + name.encode() + b"\\n")
        logfilter.uninstall()
    """
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=child_env(),
        cwd=str(ROOT),
    )
    try:
        os.set_blocking(proc.stderr.fileno(), False)
        seen = bytearray()

        def prompt_seen():
            chunk = proc.stderr.read()
            if chunk:
                seen.extend(chunk)
            return b"Your name? " in seen

        poll_for(prompt_seen, 30, what=f"the prompt on stderr (got {bytes(seen)!r})")
        proc.stdin.write(b"Ada\n")
        proc.stdin.close()
        assert proc.wait(30) == 0
        os.set_blocking(proc.stderr.fileno(), True)
        seen.extend(proc.stderr.read())
        assert bytes(seen) == b"Your name? hello Ada\n"
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
        proc.stderr.close()


@pytest.mark.cluster
@pytest.mark.usefixtures("no_child_left")
def test_uninstall_does_not_wait_for_a_child_that_inherited_the_pipe(tmp_path):
    # The child keeps a write end of the pipe open, so the reader sees no
    # end-of-file when fd 2 is restored; uninstall must still finish promptly.
    code = f"""
        import json, os, subprocess, sys, time
        from tfmagic import logfilter
        before = sorted(os.listdir("/proc/self/fd"))
        filt = logfilter.install({str(tmp_path / "native.log")!r})
        child = subprocess.Popen(
            [sys.executable, "-c", "import os, sys; os.write(2, b'from the child\\\\n'); sys.stdin.read()"],
            stdin=subprocess.PIPE,
        )
        deadline = time.monotonic() + 30
        while filt.forwarded_bytes < len(b"from the child\\n"):
            assert time.monotonic() < deadline, "the child's line never came through"
            time.sleep(0.01)
        started = time.monotonic()
        logfilter.uninstall()
        took = time.monotonic() - started
        child.stdin.close()
        child.wait(30)
        print(json.dumps(dict(took=took, before=before, after=sorted(os.listdir("/proc/self/fd")))))
    """
    rc, out, err = run_child(code, timeout=60)
    assert rc == 0, err.decode(errors="replace")
    result = last_json(out)
    assert err == b"from the child\n"
    assert result["took"] < 1.0
    assert result["before"] == result["after"], "file descriptors leaked"


@pytest.mark.cluster
@pytest.mark.usefixtures("no_child_left")
def test_a_scripts_last_traceback_still_gets_out(tmp_path):
    code = f"""
        from tfmagic import logfilter
        logfilter.install({str(tmp_path / "native.log")!r})
        raise RuntimeError("boom at the end")
    """
    rc, _, err = run_child(code, timeout=60)
    assert rc == 1
    assert b"Traceback (most recent call last):" in err and b"RuntimeError: boom at the end" in err


@pytest.mark.cluster
@pytest.mark.usefixtures("no_child_left")
def test_a_native_crash_leaves_its_python_stacks_in_the_log(tmp_path):
    # A kernel that dies inside TensorFlow (SIGSEGV, abort) says nothing unless faulthandler's trace
    # gets out; with fd 2 a pipe read by a thread of the dying process, it would be lost with it, and
    # in a kernel what fd 2 was is ipykernel's pipe, lost the same way. Faulthandler need not be on.
    code = f"""
        import ctypes, faulthandler
        from tfmagic import logfilter
        logfilter.install({str(tmp_path / "native.log")!r})
        assert faulthandler.is_enabled()
        def crash_here_on_purpose():
            ctypes.string_at(0)
        crash_here_on_purpose()
    """
    rc, _, err = run_child(code, timeout=60)
    assert rc == -signal.SIGSEGV, (rc, err[-2000:])
    log = (tmp_path / "native.log").read_bytes()
    assert b"Fatal Python error: Segmentation fault" in log, log[-2000:]
    assert b"crash_here_on_purpose" in log, log[-2000:]


@pytest.mark.cluster
@pytest.mark.usefixtures("no_child_left")
@pytest.mark.parametrize("enabled_before", [False, True])
def test_uninstall_gives_fatal_stacks_back(tmp_path, enabled_before):
    """Once the filter is gone its log file closes: faulthandler goes back to what it was before."""
    code = f"""
        import faulthandler
        from tfmagic import logfilter
        if {enabled_before}:
            faulthandler.enable()
        logfilter.install({str(tmp_path / "native.log")!r})
        assert faulthandler.is_enabled()
        logfilter.uninstall()
        assert faulthandler.is_enabled() == {enabled_before}
        print("ok")
    """
    rc, out, err = run_child(code, timeout=60)
    assert rc == 0 and "ok" in out, (rc, err[-2000:])


TF_PORT_CLASH = """
    import socket
    import tensorflow as tf

    probe = socket.socket()
    probe.bind(("localhost", 0))
    port = probe.getsockname()[1]
    probe.close()
    spec = tf.train.ClusterSpec({"worker": [f"localhost:{port}"]})
    first = tf.distribute.Server(spec, job_name="worker", task_index=0, start=True)
    try:
        tf.distribute.Server(spec, job_name="worker", task_index=0, start=True)
    except Exception as exc:  # the port is taken by `first`; TF logs why in C++
        print("caught", type(exc).__name__, file=sys.stderr)
    else:
        print("the second server started?!", file=sys.stderr)
"""

NATIVE_IN_LOG = ["add_port.cc", "Failed to add port", "grpc_server_lib.cc", "Could not start gRPC server"]


@pytest.mark.cluster
@pytest.mark.usefixtures("no_child_left")
@pytest.mark.parametrize("show", [False, True], ids=["hidden", "shown"])
def test_real_tensorflow_error_lines(tmp_path, show):
    log = tmp_path / "native.log"
    code = (
        f"""
        import json, os, sys
        from tfmagic import logfilter
        filt = logfilter.install({str(log)!r}, show={show})
        os.write(2, b"user line via fd 2\\n")
        print("user line via sys.stderr", file=sys.stderr)
        os.write(2, b"\\n")
        os.write(2, b"user line after a blank one\\n")
        """
        + textwrap.indent(textwrap.dedent(TF_PORT_CLASH), " " * 8)
        + """
        os.write(2, b"user line after tensorflow\\n")
        logfilter.uninstall()
        os.write(2, b"E0000 00:00:1.000000 1 x.cc:1] after uninstall\\n")
        print(json.dumps(dict(filtered=filt.filtered_lines)))
        """
    )
    rc, out, err_bytes = run_child(code, timeout=180)
    err = err_bytes.decode(errors="replace")
    assert rc == 0, err
    before, marker, _ = err.partition("E0000 00:00:1.000000 1 x.cc:1] after uninstall\n")
    assert marker, f"a native-looking line after uninstall must reach stderr:\n{err}"
    for text in [
        "user line via fd 2\n",
        "user line via sys.stderr\n",
        "\nuser line after a blank one\n",
        "caught UnknownError\n",
        "user line after tensorflow\n",
    ]:
        assert text in before, f"{text!r} missing from stderr:\n{err}"
    logged = log.read_text()
    for text in NATIVE_IN_LOG:
        assert text in logged, f"{text!r} missing from the log:\n{logged}"
    assert NATIVE.search(logged)
    assert last_json(out)["filtered"] >= len(NATIVE.findall(logged)) >= 2
    if show:
        for text in NATIVE_IN_LOG:
            assert text in before, f"show=True should pass {text!r} on:\n{err}"
    else:
        assert not NATIVE.search(before), f"native lines reached stderr:\n{err}"
        assert "To enable the following instructions" not in before
        assert not [
            line
            for line in before.splitlines()
            if line
            not in {
                "user line via fd 2",
                "user line via sys.stderr",
                "",
                "user line after a blank one",
                "caught UnknownError",
                "user line after tensorflow",
            }
        ], f"unexpected lines reached stderr:\n{err}"


# -- the filter inside a real ipykernel ---------------------------------------


class KernelSession:
    """A real ipykernel that forwards fd 2 the way it does under a notebook server.

    ipykernel skips its fd capture when ``PYTEST_CURRENT_TEST`` is set, which
    a kernel started from a test inherits; it is removed here.
    """

    def __init__(self, workdir: Path):
        from jupyter_client.manager import KernelManager

        self.streams: list[tuple[str, str]] = []
        self.kernel_output = workdir / "kernel-terminal.txt"
        self._terminal = open(self.kernel_output, "wb")  # noqa: SIM115 - closed in shutdown()
        self.km = KernelManager(kernel_name="python3")
        self.km.start_kernel(env=child_env(), stdout=self._terminal, stderr=subprocess.STDOUT)
        self.pid = self.km.provisioner.pid
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    def _collect(self, msg) -> None:
        if msg["msg_type"] == "stream":
            self.streams.append((msg["content"]["name"], msg["content"]["text"]))

    def run(self, code: str, sentinel: str, timeout: float = 180.0) -> None:
        """Run a cell that ends by writing ``sentinel`` to fd 2; wait until it shows.

        Output written to fd 2 reaches the frontend through ipykernel's pipe
        reader, possibly after the cell went idle (and then under its parent,
        so ``execute_interactive`` no longer passes it on): keep reading
        iopub until the sentinel, written last, has come through.
        """
        code = f"import os as _os\n{code}\n_os.write(2, {sentinel + chr(10)!r}.encode())\n"
        reply = self.kc.execute_interactive(code, output_hook=self._collect, timeout=timeout)
        assert reply["content"]["status"] == "ok", reply["content"]

        def sentinel_seen():
            try:
                self._collect(self.kc.get_iopub_msg(timeout=0.2))
            except queue.Empty:
                pass
            return sentinel in self.stderr

        poll_for(sentinel_seen, 30, interval=0, what=f"{sentinel} on the kernel's stderr stream")

    @property
    def stderr(self) -> str:
        return "".join(text for name, text in self.streams if name == "stderr")

    def shutdown(self) -> None:
        try:
            self.kc.stop_channels()
            self.km.shutdown_kernel(now=False)
        finally:
            if psutil.pid_exists(self.pid):
                try:
                    os.kill(self.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self._terminal.close()
        assert_gone([self.pid])


@pytest.fixture
def kernel_session(tmp_path):
    session = KernelSession(tmp_path)
    try:
        yield session
    finally:
        session.shutdown()


@pytest.mark.cluster
@pytest.mark.kernel
@pytest.mark.usefixtures("no_child_left")
def test_in_a_real_kernel_only_user_output_reaches_the_notebook(kernel_session, tmp_path):
    k = kernel_session
    log = tmp_path / "kernel-native.log"

    # The premise: this ipykernel forwards raw fd 2 into the notebook.
    k.run('_os.write(2, b"E0000 00:00:1.000000 1 x.cc:1] unfiltered probe\\n")', "SENTINEL-0")
    assert "unfiltered probe" in k.stderr, "ipykernel did not forward fd 2; nothing to test"

    k.streams.clear()
    k.run(
        f"import os, sys\nsys.path.insert(0, {str(ROOT)!r})\n"
        f"from tfmagic import logfilter\nfilt = logfilter.install({str(log)!r})\n",
        "SENTINEL-1",
    )
    k.run(
        textwrap.dedent(TF_PORT_CLASH)
        + 'os.write(2, b"user line via fd 2\\n")\nprint("user line via sys.stderr", file=sys.stderr)\n',
        "SENTINEL-2",
    )
    seen = k.stderr
    assert "caught UnknownError" in seen
    assert "user line via fd 2" in seen and "user line via sys.stderr" in seen
    assert not NATIVE.search(seen), f"native lines reached the notebook:\n{seen}"
    assert not any(NATIVE.search(text) for _, text in k.streams)
    logged = poll_for(
        lambda: "Could not start gRPC server" in log.read_text() and log.read_text(),
        10,
        what="the native lines in the log file",
    )
    for text in NATIVE_IN_LOG:
        assert text in logged

    k.streams.clear()
    k.run(
        'logfilter.uninstall()\nos.write(2, b"E0000 00:00:1.000000 1 x.cc:2] after uninstall\\n")\n',
        "SENTINEL-3",
    )
    assert "x.cc:2] after uninstall" in k.stderr
