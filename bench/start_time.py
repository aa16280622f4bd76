"""Time until a 1 ps + 2 worker local cluster answers, over a bare TensorFlow import.

Prints, from one run: the median of several bare ``python -c "import tensorflow"``
runs, the median cold start (every task a fresh process) and the median warm
start (every task taken from the spare pool), and the two ratios.

    python bench/start_time.py [--repeat 3]
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
    args = parser.parse_args()
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
