"""What a cluster plus its client really costs in memory (PSS and RSS), one process a task or shared.

    python bench/memory.py                                   # 1 ps + 2 workers, a process each
    python bench/memory.py --ps 2 --workers 32 --processes 1 2 auto [--pace 200ms]

For each ``--processes`` value (``none``: a process per task, the default), in a fresh Python of
its own (a client that trained before keeps what it traced), a cluster of that shape starts (cold, no spares), the client connects, runs an op on every task, and trains async for
``--updates`` updates a worker (paced at ``--pace`` when given, as the experiments' miniatures are);
then the PSS of every task process (each counted once, however many tasks it holds) and of this
client. The client is this script (what a notebook kernel does); a kernel adds ipykernel's own
~60 MB. Issue 23's target: 2 ps + 32 paced workers and the kernel within 2.0 GB.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import tfmagic
from tfmagic.procs.stats import memory_of
from tfmagic.units import human_bytes


def measure(ps: int, workers: int, processes: str, pace: str | None, updates: int) -> dict:
    """One cluster's start time and memory after a run, in this process (the client)."""
    t0 = time.monotonic()
    shared = None if processes == "none" else processes
    with tfmagic.LocalCluster(ps=ps, workers=workers, processes=shared, spares=False, pace=pace) as cluster:
        started = time.monotonic() - t0
        import tensorflow as tf

        cluster.connect()
        for task in cluster.cluster_def.tasks():
            with cluster.device(task):
                (tf.ones([256, 256]) @ tf.ones([256, 256])).numpy()
        t1 = time.monotonic()
        history = tfmagic.train(cluster, mode="async", model="digits", steps=updates * workers)
        trained = time.monotonic() - t1
        pids = sorted({p.pid for p in cluster.procs.values()})
        tasks = {pid: memory_of(pid) for pid in pids}
        client = memory_of(os.getpid())
        return {
            "processes": len(pids),
            "start_s": started,
            "train_s": trained,
            "updates": history.steps,
            "tasks_pss": sum(m["pss"] for m in tasks.values()),
            "tasks_rss": sum(m["rss"] for m in tasks.values()),
            "client_pss": client["pss"],
            "client_rss": client["rss"],
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ps", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--processes", nargs="+", default=["none"], help="none, a number, or auto (each in turn)"
    )
    parser.add_argument("--pace", default=None, help="a modelled step (200ms), as the experiments use")
    parser.add_argument("--updates", type=int, default=10, help="async updates a worker")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child: one value, JSON
    args = parser.parse_args()
    if args.one:
        print(
            "RESULT " + json.dumps(measure(args.ps, args.workers, args.processes[0], args.pace, args.updates))
        )
        return
    print(
        f"{args.ps} ps + {args.workers} workers, {args.updates} async updates a worker, pace {args.pace or 'none'}"
    )
    print(
        f"{'processes':>10s} {'start':>7s} {'train':>7s} {'tasks PSS':>10s} {'a task':>8s} {'client':>8s} {'total':>9s}"
    )
    for processes in args.processes:
        argv = [sys.executable, __file__, "--one", "--ps", str(args.ps), "--workers", str(args.workers)]
        argv += ["--processes", processes, "--updates", str(args.updates)]
        argv += ["--pace", args.pace] if args.pace else []
        out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
        r = json.loads(next(ln for ln in out.splitlines() if ln.startswith("RESULT "))[7:])
        tasks = args.ps + args.workers
        total = r["tasks_pss"] + r["client_pss"]
        print(
            f"{processes + ' (' + str(r['processes']) + ')':>10s} {r['start_s']:6.1f}s {r['train_s']:6.1f}s "
            f"{human_bytes(r['tasks_pss']):>10s} {human_bytes(r['tasks_pss'] // tasks):>8s} "
            f"{human_bytes(r['client_pss']):>8s} {human_bytes(total):>9s}",
            flush=True,
        )


if __name__ == "__main__":
    main()
