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

import threading
import time
import weakref
from collections import deque
from pathlib import Path

from ..dashdata import MAJOR, Mark, RollingRate, RunTrace, place_event
from ..errors import BadArgument
from ..events import Event
from ..gilshare import yielding
from ..metrics import Evaluation, GlobalStep, StepRecord
from ..plots import X_AXES
from . import panels
from .frame import Frame, each_run
from .panes import Panes

#: the share of the kernel's time a refreshing dashboard may take (measured: bench/dashboard.py)
BUDGET = 0.04
#: seconds between the frames drawn once nothing trains, and how often a wait looks for a run's end
GRACE_GAP = 0.25


def _histories(runs) -> list:
    """The histories behind TrainingRuns, Comparisons (all their runs), PxRuns and Histories."""
    return [getattr(r, "history", r) for r in each_run(runs)]


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
    The picture is a :class:`~.frame.Frame`; the HTML around it, :class:`~.panes.Panes`.
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
        #: each worker's steps/s over time (the throughput plot's lines)
        self.throughput: dict[str, object] = {}
        #: what is watched: TrainingRuns, Comparisons, PxRuns, Histories
        self.runs: list = []
        self.marks: deque[Mark] = deque(maxlen=100)  # cluster events: slow, kill, restart, lost
        #: the picture and the HTML around it
        self.frame = Frame(self)
        self.panes = Panes(self)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._widget = None
        self._display = None  # IPython DisplayHandle, when shown with show()
        Dashboard._latest = weakref.ref(self)
        #: measure bytes per link while refreshing (the traffic panel; see tfmagic.network.traffic)
        self.traffic = traffic
        #: the cluster's traffic meter, when this dashboard started it
        self.meter = None
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
            self.runs.append(run)

    @property
    def active(self) -> bool:
        """Something is still training (and the cluster runs)."""
        if self.cluster is not None and not self.cluster.running:
            return False
        for r in self.runs:
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
        with self.frame.lock:
            if x != self.x:
                self.x = x
                self.frame.set_x(X_AXES[x])

    def _sample_throughput(self, now: float) -> None:
        from ..dashdata import DownsampledSeries

        tasks = set(self.rates.keys())
        if self.cluster is not None and self.cluster.cluster_def is not None:
            tasks |= {str(t) for t in self.cluster.cluster_def.tasks() if t.job == "worker"}
        for task in sorted(tasks):
            series = self.throughput.setdefault(task, DownsampledSeries(self.max_points))
            series.append(now - self.origin, self.rates.rate(task, now))

    def draw(self) -> bytes:
        """Render one frame (PNG) from the current data.

        Axes, ticks, labels and event marks are drawn only when they change
        (new limits, a new line, a new event) and kept as a background; a
        usual frame restores it and draws the lines alone, which is what
        keeps a refresh cheap on a busy machine (see :mod:`.frame`).
        """
        with self.frame.lock:
            self._sample_throughput(time.time())
            return self.frame.draw()

    def gantt(self) -> tuple[str | None, float, float, dict]:
        """The run the strip shows (the latest with steps), and its window: ``(run, t0, t1, rows)``."""
        return panels.Gantt.window(self)

    # what the frame counts, read as the dashboard's (bench/dashboard.py, the tests)
    frames = property(lambda self: self.frame.frames, doc="frames drawn")
    full_draws = property(lambda self: self.frame.full_draws, doc="frames that drew the whole figure")
    axes_draws = property(lambda self: self.frame.axes_draws, doc="frames that redrew some axes")
    last_png = property(lambda self: self.frame.last_png, doc="the latest frame (PNG)")
    last_draw_s = property(lambda self: self.frame.last_draw_s, doc="how long the latest frame took")

    # -- the panes ---------------------------------------------------------------
    def table_html(self) -> str:
        """The cluster table: state, pid, CPU, memory, slowness, what each task does."""
        return self.panes.table_html()

    def header_html(self) -> str:
        """Each run's state, updates, examples, losses and staleness, the hang doctor's banner, the pace."""
        return self.panes.header_html()

    def banner(self) -> str:
        """The hang doctor's line while something has waited more than 2 s on this cluster, else ''."""
        return self.panes.banner()

    def traffic_html(self) -> str:
        """Bytes per second and per worker step on every link, measured (empty when not measured)."""
        return self.panes.traffic_html()

    def pace_note(self) -> str:
        """Why frames come less often than ``refresh`` asked, when they do ('' otherwise)."""
        if self.frame_cpu_s is None or self.interval <= self.refresh * 1.05:
            return ""
        return (
            f"a frame every {self.interval:.1f} s, not {self.refresh:g} s: each holds the kernel"
            f" {self.frame_cpu_s * 1000:.0f} ms, and frames keep to {self.budget:.0%} of its time"
            " so they do not slow the training they show"
        )

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
            and getattr(self.cluster, "meter", None) is None
        ):
            try:
                self.meter = self.cluster.traffic_meter()
            except Exception:  # noqa: BLE001 - no panel is better than no dashboard
                self.meter = None
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
                # nothing trains any more, so no budget to keep: the last frame follows at once
                self._stop.wait(GRACE_GAP)
                continue
            self._pause(self.interval - (time.monotonic() - t0))
        if self._stop.is_set():  # stopped from outside (the cluster stopped): one last frame
            self._refresh_once()
        self._unsubscribe()
        if self.meter is not None:  # started by this dashboard: it measures no longer
            self.meter.stop()
        self._publish_final()

    def _pause(self, seconds: float) -> None:
        """Wait for the next frame, or less: the end of the last run is drawn when it comes.

        Frames are spaced to keep to the budget (seconds apart when they are costly); a run that
        ends early in that gap would otherwise show its final numbers only after it.
        """
        deadline = time.monotonic() + seconds
        while not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0 or not self.active:
                return
            self._stop.wait(min(left, GRACE_GAP))

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
        if self.meter is not None:  # started by this dashboard: it measures no longer
            self.meter.stop()

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
        if self.frame.fig is None:
            self.draw()
        return self.frame.fig

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


__all__ = ["BUDGET", "Dashboard"]
