"""Stragglers: what one slowed worker of three does to sync and async training.

Prints, from one run on 1 ps + 3 workers (digits MLP, batch 32):
  1. sync step time with worker:2 slowed by k, over the unslowed step time (should track k);
     async total throughput with worker:2 slowed by k, over unslowed (aim >= 0.7);
  2. sync with 1 backup worker and worker:2 slowed, step time over sync with no straggler (aim <= 1.15).

    python bench/stragglers.py [--factors 2 4 8] [--steps 150]
"""

from __future__ import annotations

import argparse

import tfmagic
from tfmagic.training.models import Digits


def sync_step(cluster, steps, model, batch, backup=0) -> float:
    h = tfmagic.train(cluster, mode="sync", model=model, steps=steps, batch_size=batch, backup_workers=backup)
    return h.mean_step_time(last=steps - 10)


def async_rate(cluster, steps, model, batch) -> tuple[float, dict]:
    """Total updates/s (after the first 30), and steps/s per worker."""
    h = tfmagic.train(cluster, mode="async", model=model, steps=steps * 3, batch_size=batch)
    g = h.global_steps
    per_task = {t: v["steps_per_s"] for t, v in h.throughput().items() if t != "total"}
    return (len(g) - 30) / (g[-1].time - g[29].time), per_task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--factors", type=float, nargs="+", default=[2, 4, 8])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    model = Digits(hidden=args.hidden)
    with tfmagic.LocalCluster(ps=1, workers=3, spares=False) as cluster:
        base_sync = sync_step(cluster, args.steps, model, args.batch)
        base_async, base_tasks = async_rate(cluster, args.steps, model, args.batch)
        print(f"model digits MLP 64-{args.hidden}-10, batch {args.batch}, 1 ps + 3 workers")
        print(f"unslowed: sync {base_sync * 1000:.1f} ms/update, async {base_async:.1f} updates/s")
        # If the other two workers keep their pace and worker:2 runs at 1/k, async keeps
        # (2 + 1/k) / 3 of its throughput; more when the CPU worker:2 gives up speeds the others.
        print(
            " k    sync step ratio   async throughput ratio (others keep pace: (2+1/k)/3)   async steps/s per worker, over unslowed"
        )
        for k in args.factors:
            cluster.slow("worker:2", k)
            s = sync_step(cluster, args.steps, model, args.batch)
            a, tasks = async_rate(cluster, args.steps, model, args.batch)
            per = "  ".join(f"{t} {tasks[t] / base_tasks[t]:.2f}" for t in sorted(tasks))
            print(
                f"{k:4g}  {s / base_sync:10.2f}        {a / base_async:10.2f} ({(2 + 1 / k) / 3:.2f})                          {per}"
            )
        cluster.slow("worker:2", 4)
        backup = sync_step(cluster, args.steps, model, args.batch, backup=1)
        cluster.slow("worker:2", 1)
        print(f"sync + 1 backup, worker:2 slowed x4: step time ratio {backup / base_sync:.2f}  (aim <= 1.15)")


if __name__ == "__main__":
    main()
