"""What the dashboard draws, computed without any UI: bounded and incremental.

A long run must not make the dashboard slower or bigger over time, so
nothing here re-reads a run's whole history per frame: the dashboard feeds
records in as they arrive and every series keeps at most a fixed number of
points (older points are merged pairwise, keeping the whole run in view).
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

from .errors import BadArgument


class DownsampledSeries:
    """(x, y) points, at most ``max_points``: when full, neighbours are merged in pairs.

    ``merge="mean"`` averages them (a rate, where the mean is the honest
    summary); ``merge="keep"`` keeps the first of each pair, so every point
    drawn is one that was measured (a loss curve: averaging would smooth it
    without saying so).

    >>> s = DownsampledSeries(max_points=4)
    >>> for i in range(8): s.append(i, i)
    >>> len(s) <= 4, s.xs[0] == 0.5
    (True, True)
    >>> k = DownsampledSeries(max_points=4, merge="keep")
    >>> for i in range(8): k.append(i, i * 10)
    >>> len(k) <= 4, all(y == 10 * x for x, y in zip(k.xs, k.ys))
    (True, True)
    """

    def __init__(self, max_points: int = 400, merge: str = "mean") -> None:
        if max_points < 2:
            raise BadArgument("max_points must be at least 2")
        if merge not in ("mean", "keep"):
            raise BadArgument("merge is 'mean' or 'keep'")
        self.max_points = max_points
        self.merge = merge
        self.xs: list[float] = []
        self.ys: list[float] = []
        self.ws: list[int] = []  # raw points behind each stored point
        self.stride = 1  # raw points per stored point
        self._pending: list[tuple[float, float]] = []

    def append(self, x: float, y: float) -> None:
        self._pending.append((x, y))
        if len(self._pending) < self.stride:
            return
        if self.merge == "keep":
            px, py = self._pending[0]
        else:
            px = sum(p[0] for p in self._pending) / len(self._pending)
            py = sum(p[1] for p in self._pending) / len(self._pending)
        self.ws.append(len(self._pending))
        self._pending.clear()
        self.xs.append(px)
        self.ys.append(py)
        if len(self.xs) > self.max_points:
            self._halve()

    def _halve(self) -> None:
        """Merge neighbours pairwise, weighted by how many raw points each holds."""
        xs, ys, ws = [], [], []
        n = len(self.xs) // 2 * 2
        for i in range(0, n, 2):
            a, b = self.ws[i], self.ws[i + 1]
            if self.merge == "keep":
                xs.append(self.xs[i])
                ys.append(self.ys[i])
            else:
                xs.append((self.xs[i] * a + self.xs[i + 1] * b) / (a + b))
                ys.append((self.ys[i] * a + self.ys[i + 1] * b) / (a + b))
            ws.append(a + b)
        if n < len(self.xs):
            xs.append(self.xs[-1])
            ys.append(self.ys[-1])
            ws.append(self.ws[-1])
        self.xs, self.ys, self.ws = xs, ys, ws
        self.stride *= 2

    def __len__(self) -> int:
        return len(self.xs)


class RollingRate:
    """Events per second over the last ``window`` seconds, per key.

    >>> r = RollingRate(window=2.0)
    >>> for t in (0.1, 0.5, 1.0, 1.5): r.add("worker:0", t)
    >>> r.rate("worker:0", now=2.0)
    2.0
    """

    def __init__(self, window: float = 5.0) -> None:
        self.window = window
        self._times: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def add(self, key: str, when: float) -> None:
        with self._lock:
            q = self._times.setdefault(key, deque())
            q.append(when)
            self._trim(q, when)

    def _trim(self, q: deque[float], now: float) -> None:
        while q and q[0] <= now - self.window:
            q.popleft()

    def rate(self, key: str, now: float) -> float:
        with self._lock:
            q = self._times.get(key)
            if not q:
                return 0.0
            self._trim(q, now)
            return len(q) / self.window

    def keys(self) -> list[str]:
        with self._lock:
            return sorted(self._times)


@dataclass
class Mark:
    """An event placed on the plots: at a time (s since the dashboard's origin) and a global step.

    ``examples``: how many examples the run had consumed when it happened (None: not known).
    """

    t: float
    step: float | None
    kind: str
    task: str
    label: str
    examples: float | None = None


#: Modes whose gradients can be stale (a staleness histogram is theirs)
STALE_MODES = ("async", "ssp")

#: Events drawn as lines with a label; others (many per run) as small ticks.
MAJOR = ("slow", "kill", "restart", "lost", "rejoin", "resume", "error", "joined", "left")


def place_event(event, origin: float, last_step: float | None) -> Mark:
    """Where an event goes: its time since ``origin``; its step, or the run's latest one."""
    step = event.step if getattr(event, "step", None) is not None else last_step
    label = f"{event.task} {event.kind}".strip()
    if event.kind == "slow" and event.detail:
        label = f"{event.task} {event.detail}"
    return Mark(event.time - origin, step, event.kind, event.task, label)


class MovingMean:
    """The mean of the last ``window`` values, kept as they come (O(1) each).

    >>> m = MovingMean(3)
    >>> [m.add(v) for v in (3.0, 6.0, 9.0, 12.0)]
    [3.0, 4.5, 6.0, 9.0]
    """

    def __init__(self, window: int) -> None:
        if window < 1:
            raise BadArgument("a moving mean needs a window of at least 1")
        self.window = window
        self._values: deque[float] = deque()
        self._sum = 0.0

    def add(self, value: float) -> float:
        self._values.append(value)
        self._sum += value
        if len(self._values) > self.window:
            self._sum -= self._values.popleft()
        return self._sum / len(self._values)


#: What a worker's time in the Gantt strip is: computing (busy, its modelled step when paced),
#: waiting for the others at sync's barrier, a gradient dropped as stale, the run's warm-up.
SEGMENT_KINDS = ("busy", "wait", "dropped", "warm-up")


def step_segments(r) -> list[tuple[str, float, float]]:
    """A :class:`~tfmagic.metrics.StepRecord` as Gantt segments ``(kind, start, end)``, absolute times.

    The step is busy from its start to its end (on a paced cluster the end is
    when its modelled machine is done); a sync step then waits ``r.wait`` for
    the aggregation (the other workers); a dropped one was work for nothing.

    >>> from tfmagic.metrics import StepRecord
    >>> step_segments(StepRecord("worker:0", 3, 10.0, 10.5, 1.0, mode="sync", wait=0.25))
    [('busy', 10.0, 10.5), ('wait', 10.5, 10.75)]
    >>> step_segments(StepRecord("worker:1", 3, 10.0, 11.0, 1.0, mode="sync", dropped=True, applied=False))
    [('dropped', 10.0, 11.0)]
    """
    if r.dropped:
        return [("dropped", r.start, r.end)]
    out = [("warm-up" if r.warmup else "busy", r.start, r.end)]
    if r.wait:
        out.append(("wait", r.end, r.end + r.wait))
    return out


class GanttTrace:
    """Each worker's last steps as segments (busy, waiting, dropped), bounded per worker.

    :meth:`window` picks the time span of the last ``steps`` steps of a
    typical worker (the median over workers, so a worker that died long ago
    does not stretch it), ending at the latest segment: the picture of "the
    slowest worker paces sync" (the others' waits) and of async (no waits).

    >>> from tfmagic.metrics import StepRecord
    >>> g = GanttTrace()
    >>> for i in range(20):
    ...     g.on_step(StepRecord("worker:0", i, i, i + 0.25, 1.0, mode="sync", wait=0.75))
    ...     g.on_step(StepRecord("worker:1", i, i, i + 1.0, 1.0, mode="sync"))
    >>> t0, t1, rows = g.window(steps=4)
    >>> (t0, t1), sorted(rows), g.shares(t0, t1, rows)["worker:0"]["wait"]
    ((16.0, 20.0), ['worker:0', 'worker:1'], 0.75)
    """

    def __init__(self, per_task: int = 256) -> None:
        self.per_task = per_task
        self._rows: dict[str, deque] = {}
        self._lock = threading.Lock()

    def on_step(self, r) -> None:
        segs = step_segments(r)
        with self._lock:
            row = self._rows.get(str(r.task))
            if row is None:
                row = self._rows[str(r.task)] = deque(maxlen=self.per_task)
            row.append((r.start, segs))

    def window(self, steps: int = 10) -> tuple[float, float, dict[str, list[tuple[str, float, float]]]]:
        """``(t0, t1, {task: [(kind, start, end), ...]})`` over the last ``steps`` steps."""
        with self._lock:
            rows = {task: sorted(row, key=lambda s: s[0]) for task, row in self._rows.items() if row}
        if not rows:
            return 0.0, 0.0, {}
        t1 = max(end for row in rows.values() for _, segs in row for _, _, end in segs)
        spans = sorted(t1 - row[-min(steps, len(row))][0] for row in rows.values())
        t0 = t1 - spans[len(spans) // 2]
        out = {}
        for task, row in rows.items():
            out[task] = [(kind, max(a, t0), b) for _, segs in row for kind, a, b in segs if b > t0 and b > a]
        return t0, t1, out

    @staticmethod
    def shares(t0: float, t1: float, rows: dict) -> dict[str, dict[str, float]]:
        """Each worker's share of the window ``t0``..``t1`` spent in each kind of segment."""
        span = max(t1 - t0, 1e-12)
        out = {}
        for task, segs in rows.items():
            row = dict.fromkeys(SEGMENT_KINDS, 0.0)
            for kind, a, b in segs:
                row[kind] += (min(b, t1) - max(a, t0)) / span
            out[task] = row
        return out


class StalenessCounts:
    """How many applied gradients had each staleness (async, SSP): counts, O(1) per step.

    >>> s = StalenessCounts()
    >>> for v in (0, 1, 2, 2, 2, 3): s.add(v)
    >>> s.mean(), s.fractions()[2]
    (1.6666666666666667, 0.5)
    """

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.n = 0
        self.total = 0

    def add(self, staleness: int) -> None:
        self.counts[staleness] = self.counts.get(staleness, 0) + 1
        self.n += 1
        self.total += staleness

    def mean(self) -> float | None:
        return self.total / self.n if self.n else None

    def fractions(self) -> dict[int, float]:
        return {k: v / self.n for k, v in sorted(self.counts.items())} if self.n else {}


class RunTrace:
    """One run as the dashboard sees it, bounded, fed item by item.

    * the **training loss** of each update (a sync update's is the mean
      over the batches it averaged, an async one's is its one batch) against
      updates, examples consumed and time: raw values (a long run keeps
      every n-th, never an average), or a moving mean of ``smooth`` updates
      when asked (and then labelled so);
    * the **held-out loss** (``History.evals``: the same 256 examples for
      every mode, the curve that compares modes) at each probe, with the
      updates, examples and time it was taken at;
    * events placed where they happened.

    Times are seconds since ``origin`` (the dashboard's time 0); the run's
    own clock starts at :meth:`anchor` (the end of its warm-up).
    """

    def __init__(
        self,
        history,
        origin: float,
        max_points: int = 400,
        max_marks: int = 200,
        smooth: int | None = None,
    ) -> None:
        self.history = history
        self.name = history.run
        self.mode = history.mode
        self.origin = origin
        self.smooth = smooth if smooth and smooth > 1 else None
        self._mean = MovingMean(self.smooth) if self.smooth else None
        self.by_step = DownsampledSeries(max_points, merge="keep")
        self.by_time = DownsampledSeries(max_points, merge="keep")
        self.by_examples = DownsampledSeries(max_points, merge="keep")
        #: held-out loss probes: (update, examples, time, loss), raw (a run makes about 40)
        self.evals: list[tuple[float, float, float, float]] = []
        self.max_points = max_points
        # Dropped gradients come every step of a long sync run with backups; they get
        # their own bound so they never push slow/kill/restart marks off the plot.
        self.marks: deque[Mark] = deque(maxlen=max_marks)
        self.drop_marks: deque[Mark] = deque(maxlen=max_marks)
        self.dropped = 0
        self.last_step: float | None = None
        self.updates = 0
        self.examples = 0  # consumed by the run's workers so far (dropped gradients included)
        self.first_time: float | None = None  # when its first update was recorded (absolute)
        self.last_eval: tuple[int, float] | None = None  # (update, held-out loss)
        self.gantt = GanttTrace()
        self.stale = StalenessCounts()  # async and SSP runs
        self._lock = threading.Lock()

    def examples_per_update(self) -> float:
        return self.examples / self.updates if self.updates else 0.0

    def on_step(self, r) -> None:
        """A worker step: the examples it consumed, its place in the Gantt strip, its staleness."""
        self.gantt.on_step(r)
        with self._lock:
            self.examples += r.examples or 0
            if self.mode in STALE_MODES and r.applied and not r.warmup and not r.dropped:
                self.stale.add(r.staleness)

    def on_global(self, g) -> None:
        with self._lock:
            loss = self._mean.add(g.loss) if self._mean is not None else g.loss
            self.by_step.append(g.step, loss)
            self.by_time.append(g.time - self.origin, loss)
            self.by_examples.append(self.examples, loss)
            self.last_step = g.step
            self.updates += 1
            if self.first_time is None or g.time < self.first_time:
                self.first_time = g.time

    def on_eval(self, e) -> None:
        """A probe of the held-out loss (a :class:`~tfmagic.metrics.Evaluation`)."""
        self._add_eval(e.step, e.time, e.loss)

    def _add_eval(self, step: int, when: float, loss: float) -> None:
        with self._lock:
            # the records of the updates it follows are in: examples per update so far, times its update
            examples = step * self.examples / self.updates if self.updates else 0.0
            self.evals.append((step, examples, when - self.origin, loss))
            if len(self.evals) > self.max_points:  # bounded like the rest: every other one, raw
                self.evals = self.evals[::2]
            self.last_eval = (step, loss)

    def on_event(self, e) -> None:
        with self._lock:
            if e.kind == "dropped":
                self.dropped += 1
            if e.kind == "start":
                return
            mark = place_event(e, self.origin, self.last_step)
            mark.examples = (mark.step or 0) * self.examples / self.updates if self.updates else 0.0
            (self.drop_marks if e.kind == "dropped" else self.marks).append(mark)

    def anchor(self) -> float | None:
        """The run's time 0, in seconds since ``origin``: the end of its warm-up (tracing, first
        connections), or its first update when the warm-up was not marked."""
        ended = self.history.warmup_ended_at or self.first_time
        return None if ended is None else ended - self.origin

    def copy(self) -> dict:
        """A consistent snapshot for drawing."""

        def ordered(series):
            # async updates arrive a few at a time from each worker, not in step order
            pairs = sorted(zip(series.xs, series.ys))
            return [p[0] for p in pairs], [p[1] for p in pairs]

        with self._lock:
            return {
                "name": self.name,
                "mode": self.mode,
                "step": ordered(self.by_step),
                "time": ordered(self.by_time),
                "examples": ordered(self.by_examples),
                "evals": sorted(self.evals),
                "anchor": self.anchor(),
                "smooth": self.smooth,
                "marks": list(self.marks) + list(self.drop_marks),
                "dropped": self.dropped,
                "updates": self.updates,
                "examples_total": self.examples,
                "staleness": self.stale.fractions() if self.mode in STALE_MODES else None,
                "mean_staleness": self.stale.mean(),
                "workers": len(self.history.workers),
            }

    def replay(self) -> None:
        """Feed what the run recorded before it was followed, in the order it happened.

        Records before the update they made (the examples seen at each update
        count right), held-out probes and events after.
        """
        records, gsteps, events = self.history.snapshot()
        items = [(r.end, 0, i, r) for i, r in enumerate(records)]
        items += [(g.time, 1, i, g) for i, g in enumerate(gsteps)]
        items.sort(key=lambda x: x[:3])
        for _, kind, _, item in items:
            (self.on_step if kind == 0 else self.on_global)(item)
        for step, when, loss in list(self.history.evals):
            self._add_eval(step, when, loss)
        for e in events:
            self.on_event(e)
