"""Scaling against the ps's network card: async updates/s of N paced workers, measured beside the arithmetic min(N / T, k R / 8B).

Async workers never wait for each other, so N workers whose step takes T
ask for N / T updates a second.  Every update moves the model through a
ps's card: the parameters out to the worker and the gradient back, B bytes
each way.  A card of rate R carries R / (8 B) updates a second each way:
past N = T R / 8B the throughput flattens there, and k ps (each with its
own card and B / k of the bytes) lift the ceiling k times (Li et al. 2014;
d2l's parameter-server chapter does this arithmetic on paper).

    updates/s = min(N / T, k R / 8B),  T = the pace + an update's bytes' time on an idle card

B is the model's parameters; the gradient's bytes are B times the share the cards counted in against
out during the run (``cluster.net()``).

The ``ps-scaling`` experiment checks this on four runs within its 150 s
(:mod:`tfmagic.experiments.ps_scaling`, whose model, card and arithmetic this
uses); this benchmark runs any sizes, a cluster each, with more updates a run:
each run is a paced cluster (tasks sharing processes from 8 workers) whose
ps cards are modelled (``net="ps:* rate=2mbit"``), and on a modelled
network a paced async step is its reading, its modelled computation and its
applying, so a full card queues the transfers as between machines
(:meth:`tfmagic.training.asynchronous.AsyncLoop.wait_out_pace`).

    python bench/ps_scaling.py [--runs 1x4 1x8 1x16 2x16 1x32 2x32] [--per-worker 6]
"""

from __future__ import annotations

import argparse
import time

from tfmagic.experiments.base import MemoryWatch
from tfmagic.experiments.ps_bottleneck import Ballast
from tfmagic.experiments.ps_scaling import BLOCK, BLOCKS, DELAY, PACE, expected, model_bytes

#: each ps's card, each way (the experiment's is 1.5 Mbit/s)
RATE, RATE_BITS = "2mbit", 2e6

#: from this many workers the tasks share processes (as the staleness experiment's do)
SHARED_FROM = 8


def run(ps: int, workers: int, per_worker: int, seed: int, watch: MemoryWatch) -> str:
    import tfmagic
    from tfmagic.pace import Pace

    processes = "auto" if workers >= SHARED_FROM else None
    t0 = time.monotonic()
    with tfmagic.LocalCluster(
        ps=ps,
        workers=workers,
        spares=False,
        pace=Pace.parse(f"{PACE * 1000:g}ms", seed=seed),
        processes=processes,
        net=f"ps:* rate={RATE} delay={DELAY}",
    ) as cluster:
        h = tfmagic.train(
            cluster,
            "async",
            steps=per_worker * workers,
            model=Ballast(seed=seed, blocks=BLOCKS, block=BLOCK),
            lr=0.05,
            seed=seed,
        )
        watch.sample()
        cards = cluster.net().rows
    rate = h.updates_per_s()
    # Each step reads every parameter (B out of the cards); what its gradient puts back is measured as
    # the share the cards counted in against out. Their totals over the number of updates would count
    # each worker's warm-up read and its last read (a step past the run's end) too: 64 kB an update
    # at 32 workers and 192 updates, not 41.6.
    out_bytes = model_bytes()
    in_bytes = out_bytes * sum(r["to_task"] for r in cards) / max(1, sum(r["from_task"] for r in cards))
    want, asked, carried = expected(workers, ps, out_bytes, in_bytes, RATE_BITS)
    missed = [n for n in h.notes if "could not keep" in n]
    return (
        f"{ps} ps, {workers:2d} workers: {rate:5.2f} updates/s, the arithmetic {want:5.2f} "
        f"(asked {asked:5.2f}, carried {carried:5.2f}; {out_bytes / 1e3:.1f} kB out, {in_bytes / 1e3:.1f} kB in "
        f"an update): measured / arithmetic {rate / want:.2f}; "
        f"{time.monotonic() - t0:.0f} s, warm-up {h.warmup_s or 0:.0f} s"
        + (f"; {missed[0]}" if missed else "")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="+", default=["1x4", "1x8", "1x16", "2x16", "1x32", "2x32"])
    parser.add_argument("--per-worker", type=int, default=6, help="updates per worker in each run")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(
        f"each ps's card {RATE} each way, {DELAY}; {model_bytes() / 1e3:.1f} kB of parameters; "
        f"pace {PACE * 1000:g} ms",
        flush=True,
    )
    with MemoryWatch() as watch:
        for spec in args.runs:
            ps, workers = (int(x) for x in spec.split("x"))
            print(run(ps, workers, args.per_worker, args.seed, watch), flush=True)
    print(f"peak memory {watch.peak / 1e9:.2f} GB (PSS, this process and its tasks)")


if __name__ == "__main__":
    main()
