"""Time until a 1 ps + 2 worker cluster answers, per backend, over the local backend; memory per task.

    python bench/backends.py [--rounds 2]

Backends measured side by side in one run, alternating, medians reported:
local; SSH to a private sshd on loopback; SSH to hosts in network namespaces
(needs root), plain and with --tunnel; Spark local[3] (needs pyspark and
Java).  Every start is cold (no warm spares) so that the ratios compare like
with like.  Memory is PSS beside RSS per task, measured on the task's own
host by the task.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ["TFMAGIC_SPARES"] = "0"
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tfmagic
from tests import sshhosts


def _factories(loop, ns):
    out = {"local": lambda: tfmagic.LocalCluster(ps=1, workers=2, spares=False)}
    if loop is not None:
        out["ssh (loopback sshd)"] = lambda: tfmagic.SSHCluster(
            loop.aliases, ps=1, workers=2, python=sys.executable, ssh_config=loop.config
        )
    if ns is not None:
        out["ssh (2 namespace hosts)"] = lambda: tfmagic.SSHCluster(
            ns.aliases, ps=1, workers=2, python=sys.executable, ssh_config=ns.config
        )
        out["ssh --tunnel (2 namespace hosts)"] = lambda: tfmagic.SSHCluster(
            ns.aliases, ps=1, workers=2, python=sys.executable, ssh_config=ns.config, tunnel=True
        )
    try:
        from tfmagic import SparkCluster

        out["spark local[3]"] = lambda: SparkCluster(master="local[3]", ps=1, workers=2)
    except Exception as exc:  # noqa: BLE001 - reported, the rest still runs
        print(f"(spark skipped: {exc})")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    loop = sshhosts.loopback_host() if not sshhosts.skip_reason() else None
    ns = sshhosts.namespace_hosts(2) if not sshhosts.netns_skip_reason() else None
    times: dict[str, list[float]] = {}
    memory: dict[str, list[tuple[int, int]]] = {}
    try:
        factories = _factories(loop, ns)
        for _ in range(args.rounds):
            for name, make in factories.items():
                cluster = make()
                t0 = time.perf_counter()
                cluster.start()
                times.setdefault(name, []).append(time.perf_counter() - t0)
                for row in cluster.status().tasks:
                    if row.pss:
                        memory.setdefault(name, []).append((row.pss, row.rss))
                cluster.stop()
    finally:
        for hosts in (loop, ns):
            if hosts is not None:
                hosts.close()
    base = statistics.median(times["local"])
    print(f"{'backend':34s} {'start s':>8s} {'/ local':>8s} {'PSS/task':>9s} {'RSS/task':>9s}")
    for name, values in times.items():
        med = statistics.median(values)
        mem = memory.get(name, [])
        pss = statistics.median(m[0] for m in mem) / 2**20 if mem else float("nan")
        rss = statistics.median(m[1] for m in mem) / 2**20 if mem else float("nan")
        print(f"{name:34s} {med:8.1f} {med / base:8.2f} {pss:7.0f}MB {rss:7.0f}MB")


if __name__ == "__main__":
    main()
