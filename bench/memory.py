"""What a 1 ps + 2 worker cluster plus its client really costs in memory (PSS and RSS).

    python bench/memory.py

The client here is this script after connecting and running an op on every
task (what a notebook kernel does); a kernel adds ipykernel's own ~60 MB.
"""

from __future__ import annotations

import os

import tfmagic
from tfmagic.procs.stats import memory_of
from tfmagic.units import human_bytes


def main() -> None:
    with tfmagic.LocalCluster(ps=1, workers=2, spares=False) as cluster:
        import tensorflow as tf

        cluster.connect()
        for task in cluster.cluster_def.tasks():
            with cluster.device(task):
                (tf.ones([256, 256]) @ tf.ones([256, 256])).numpy()
        rows = [(str(t), memory_of(p.pid)) for t, p in cluster.procs.items()]
        rows.append(("client", memory_of(os.getpid())))
        total_pss = sum(m["pss"] for _, m in rows)
        total_rss = sum(m["rss"] for _, m in rows)
        for name, m in rows:
            print(f"{name:10s} PSS {human_bytes(m['pss']):>9s}   RSS {human_bytes(m['rss']):>9s}")
        print(f"{'total':10s} PSS {human_bytes(total_pss):>9s}   RSS {human_bytes(total_rss):>9s}")


if __name__ == "__main__":
    main()
