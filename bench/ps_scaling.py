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

This is issue 23's "scaling to 32 with a modelled ps card", as a benchmark:
each run is a paced cluster (tasks sharing processes from 8 workers) whose
ps cards are modelled (``net="ps:* rate=2mbit"``), and on a modelled
network a paced async step is its reading, its modelled computation and its
applying, so a full card queues the transfers as between machines
(:meth:`tfmagic.training.asynchronous.AsyncLoop.wait_out_pace`).  Not an
experiment yet: a saturated card's queue needs several steps of every
worker to settle (measured: 1 ps and 32 workers, 192 updates, 68 s), so the
runs that show the bend do not fit the 150 s an experiment has.

    python bench/ps_scaling.py [--runs 1x4 1x8 1x16 2x16 1x32 2x32] [--per-worker 6]
"""

from __future__ import annotations

import argparse
import time

from tfmagic.experiments.base import MemoryWatch
from tfmagic.experiments.ps_bottleneck import Ballast

#: the modelled computation of a step: 32 workers then ask for at most 20 updates a second, which the
#: kernel (making every call) keeps
PACE = 1.6
#: each ps's card, each way, and its one-way delay
RATE, RATE_BITS, DELAY = "2mbit", 2e6, "1ms"
#: the model's tables: 2 x 5,200 floats, about 41.6 kB each way per update (6 updates a second on one card)
BLOCKS, BLOCK = 2, 5_200
#: from this many workers the tasks share processes (as the staleness experiment's do)
SHARED_FROM = 8


def model_bytes() -> int:
    """B: the parameters of one update, in bytes: the tables, w and b (float32).

    >>> model_bytes()
    41608
    """
    return (BLOCKS * BLOCK + 2) * 4


def expected(workers: int, ps: int, out_bytes: float, in_bytes: float) -> tuple[float, float, float]:
    """(updates/s, what the workers ask for, what the cards carry) by the arithmetic, for ``out_bytes``
    (parameters, ps to worker) and ``in_bytes`` (gradient, worker to ps) through the cards per update.

    The gradient's direction carries less than B here (measured about 7 kB of 41.6: TensorFlow computes
    the tables' L2 gradient beside them, on the ps), so the parameters' direction is the one that fills.

    >>> [round(x, 2) for x in expected(4, 1, 41_608, 7_000)]
    [2.22, 2.22, 6.01]
    >>> [round(x, 2) for x in expected(32, 1, 41_608, 7_000)]
    [6.01, 17.79, 6.01]
    >>> round(expected(32, 2, 41_608, 7_000)[0], 2)
    12.02
    """
    delays = 2 * 2 * 1e-3  # DELAY each way, a request and its answer
    # the parameters in, compute, the gradient out; k ps's cards each carry 1 / k of the bytes at once
    step = PACE + (out_bytes + in_bytes) / ps * 8 / RATE_BITS + delays
    asked = workers / step
    carried = ps * RATE_BITS / (8 * max(out_bytes, in_bytes))
    return min(asked, carried), asked, carried


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
    want, asked, carried = expected(workers, ps, out_bytes, in_bytes)
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
