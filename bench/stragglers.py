"""Stragglers, paced and unpaced side by side: what one slowed worker of three does to sync and async.

One cluster of 1 ps + 3 workers without a pace (``slow`` pauses and resumes
the task's process), then one with a pace (each worker a modelled machine;
``slow`` makes that machine k times slower); digits MLP, batch 32.  For
k = 2, 4, 8 on worker:2, and against the textbook:

* sync step time over the unslowed step time (textbook: k);
* async total updates/s over unslowed (two workers at full pace, one at 1/k: (2 + 1/k) / 3);
* the unslowed workers' async pace over theirs without a straggler (textbook: 1);
* sync with 1 backup worker and a x4 straggler, over the same backup setting without one (textbook: 1),
  and over plain sync without a straggler.

    python bench/stragglers.py [--factors 2 4 8] [--steps 40] [--pace 100ms] [--only paced|unpaced]
"""

from __future__ import annotations

import argparse
import time

import tfmagic
from tfmagic.training.models import Digits

#: what runs said the reader must know (a pace the machine could not keep), printed with the figures
NOTES: list[str] = []


def _noted(h, what: str):
    NOTES.extend(f"{what}: {note}" for note in h.notes)
    return h


def sync_step(cluster, steps, model, batch, backup=0) -> float:
    """Median seconds per update (warm-up left out)."""
    h = tfmagic.train(cluster, mode="sync", model=model, steps=steps, batch_size=batch, backup_workers=backup)
    return _noted(
        h, f"sync (backup {backup}, {cluster.pace.describe() if cluster.pace else 'unpaced'})"
    ).median_step_time()


def async_rate(cluster, steps, model, batch) -> tuple[float, dict]:
    """Total updates/s after warm-up, and steps/s per worker."""
    h = tfmagic.train(cluster, mode="async", model=model, steps=steps, batch_size=batch)
    _noted(h, f"async ({cluster.pace.describe() if cluster.pace else 'unpaced'})")
    per_task = {t: v["steps_per_s"] for t, v in h.throughput().items() if t != "total"}
    return h.updates_per_s(), per_task


def measure(cluster, args, model) -> dict:
    out: dict = {}
    steps = args.steps
    base_sync = sync_step(cluster, steps, model, args.batch)
    base_async, base_tasks = async_rate(cluster, 12 * steps, model, args.batch)
    out["base"] = (base_sync, base_async)
    for k in args.factors:
        cluster.slow("worker:2", k)
        s = sync_step(cluster, steps, model, args.batch)
        a, tasks = async_rate(cluster, 12 * steps, model, args.batch)
        others = min(tasks[t] / base_tasks[t] for t in ("worker:0", "worker:1"))
        out[k] = (s / base_sync, a / base_async, others, tasks["worker:2"] / base_tasks["worker:2"])
    cluster.slow("worker:2", 4)
    backup_slow = sync_step(cluster, steps, model, args.batch, backup=1)
    cluster.slow("worker:2", 1)
    backup_fast = sync_step(cluster, steps, model, args.batch, backup=1)
    out["backup"] = (backup_slow / backup_fast, backup_slow / base_sync)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--factors", type=float, nargs="+", default=[2, 4, 8])
    parser.add_argument("--steps", type=int, default=40, help="sync updates per measurement (async: 12x)")
    parser.add_argument("--pace", default="100ms")
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--only", choices=("paced", "unpaced"), default=None)
    args = parser.parse_args()
    model = Digits(hidden=args.hidden)
    results = {}
    for name, pace in (("unpaced", None), ("paced", args.pace)):
        if args.only and name != args.only:
            continue
        t0 = time.monotonic()
        with tfmagic.LocalCluster(ps=1, workers=3, spares=False, pace=pace) as cluster:
            results[name] = measure(cluster, args, model)
        print(f"{name}: measured in {time.monotonic() - t0:.0f} s", flush=True)
    names = list(results)
    print()
    print(f"model digits MLP 64-{args.hidden}-10, batch {args.batch}, 1 ps + 3 workers, worker:2 slowed by k")
    print(
        f"{'':44s}"
        + "".join(f"{n + (' ' + args.pace if n == 'paced' else ''):>16s}" for n in names)
        + "   textbook"
    )

    def row(label, values, textbook):
        print(f"{label:44s}" + "".join(f"{v:16.2f}" for v in values) + f"   {textbook}")

    print(
        f"{'unslowed sync ms/update':44s}" + "".join(f"{results[n]['base'][0] * 1000:16.1f}" for n in names)
    )
    print(f"{'unslowed async updates/s':44s}" + "".join(f"{results[n]['base'][1]:16.1f}" for n in names))
    for k in args.factors:
        row(f"k={k:g}: sync step time ratio", [results[n][k][0] for n in names], f"{k:g}")
        row(
            f"k={k:g}: async throughput ratio",
            [results[n][k][1] for n in names],
            f"(2 + 1/k) / 3 = {(2 + 1 / k) / 3:.2f}",
        )
        row(f"k={k:g}: unslowed workers' async pace (min)", [results[n][k][2] for n in names], "1 (>= 0.95)")
        row(f"k={k:g}: slowed worker's async pace", [results[n][k][3] for n in names], f"1/k = {1 / k:.2f}")
    row(
        "sync+1 backup, x4 straggler / no straggler",
        [results[n]["backup"][0] for n in names],
        "1 (0.95-1.10)",
    )
    row("sync+1 backup, x4 straggler / plain sync", [results[n]["backup"][1] for n in names], "about 1")
    for note in NOTES:
        print("note:", note)


if __name__ == "__main__":
    main()
