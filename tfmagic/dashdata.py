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


class DownsampledSeries:
    """(x, y) points, at most ``max_points``: when full, neighbours are averaged in pairs.

    >>> s = DownsampledSeries(max_points=4)
    >>> for i in range(8): s.append(i, i)
    >>> len(s) <= 4, s.xs[0] == 0.5
    (True, True)
    """

    def __init__(self, max_points: int = 400) -> None:
        if max_points < 2:
            raise ValueError("max_points must be at least 2")
        self.max_points = max_points
        self.xs: list[float] = []
        self.ys: list[float] = []
        self.ws: list[int] = []  # raw points behind each stored point
        self.stride = 1  # raw points per stored point
        self._pending: list[tuple[float, float]] = []

    def append(self, x: float, y: float) -> None:
        self._pending.append((x, y))
        if len(self._pending) < self.stride:
            return
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
    """An event placed on the plots: at a time (s since the dashboard's origin) and a global step."""

    t: float
    step: float | None
    kind: str
    task: str
    label: str


#: Events drawn as lines with a label; others (many per run) as small ticks.
MAJOR = ("slow", "kill", "restart", "lost", "rejoin", "resume", "error")


def place_event(event, origin: float, last_step: float | None) -> Mark:
    """Where an event goes: its time since ``origin``; its step, or the run's latest one."""
    step = event.step if getattr(event, "step", None) is not None else last_step
    label = f"{event.task} {event.kind}".strip()
    if event.kind == "slow" and event.detail:
        label = f"{event.task} {event.detail}"
    return Mark(event.time - origin, step, event.kind, event.task, label)


class RunTrace:
    """One run as the dashboard sees it: loss per step and per second, bounded."""

    def __init__(self, history, origin: float, max_points: int = 400, max_marks: int = 200) -> None:
        self.history = history
        self.name = history.run
        self.mode = history.mode
        self.origin = origin
        self.by_step = DownsampledSeries(max_points)
        self.by_time = DownsampledSeries(max_points)
        # Dropped gradients come every step of a long sync run with backups; they get
        # their own bound so they never push slow/kill/restart marks off the plot.
        self.marks: deque[Mark] = deque(maxlen=max_marks)
        self.drop_marks: deque[Mark] = deque(maxlen=max_marks)
        self.dropped = 0
        self.last_step: float | None = None
        self.updates = 0
        self._lock = threading.Lock()

    def on_global(self, g) -> None:
        with self._lock:
            self.by_step.append(g.step, g.loss)
            self.by_time.append(g.time - self.origin, g.loss)
            self.last_step = g.step
            self.updates += 1

    def on_event(self, e) -> None:
        with self._lock:
            if e.kind == "dropped":
                self.dropped += 1
            if e.kind == "start":
                return
            mark = place_event(e, self.origin, self.last_step)
            (self.drop_marks if e.kind == "dropped" else self.marks).append(mark)

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
                "marks": list(self.marks) + list(self.drop_marks),
                "dropped": self.dropped,
                "updates": self.updates,
            }
