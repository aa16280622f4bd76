"""A cluster in miniature that behaves like real machines: each worker step takes a modelled time.

On two cores, eight worker processes share the CPU: a straggler slowed by
pausing its process delays its messages more than its computation, and the
other workers speed up on the cores it gives away.  The numbers a student
then reads teach the laptop, not the algorithm.  A *paced* cluster gives
every worker a modelled machine instead: a step of worker ``i`` takes

    base x slowdown_i x jitter  (+ a rare hiccup)

of wall time (or, with ``exponential=μ``, ``(base + an exponentially
distributed time of mean μ) x slowdown_i``: the step-time model under which
Dutta et al. derive sync's and K-sync's expected step times), whatever the processes really need (as long as they need
less: when they do not, the run says so and names a pace that would work).
The training engine waits out the rest of each step on the worker's behalf,
so sync updates are paced by the slowest worker exactly as on separate
machines, and async throughput adds up over workers.

On a modelled network (``net=``) a paced async step is its reading of the
parameters, the modelled computation and its applying of the gradient: the
links' times come on top of the pace, so a ps card that is full queues the
transfers and the steps lengthen, as between machines (``bench/ps_scaling.py``). Paced sync counts its call, network included, inside the pace.

Only tfmagic's training engine is paced; ``%%tf_px`` programs and other
clients of the cluster see the processes' real speed (``slow`` on a paced
cluster changes the modelled speed, not the process).

>>> p = Pace.parse("40ms")
>>> p.base, p.duration("worker:0", 0) == p.base
(0.04, True)
>>> p.set_slowdown("worker:1", 4); round(p.duration("worker:1", 0), 3)
0.16
>>> e = Pace.parse("50ms", exponential=0.1)
>>> draws = [e.duration("worker:0", i) for i in range(4000)]
>>> min(draws) >= 0.05, round(sum(draws) / len(draws), 2)
(True, 0.15)
"""

from __future__ import annotations

import math
import random
import threading
from dataclasses import dataclass, field

from .errors import BadPace
from .units import parse_seconds

#: a run keeps its pace when no more than this share of its steps took over LATE times their modelled time,
#: or when the time its steps took over their model adds no more than OVERSHOOT to the run's modelled time
#: (a figure is then within that share of the model's, well inside every claim's tolerance)
MISSED, LATE, OVERSHOOT = 0.1, 1.25, 0.05
#: paced async keeps its model's staleness when no more than this share of the other workers' updates
#: landed while a worker was applying its own (:func:`updates_while_applying`)
UNSEEN = 0.1


@dataclass
class Pace:
    """The modelled machines: a base step time, each worker's slowdown, jitter and hiccups.

    ``jitter`` is the spread of a step's time (the standard deviation of its
    logarithm: 0.1 gives about +-10 %); ``hiccup`` the chance that a step
    takes ``hiccup_factor`` times as long (a GC pause, a busy neighbour).
    Draws come from a generator seeded per task, so a run repeats.
    ``stalls`` are stalls on purpose, the same in every run: ``(task, step,
    factor)`` makes that task's local step ``step`` of each run take
    ``factor`` times the base step, without jitter (a long pause that an
    experiment needs in every mode it compares, where a random hiccup would
    fall in one run and not another).  ``exponential``, when set, is the
    mean of an exponentially distributed time added to every step (a shifted
    exponential: ``base`` is then the shortest a step can take, and should
    be at least what a real step needs, so the machine keeps the model).
    """

    base: float
    jitter: float = 0.0
    hiccup: float = 0.0
    hiccup_factor: float = 5.0
    seed: int = 0
    slowdown: dict[str, float] = field(default_factory=dict)
    stalls: tuple[tuple[str, int, float], ...] = ()
    exponential: float = 0.0
    _rngs: dict[str, random.Random] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    #: "auto": the base is measured on this machine at the first paced run
    #: (:func:`tfmagic.training.calibrate.calibrate`); ``measured`` then says how
    auto: bool = False
    measured: str = ""

    @classmethod
    def parse(cls, pace: str | float | Pace | None, **kwargs) -> Pace | None:
        if pace is None or isinstance(pace, Pace):
            return pace
        if isinstance(pace, str) and pace.strip().lower() == "auto":
            p = cls(0.0, auto=True, **kwargs)
        else:
            p = cls(parse_seconds(pace), **kwargs)
        if not (0 <= p.exponential < 3600 and math.isfinite(p.exponential)):
            raise BadPace("exponential is the mean of a step's exponential part in seconds, 0 (none) to 3600")
        if not (0 <= p.jitter < 2 and 0 <= p.hiccup <= 1 and p.hiccup_factor >= 1):
            raise BadPace("jitter is 0 to 2 (log spread), hiccup a chance 0 to 1, hiccup_factor at least 1")
        if any(factor < 1 or step < 0 for _task, step, factor in p.stalls):
            raise BadPace("a stall is (task, step >= 0, factor >= 1)")
        return p

    def set_slowdown(self, task: str, factor: float) -> None:
        """``task``'s modelled machine is ``factor`` times slower (1 restores it)."""
        with self._lock:
            if factor == 1:
                self.slowdown.pop(str(task), None)
            else:
                self.slowdown[str(task)] = float(factor)

    def duration(self, task: str, step: int) -> float:
        """How long ``task``'s step ``step`` takes on its modelled machine, in seconds."""
        with self._lock:
            rng = self._rngs.get(str(task))
            if rng is None:
                rng = self._rngs[str(task)] = random.Random(f"{self.seed}-{task}")
            slow = self.slowdown.get(str(task), 1.0)
            d = plain = self.base * slow
            if self.exponential:
                d += rng.expovariate(1 / self.exponential) * slow
            if self.jitter:
                d *= math.exp(rng.gauss(-(self.jitter**2) / 2, self.jitter))  # mean 1
            if self.hiccup and rng.random() < self.hiccup:
                d *= self.hiccup_factor
            for stalled, at, factor in self.stalls:
                if stalled == str(task) and at == step:
                    # a stall on purpose is the same length in every run: no jitter on it (a jittered
                    # stall of 12 x 400 ms ran past the end of some runs, and async never showed it)
                    d = plain * factor
            return d

    @property
    def asked(self) -> tuple:
        """What was asked for: "auto" or the base step time (so "auto" matches "auto" once measured),
        and the jitter."""
        return ("auto" if self.auto else self.base, self.jitter)

    @property
    def calibrated(self) -> bool:
        """Whether the base step time is known (always, unless "auto" has not measured it yet)."""
        return self.base > 0

    def describe(self) -> str:
        if not self.calibrated:
            return "paced: auto, at a step time measured on this machine before the first paced run"
        parts = [f"{self.base * 1000:g} ms per step" + (" (auto)" if self.auto else "")]
        if self.exponential:
            parts[0] += f" + an exponential time of mean {self.exponential * 1000:g} ms"
        if self.jitter:
            parts.append(f"jitter {self.jitter:g}")
        if self.hiccup:
            parts.append(f"{self.hiccup:.0%} hiccups x{self.hiccup_factor:g}")
        for stalled, at, factor in self.stalls:
            parts.append(f"{stalled}'s step {at} x{factor:g}")
        slow = ", ".join(f"{t} x{f:g}" for t, f in sorted(self.slowdown.items()))
        return "paced: " + ", ".join(parts) + (f"; slowed {slow}" if slow else "")


def updates_while_applying(records) -> tuple[int, int]:
    """(others' updates that landed between a worker's update and its next read, all others' updates).

    A modelled machine applies its gradient and reads the parameters again at one instant, so with
    N workers at one pace each gradient meets exactly N - 1 updates of the others: the staleness
    the lesson predicts. A real call takes milliseconds between the two (take an update number on
    the ps, apply the update there, read the global step again), and an update by another worker
    that lands then is in the parameters the worker reads next, so it counts for none of that
    worker's gradients: the mean staleness falls short of N - 1 by about that share (three workers
    at 60 ms on a loaded machine here: 13 to 20 % of the updates, a mean of 1.54 to 1.69 where
    the model says 2). Counted from consecutive records of each worker: the global step read for
    step k + 1 less the update step k became, against all the others' updates between the two.
    """
    by_task: dict = {}
    for r in records:
        by_task.setdefault(str(r.task), []).append(r)
    unseen = others = 0
    for recs in by_task.values():
        recs.sort(key=lambda r: r.local_step)
        for a, b in zip(recs, recs[1:]):
            applied = (a.update or 0) > 0 and (b.update or 0) > 0  # not past the run's last update
            if b.local_step != a.local_step + 1 or not applied:
                continue  # a step lost in between, or one that applied nothing
            unseen += max(0, b.step - a.update)
            others += max(0, b.update - a.update - 1)
    return unseen, others


def pace_notes(pace: Pace, records, instant_updates: bool = False) -> list[str]:
    """What a run on ``pace`` must tell its reader about the model (nothing when the run was the model's).

    ``records`` are the run's steps after warm-up. When over a tenth of the steps took over LATE
    times their modelled time and their time over the model adds over OVERSHOOT (5 %) to the run's
    modelled time, the run teaches the laptop, not the model: the note says "could not keep"
    (experiments and lessons look for it) and names a pace that would work. The second condition is
    what a figure feels: with exponential step times many modelled steps are a few milliseconds
    long, and one late by a scheduling tick moves a mean by a fraction of a percent, not by 25 %. ``instant_updates``
    (paced async and SSP, whose staleness is a lesson) also checks the model's instant
    update-then-read (:func:`updates_while_applying`); when over a tenth of the updates fell in the
    gap, the staleness figures are real but below the model's, and the note says so and why (an
    explanation, not a failure: a lesson checks the staleness itself).
    """
    recs = [r for r in records if r.paced is not None and r.compute is not None]
    if len(recs) < 10:
        return []
    notes = []
    real = sorted((r.compute or 0) + (r.transfer or 0) + (r.apply or 0) for r in recs)
    missed = sum(1 for r in recs if r.duration > r.paced * LATE) / len(recs)
    over = sum(max(0.0, r.duration - r.paced) for r in recs) / max(sum(r.paced for r in recs), 1e-9)
    p90 = real[len(real) * 9 // 10]
    if missed > MISSED and over > OVERSHOOT:
        notes.append(
            f"the machine could not keep the {pace.base * 1000:g} ms pace: {missed:.0%} of the steps took "
            f"longer than modelled, adding {over:.0%} to the run's modelled time (real steps took up to "
            f"{p90 * 1000:.0f} ms here); "
            f"its figures teach this machine, not the model. A pace of {p90 * 1500:.0f} ms or more would work"
        )
    unseen, others = updates_while_applying(recs) if instant_updates else (0, 0)
    if others >= 50 and unseen / others > UNSEEN:
        notes.append(
            f"staleness below the model's: {unseen / others:.0%} of the other workers' updates landed while "
            "a worker was between applying its own update and reading the parameters again (an instant in "
            "the model, a real call here: some milliseconds, longer over a modelled card; workers whose steps end together land inside "
            "each other's call about half the time), so none of its gradients counted them. Jitter on the "
            "pace (steps then rarely end together) and a longer pace bring the staleness back toward the model's"
        )
    return notes
