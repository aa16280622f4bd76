"""Scaling against the ps's card: async throughput grows with N until a ps's network card is full, then flattens, and a second ps lifts it.

Async workers never wait for each other, so N workers whose step takes T ask
for N / T updates a second.  Every update moves the model through a ps's
card: the parameters out to the worker and the gradient back, B bytes the
fuller way.  A card of R bits a second carries R / 8B updates a second: past
N = T R / 8B the throughput flattens there, and k ps (each with its own card
and B / k of the bytes) lift the ceiling k times (Li et al. 2014; d2l's
parameter-server chapter does this arithmetic on paper)::

    updates/s = min(N / T, k R / 8B),  T = the pace + an update's bytes' time on an idle card

Measured with 32 paced workers on 2 ps, then 16 and 4 on 1 ps (a cluster
each, their tasks sharing processes, ``processes="auto"``; a killed worker is
left out of the next run), each ps's card modelled at ``RATE``
(:mod:`tfmagic.network.shaper`): 4 workers get their pace's worth, 16 ask for
more than one card carries and get the card's, and 32 on two cards get twice
that.  The pace is 1.6 s so that 32 workers ask for at most 20 updates a
second, which the kernel (making every call) keeps; on a modelled network a
paced async step is its reading, its modelled computation and its applying,
so a full card queues the transfers as between machines.

B is what an update moves through the cards the fuller way, the parameters
out to the worker: two tables of ``BLOCK`` floats (the embedding tables that
made parameter servers necessary), 41.6 kB, plus what the card counts beside
them (gRPC's framing, w, b, the step count; :class:`CardMeter`). The
gradient's direction carries less (TensorFlow computes the tables' L2 term
on the ps).  Each rate and each B is taken over its run's middle half
(:func:`middle_half`): a few steps of every worker fit the 150 s an
experiment has, and over so few the run's two ends pull the rate below the
card's.
"""

from __future__ import annotations

import bisect
import threading
import time

from .base import Check, Claim, Finding, Lab, figure

CLAIM = Claim(
    "With parameter servers, async throughput grows with the workers until a ps's network card is full: "
    "updates/s = min(N / T, k R / 8B) for N workers of step T and k ps, each card carrying R bits/s and "
    "each update B bytes; past N = T R / 8B it flattens, and more ps lift it",
    "Li et al., Scaling Distributed Machine Learning with the Parameter Server, OSDI 2014; "
    "Dive into Deep Learning, section 13.7 (Parameter Servers)",
)

#: the modelled computation of a step: 32 workers then ask for at most 20 updates a second
PACE = 1.6
#: each ps's card, each way, and its one-way delay: about 4.3 updates a second a card, so 16 workers ask
#: one card for 1.9 times what it carries (on a 2 Mbit/s card, 1.44 times, that run measured 0.78-0.92 of
#: the arithmetic, with B the parameters alone; not measured again with the B the card counts)
RATE, RATE_BITS, DELAY = "1.5mbit", 1.5e6, "1ms"
#: the model's tables: 2 x 5,200 floats, about 41.6 kB each way per update
BLOCKS, BLOCK = 2, 5_200
#: (ps, workers) -> async updates in the run: a few steps of every worker
RUNS = {(2, 32): 96, (1, 16): 64, (1, 4): 24}
TOLERANCE = 0.15


def model_bytes() -> int:
    """The parameters of one update, in bytes (the tables, w and b, float32): B's floor.

    >>> model_bytes()
    41608
    """
    return (BLOCKS * BLOCK + 2) * 4


def expected(
    workers: int, ps: int, out_bytes: float, in_bytes: float, rate_bits: float = RATE_BITS
) -> tuple[float, float, float]:
    """(updates/s, what the workers ask for, what the cards carry) by the arithmetic, for ``out_bytes``
    (parameters, ps to worker) and ``in_bytes`` (gradient, worker to ps) through cards of
    ``rate_bits`` bits/s per update.

    >>> [round(x, 2) for x in expected(4, 1, 41_608, 7_000)]
    [2.15, 2.15, 4.51]
    >>> [round(x, 2) for x in expected(32, 1, 41_608, 7_000, rate_bits=2e6)]
    [6.01, 17.79, 6.01]
    >>> round(expected(32, 2, 41_608, 7_000)[0], 2)
    9.01
    """
    delays = 2 * 2 * 1e-3  # DELAY each way, a request and its answer
    # the parameters in, compute, the gradient out; k ps's cards each carry 1 / k of the bytes at once
    step = PACE + (out_bytes + in_bytes) / ps * 8 / rate_bits + delays
    asked = workers / step
    carried = ps * rate_bits / (8 * max(out_bytes, in_bytes))
    return min(asked, carried), asked, carried


class CardMeter:
    """The bytes through every card, sampled every ``every`` seconds while a run trains.

    B in the arithmetic is the bytes an update moves through the cards. The
    parameters are its floor (41.6 kB here); the card also counts gRPC's
    framing, the step count, w and b: 43.9-45.8 kB an update, measured. Taken
    over the same middle half as the rate, the meter gives the B the cards
    really carried, so the check asks whether the cards were full, not how
    big a message's framing is.
    """

    def __init__(self, cluster, every: float = 0.1) -> None:
        self.cluster, self.every = cluster, every
        self.samples: list[tuple[float, int, int]] = []  # (time, to the ps, from the ps)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tfmagic-card-meter", daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            rows = self.cluster.net().rows
            self.samples.append(
                (time.time(), sum(r["to_task"] for r in rows), sum(r["from_task"] for r in rows))
            )
            self._stop.wait(self.every)

    def __enter__(self) -> CardMeter:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def between(self, t0: float, t1: float) -> tuple[int, int]:
        """(to the ps, from the ps): bytes through the cards from ``t0`` to ``t1`` (nearest samples)."""
        times = [x[0] for x in self.samples]
        i = min(bisect.bisect_left(times, t0), len(times) - 1)
        j = min(bisect.bisect_left(times, t1), len(times) - 1)
        return self.samples[j][1] - self.samples[i][1], self.samples[j][2] - self.samples[i][2]


def middle_half(history) -> tuple[float, float, int]:
    """(start, end, updates) of the run's middle half, by updates.

    A full card's queue fills while every worker makes its first read, and the
    reads of the steps in flight when the run reaches its count cross the card
    without an update counted: over a few steps a worker, the run's two ends
    pull the rate below the card's (measured: 0.86-0.90 of it with 4-6 updates
    a worker). Its middle half is the steady state the arithmetic describes.
    """
    times = sorted(g.time for g in history.snapshot()[1])
    a, b = len(times) // 4, 3 * len(times) // 4
    return times[a], times[b], b - a


def steady_rate(history) -> float:
    """Updates per second over the run's middle half (:func:`middle_half`)."""
    if len(history.snapshot()[1]) < 8:
        return history.updates_per_s()
    t0, t1, n = middle_half(history)
    return n / max(t1 - t0, 1e-9)


def _run(lab: Lab, cluster, ps: int, workers: int) -> dict[str, float]:
    from .ps_bottleneck import Ballast

    where = f"{ps} ps, {workers} workers"
    model = Ballast(seed=lab.seed, blocks=BLOCKS, block=BLOCK)  # round-robin: a table on each of 2 ps
    with CardMeter(cluster) as meter:
        h = lab.train(cluster, "async", RUNS[(ps, workers)], label=where, model=model, lr=0.05)
    t0, t1, n = middle_half(h)
    to_ps, from_ps = meter.between(t0, t1)
    out_bytes, in_bytes = from_ps / n, to_ps / n
    want, asked, carried = expected(workers, ps, out_bytes, in_bytes)
    got = steady_rate(h)
    lab.progress(
        f"{where}: {got:.2f} updates/s, the arithmetic {want:.2f} (asked {asked:.2f}, the cards carry "
        f"{carried:.2f} at {out_bytes / 1e3:.1f} kB out and {in_bytes / 1e3:.1f} kB in an update)"
    )
    return {
        "measured": got,
        "expected": want,
        "asked": asked,
        "carried": carried,
        "in": in_bytes,
        "out": out_bytes,
    }


def measure(lab: Lab) -> Finding:
    found: dict[tuple[int, int], dict[str, float]] = {}
    net = f"ps:* rate={RATE} delay={DELAY}"
    # a cluster each: a run of N workers costs its tasks' processes about N x (N + 2) functions'
    # memory, so 32 workers run once (0.6 GB), on 2 ps, and one ps's runs follow on a smaller cluster
    with lab.cluster(workers=32, ps=2, processes="auto", base=PACE, net=net) as cluster:
        found[(2, 32)] = _run(lab, cluster, 2, 32)
    with lab.cluster(workers=16, ps=1, processes="auto", base=PACE, net=net) as cluster:
        for n in (16, 4):
            for i in range(n, 16):
                if cluster.procs[f"worker:{i}"].alive:
                    cluster.kill(f"worker:{i}")
            found[(1, n)] = _run(lab, cluster, 1, n)
    measured: dict = {}
    checks = []
    for (k, n), f in found.items():
        where = f"{k} ps, {n} workers"
        measured[f"updates/s, {where}"] = f["measured"]
        measured[f"the arithmetic, {where}"] = f["expected"]
        ratio = f["measured"] / f["expected"]
        measured[f"measured / arithmetic, {where}"] = ratio
        measured[f"bytes out an update, {where}"] = f["out"]
        meaning = "the cards are full: k R / 8B" if f["asked"] > f["carried"] else "the workers' pace: N / T"
        checks += [
            Check(f"measured / arithmetic, {where}", ratio, 1 - TOLERANCE, ">=", meaning),
            Check(f"measured / arithmetic, {where}", ratio, 1 + TOLERANCE, "<=", meaning),
        ]
    flat = found[(1, 16)]["measured"] / found[(1, 16)]["asked"]
    double = found[(2, 32)]["measured"] / found[(1, 16)]["measured"]
    measured |= {"1 ps, 16 workers: measured over asked": flat, "2 ps, 32 workers over 1 ps, 16": double}
    checks += [
        Check("1 ps, 16 workers: updates/s over N / T", flat, 0.8, "<=", "past one card it flattens"),
        Check(
            "2 ps and 32 workers over 1 ps and 16: updates/s",
            double,
            1.7,
            ">=",
            "two cards carry about twice one's",
        ),
    ]
    params = model_bytes()
    out, grad = found[(1, 16)]["out"], found[(1, 16)]["in"]
    fig, (a,) = figure(1, 6)
    ns = list(range(1, 33))
    for k, color in ((1, "C0"), (2, "C1")):
        a.plot(
            ns, [expected(n, k, out, grad)[0] for n in ns], "--", color=color, label=f"min(N / T, {k} R / 8B)"
        )
        pts = sorted((n, f["measured"]) for (kk, n), f in found.items() if kk == k)
        a.plot([p[0] for p in pts], [p[1] for p in pts], "o", color=color, label=f"measured, {k} ps")
    a.set_xlabel("workers")
    a.set_ylabel("async updates/s")
    a.set_title(f"each ps's card {RATE}, B = {out / 1e3:.1f} kB, T = {PACE:g} s")
    a.legend(fontsize=8)
    fig.tight_layout()
    notes = [
        f"each ps's card: {RATE} each way, {DELAY} one way; B = {out / 1e3:.1f} kB out an update as the "
        f"card counted it ({params / 1e3:.1f} kB of parameters, the rest framing, w, b and the step count), "
        f"{grad / 1e3:.1f} kB back; one card carries {expected(32, 1, out, grad)[2]:.2f} updates/s; rates "
        "and bytes over each run's middle half"
    ]
    return Finding(measured, checks, fig, notes)
