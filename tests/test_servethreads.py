"""A task's TensorFlow server serves with one thread, not TensorFlow's 8 (``_native/servethreads.c``).

Each serving thread posts about 1,750 calls before any arrives, most of a server's memory. Real
servers in real processes: one preloaded as tasks are, one changed while running as the kernel is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tfmagic.network import bindguard

pytestmark = pytest.mark.cluster

_SERVE = r"""
import ctypes, json, os, socket, sys
from tensorflow.python.training import server_lib
from tfmagic.network import bindguard

def port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

running = sys.argv[1] == "running"
entries = bindguard.serving_threads_this_process(1) if running else None
threads = len(os.listdir("/proc/self/task"))
spec = server_lib.ClusterSpec({"worker": [f"127.0.0.1:{port()}"]})
server = server_lib.Server(spec, job_name="worker", task_index=0, protocol="grpc", start=True)
lib = ctypes.CDLL(bindguard.bind_guard().library)
print("RESULT " + json.dumps({
    "entries": entries,
    "changed": lib.tfmagic_serving_threads_changed(),
    "server_threads": len(os.listdir("/proc/self/task")) - threads,
}))
"""


def _serve(how: str, **env) -> dict:
    guard = bindguard.bind_guard()
    if not guard.available:
        pytest.skip(guard.reason)
    full = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **env}
    full.pop("TFMAGIC_SERVING_THREADS", None)
    full.pop("LD_PRELOAD", None)
    if how == "preloaded":
        full.update(guard.env)
    full.update(env)
    done = subprocess.run(
        [sys.executable, "-c", _SERVE, how], env=full, capture_output=True, text=True, timeout=120
    )
    found = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    assert done.returncode == 0 and found, done.stderr[-3000:]
    return json.loads(found[-1][len("RESULT ") :])


def test_a_preloaded_task_server_serves_with_the_threads_it_was_given():
    one = _serve("preloaded", TFMAGIC_SERVING_THREADS="1")
    default = _serve("preloaded")
    assert one["changed"] == 1 and default["changed"] == 0, (one, default)
    # (the thread count right after a start is no proof: gRPC starts and ends its own threads beside
    # the serving ones, and a clean-clone run counted 87 for both; the counter is the library's own)


def test_a_running_process_server_started_after_the_change_serves_with_one_thread():
    running = _serve("running")
    assert running["entries"] > 0 and running["changed"] == 1, running


def test_a_local_clusters_tasks_start_with_one_serving_thread(no_leaks):
    import tfmagic

    cluster = tfmagic.LocalCluster(ps=1, workers=1, spares=False)
    cluster.start()
    try:
        for name, proc in cluster.procs.items():
            with open(f"/proc/{proc.pid}/environ", "rb") as f:
                env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
            assert env[b"TFMAGIC_SERVING_THREADS"] == b"1", name
            assert bindguard.bind_guard().library.encode() in env[b"LD_PRELOAD"].split(b":"), name
    finally:
        cluster.close()
