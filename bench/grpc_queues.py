"""What TensorFlow's 64 gRPC completion queues per server cost, and what fewer change.

    python bench/grpc_queues.py [--workers 4] [--steps 600] [--rounds 2] [--queues 64 4]

Every ``tf.distribute.Server`` (each task's, and the one a client starts when it connects) makes
``TF_GRPC_WORKER_CACHE_QUEUES`` completion queues for its calls to other tasks, one polling thread
each (default 64: ``CreateGrpcWorkerEnv`` in TensorFlow's ``grpc_worker_cache.cc``); tfmagic sets
:data:`tfmagic.network.clientserver.GRPC_ENV` for its tasks.  For each setting, one child
process (the variable is read once per process) starts 1 ps + N workers with it, trains the digits
model async, unpaced, and reports updates a second after a warm-up, and the threads and PSS of
every task and of the client.  Settings alternate over rounds; the medians are compared side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

WARMUP = 50

CHILD = r"""
import json, os, sys
import psutil
import tfmagic
from tfmagic.procs.stats import memory_of
from tfmagic.training.models import Digits

workers, steps, WARMUP = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
queues = os.environ["TF_GRPC_WORKER_CACHE_QUEUES"]

env = {"TF_GRPC_WORKER_CACHE_QUEUES": queues}
launcher = tfmagic.launchers.LocalLauncher(env=env)
with tfmagic.LocalCluster(ps=1, workers=workers, spares=False, launcher=launcher) as cluster:
    h = tfmagic.train(cluster, mode="async", model=Digits(), steps=steps, batch_size=32, lr=0.05)
    g = h.global_steps
    rate = (len(g) - WARMUP) / (g[-1].time - g[WARMUP - 1].time)
    pids = {str(t): p.pid for t, p in cluster.procs.items()}
    pids["client"] = os.getpid()
    out = {name: {"threads": psutil.Process(pid).num_threads(), "pss": memory_of(pid)["pss"]} for name, pid in pids.items()}
    print("RESULT " + json.dumps({"rate": rate, "tasks": out}), flush=True)
"""


def run(queues: str, workers: int, steps: int) -> dict:
    env = dict(os.environ, TF_GRPC_WORKER_CACHE_QUEUES=queues, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(workers), str(steps), str(WARMUP)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        raise SystemExit(f"queues={queues}: no result\n{done.stderr[-3000:]}")
    return json.loads(lines[0][len("RESULT ") :])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--queues", nargs="+", default=["64", "4"])
    args = parser.parse_args()
    results: dict[str, list[dict]] = {q: [] for q in args.queues}
    for r in range(args.rounds):
        for q in args.queues if r % 2 == 0 else list(reversed(args.queues)):
            results[q].append(run(q, args.workers, args.steps))
            print(f"round {r + 1}, {q} queues: {results[q][-1]['rate']:.0f} updates/s", flush=True)
    print(f"\n1 ps + {args.workers} workers, async, {args.steps} updates, {args.rounds} rounds (medians)")
    print(
        f"{'queues':>7} {'updates/s':>10} {'task threads':>13} {'task PSS MB':>12} {'client threads':>15} {'client PSS MB':>14}"
    )
    base = None
    for q, runs in results.items():
        rate = statistics.median(x["rate"] for x in runs)
        tasks = [v for x in runs for k, v in x["tasks"].items() if k != "client"]
        clients = [x["tasks"]["client"] for x in runs]
        t_thr = statistics.median(v["threads"] for v in tasks)
        t_pss = statistics.median(v["pss"] for v in tasks) / 2**20
        c_thr = statistics.median(v["threads"] for v in clients)
        c_pss = statistics.median(v["pss"] for v in clients) / 2**20
        base = base or (rate, t_thr, t_pss)
        print(
            f"{q:>7} {rate:>10.0f} {t_thr:>13.0f} {t_pss:>12.0f} {c_thr:>15.0f} {c_pss:>14.0f}"
            f"   (rate x{rate / base[0]:.2f}, task threads x{t_thr / base[1]:.2f}, task PSS x{t_pss / base[2]:.2f})"
        )


if __name__ == "__main__":
    main()
