"""What tasks cost when they share one process (issue 23's question), measured with a run on them.

    python bench/shared_process.py [--default-pool] [N ...]   (workers; default 4 8 16 32, with 2 ps)

For each N: one process starts the 2 ps and N worker servers (``tf.distribute.Server``, each its own
gRPC server and devices, kept on loopback by tfmagic's bind guard), this script attaches to them as
a notebook would (``tfmagic.attach``) and trains the digits model async, unpaced, for 20 updates a
worker: every worker's variables, input and step functions are then placed in that process.  It
prints that process's PSS and threads bare and after the run, per task, beside this client's PSS,
against what one process per task costs (``bench/memory.py``: about 0.2 GB a task).

This is the bare figure the design started from; tfmagic's own ``processes=`` (``LocalCluster(...,
processes="auto")``, :mod:`tfmagic.task.host`) is measured by ``bench/memory.py --processes``.

Found on the way, and the cure: with two or more workers in one process the async engine's unary
calls hung (every worker's first call, for ever; one worker trained).  All the servers of a process
share one pool of inter-op threads (TensorFlow's ``ComputePool``, sized by the first server's
options: the number of cores, 2 here), and a unary call holds a thread of it while its function
waits for the ps's part, which needs a thread of the same pool: N workers' calls take every thread,
the ps's parts wait for ever.  Measured with a plain ``tf.function`` from N threads: 4 workers hang
with 4 threads and train with 5; streaming calls do not hold the threads.  This script therefore
sizes the pool (``TF_NUM_INTEROP_THREADS``) at the process's tasks + 2 and keeps the engine's unary
calls; ``--default-pool`` leaves TensorFlow's size and reports the hang after ``WAIT_S``.
Measured here (2026-12-01, 2 cores, streaming calls then): per task 153 / 116 / 88 / 70 / 61 MB PSS
for N = 2 / 4 / 8 / 16 / 32 after the run (the process 2.03 GB and 3,146 threads at 32, 1.39 GB
bare), the client 0.5-0.57 GB: 32 workers cost about 2.6 GB with the client, against about 6.8 GB as
34 processes, and over the 2.0 GB issue 23 asks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import psutil

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # each attach after the first logs the last host's end

import tfmagic  # after the log level, which TensorFlow reads once
from tfmagic.network.bindguard import bind_guard
from tfmagic.network.clientserver import GRPC_ENV
from tfmagic.network.ports import free_port
from tfmagic.procs.stats import memory_of
from tfmagic.units import human_bytes

PS = 2
#: leave TensorFlow's inter-op pool at its size (--default-pool): two workers or more hang
DEFAULT_POOL = False
#: how long a run may take before it is reported as hung
WAIT_S = 120.0

#: the process that holds every server: it starts them, says so, and lives until its stdin closes
HOST = r"""
import json, sys
spec = json.loads(sys.argv[1])
import tensorflow as tf
servers = [
    tf.distribute.Server(tf.train.ClusterSpec(spec), job_name=job, task_index=i, start=True)
    for job in spec for i in range(len(spec[job]))
]
print("ready", flush=True)
sys.stdin.read()
"""


def measure(workers: int) -> dict:
    spec = {
        "ps": [f"127.0.0.1:{free_port()}" for _ in range(PS)],
        "worker": [f"127.0.0.1:{free_port()}" for _ in range(workers)],
    }
    guard = bind_guard("127.0.0.1")
    env = dict(os.environ, MALLOC_ARENA_MAX="2", TF_CPP_MIN_LOG_LEVEL="2", **guard.env, **GRPC_ENV)
    if not DEFAULT_POOL:  # one inter-op thread for each task's waiting call, and two to spare
        env["TF_NUM_INTEROP_THREADS"] = str(PS + workers + 2)
    t0 = time.monotonic()
    host = subprocess.Popen(
        [sys.executable, "-c", HOST, json.dumps(spec)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        text=True,
    )
    try:
        if host.stdout.readline().strip() != "ready":
            raise SystemExit(f"the host process of {workers} workers did not start")
        started = time.monotonic() - t0
        bare = memory_of(host.pid)["pss"], psutil.Process(host.pid).num_threads()
        cluster = tfmagic.attach(spec, name=f"shared-{workers}")
        try:
            t1 = time.monotonic()
            run = tfmagic.train(cluster, "async", model="digits", steps=20 * workers, lr=0.1, block=False)
            try:
                run.wait(WAIT_S)
                hung = False
            except tfmagic.errors.WaitTimedOut:
                hung = True
                run.stop()
            trained_s = time.monotonic() - t1
            history = run.history
            after = memory_of(host.pid)["pss"], psutil.Process(host.pid).num_threads()
        finally:
            cluster.stop()
        client = memory_of(os.getpid())["pss"]
    finally:
        host.stdin.close()
        host.wait(30)
    return {
        "workers": workers,
        "tasks": workers + PS,
        "start_s": started,
        "bare_pss": bare[0],
        "bare_threads": bare[1],
        "pss": after[0],
        "threads": after[1],
        "client_pss": client,
        "trained_s": trained_s,
        "updates": history.steps,
        "hung": hung,
    }


def main(sizes: list[int]) -> None:
    pool = "TensorFlow's inter-op pool" if DEFAULT_POOL else "an inter-op pool of N + 4 threads"
    print(
        f"{PS} ps + N workers in one process (MALLOC_ARENA_MAX=2, {pool}), async digits with the engine's "
        "unary calls, 20 updates a worker"
    )
    print(
        f"{'N':>3} {'start':>6} {'bare PSS':>9} {'threads':>7} {'PSS after':>9} {'threads':>7} "
        f"{'per task':>9} {'client':>9} {'train s':>7}"
    )
    for n in sizes:
        r = measure(n)
        print(
            f"{n:>3} {r['start_s']:>5.1f}s {human_bytes(r['bare_pss']):>9} {r['bare_threads']:>7} "
            f"{human_bytes(r['pss']):>9} {r['threads']:>7} {human_bytes(r['pss'] / r['tasks']):>9} "
            f"{human_bytes(r['client_pss']):>9} {r['trained_s']:>7.1f}"
            + (f"  hung: {r['updates']} of {20 * n} updates in {WAIT_S:g} s" if r["hung"] else ""),
            flush=True,
        )
    print("one process per task: about 0.2 GB PSS a task (python bench/memory.py)")


if __name__ == "__main__":
    args = sys.argv[1:]
    DEFAULT_POOL = "--default-pool" in args
    main([int(a) for a in args if a != "--default-pool"] or [4, 8, 16, 32])
