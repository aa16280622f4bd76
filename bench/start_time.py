"""Time until a 1 ps + 2 worker local cluster answers, over a bare TensorFlow import.

Prints, from one run: the median of several bare ``python -c "import tensorflow"``
runs, the median cold start (every task a fresh process) and the median warm
start (every task taken from the spare pool), and the two ratios.

With ``--workers 32 --ps 2 --processes auto`` it times a cold start of that
cluster, its tasks sharing processes (issue 23: 34 tasks within 10 s), and
the first connection to every task.  Spares are a process each, so a shared
start has no warm form: it is always cold.

    python bench/start_time.py [--repeat 3] [--ps 2 --workers 32 --processes auto]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import tfmagic
from tfmagic.pool import SparePool


def bare_import() -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import tensorflow"], check=True, capture_output=True)
    return time.perf_counter() - t0


def cold_start() -> float:
    cluster = tfmagic.LocalCluster(ps=1, workers=2, spares=False)
    t0 = time.perf_counter()
    cluster.start()
    took = time.perf_counter() - t0
    cluster.stop()
    return took


def shared_start(ps: int, workers: int, processes) -> tuple[float, float]:
    """(start, first connection) seconds of a cold cluster whose tasks share processes."""
    cluster = tfmagic.LocalCluster(ps=ps, workers=workers, spares=False, processes=processes)
    t0 = time.perf_counter()
    cluster.start()
    started = time.perf_counter() - t0
    t1 = time.perf_counter()
    cluster.connect()
    connected = time.perf_counter() - t1
    cluster.stop()
    return started, connected


def warm_starts(repeat: int) -> list[float]:
    pool = SparePool(budget="8GB")
    first = tfmagic.LocalCluster(ps=1, workers=2, pool=pool, spares=True)
    first.start()
    times = []
    try:
        for _ in range(repeat):
            deadline = time.monotonic() + 180
            while len([p for p in pool.processes() if p.warm_at]) < 3:
                if time.monotonic() > deadline:
                    raise RuntimeError("spares did not become warm in 180 s")
                time.sleep(0.1)
            first.stop()
            cluster = tfmagic.LocalCluster(ps=1, workers=2, pool=pool, spares=True)
            t0 = time.perf_counter()
            outcome = cluster.start()
            times.append(time.perf_counter() - t0)
            assert outcome.warm == 3, outcome
            first = cluster
    finally:
        first.close()
        pool.shutdown()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--ps", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--processes", default=None, help='"auto" or a number: tasks share processes')
    args = parser.parse_args()
    if args.processes is not None:
        processes = args.processes if args.processes == "auto" else int(args.processes)
        runs = [shared_start(args.ps, args.workers, processes) for _ in range(args.repeat)]
        starts, connects = [r[0] for r in runs], [r[1] for r in runs]
        name = f"{args.ps}ps+{args.workers}w in {args.processes} processes"
        print(f"cold start {name}: median {statistics.median(starts):.2f} s  {['%.2f' % t for t in starts]}")
        print(
            f"first connection to every task: median {statistics.median(connects):.2f} s  {['%.2f' % t for t in connects]}"
        )
        print("warm start: none (spares are a process each; a start whose tasks share processes is cold)")
        return
    imports = [bare_import() for _ in range(args.repeat)]
    colds = [cold_start() for _ in range(args.repeat)]
    warms = warm_starts(args.repeat)
    base = statistics.median(imports)
    cold, warm = statistics.median(colds), statistics.median(warms)
    print(f"bare import tensorflow : median {base:.2f} s  {['%.2f' % t for t in imports]}")
    print(f"cold start 1ps+2w      : median {cold:.2f} s  {['%.2f' % t for t in colds]}")
    print(f"warm start 1ps+2w      : median {warm:.3f} s  {['%.3f' % t for t in warms]}")
    print(f"ratio cold / import    : {cold / base:.2f}   (aim <= 1.3)")
    print(f"ratio warm / import    : {warm / base:.3f}  (aim <= 0.2)")


if __name__ == "__main__":
    main()
