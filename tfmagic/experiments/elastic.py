"""Elastic: async throughput follows the number of workers as they join and leave one running run.

One paced cluster of 1 ps and 1 worker, one async run that never stops in
between: workers join one by one (``cluster.add("worker")``: a new process,
connected in place) up to 4, then leave again, highest first
(``cluster.remove("worker:3")``, ...), down to 1.  After each change the
run settles (a joined worker has made its first updates, a removal is a
moment past), then its update rate is measured over a window.  With one ps
that keeps up, N paced workers make N times the updates per second of one,
whether they were there from the start or joined a minute ago.
"""

from __future__ import annotations

import logging
import time

from ..errors import TrainingError, WillNotFit
from .base import Check, Claim, Finding, Lab, figure

CLAIM = Claim(
    "Asynchronous training is elastic: workers can join and leave a running job, and its throughput "
    "follows the number of workers, N of them making about N times the updates per second of one "
    "(within 15 %), growing and shrinking",
    "source article 001 (data parallelism, async SGD); Dean et al., Large Scale Distributed Deep Networks, "
    "NIPS 2012; elastic membership: context.update_server_def, as remote_cluster_test.py in TensorFlow tests it",
)

MOST = 4  # workers at the top
WINDOWS = {1: 8.0}  # seconds of measuring with one worker (the reference: about 20 updates) ...
WINDOW = 6.0  # ... and with more (15 updates a worker or more, 30 in all)
SETTLE = 1.5  # seconds skipped after a change (a joined worker has also made its first updates)
FIRST_UPDATES = 2  # a joined worker's updates (warm-up left out) before its size is measured
JOIN_TIMEOUT = 30.0  # a joined worker that makes no update in this long fails the run
TOLERANCE = 0.15


def window_rate(history, start: float, end: float) -> tuple[float, int]:
    """Updates/s in [start, end] (each worker's steps inside it over their span, summed) and the workers seen.

    Counting each worker's whole steps over their own span leaves out the
    half steps cut by the window's edges (with 20 steps in a window, one
    step more or less would be 5 %).
    """
    rate, seen = 0.0, 0
    for recs in history.by_task().values():
        inside = [r for r in recs if r.applied and not r.warmup and r.start >= start and r.end <= end]
        if len(inside) < 2:
            continue
        span = max(r.end for r in inside) - min(r.start for r in inside)
        rate += len(inside) / max(span, 1e-9)
        seen += 1
    return rate, seen


def _applied(history, task: str) -> int:
    return sum(1 for r in history.records if str(r.task) == task and r.applied and not r.warmup)


def _wait(run, until, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not until():
        if not run.running:
            run.wait()  # raises the run's error, if it ended with one
            raise TrainingError(f"the run ended while {what}")
        if time.monotonic() > deadline:
            raise TrainingError(f"{what} took more than {timeout:g} s")
        time.sleep(0.05)


def measure(lab: Lab) -> Finding:
    from .. import training
    from ..training.models import Linear

    notes: list[str] = []
    top = 1  # the most workers measured
    windows: list[tuple[str, int, float, float]] = []  # (growing/shrinking, workers, start, end)
    joined: list[float] = []  # seconds each cluster.add took
    left: list[float] = []  # seconds each cluster.remove took
    changes: list[tuple[float, str]] = []  # (when, what) for the figure

    with lab.cluster(workers=1) as cluster:
        lab.progress("async: one run, workers joining and leaving while it trains")
        # each run traces its step functions anew: TensorFlow's "retracing" warnings say so, not the
        # claim (set after TensorFlow's import, as Lab.train does; conclude() restores it)
        logging.getLogger("tensorflow").setLevel(logging.ERROR)
        run = training.train(
            cluster,
            "async",
            steps=10**6,
            block=False,
            model=Linear(seed=lab.seed),
            seed=lab.seed,
            name="elastic",
        )
        history = run.history
        try:

            def measure_at(n: int, phase: str) -> None:
                time.sleep(SETTLE)
                start, seconds = time.time(), WINDOWS.get(n, WINDOW)
                lab.progress(f"async, {n} worker{'s' * (n > 1)}: measuring {seconds:g} s")
                _wait(run, lambda: time.time() >= start + seconds, seconds + 5, "measuring")
                windows.append((phase, n, start, time.time()))
                lab.memory.sample()

            _wait(
                run,
                lambda: _applied(history, "worker:0") >= FIRST_UPDATES,
                60,
                "waiting for the first updates",
            )
            measure_at(1, "growing")
            for n in range(2, MOST + 1):
                ok, words = lab.fits(n + 1)
                if not ok:
                    notes.append(f"{n} workers and more skipped: they would not fit ({words})")
                    lab.progress(notes[-1])
                    break
                task = f"worker:{n - 1}"
                lab.progress(f"adding {task}")
                t0 = time.monotonic()
                try:
                    added = cluster.add("worker")
                except WillNotFit as exc:
                    notes.append(f"{n} workers and more skipped: {exc}")
                    lab.progress(notes[-1])
                    break
                joined.append(time.monotonic() - t0)
                changes.append((time.time(), f"+{task}"))
                _wait(
                    run,
                    lambda task=task: _applied(history, task) >= FIRST_UPDATES,
                    JOIN_TIMEOUT,
                    f"waiting for {task}'s first updates",
                )
                lab.progress(
                    f"{task} joined ({'a warm spare' if added.warm else 'a new process'}) in {joined[-1]:.1f} s, "
                    f"updating {time.monotonic() - t0:.1f} s after the call"
                )
                top = n
                measure_at(n, "growing")
            if top == MOST:
                notes.append(f"{MOST} workers fit the memory limit ({lab.fits(MOST + 1)[1]})")
            for n in range(top - 1, 0, -1):
                task = f"worker:{n}"
                lab.progress(f"removing {task} (it finishes its step)")
                t0 = time.monotonic()
                cluster.remove(task, drain=True)
                left.append(time.monotonic() - t0)
                changes.append((time.time(), f"-{task}"))
                measure_at(n, "shrinking")
        finally:
            run.stop(wait=False)
            try:
                run.wait(30, raise_error=False)
            except TimeoutError:
                pass  # stopping the cluster below ends it

        lab.memory.sample()
    return summarize(history, windows, changes, joined, left, top, notes)


def summarize(history, windows, changes, joined, left, top: int, notes: list[str]) -> Finding:
    """The figures, checks and picture of a finished elastic run (its windows: phase, workers, start, end)."""
    if history.error:
        raise TrainingError(f"the elastic run failed: {history.error}")
    for note in history.notes:
        if "could not keep" in note:
            raise TrainingError(f"in the elastic run, {note}")

    rates: list[tuple[str, int, float]] = []
    for phase, n, start, end in windows:
        rate, seen = window_rate(history, start, end)
        if seen != n:
            raise TrainingError(
                f"{seen} worker(s) made updates in the {n}-worker window ({phase}), not {n}: "
                "the figure would not be the one the claim is about"
            )
        rates.append((phase, n, rate))
    one = rates[0][2]

    def key(phase: str, n: int) -> str:
        where = "" if (phase, n) in (("growing", 1), ("growing", top)) else f", {phase}"
        return f"{n} worker{'s' * (n > 1)}{where}"

    measured: dict = {f"updates/s, {key(p, n)}": r for p, n, r in rates}
    measured |= {f"over {n} x one, {key(p, n)}": r / (n * one) for p, n, r in rates[1:]}
    measured["seconds to join"] = joined
    measured["seconds to leave"] = left
    checks = [
        Check(
            f"updates/s / ({n} x one), {key(p, n)}",
            r / (n * one),
            bound,
            op,
            f"within {TOLERANCE:.0%} of N x one",
        )
        for p, n, r in rates[1:]
        for bound, op in ((1 - TOLERANCE, ">="), (1 + TOLERANCE, "<="))
    ]

    fig, (a, b) = figure()
    colors = {"growing": "#1f77b4", "shrinking": "#d62728"}
    t_zero = windows[0][2]
    ends = sorted(g.time for g in history.snapshot()[1])
    if ends:  # the run's update rate in 2 s bins, from a little before the first window
        edges = [t_zero - 4 + 2 * i for i in range(int((ends[-1] - t_zero + 4) // 2) + 1)]
        counts = [sum(1 for t in ends if lo <= t < lo + 2) / 2 for lo in edges]
        a.step([e - t_zero for e in edges], counts, where="post", color="#999", lw=1, label="2 s bins")
    shown = set()
    for (phase, n, start, end), (_, _, rate) in zip(windows, rates, strict=True):
        a.axvspan(start - t_zero, end - t_zero, color=colors[phase], alpha=0.1)
        label = None if phase in shown else f"measured, {phase}"
        a.hlines(rate, start - t_zero, end - t_zero, color=colors[phase], lw=2, label=label)
        label = None if shown else "N x one worker"
        a.hlines(n * one, start - t_zero, end - t_zero, color="k", lw=1, linestyles="--", label=label)
        shown.add(phase)
    a.set_ylim(bottom=0)
    for when, what in changes:
        a.axvline(when - t_zero, color="#555", lw=0.6, ls=":")
        a.text(when - t_zero, 0.2, what, fontsize=7, rotation=90, va="bottom", ha="right")
    a.set_xlabel("seconds (from the first window)")
    a.set_ylabel("async updates/s")
    a.legend(fontsize=8, loc="upper left")
    for phase, style in (("growing", "o-"), ("shrinking", "s-")):
        pts = [(n, r / one) for p, n, r in rates if p == phase or (phase == "shrinking" and n == top)]
        if len(pts) > 1:
            b.plot(*zip(*pts, strict=True), style, color=colors[phase], label=f"measured, {phase}")
    sizes = sorted({n for _, n, _ in rates})
    b.plot(sizes, sizes, "k--", lw=1, label="N times one worker")
    b.fill_between(
        sizes,
        [n * (1 - TOLERANCE) for n in sizes],
        [n * (1 + TOLERANCE) for n in sizes],
        color="k",
        alpha=0.08,
        label=f"within {TOLERANCE:.0%}",
    )
    b.set_xlabel("workers")
    b.set_ylabel("async updates/s over one worker's")
    b.set_xticks(sizes)
    b.legend(fontsize=8)
    fig.tight_layout()
    return Finding(measured, checks, fig, notes)
