"""How much of a sync update is the algorithm, and how much the engine: measured side by side.

For 2 and 3 workers (digits, batch 32, unpaced), alternating sync and async
runs on one cluster (ABAB..., medians):

* sync update time / (slowest worker's gradient + the apply): 1.0 would be
  an engine that costs nothing; the gradient and apply times are measured on
  the devices themselves (``History.breakdown``);
* sync updates/s over async updates/s (the issue's aim: at least 0.5 with 2
  warmed-up workers), warm-up left out of both;
* the same with ``steps_per_call`` updates per call.

    python bench/sync_overhead.py [--rounds 3] [--steps 600]
"""

from __future__ import annotations

import argparse
import statistics

import tfmagic


def _update_time_over_work(h) -> float:
    rows = {r["task"]: r for r in h.breakdown()}
    workers = [r for t, r in rows.items() if t != "total"]
    slowest = max(r["compute"] + r["transfer"] for r in workers)
    apply = rows["total"]["apply"]
    return (1.0 / h.updates_per_s()) / (slowest + apply)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=600)
    args = ap.parse_args()
    print(
        f"{'workers':>7s} {'per call':>8s} {'sync/s':>7s} {'async/s':>8s} {'ratio':>6s} {'update / (slowest grad + apply)':>32s}"
    )
    for workers in (2, 3):
        with tfmagic.LocalCluster(ps=1, workers=workers, spares=False) as cluster:
            for per_call in (1, 4):
                kw = dict(model="digits", steps=args.steps, steps_per_call=per_call)
                tfmagic.train(cluster, "sync", **{**kw, "steps": 40})  # traces and connects once
                tfmagic.train(cluster, "async", **{**kw, "steps": 40})
                sync, asyn, over = [], [], []
                for _ in range(args.rounds):
                    h = tfmagic.train(cluster, "sync", **kw)
                    sync.append(h.updates_per_s())
                    over.append(_update_time_over_work(h))
                    asyn.append(tfmagic.train(cluster, "async", **kw).updates_per_s())
                s, a = statistics.median(sync), statistics.median(asyn)
                print(
                    f"{workers:7d} {per_call:8d} {s:7.0f} {a:8.0f} {s / a:6.2f} {statistics.median(over):32.2f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
