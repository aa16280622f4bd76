"""Scaling: async throughput grows with the number of workers, as separate machines would give.

Async workers never wait for each other, so with one ps that keeps up, N
paced workers make about N times the updates per second of one.  Measured
with 4, 3, 2 and 1 paced workers (one cluster, a worker killed between
runs), and 8 where memory allows, its tasks sharing processes
(``processes="auto"``, as :mod:`~tfmagic.experiments.staleness` does): a process
each, 8 workers did not fit the 1.8 GB of lesson 06.  Shared sizes run at the
staleness experiment's pace of N / 20 s (the kernel makes every call: at 200 ms,
8 workers ask for 40 updates a second, and 2 of 10 seeds could not keep it), so
their speed-up is counted in updates per modelled step, which is what a paced
worker's rate means: N workers at any pace against one worker at its own.
"""

from __future__ import annotations

from .base import PACE, Check, Claim, Finding, Lab, figure
from .staleness import RATE, SHARED_FROM

CLAIM = Claim(
    "Asynchronous data-parallel training scales: with a parameter server that keeps up, N workers "
    "make about N times the updates per second of one",
    "source article 001 (data parallelism, async SGD); Dean et al., Large Scale Distributed Deep Networks, NIPS 2012",
)

SIZES = (1, 2, 3, 4, 8)
UPDATES_PER_WORKER = 20
EFFICIENCY = 0.8


def measure(lab: Lab) -> Finding:
    rate: dict[int, float] = {}  # updates per second at PACE: measured, or per modelled step / PACE
    notes = []
    # One cluster of 4 serves 4, 3, 2 and 1 workers: a killed worker is left out of the next run
    # (starting a cluster per size would cost more time than the runs).
    with lab.cluster(workers=4) as cluster:
        for n in (4, 3, 2, 1):
            for i in range(n, 4):
                if cluster.procs[f"worker:{i}"].alive:
                    cluster.kill(f"worker:{i}")
            h = lab.train(cluster, "async", UPDATES_PER_WORKER * n, label=f"async, {n} worker{'s' * (n > 1)}")
            rate[n] = h.updates_per_s()
    for n in SIZES:
        if n <= 4:
            continue
        processes = "auto" if n >= SHARED_FROM else None
        ok, words = lab.fits(n + 1, processes)
        if not ok:
            notes.append(f"{n} workers skipped: it would not fit ({words})")
            lab.progress(notes[-1])
            continue
        notes.append(f"{n} workers fit the memory limit ({words})")
        pace = max(PACE, n / RATE) if processes else PACE
        h = lab.train_alone(n, UPDATES_PER_WORKER * n, notes, processes, pace)
        if h is None:
            continue
        rate[n] = h.updates_per_s() * pace / PACE
        if pace != PACE:
            notes.append(
                f"{n} workers ran at {pace * 1000:g} ms a step: {h.updates_per_s():.1f} updates/s, "
                f"{h.updates_per_s() * pace:.2f} per modelled step, counted as {rate[n]:.1f}/s at {PACE * 1000:g} ms"
            )
    sizes = sorted(rate)
    measured = {f"updates/s, {n} worker{'s' * (n > 1)}": rate[n] for n in sizes}
    measured |= {f"speed-up, {n} workers": rate[n] / rate[1] for n in sizes if n > 1}
    checks = [
        Check(
            f"speed-up with {n} workers / {n}", rate[n] / rate[1] / n, EFFICIENCY, ">=", "about N times one"
        )
        for n in sizes
        if n > 1
    ]
    fig, (a,) = figure(1, 5)
    a.plot(sizes, [rate[n] / rate[1] for n in sizes], "o-", label="measured")
    a.plot(sizes, sizes, "k--", label="N times one worker")
    a.set_xlabel("workers")
    a.set_ylabel("async updates/s over one worker's")
    a.set_xticks(sizes)
    a.legend(fontsize=8)
    fig.tight_layout()
    return Finding(measured, checks, fig, notes)
