"""Elastic clusters, timed: how soon an added worker helps, and what a removal costs a sync step.

On a 1 ps + 2 worker local cluster (linear model, unpaced):

* async: time from ``cluster.add("worker")`` to the new worker's first
  applied update, with a warm spare waiting and without one (a fresh
  process imports TensorFlow first), split into the add itself and the
  engine's pick-up (placing the worker's data and tracing its step);
* a ps added during async and fused sync training (digits): the run's
  record of the variables moved and the bytes, and the pause (the longest
  gap between updates around it, beside the median gap before);
* sync (fused, 3 workers): ``cluster.remove("worker:2", drain=True)``, the
  time from the call to the first update with 2 replicas, and that update's
  step time (since the update before it), beside the median update time
  before the removal.

    python bench/elastic.py [--rounds 3]

The figures depend on the machine's load: on 2 shared cores a cold import
takes from 2 s (idle) to 20 s (other TensorFlow processes busy).
"""

from __future__ import annotations

import argparse
import statistics
import time

import tfmagic
from tfmagic.pool import SparePool


def _applied(history, task) -> int:
    return sum(1 for r in history.records if r.task == task and r.applied and r.update)


def _wait(predicate, timeout: float) -> float:
    t0 = time.monotonic()
    while not predicate():
        if time.monotonic() - t0 > timeout:
            raise TimeoutError("gave up waiting")
        time.sleep(0.01)
    return time.monotonic() - t0


def add_during_async(cluster, warm: bool) -> tuple[float, float, bool]:
    """(add seconds, add to first applied update, warm spare used)."""
    cluster.use_spares = warm
    if warm:
        cluster.pool.fill(cluster.launcher, 1)
        _wait(lambda: any(p.warm_at is not None for p in cluster.pool.processes()), 120)
    run = tfmagic.train(cluster, "async", steps=10**6, block=False, name=f"bench-add-{warm}")
    try:
        _wait(lambda: run.history.steps > 50, 120)
        t0 = time.monotonic()
        added = cluster.add("worker")
        t_add = time.monotonic() - t0
        _wait(lambda: _applied(run.history, "worker:2") > 0, 120)
        first = time.monotonic() - t0
    finally:
        run.stop()
        cluster.use_spares = False
    cluster.remove("worker:2")
    return t_add, first, bool(added.warm)


def remove_during_sync(cluster) -> tuple[float, float, float, float]:
    """(median update before, remove seconds, remove to the first 2-replica update, that update's time
    since the one before it: the step that spans the change)."""
    cluster.add("worker")
    run = tfmagic.train(cluster, "sync", steps=10**6, block=False, name="bench-remove")
    try:
        _wait(lambda: run.history.steps > 60, 120)
        g = run.history.global_steps[-40:]
        before = statistics.median(b.time - a.time for a, b in zip(g, g[1:]))
        t0, wall = time.monotonic(), time.time()
        cluster.remove("worker:2", drain=True)
        t_remove = time.monotonic() - t0
        _wait(lambda: len(run.history.global_steps[-1].aggregated) == 2, 60)
        g = list(run.history.global_steps)
        i = next(i for i, s in enumerate(g) if len(s.aggregated) == 2)
        after, spanning = g[i].time - wall, g[i].time - g[i - 1].time
    finally:
        run.stop()
    return before, t_remove, after, spanning


def add_ps_during_training(cluster, mode: str) -> str:
    """The run's own record of the re-spread (variables moved, bytes, pause), and the add's seconds."""
    run = tfmagic.train(cluster, mode, model="digits", steps=10**6, block=False, name=f"bench-ps-{mode}")
    try:
        _wait(lambda: run.history.steps > 50, 120)
        t0, wall = time.monotonic(), time.time()
        cluster.add("ps")
        t_add = time.monotonic() - t0
        _wait(lambda: any(e.kind == "respread" for e in run.history.events), 60)
        event = next(e for e in run.history.events if e.kind == "respread")
        n = run.history.steps
        _wait(lambda: run.history.steps > n + 50, 60)
    finally:
        run.stop()
    times = sorted(g.time for g in run.history.global_steps)
    near = [b - a for a, b in zip(times, times[1:]) if wall < b < event.time + 30]
    before = [b - a for a, b in zip(times, times[1:]) if b < wall][-40:] or [float("nan")]
    return (
        f"{mode:>5s} add() {t_add:5.2f} s; longest gap between updates around it {max(near):.2f} s "
        f"(median before {statistics.median(before):.3f} s); {event.detail}"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    pool = SparePool(budget="1GB")
    with tfmagic.LocalCluster(ps=1, workers=2, spares=False, pool=pool, name="bench-elastic") as cluster:
        try:
            print("add a worker during async: seconds from add() to its first applied update")
            print(f"{'spare':>6s} {'add()':>7s} {'first update':>13s}")
            for warm in (True, False) * args.rounds:
                t_add, first, used = add_during_async(cluster, warm)
                print(f"{'warm' if used else 'none':>6s} {t_add:7.2f} {first:13.2f}")
            print("\nremove worker:2 (drain) during fused sync with 3 workers")
            print(
                f"{'update before':>13s} {'remove()':>9s} {'to first 2-replica update':>26s} "
                f"{'the step spanning it':>21s}"
            )
            for _ in range(args.rounds):
                before, t_remove, after, spanning = remove_during_sync(cluster)
                print(f"{before:13.3f} {t_remove:9.2f} {after:26.2f} {spanning:21.2f}")
            print("\nadd a ps during training (digits): what the run recorded")
            for mode in ("async", "sync"):
                print(add_ps_during_training(cluster, mode))
        finally:
            pool.shutdown()


if __name__ == "__main__":
    main()
