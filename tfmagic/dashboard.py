"""A live dashboard in the notebook: per-worker throughput, convergence, the cluster.

Five plots: each worker's steps/s (warm-up shaded apart, never counted);
the training loss of every update, raw unless ``smooth=`` asks for a
labelled moving mean; the held-out loss (the same examples for every mode:
the curve that compares modes), both against updates, examples seen or
seconds after warm-up (``x=``, or the selector above the picture); a Gantt
strip of each worker's last steps (busy, waiting at sync's barrier,
dropped: the picture of "the slowest worker paces sync"); and, for async
and SSP runs, the staleness histogram with its mean.

Built from ipywidgets (an ``Image`` holding a matplotlib drawing, a
selector and two ``HTML`` panes), refreshed from a background thread at ``refresh`` seconds
while training runs, so the kernel stays free: slow a worker in the next
cell and the next frame shows it.  It stops refreshing when the runs it
watches end or the cluster stops, and keeps its last frame.

Without a widget front end (terminal IPython, nbconvert without widget
state) the same object shows a PNG of its latest frame and a text summary.
Shown with :meth:`Dashboard.show`, its output is re-published once the
refresh ends, so a notebook saved afterwards holds the last frame even where
widget state is not saved.
"""

from __future__ import annotations

import html
import threading
import time
import weakref
from collections import deque
from pathlib import Path

from .dashdata import MAJOR, STALE_MODES, Mark, RollingRate, RunTrace, place_event
from .errors import BadArgument
from .events import Event
from .gilshare import yielding
from .metrics import Evaluation, GlobalStep, StepRecord
from .plots import COLORS, SEGMENT_COLORS, SEGMENT_LABELS, X_AXES
from .procstats import human_bytes

# the same colours, axes and Gantt segments as the notebooks' static pictures
MODE_COLORS = COLORS
MARK_COLORS = {
    "slow": "#ff7f0e",
    "kill": "#d62728",
    "lost": "#d62728",
    "restart": "#2ca02c",
    "rejoin": "#2ca02c",
    "resume": "#9467bd",
    "error": "#000000",
}


#: which axes a change of each limit redraws
_LIMIT_AXES = {
    "tp_x": ("tp",),
    "tp_x0": ("tp",),
    "tp_y": ("tp",),
    "loss_x": ("loss", "eval"),
    "loss": ("loss", "eval"),
    "stale_x": ("stale",),
    "gantt_x": ("gantt",),
}

#: the share of the kernel's time a refreshing dashboard may take (measured: bench/dashboard.py)
BUDGET = 0.04


def _each_run(runs) -> list:
    """TrainingRuns, PxRuns and Histories as given; a Comparison as its runs."""
    return [r for run in runs for r in (getattr(run, "runs", None) or [run])]


def _histories(runs) -> list:
    """The histories behind TrainingRuns, Comparisons (all their runs), PxRuns and Histories."""
    return [getattr(r, "history", r) for r in _each_run(runs)]


def _started(history) -> float:
    """When a history's first point or event happened (or it started, if earlier)."""
    firsts = [g.time for g in history.global_steps[:1]] + [e.time for e in history.events[:1]]
    return min([history.started_at] + firsts)


class Dashboard:
    """Watch training runs on a cluster.

    >>> dash = Dashboard(cluster, runs=[run])       # doctest: +SKIP
    >>> dash.show()                                 # in the notebook; refreshes itself
    >>> dash.set_x("examples")                      # doctest: +SKIP

    ``x``: the loss curves against ``"updates"``, ``"examples"`` or
    ``"seconds"`` (after each run's warm-up); ``smooth``: a moving mean of
    that many updates for the training loss (labelled; raw by default);
    ``gantt_steps``: how many of each worker's last steps the strip shows.
    """

    _latest: weakref.ref | None = None

    def __init__(
        self,
        cluster=None,
        runs=(),
        refresh: float = 0.5,
        window: float = 3.0,
        max_points: int = 400,
        x: str = "updates",
        smooth: int | None = None,
        gantt_steps: int = 10,
        traffic: bool = True,
        budget: float = BUDGET,
    ) -> None:
        if x not in X_AXES:
            raise BadArgument(f"x is one of {', '.join(X_AXES)}, not {x!r}")
        self.x = x
        self.smooth = smooth if smooth and smooth > 1 else None
        self.gantt_steps = gantt_steps
        self._draw_lock = threading.RLock()  # the refresh thread and the selector both draw
        self._gantt_rows: tuple = ()
        self._lim: dict = {}
        self.cluster = cluster
        self.refresh = refresh
        #: the share of the kernel's time the refresh may hold (its frames are spaced to keep to it)
        self.budget = budget
        self.interval = refresh  # the spacing of frames now: ``refresh``, or longer when frames cost more
        self.frame_cpu_s: float | None = None  # a moving mean of one refresh's CPU time (the lock it holds)
        self.window = window
        self.max_points = max_points
        runs = list(runs)
        # Time 0 is when the earliest watched run started: a dashboard opened on a run that is
        # already training (or done) shows its whole curve, not only what came after it opened.
        self.origin = min([time.time()] + [_started(h) for h in _histories(runs)])
        self.rates = RollingRate(window)
        self.traces: list[RunTrace] = []
        self._throughput: dict[str, object] = {}
        self._runs: list = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.frames = 0
        self.full_draws = 0  # the whole figure drawn (the first frame, a new line or legend)
        # frames that redrew some axes (new limits, marks, rows); the rest draw lines only
        self.axes_draws = 0
        self.last_png: bytes | None = None
        self.last_draw_s: float | None = None
        self._fig = None
        self._widget = None
        self._display = None  # IPython DisplayHandle, when shown with show()
        Dashboard._latest = weakref.ref(self)
        #: measure bytes per link while refreshing (the traffic panel; see tfmagic.traffic)
        self.traffic = traffic
        self._meter = None  # the cluster's traffic meter, when this dashboard started it
        self._diagnosis: tuple[float, str] = (0.0, "")  # (when, the hang doctor's banner)
        self.marks: deque[Mark] = deque(maxlen=100)  # cluster events: slow, kill, restart, lost
        self.memory_every = 15.0  # seconds between memory (PSS) reads of each task
        self._memory: dict = {}  # task -> (when, pid, {"rss", "pss"})
        #: what this dashboard follows; closed when it stops (a finished dashboard costs nothing)
        self._subscriptions: list = []
        if cluster is not None:
            self._subscriptions.append(cluster.events.subscribe(self._on_cluster_event))
        for run in runs:
            self.watch(run)

    def _on_cluster_event(self, event) -> None:
        if event.kind in MAJOR:
            self.marks.append(place_event(event, self.origin, None))
        elif event.kind == "stopping":
            self._stop.set()  # the refresh draws no more frames; the last one stays

    # -- what is watched -----------------------------------------------------
    def watch(self, run) -> None:
        """Follow a TrainingRun, a Comparison (all its runs) or a History.

        A run that started before the dashboard's time 0 (the earliest run it
        was made with) shows from there on.
        """
        for history in _histories([run]):
            trace = RunTrace(history, self.origin, self.max_points, smooth=self.smooth)
            trace.replay()

            def follow(item, trace=trace):
                if isinstance(item, StepRecord):
                    if not item.warmup:  # warm-up is shown apart, never counted in throughput
                        self.rates.add(item.task, item.end)
                    trace.on_step(item)
                elif isinstance(item, GlobalStep):
                    trace.on_global(item)
                elif isinstance(item, Evaluation):
                    trace.on_eval(item)
                elif isinstance(item, Event):
                    trace.on_event(item)

            self._subscriptions.append(history.feed.subscribe(follow))
            with self._lock:
                self.traces.append(trace)
        with self._lock:
            self._runs.append(run)

    @property
    def active(self) -> bool:
        """Something is still training (and the cluster runs)."""
        if self.cluster is not None and not self.cluster.running:
            return False
        for r in self._runs:
            running = getattr(r, "running", None)  # TrainingRun, Comparison
            if running is None:
                running = not getattr(r, "done", True)  # a History
            if running:
                return True
        return False

    # -- drawing -------------------------------------------------------------
    def set_x(self, x: str) -> None:
        """Plot the loss curves against ``"updates"``, ``"examples"`` seen or ``"seconds"`` after warm-up."""
        if x not in X_AXES:
            raise BadArgument(f"x is one of {', '.join(X_AXES)}, not {x!r}")
        with self._draw_lock:
            if x != self.x:
                self.x = x
                self._lim.pop("loss_x", None)
                self._background = None
                if self._fig is not None:
                    for ax in (self._ax["loss"], self._ax["eval"]):
                        ax.set_xlabel(X_AXES[x])

    def _offset(self) -> float:
        """The throughput plot's time 0 (s since ``origin``): the end of the first run's warm-up."""
        anchors = [a for a in (t.anchor() for t in self.traces) if a is not None]
        return min(anchors) if anchors else 0.0

    def _sample_throughput(self, now: float) -> None:
        from .dashdata import DownsampledSeries

        tasks = set(self.rates.keys())
        if self.cluster is not None and self.cluster.cluster_def is not None:
            tasks |= {str(t) for t in self.cluster.cluster_def.tasks() if t.job == "worker"}
        for task in sorted(tasks):
            series = self._throughput.setdefault(task, DownsampledSeries(self.max_points))
            series.append(now - self.origin, self.rates.rate(task, now))

    def _figure(self):
        """The figure and its axes, made once; frames only update their data."""
        from matplotlib.figure import Figure
        from matplotlib.ticker import FormatStrFormatter, LogLocator, MaxNLocator, NullFormatter, NullLocator

        if self._fig is None:
            fig = Figure(figsize=(11, 5.6), dpi=72)
            grid = fig.add_gridspec(2, 3, height_ratios=(1.0, 0.75))
            ax = {
                "tp": fig.add_subplot(grid[0, 0]),
                "loss": fig.add_subplot(grid[0, 1]),
                "eval": fig.add_subplot(grid[0, 2]),
                "gantt": fig.add_subplot(grid[1, :2]),
                "stale": fig.add_subplot(grid[1, 2]),
            }
            fig.subplots_adjust(left=0.07, right=0.99, bottom=0.08, top=0.95, wspace=0.28, hspace=0.42)
            smooth = next((t.smooth for t in self.traces if t.smooth), self.smooth)
            loss_title = (
                f"training loss, moving mean of {smooth} updates"
                if smooth
                else "training loss per update (raw)"
            )
            titles = {
                "tp": (
                    f"worker steps/s (last {self.window:g} s, warm-up apart)",
                    "seconds after warm-up",
                    "steps/s",
                ),
                "loss": (loss_title, X_AXES[self.x], "training loss (log)"),
                "eval": ("held-out loss (same examples, every mode)", X_AXES[self.x], "held-out loss (log)"),
                "gantt": (
                    f"each worker's last {self.gantt_steps} steps: busy, waiting for the others, dropped",
                    "seconds before the latest step",
                    "task",
                ),
                "stale": (
                    "staleness (dotted: the mean)",
                    "updates by others between read and apply",
                    "share of steps",
                ),
            }
            for key, (title, xlabel, ylabel) in titles.items():
                a = ax[key]
                a.set_title(title, fontsize=9)
                a.set_xlabel(xlabel, fontsize=8, labelpad=1)
                a.set_ylabel(ylabel, fontsize=8, labelpad=1)
                a.grid(alpha=0.3)
                a.tick_params(labelsize=8)
                a.xaxis.set_major_locator(MaxNLocator(5))
            ax["tp"].yaxis.set_major_locator(MaxNLocator(5))
            for a in (ax["loss"], ax["eval"]):
                a.set_yscale("log")
                # Tick text is most of a frame's cost: few ticks, plain numbers
                # (the default log labels go through mathtext), no minor ticks.
                a.yaxis.set_major_locator(LogLocator(numticks=4))
                a.yaxis.set_major_formatter(FormatStrFormatter("%g"))
                a.yaxis.set_minor_locator(NullLocator())
                a.yaxis.set_minor_formatter(NullFormatter())
            ax["stale"].set_ylim(0, 1.05)
            ax["stale"].yaxis.set_major_locator(MaxNLocator(3))
            ax["gantt"].grid(False)
            from matplotlib.patches import Patch

            ax["gantt"].legend(
                handles=[Patch(color=SEGMENT_COLORS[k], label=SEGMENT_LABELS[k]) for k in SEGMENT_LABELS],
                fontsize=7,
                loc="upper left",
                ncol=4,
                bbox_to_anchor=(0.0, 1.0),
                framealpha=0.8,
            )
            self._fig, self._ax = fig, ax
            self._axes = tuple(ax.values())
            self._canvas = None
            self._background = None
            self._regions = {}
            self._lim = {}
            self._lines = {}
            self._mark_artists = []
            self._marks_drawn = ()
        return self._fig, self._axes

    def _line(self, key: tuple, ax, **style):
        line = self._lines.get(key)
        if line is None:
            (line,) = ax.plot([], [], animated=True, **style)
            self._lines[key] = line
            self._background = None  # the legend changes: redraw everything once
            if style.get("label") and not style["label"].startswith("_"):
                ax.legend(fontsize=7, loc="upper right" if ax is not self._ax["tp"] else "lower left")
        return line

    def _artist(self, key: tuple, make):
        """An animated artist other than a line (bars, text), made once."""
        artist = self._lines.get(key)
        if artist is None:
            artist = self._lines[key] = make()
            artist.set_animated(True)
            self._background = None
        return artist

    def _x_of(self, tr: dict) -> tuple[list, list]:
        """A run's training-loss curve against the chosen x (seconds: from the end of its warm-up)."""
        if self.x == "updates":
            return tr["step"]
        if self.x == "examples":
            return tr["examples"]
        anchor = tr["anchor"] or 0.0
        pts = [(x - anchor, y) for x, y in zip(*tr["time"]) if x >= anchor]
        return [p[0] for p in pts], [p[1] for p in pts]

    def _evals_of(self, tr: dict) -> tuple[list, list]:
        """A run's held-out probes against the chosen x."""
        evals = tr["evals"]
        if self.x == "seconds":
            anchor = tr["anchor"] or 0.0
            evals = [e for e in evals if e[2] >= anchor]
            return [e[2] - anchor for e in evals], [e[3] for e in evals]
        col = 0 if self.x == "updates" else 1
        return [e[col] for e in evals], [e[3] for e in evals]

    def _mark_x(self, tr: dict, m: Mark) -> float | None:
        if self.x == "updates":
            return m.step
        if self.x == "examples":
            return m.examples
        return m.t - (tr["anchor"] or 0.0)

    def _limits(self, traces: list[dict]) -> tuple:
        """Axis limits that change rarely (grown in steps), so most frames only redraw lines."""
        import math

        def grow(current, needed, factor=2.0, floor=1.0):
            # doubling: a long run redraws its axes a handful of times, not every few seconds
            return current if current >= needed else max(floor, needed * factor)

        lim = dict(self._lim)
        xs_tp, ys_tp, xs_loss, losses = [0.0], [0.0], [0.0], []
        for key, line in self._lines.items():
            if key[0] not in ("tp", "loss", "eval"):
                continue
            x, y = line.get_data()
            if not len(x):
                continue
            if key[0] == "tp":
                xs_tp.append(max(x))
                ys_tp.append(max(y))
            else:
                xs_loss.append(max(x))
                losses.extend(v for v in y if v > 0)
        xs_tp.extend(m.t - self._offset() for m in list(self.marks))  # every event's line in view
        # Every change of limits redraws the axes (60-140 ms here, against 9 ms for a usual
        # frame, and it holds the Python lock the training threads need), so limits grow in
        # few, large steps: measured, a 3,000-step run redrew 8 times when they doubled.
        lim["tp_x"] = grow(lim.get("tp_x", 30.0), max(xs_tp))
        lim["tp_x0"] = min([0.0] + [a - self._offset() for a, _ in self._warmups()])
        lim["tp_y"] = grow(lim.get("tp_y", 5.0), max(ys_tp), 4.0)  # rates ramp up over the window
        if self.x == "seconds":
            lim["loss_x"] = grow(lim.get("loss_x", 30.0), max(xs_loss))
        else:
            runs = _each_run(self._runs)
            # planned updates: a TrainingRun knows them (a History's `steps` is only how many so far)
            planned = max(
                [
                    r.steps
                    for r in runs
                    if hasattr(r, "history") and isinstance(getattr(r, "steps", None), int)
                ]
                + [0]
            )
            if self.x == "examples":
                planned = int(
                    planned * max([t["examples_total"] / t["updates"] for t in traces if t["updates"]] + [0])
                )
            # A quarter of the planned steps first (a 20,000-step run is not a sliver at the left
            # edge for long), then fourfold up to the planned steps: one redraw in a run.
            first = float(min(planned, max(100, planned / 4))) if planned else 100.0
            loss_x = grow(lim.get("loss_x", first), max(xs_loss), 4.0)
            lim["loss_x"] = min(loss_x, float(planned)) if 0 < planned >= max(xs_loss) else loss_x
        decades = None  # the whole decades the losses span
        if losses:
            decades = (10 ** math.floor(math.log10(min(losses))), 10 ** math.ceil(math.log10(max(losses))))
            lo, hi = decades
            if "loss" not in lim:
                lo /= 10  # losses fall: room for one decade below the first ones
            lim["loss"] = (min(lo, lim.get("loss", (lo, hi))[0]), max(hi, lim.get("loss", (lo, hi))[1]))
        top = max([0] + [max(t["staleness"]) for t in traces if t["staleness"]])
        lim["stale_x"] = grow(lim.get("stale_x", 4.0), top + 1.0)
        if not self.active:
            # Nothing trains any more: one last redraw fits the axes to what was measured (a 2 s
            # run is not drawn on a 30 s axis, 120 updates not on 480).
            lim["tp_x"] = max(1.0, max(xs_tp) * 1.05)
            lim["tp_y"] = max(1.0, max(ys_tp) * 1.15)
            lim["loss_x"] = max(1.0, max(xs_loss) * 1.03)
            lim["stale_x"] = top + 1.0
            if decades is not None:
                lim["loss"] = decades
        return tuple(sorted(lim.items()))

    def _warmups(self) -> list[tuple[float, float]]:
        """Each run's warm-up, (start, end) in seconds since ``origin``."""
        out = []
        for tr in self.traces:
            h = tr.history
            if getattr(h, "warmup_ended_at", None) is not None:
                out.append((h.started_at - self.origin, h.warmup_ended_at - self.origin))
        return out

    def draw(self) -> bytes:
        """Render one frame (PNG) from the current data.

        Axes, ticks, labels and event marks are drawn only when they change
        (new limits, a new line, a new event) and kept as a background; a
        usual frame restores it and draws the lines alone, which is what
        keeps a refresh cheap on a busy machine.
        """
        with self._draw_lock:
            return self._draw()

    def _draw(self) -> bytes:
        import io

        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from PIL import Image

        t0 = time.perf_counter()
        now = time.time()
        self._sample_throughput(now)
        fig, _ = self._figure()
        ax = self._ax
        offset = self._offset()
        for i, (task, series) in enumerate(sorted(self._throughput.items())):
            self._line(("tp", task), ax["tp"], color=f"C{i}", label=task, lw=1.5).set_data(
                [x - offset for x in series.xs], series.ys
            )
        traces = [t.copy() for t in self.traces]
        for tr in traces:
            color = MODE_COLORS.get(tr["mode"])
            self._line(("loss", tr["name"]), ax["loss"], color=color, label=tr["name"], lw=1.0).set_data(
                *self._x_of(tr)
            )
            self._line(
                ("eval", tr["name"]), ax["eval"], color=color, label=tr["name"], lw=1.5, marker="o", ms=3
            ).set_data(*self._evals_of(tr))
            drops = [self._mark_x(tr, m) for m in tr["marks"] if m.kind == "dropped"]
            drops = [x for x in drops if x is not None]
            if drops:  # one artist for all of them: a long run has many
                self._line(
                    ("drop", tr["name"]),
                    ax["loss"],
                    ls="",
                    marker="|",
                    color="#7f7f7f",
                    transform=ax["loss"].get_xaxis_transform(),
                    label=f"{tr['name']}: dropped gradient",
                ).set_data(drops, [0.03] * len(drops))
        self._draw_staleness(traces)
        gantt_changed = self._draw_gantt()
        marks_changed = self._draw_marks(traces, offset)
        limits = self._limits(traces)
        canvas = FigureCanvasAgg(fig) if self._canvas is None else self._canvas
        self._canvas = canvas
        changed = {
            key for name, value in limits if self._lim.get(name) != value for key in _LIMIT_AXES.get(name, ax)
        }
        if marks_changed:
            changed |= {"tp", "loss", "eval"}
        if gantt_changed:
            changed.add("gantt")
        if self._background is None or changed:
            self._lim = dict(limits)
            ax["tp"].set_xlim(self._lim["tp_x0"], self._lim["tp_x"])
            ax["tp"].set_ylim(0, self._lim["tp_y"])
            for key in ("loss", "eval"):
                ax[key].set_xlim(0, self._lim["loss_x"])
                if "loss" in self._lim:
                    ax[key].set_ylim(*self._lim["loss"])
            ax["stale"].set_xlim(-0.5, self._lim["stale_x"])
            ax["gantt"].set_xlim(-self._lim.get("gantt_x", 1.0), 0)
            if self._background is None:
                canvas.draw()
                self.full_draws += 1
                renderer = canvas.get_renderer()  # every axes' area, for the partial redraws that follow
                self._regions = {key: a.get_tightbbox(renderer) for key, a in ax.items()}
            else:
                canvas.restore_region(self._background)
                self._redraw_axes(changed)  # keeps the redrawn axes' areas
            self._background = canvas.copy_from_bbox(fig.bbox)
            self.axes_draws += 1
        else:
            canvas.restore_region(self._background)
        for artist in self._lines.values():
            artist.axes.draw_artist(artist)
        image = Image.frombuffer("RGBA", canvas.get_width_height(), canvas.buffer_rgba(), "raw", "RGBA", 0, 1)
        buf = io.BytesIO()
        image.convert("RGB").save(buf, format="PNG", compress_level=1)
        png = buf.getvalue()
        self.last_png = png
        self.frames += 1
        self.last_draw_s = time.perf_counter() - t0
        return png

    def _redraw_axes(self, changed: set[str]) -> None:
        """Redraw only the axes whose limits, marks or rows changed, over the kept background.

        A full redraw is mostly tick and title text (147 ms here for the five
        axes, 23-40 ms each), so a change of the throughput axis alone costs
        one axes' worth.  Each redrawn axes' area (its ticks, labels, title
        and legend, before and after the change) is cleared first; an axes
        whose own area overlaps a cleared one is redrawn too, so nothing is
        drawn twice over itself or left half-erased.
        """
        import math

        from matplotlib.patches import Rectangle
        from matplotlib.transforms import Bbox

        renderer = self._canvas.get_renderer()
        regions = {}
        for key in changed:  # the area of an axes that did not change is the one kept from before
            now = self._ax[key].get_tightbbox(renderer)
            before = self._regions.get(key)
            regions[key] = Bbox.union([now, before]) if before is not None else now
            self._regions[key] = now
        grown = True
        while grown:  # neighbours whose drawn area a cleared region touches
            grown = False
            for key, area in self._regions.items():
                if key not in regions and any(area.overlaps(r) for r in regions.values()):
                    regions[key] = area
                    grown = True
        face = self._fig.get_facecolor()
        for area in regions.values():
            x0, y0 = math.floor(area.x0) - 2, math.floor(area.y0) - 2
            x1, y1 = math.ceil(area.x1) + 2, math.ceil(area.y1) + 2
            blank = Rectangle(
                (x0, y0), x1 - x0, y1 - y0, transform=None, facecolor=face, lw=0, antialiased=False
            )
            blank.set_figure(self._fig)
            self._fig.draw_artist(blank)
        for key, a in self._ax.items():  # in the figure's order, as a full draw would
            if key in regions:
                self._fig.draw_artist(a)

    def gantt(self) -> tuple[str | None, float, float, dict]:
        """The run the strip shows (the latest with steps), and its window: ``(run, t0, t1, rows)``."""
        for trace in reversed(self.traces):
            t0, t1, rows = trace.gantt.window(self.gantt_steps)
            if rows:
                return trace.name, t0, t1, rows
        return None, 0.0, 0.0, {}

    def _draw_gantt(self) -> bool:
        """Bars per worker of the last steps; True when the axes must be redrawn (new rows or span)."""
        import math

        from matplotlib.collections import PolyCollection

        ax = self._ax["gantt"]
        name, t0, t1, rows = self.gantt()
        tasks = sorted(rows)
        verts: dict[str, list] = {k: [] for k in SEGMENT_COLORS}
        for y, task in enumerate(tasks):
            for kind, a, b in rows[task]:
                x0, x1 = a - t1, b - t1
                verts[kind].append([(x0, y - 0.35), (x0, y + 0.35), (x1, y + 0.35), (x1, y - 0.35)])
        for kind, color in SEGMENT_COLORS.items():
            bars = self._artist(
                ("gantt", kind),
                lambda color=color: ax.add_collection(
                    PolyCollection([], facecolors=color, edgecolors="white", linewidths=0.6)
                ),
            )
            bars.set_verts(verts[kind])
        span = max(t1 - t0, 1e-3)
        nice = 2.0 ** math.ceil(math.log2(span))
        current = self._lim.get("gantt_x")
        if current is not None and current / 4 <= nice <= current:
            nice = current  # grows at once, shrinks only when 4x too wide: spans that wobble redraw nothing
        changed = False
        if (tasks, name) != self._gantt_rows:
            self._gantt_rows = (tasks, name)
            ax.set_yticks(range(len(tasks)), tasks)
            ax.set_ylim(len(tasks) - 0.5, -1.3)  # a band on top for the legend
            ax.set_title(
                (f"{name}: " if name else "")
                + f"each worker's last {self.gantt_steps} steps (busy, waiting for the others, dropped)",
                fontsize=9,
            )
            changed = True
        if self._lim.get("gantt_x") != nice:
            self._lim["gantt_x"] = nice
            changed = True
        return changed

    def _draw_staleness(self, traces: list[dict]) -> None:
        """Per async/SSP run: the share of applied gradients of each staleness, and the mean."""
        ax = self._ax["stale"]
        shown = [tr for tr in traces if tr["staleness"] is not None]
        for tr in shown:
            color = MODE_COLORS.get(tr["mode"])
            frac = tr["staleness"]
            xs = list(range(max(frac) + 1)) if frac else []
            self._line(
                ("stale", tr["name"]), ax, color=color, label=tr["name"], lw=1.5, drawstyle="steps-mid"
            ).set_data(xs, [frac.get(x, 0.0) for x in xs])
            mean = tr["mean_staleness"]
            self._line(("stale-mean", tr["name"]), ax, color=color, ls=":", lw=1.5).set_data(
                [mean, mean] if mean is not None else [], [0, 1] if mean is not None else []
            )
            # the mean's value is in the header: text drawn every frame cost as much as all the lines

    def _draw_marks(self, traces, offset: float = 0.0) -> bool:
        """Vertical lines for events and warm-up spans; redrawn only when they change."""
        ax = self._ax
        loss_marks = []
        for tr in traces:
            for m in tr["marks"]:
                x = self._mark_x(tr, m) if m.kind in MAJOR else None
                if x is not None:
                    loss_marks.append((x, m.kind))
        time_marks = [(m.t - offset, m.kind, m.label) for m in list(self.marks)]
        warm = [(a - offset, b - offset) for a, b in self._warmups()]
        # Labels are written upright beside their line; two events closer than this on the time
        # axis would be written over each other, so they share one label.
        gap = 0.035 * (self._lim.get("tp_x", 30.0) - self._lim.get("tp_x0", 0.0))
        key = (tuple(loss_marks), tuple(time_marks), tuple(warm), self.x, gap)
        if key == self._marks_drawn:
            return False
        for artist in self._mark_artists:
            artist.remove()
        self._mark_artists = []
        for x, kind in loss_marks:
            for a in (ax["loss"], ax["eval"]):
                self._mark_artists.append(a.axvline(x, color=MARK_COLORS.get(kind, "#7f7f7f"), ls="--", lw=1))
        for a, b in warm:  # shown apart: no throughput is counted there
            self._mark_artists.append(ax["tp"].axvspan(a, b, color="#bbbbbb", alpha=0.35, lw=0))
        labels = _grouped_labels(time_marks, gap)
        if warm and all(abs(t - sum(warm[0]) / 2) > gap for t, _ in labels):
            a, b = warm[0]
            self._mark_artists.append(
                ax["tp"].annotate(
                    "warm-up",
                    ((a + b) / 2, 0.5),
                    xycoords=("data", "axes fraction"),
                    rotation=90,
                    fontsize=7,
                    color="#555555",
                    ha="center",
                    va="center",
                )
            )
        for t, kind, _ in time_marks:
            c = MARK_COLORS.get(kind, "#7f7f7f")
            self._mark_artists.append(ax["tp"].axvline(t, color=c, ls="--", lw=1))
        for t, label in labels:
            self._mark_artists.append(
                ax["tp"].annotate(
                    label,
                    (t, 0.98),
                    xycoords=("data", "axes fraction"),
                    rotation=90,
                    fontsize=7,
                    color="#444444",
                    va="top",
                    ha="right",
                    annotation_clip=True,  # never written into the next panel
                )
            )
        self._marks_drawn = key
        return True

    def _stats(self, task, proc, now: float) -> dict:
        """A task's CPU every frame; its memory every ``memory_every`` seconds.

        Measured here: the table took 146 ms a frame when it read PSS for 3
        tasks each time (the kernel walks every mapping of a 0.7 GB process),
        seven times the drawing, and it slowed the training it watched.  Every
        5 s it was still 14-22 ms a frame on average (2.7 % of a core, most of
        the frames' CPU budget), so PSS is read every 15 s.
        """
        cached = self._memory.get(task)
        fresh = cached is None or now - cached[0] > self.memory_every or cached[1] != proc.task_pid
        stats = dict(self.cluster.launcher.stats(proc, memory=fresh) or {})
        if fresh:
            self._memory[task] = (now, proc.task_pid, {k: stats.get(k) for k in ("rss", "pss")})
        else:
            stats.update(cached[2])
        return stats

    def table_html(self) -> str:
        """The cluster table: state, pid, CPU, memory, slowness, what each task does."""
        rows = []
        now = time.time()
        if self.cluster is not None:
            defn = self.cluster.cluster_def
            for task, proc in list(self.cluster.procs.items()):
                alive = proc.alive
                # measured where the task runs (the task answers for remote launchers)
                stats = self._stats(task, proc, now) if alive else {}
                slow = self.cluster.slowness.get(task)
                rate = self.rates.rate(str(task), now)
                if not alive:
                    doing = "gone"
                elif task.job == "ps":
                    doing = "holding variables"
                elif rate > 0:
                    doing = f"training, {rate:.0f} steps/s"
                else:
                    doing = "idle"
                rows.append(
                    [
                        str(task),
                        "running" if alive else f"exited ({proc.exit_code})",
                        str(proc.task_pid or "-"),
                        "-" if stats.get("cpu_percent") is None else f"{stats['cpu_percent']:.0f}%",
                        human_bytes(stats.get("rss")) if stats.get("rss") else "-",
                        human_bytes(stats.get("pss")) if stats.get("pss") else "-",
                        f"x{slow:g}" if slow else "-",
                        doing,
                    ]
                )
            state = f"cluster {self.cluster.name}: {self.cluster.shape.describe()}" + (
                "" if defn else " (stopped)"
            )
        else:
            state = "no cluster"
        head = "".join(
            f"<th style='text-align:left;padding:0 8px'>{h}</th>"
            for h in ("task", "state", "pid", "CPU", "RSS", "PSS", "slowed", "doing")
        )
        body = "".join(
            "<tr>" + "".join(f"<td style='padding:0 8px'>{html.escape(c)}</td>" for c in r) + "</tr>"
            for r in rows
        )
        return (
            f"<div class='tfmagic-cluster'><b>{html.escape(state)}</b><table><tr>{head}</tr>{body}</table></div>"
            + self.traffic_html()
        )

    def header_html(self) -> str:
        parts = []
        for tr in self.traces:
            h = tr.history
            state = "done" if h.done else "training"
            if h.error:
                state = "stopped"
            extra = f", {tr.dropped} dropped" if tr.dropped else ""
            loss = f", loss {h.global_steps[-1].loss:.4f}" if h.global_steps else ""
            if tr.last_eval is not None:
                loss += f", held-out {tr.last_eval[1]:.4f}"
            mean = tr.stale.mean() if tr.mode in STALE_MODES else None
            if mean is not None:
                hint = f" (workers - 1 = {len(h.workers) - 1})" if len(h.workers) > 1 else ""
                loss += f", mean staleness {mean:.2f}{hint}"
            warm = getattr(h, "warmup_s", None)
            seen = f", {tr.examples:,} examples" if tr.examples else ""
            seen += f", warm-up {warm:.1f} s" if warm is not None else ""
            parts.append(f"<b>{html.escape(tr.name)}</b>: {state}, {tr.updates} updates{seen}{loss}{extra}")
        if not parts:
            parts.append("no training run yet")
        banner = self.banner()
        shown = (
            f"<div class='tfmagic-banner' style='background:#fde2e1;padding:2px 6px'>&#9888; {html.escape(banner)}</div>"
            if banner
            else ""
        )
        pace = self.pace_note()
        if pace:
            parts.append(f"<span style='color:#777'>{html.escape(pace)}</span>")
        return shown + "<div class='tfmagic-header'>" + " &nbsp;|&nbsp; ".join(parts) + "</div>"

    def pace_note(self) -> str:
        """Why frames come less often than ``refresh`` asked, when they do ('' otherwise)."""
        if self.frame_cpu_s is None or self.interval <= self.refresh * 1.05:
            return ""
        return (
            f"a frame every {self.interval:.1f} s, not {self.refresh:g} s: each holds the kernel"
            f" {self.frame_cpu_s * 1000:.0f} ms, and frames keep to {self.budget:.0%} of its time"
            " so they do not slow the training they show"
        )

    def banner(self) -> str:
        """The hang doctor's line while something has waited more than 2 s on this cluster, else ''.

        Free while nothing waits (one look at the wait registry); while
        something does, the doctor is asked at most once a second.
        """
        from . import doctor, waits

        if self.cluster is None or not self.cluster.running or not waits.current(doctor.THRESHOLD):
            self._diagnosis = (0.0, "")
            return ""
        when, said = self._diagnosis
        if time.monotonic() - when >= 1.0:
            try:
                said = doctor.why(self.cluster).banner
            except Exception:  # noqa: BLE001 - a banner that cannot be made is left out, not raised
                said = ""
            self._diagnosis = (time.monotonic(), said)
        return said

    def traffic_html(self) -> str:
        """Bytes per second and per worker step on every link, measured (empty when not measured)."""
        meter = self._meter or (getattr(self.cluster, "_meter", None) if self.cluster is not None else None)
        if meter is None:
            return ""
        now = time.time()
        steps_per_s = sum(
            self.rates.rate(str(t), now) for t in getattr(self.cluster, "procs", {}) if t.job == "worker"
        )
        rows = []
        for link in meter.links():
            if not link.bytes:
                continue
            per_step = human_bytes(link.rate / steps_per_s) if steps_per_s > 0 and link.rate > 0 else "-"
            rows.append(
                f"<tr><td style='padding:0 8px'>{html.escape(link.src)} &rarr; {html.escape(link.dst)}</td>"
                f"<td style='padding:0 8px;text-align:right'>{human_bytes(link.rate)}/s</td>"
                f"<td style='padding:0 8px;text-align:right'>{per_step}</td>"
                f"<td style='padding:0 8px;text-align:right'>{human_bytes(link.bytes)}</td></tr>"
            )
        if not rows:
            return ""
        head = "".join(
            f"<th style='text-align:left;padding:0 8px'>{h}</th>"
            for h in ("link (measured: TCP counters)", "now", "per worker step", "since start")
        )
        return f"<div class='tfmagic-traffic'><table><tr>{head}</tr>{''.join(rows)}</table></div>"

    def summary(self) -> str:
        lines = []
        for tr in self.traces:
            lines.append(tr.history.summary())
        return "\n".join(lines) or "no training run yet"

    # -- widgets and refresh -------------------------------------------------
    @property
    def widget(self):
        if self._widget is None:
            import ipywidgets as w

            self._image = w.Image(
                value=self.draw(), format="png", layout=w.Layout(width="100%", max_width="1100px")
            )
            self._header = w.HTML(self.header_html())
            self._table = w.HTML(self.table_html())
            self._selector = w.ToggleButtons(
                options=[(label, key) for key, label in X_AXES.items()],
                value=self.x,
                description="loss against",
                style={"button_width": "110px"},
            )
            self._selector.observe(self._on_select, names="value")
            self._widget = w.VBox([self._header, self._selector, self._image, self._table])
            self._widget.add_class("tfmagic-dashboard")
        return self._widget

    def _on_select(self, change) -> None:
        self.set_x(change["new"])
        if not self.refreshing:  # a finished dashboard redraws its last frame on the new axis
            self.update()

    def update(self) -> None:
        """Draw a new frame into the widgets (safe from a background thread)."""
        png = self.draw()
        if self._widget is not None:
            self._image.value = png
            self._header.value = self.header_html()
            self._table.value = self.table_html()

    def start(self) -> Dashboard:
        """Refresh every ``refresh`` seconds until nothing is training."""
        if self._thread is not None and self._thread.is_alive():
            return self
        self.widget  # noqa: B018 - build the widgets before the thread touches them
        if (
            self.traffic
            and getattr(self.cluster, "running", False)
            and hasattr(self.cluster, "traffic_meter")
            and getattr(self.cluster, "_meter", None) is None
        ):
            try:
                self._meter = self.cluster.traffic_meter()
            except Exception:  # noqa: BLE001 - no panel is better than no dashboard
                self._meter = None
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="tfmagic-dashboard", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        grace = 2  # frames drawn after the last run ended, so the final numbers show
        while not self._stop.is_set():
            t0 = time.monotonic()
            self._refresh_once()
            if not self.active:
                grace -= 1
                if grace <= 0:
                    break
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - t0)))
        if self._stop.is_set():  # stopped from outside (the cluster stopped): one last frame
            self._refresh_once()
        self._unsubscribe()
        if self._meter is not None:  # started by this dashboard: it measures no longer
            self._meter.stop()
        self._publish_final()

    def _refresh_once(self) -> None:
        """One frame, yielding the GIL promptly to the engine's threads, and the spacing of the next.

        Every millisecond a frame holds Python's lock is taken from the training it
        shows (the engine's threads need the lock between their remote calls), so
        frames are spaced to keep their CPU time to ``budget`` of the kernel's:
        ``refresh`` apart while frames are cheap, further when they cost more.
        """
        c0 = time.thread_time()
        try:
            with yielding():
                self.update()
        except Exception:  # noqa: BLE001 - a failed frame must not kill the refresh
            pass
        cost = time.thread_time() - c0
        mean = self.frame_cpu_s
        self.frame_cpu_s = cost if mean is None else 0.7 * mean + 0.3 * cost
        self.interval = max(self.refresh, self.frame_cpu_s / self.budget) if self.budget > 0 else self.refresh

    def _unsubscribe(self) -> None:
        subs, self._subscriptions = self._subscriptions, []
        for sub in subs:
            sub.close()

    def stop(self) -> None:
        """Stop refreshing (the last frame stays) and stop following the cluster and the runs."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(10)
        self._unsubscribe()
        if self._meter is not None:  # started by this dashboard: it measures no longer
            self._meter.stop()

    @property
    def refreshing(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> None:
        """Block until the refresh thread has drawn its last frame."""
        if self._thread is not None:
            self._thread.join(timeout)

    # -- display -------------------------------------------------------------
    def _repr_mimebundle_(self, include=None, exclude=None):
        try:
            bundle = self.widget._repr_mimebundle_(include=include, exclude=exclude)
        except Exception:  # noqa: BLE001 - no widget support: static picture
            bundle = {}
        if isinstance(bundle, tuple):
            bundle = bundle[0]
        bundle = dict(bundle or {})
        png = self.last_png or self.draw()
        import base64

        bundle["image/png"] = base64.b64encode(png).decode()
        bundle["text/plain"] = self.summary()
        if self._thread is None or self.active:  # a finished dashboard keeps its last frame
            self.start()
        return bundle

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(self.summary())

    def show(self) -> Dashboard:
        """Display in the notebook and refresh; the output is re-published with the
        last frame when the refresh ends (what a saved notebook then holds)."""
        from IPython.display import display

        self._display = display(self, display_id=True)
        return self

    @classmethod
    def latest(cls) -> Dashboard | None:
        """The dashboard made last in this process (``%tf_train`` and ``%tf_dashboard`` make one)."""
        return cls._latest() if cls._latest is not None else None

    @property
    def figure(self):
        """The matplotlib Figure the frames are drawn on (the latest frame; one is drawn if none was)."""
        if self._fig is None:
            self.draw()
        return self._fig

    def save(self, path: str | Path) -> Path:
        """Write the latest frame as a PNG (a static picture outside a notebook)."""
        path = Path(path)
        path.write_bytes(self.last_png or self.draw())
        return path

    def _publish_final(self) -> None:
        if self._display is None:
            return
        try:
            self._display.update(self)
        except Exception:  # noqa: BLE001 - the front end may be gone; the widget still holds the frame
            pass


def _grouped_labels(marks: list[tuple[float, str, str]], gap: float) -> list[tuple[float, str]]:
    """One label per group of events less than ``gap`` apart on the time axis, at the group's first.

    ``[(1.0, "kill", "worker:1 killed"), (1.2, "restart", "worker:1 restarted")]`` with a gap of 0.5
    gives ``[(1.0, "worker:1 killed; worker:1 restarted")]``.
    """
    groups: list[tuple[float, list[str]]] = []
    for t, _, label in sorted(marks, key=lambda m: m[0]):
        if groups and t - groups[-1][0] < gap:
            groups[-1][1].append(label)
        else:
            groups.append((t, [label]))
    return [(t, "; ".join(dict.fromkeys(names))) for t, names in groups]
