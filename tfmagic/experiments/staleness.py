"""Staleness: in async training each gradient lands about N - 1 updates after it was read.

With N workers at the same pace, between one worker's read of the parameters
and its update the other N - 1 workers each apply about one update.  Measured
on paced clusters of 2 and 4 workers (a process each), then 8, 16 and 32 whose
tasks share processes (``processes="auto"``: a process costs about 0.1-0.16 GB,
a further task in it about 0.03 GB), each where it fits the 2 GB an experiment
may use (the result says which size was skipped and the arithmetic).  From 8
workers the pace grows with N so the cluster asks this machine for at most
``RATE`` updates a second: the kernel makes every call, and the staleness is
the model's only while each worker's update-then-read is short against its
step (:func:`tfmagic.pace.updates_while_applying`).
"""

from __future__ import annotations

from .base import PACE, Check, Claim, Finding, Lab, figure

CLAIM = Claim(
    "In asynchronous SGD a gradient is applied to parameters that have moved on: with N workers at "
    "the same speed its staleness is about N - 1 updates, growing with the number of workers",
    "source article 001 (stale gradients in async SGD); Dean et al., Large Scale Distributed Deep Networks "
    "(Downpour SGD), NIPS 2012",
)

SIZES = (2, 4, 8, 16, 32)
UPDATES_PER_WORKER = 20
#: from this many workers the tasks share processes
SHARED_FROM = 8
#: updates a second a cluster of SHARED_FROM or more workers asks for: its pace is N / RATE
RATE = 20


def mean_staleness(history) -> float:
    values = [r.staleness for r in history.records if r.applied and not r.warmup]
    return sum(values) / len(values)


def measure(lab: Lab) -> Finding:
    found: dict[int, float] = {}
    spread: dict[int, list[int]] = {}
    notes = []
    # One cluster of 4 serves 4 and 2 workers: killed workers are left out of the next run
    with lab.cluster(workers=4) as cluster:
        for n in (4, 2):
            for i in range(n, 4):
                if cluster.procs[f"worker:{i}"].alive:
                    cluster.kill(f"worker:{i}")
            h = lab.train(cluster, "async", UPDATES_PER_WORKER * n, label=f"async, {n} workers")
            found[n] = mean_staleness(h)
            spread[n] = [r.staleness for r in h.records if r.applied and not r.warmup]
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
        found[n] = mean_staleness(h)
        spread[n] = [r.staleness for r in h.records if r.applied and not r.warmup]
    found = dict(sorted(found.items()))
    measured = {f"mean staleness, {n} workers": s for n, s in found.items()}
    measured |= {f"over N - 1, {n} workers": s / (n - 1) for n, s in found.items()}
    checks = [
        Check(f"mean staleness / (N - 1), N = {n}", s / (n - 1), bound, op, "about N - 1")
        for n, s in found.items()
        for bound, op in ((0.85, ">="), (1.15, "<="))  # within 15 %
    ]
    sizes = sorted(found)
    checks += [
        Check(f"staleness {b} workers / {a} workers", found[b] / found[a], 1.5, ">=", "grows with workers")
        for a, b in zip(sizes, sizes[1:])
    ]
    fig, (a, b) = figure()
    a.plot(sizes, [found[n] for n in sizes], "o-", label="measured")
    a.plot(sizes, [n - 1 for n in sizes], "k--", label="N - 1")
    a.set_xlabel("workers")
    a.set_ylabel("mean staleness (updates)")
    a.set_xticks(sizes)
    a.legend(fontsize=8)
    for n in sizes:
        values = spread[n]
        top = max(values)
        b.hist(values, bins=range(top + 2), alpha=0.5, label=f"{n} workers", align="left")
    b.set_xlabel("staleness of an update")
    b.set_ylabel("updates")
    b.legend(fontsize=8)
    fig.tight_layout()
    return Finding(measured, checks, fig, notes)
