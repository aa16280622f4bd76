"""``pace="auto"``: the smallest modelled step this machine keeps for a cluster's shape, with margin.

A paced cluster is honest only while the processes need less time than the
model gives them (:mod:`tfmagic.pace`): a pace picked by hand is either too
small for a busy laptop (the run then says it could not keep it) or larger,
and slower to teach, than needed.  "auto" measures instead: a short
unpaced async run of the cluster's workers on the digits model, every worker
stepping as fast as it can at once, gives the machine's capacity, R updates
a second.  N paced workers ask for N / pace updates a second; the pace is
picked so that they ask for at most ``SHARE`` of R (the rest is room for
sync's barrier, jitter and hiccups, a dashboard, the kernel), and no less
than ``HEADROOM`` times the slowest tenth of the measured steps' own time.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import BadPace

if TYPE_CHECKING:
    from ..metrics import History

#: the share of the measured capacity that paced workers may ask for
SHARE = 1 / 3
#: a modelled step is at least this many times a real step's own time (the slowest tenth)
HEADROOM = 1.5
#: the smallest and the largest pace "auto" picks
FLOOR, CEILING = 0.02, 2.0
#: worker steps of the measuring run, per worker
STEPS_PER_WORKER = 30


def pick(workers: int, updates_per_s: float, step_p90_s: float) -> float:
    """The pace for ``workers`` workers on a machine that made ``updates_per_s`` unpaced, whose
    steps took ``step_p90_s`` (slowest tenth) on their own; rounded up to 10 ms.

    >>> pick(3, 150.0, 0.02)
    0.06
    >>> pick(1, 400.0, 0.004)
    0.02
    """
    need = max(workers / (SHARE * updates_per_s), HEADROOM * step_p90_s, FLOOR)
    return math.ceil(round(need * 100, 6)) / 100


def calibrate(cluster, probe: Callable[[int], History]) -> float:
    """Measure this machine for ``cluster``'s workers and set its pace's step time; returns it.

    ``probe(steps)`` trains unpaced async on the digits model and returns the history
    (:func:`tfmagic.training.run.measure_pace` passes a :class:`TrainingRun`).  Raises
    :class:`~tfmagic.errors.BadPace` when even the largest pace would not be kept (the machine is
    too busy), saying what was measured.
    """
    pace = cluster.pace
    workers = cluster.shape.workers
    cluster.pace = None  # the measuring run goes at the machine's own speed
    try:
        history = probe(STEPS_PER_WORKER * workers)
        if not history.updates_per_s() and history.steps:
            # every update came before the last worker's first step ended (the warm-up): too short to
            # tell a rate from (a CI run measured "0 updates/s" and called the machine too busy)
            history = probe(3 * STEPS_PER_WORKER * workers)
    finally:
        cluster.pace = pace
    rate = history.updates_per_s()
    own = sorted(
        (r.compute or 0) + (r.transfer or 0) + (r.apply or 0) for r in history.records if not r.warmup
    )
    p90 = own[len(own) * 9 // 10] if own else 0.0
    what = (
        f"{workers} unpaced worker{'s' if workers != 1 else ''} made {rate:.0f} updates/s here, "
        f"a step's own time up to {p90 * 1000:.0f} ms"
    )
    if not rate or workers / (SHARE * rate) > CEILING:
        raise BadPace(
            f"this machine is too busy to keep any pace for {workers} workers ({what}); "
            "stop what else runs here, or use fewer workers"
        )
    pace.base = pick(workers, rate, p90)
    pace.measured = (
        f"{pace.base * 1000:g} ms per step, measured: {what}; paced workers ask for at most a third of that"
    )
    return pace.base
