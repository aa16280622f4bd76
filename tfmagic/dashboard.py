"""A live dashboard in the notebook: per-worker throughput, convergence, the cluster.

Built from ipywidgets (an ``Image`` holding a matplotlib drawing, and two
``HTML`` panes), refreshed from a background thread at ``refresh`` seconds
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

from .dashdata import MAJOR, Mark, RollingRate, RunTrace, place_event
from .events import Event
from .metrics import GlobalStep, StepRecord
from .procstats import human_bytes

MODE_COLORS = {"sync": "#1f77b4", "async": "#d62728"}
MARK_COLORS = {
    "slow": "#ff7f0e",
    "kill": "#d62728",
    "lost": "#d62728",
    "restart": "#2ca02c",
    "rejoin": "#2ca02c",
    "resume": "#9467bd",
    "error": "#000000",
}


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
    """

    _latest: weakref.ref | None = None

    def __init__(
        self, cluster=None, runs=(), refresh: float = 0.5, window: float = 3.0, max_points: int = 400
    ) -> None:
        self.cluster = cluster
        self.refresh = refresh
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
        self.full_draws = 0
        self.last_png: bytes | None = None
        self.last_draw_s: float | None = None
        self._fig = None
        self._widget = None
        self._display = None  # IPython DisplayHandle, when shown with show()
        Dashboard._latest = weakref.ref(self)
        self.marks: deque[Mark] = deque(maxlen=100)  # cluster events: slow, kill, restart, lost
        self.memory_every = 5.0  # seconds between memory (PSS) reads of each task
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
            trace = RunTrace(history, self.origin, self.max_points)
            for g in list(history.global_steps):
                trace.on_global(g)
            for e in list(history.events):
                trace.on_event(e)

            def follow(item, trace=trace):
                if isinstance(item, StepRecord):
                    self.rates.add(item.task, item.end)
                elif isinstance(item, GlobalStep):
                    trace.on_global(item)
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
            fig = Figure(figsize=(11, 3.2), dpi=72)
            axes = fig.subplots(1, 3)
            fig.subplots_adjust(left=0.05, right=0.99, bottom=0.16, top=0.9, wspace=0.22)
            titles = (
                (f"worker throughput (steps/s, last {self.window:g} s)", "seconds"),
                ("loss per update", "global step"),
                ("loss over time", "seconds"),
            )
            for ax, (title, xlabel) in zip(axes, titles):
                ax.set_title(title, fontsize=10)
                ax.set_xlabel(xlabel)
                ax.grid(alpha=0.3)
                ax.tick_params(labelsize=8)
                ax.xaxis.set_major_locator(MaxNLocator(5))
            axes[0].yaxis.set_major_locator(MaxNLocator(5))
            for ax in axes[1:]:
                ax.set_yscale("log")
                # Tick text is most of a frame's cost: few ticks, plain numbers
                # (the default log labels go through mathtext), no minor ticks.
                ax.yaxis.set_major_locator(LogLocator(numticks=4))
                ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
                ax.yaxis.set_minor_locator(NullLocator())
                ax.yaxis.set_minor_formatter(NullFormatter())
            self._fig, self._axes = fig, axes
            self._canvas = None
            self._background = None
            self._lim: dict = {}
            self._lines: dict[tuple, object] = {}
            self._mark_artists: list = []
            self._marks_drawn: tuple = ()
        return self._fig, self._axes

    def _line(self, key: tuple, ax, **style):
        line = self._lines.get(key)
        if line is None:
            (line,) = ax.plot([], [], animated=True, **style)
            self._lines[key] = line
            self._background = None  # the legend changes: redraw everything once
            ax.legend(fontsize=8, loc="upper right" if ax is not self._axes[0] else "lower left")
        return line

    def _limits(self) -> tuple:
        """Axis limits that change rarely (grown in steps), so most frames only redraw lines."""
        import math

        def grow(current, needed, factor=2.0, floor=1.0):
            # doubling: a long run redraws its axes a handful of times, not every few seconds
            return current if current >= needed else max(floor, needed * factor)

        lim = dict(self._lim)
        xs_tp, ys_tp, xs_step, xs_time, losses = [0.0], [0.0], [0.0], [0.0], []
        for key, line in self._lines.items():
            x, y = line.get_data()
            if not len(x):
                continue
            if key[0] == "tp":
                xs_tp.append(max(x))
                ys_tp.append(max(y))
            elif key[0] == "step":
                xs_step.append(max(x))
                losses.extend(v for v in y if v > 0)
            elif key[0] == "time":
                xs_time.append(max(x))
        # Every change of limits redraws the axes (60-140 ms here, against 9 ms for a usual
        # frame, and it holds the Python lock the training threads need), so limits grow in
        # few, large steps: measured, a 3,000-step run redrew 8 times when they doubled.
        lim["tp_x"] = grow(lim.get("tp_x", 30.0), max(xs_tp + xs_time))
        lim["tp_y"] = grow(lim.get("tp_y", 50.0), max(ys_tp), 2.0)
        runs = _each_run(self._runs)
        # planned updates: a TrainingRun knows them (a History's `steps` is only how many so far)
        planned = max(
            [r.steps for r in runs if hasattr(r, "history") and isinstance(getattr(r, "steps", None), int)]
            + [0]
        )
        # A quarter of the planned steps first (a 20,000-step run is not a sliver at the left
        # edge for long), then fourfold up to the planned steps: one redraw in a run.
        first = float(min(planned, max(100, planned / 4))) if planned else 100.0
        step_x = grow(lim.get("step_x", first), max(xs_step), 4.0)
        lim["step_x"] = min(step_x, float(planned)) if planned >= max(xs_step) else step_x
        if losses:
            lo = 10 ** math.floor(math.log10(min(losses)))
            hi = 10 ** math.ceil(math.log10(max(losses)))
            if "loss" not in lim:
                lo /= 10  # losses fall: room for one decade below the first ones
            lim["loss"] = (min(lo, lim.get("loss", (lo, hi))[0]), max(hi, lim.get("loss", (lo, hi))[1]))
        return tuple(sorted(lim.items()))

    def draw(self) -> bytes:
        """Render one frame (PNG) from the current data.

        Axes, ticks, labels and event marks are drawn only when they change
        (new limits, a new line, a new event) and kept as a background; a
        usual frame restores it and draws the lines alone, which is what
        keeps a refresh cheap on a busy machine.
        """
        import io

        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from PIL import Image

        t0 = time.perf_counter()
        now = time.time()
        self._sample_throughput(now)
        fig, (ax_tp, ax_step, ax_time) = self._figure()
        for i, (task, series) in enumerate(sorted(self._throughput.items())):
            self._line(("tp", task), ax_tp, color=f"C{i}", label=task, lw=1.5).set_data(series.xs, series.ys)
        traces = [t.copy() for t in self.traces]
        for tr in traces:
            color = MODE_COLORS.get(tr["mode"])
            self._line(("step", tr["name"]), ax_step, color=color, label=tr["name"], lw=1.5).set_data(
                *tr["step"]
            )
            self._line(("time", tr["name"]), ax_time, color=color, label=tr["name"], lw=1.5).set_data(
                *tr["time"]
            )
            drops = [m.step for m in tr["marks"] if m.kind == "dropped" and m.step is not None]
            if drops:  # one artist for all of them: a long run has many
                self._line(
                    ("drop", tr["name"]),
                    ax_step,
                    ls="",
                    marker="|",
                    color="#7f7f7f",
                    transform=ax_step.get_xaxis_transform(),
                    label=f"{tr['name']}: dropped gradient",
                ).set_data(drops, [0.03] * len(drops))
        marks_changed = self._draw_marks(traces)
        limits = self._limits()
        canvas = FigureCanvasAgg(fig) if self._canvas is None else self._canvas
        self._canvas = canvas
        if self._background is None or marks_changed or limits != tuple(sorted(self._lim.items())):
            self._lim = dict(limits)
            ax_tp.set_xlim(0, self._lim["tp_x"])
            ax_time.set_xlim(0, self._lim["tp_x"])
            ax_tp.set_ylim(0, self._lim["tp_y"])
            ax_step.set_xlim(0, self._lim["step_x"])
            if "loss" in self._lim:
                ax_step.set_ylim(*self._lim["loss"])
                ax_time.set_ylim(*self._lim["loss"])
            canvas.draw()
            self._background = canvas.copy_from_bbox(fig.bbox)
            self.full_draws += 1
        else:
            canvas.restore_region(self._background)
        for line in self._lines.values():
            line.axes.draw_artist(line)
        image = Image.frombuffer("RGBA", canvas.get_width_height(), canvas.buffer_rgba(), "raw", "RGBA", 0, 1)
        buf = io.BytesIO()
        image.convert("RGB").save(buf, format="PNG", compress_level=1)
        png = buf.getvalue()
        self.last_png = png
        self.frames += 1
        self.last_draw_s = time.perf_counter() - t0
        return png

    def _draw_marks(self, traces) -> bool:
        """Vertical lines for events; redrawn only when the set of events changes."""
        (ax_tp, ax_step, ax_time) = self._axes
        step_marks = [
            (m.step, m.kind) for tr in traces for m in tr["marks"] if m.kind in MAJOR and m.step is not None
        ]
        time_marks = [(m.t, m.kind, m.label) for m in list(self.marks)]
        key = (tuple(step_marks), tuple(time_marks))
        if key == self._marks_drawn:
            return False
        for artist in self._mark_artists:
            artist.remove()
        self._mark_artists = []
        for step, kind in step_marks:
            self._mark_artists.append(
                ax_step.axvline(step, color=MARK_COLORS.get(kind, "#7f7f7f"), ls="--", lw=1)
            )
        for t, kind, label in time_marks:
            c = MARK_COLORS.get(kind, "#7f7f7f")
            for ax in (ax_tp, ax_time):
                self._mark_artists.append(ax.axvline(t, color=c, ls="--", lw=1))
            self._mark_artists.append(
                ax_tp.annotate(
                    label,
                    (t, 0.98),
                    xycoords=("data", "axes fraction"),
                    rotation=90,
                    fontsize=7,
                    color=c,
                    va="top",
                    ha="right",
                )
            )
        self._marks_drawn = key
        return True

    def _stats(self, task, proc, now: float) -> dict:
        """A task's CPU every frame; its memory every ``memory_every`` seconds.

        Measured here: the table took 146 ms a frame when it read PSS for 3
        tasks each time (the kernel walks every mapping of a 0.7 GB process),
        seven times the drawing, and it slowed the training it watched.
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
        return f"<div class='tfmagic-cluster'><b>{html.escape(state)}</b><table><tr>{head}</tr>{body}</table></div>"

    def header_html(self) -> str:
        parts = []
        for tr in self.traces:
            h = tr.history
            state = "done" if h.done else "training"
            if h.error:
                state = "stopped"
            extra = f", {tr.dropped} dropped" if tr.dropped else ""
            loss = f", loss {h.global_steps[-1].loss:.4f}" if h.global_steps else ""
            parts.append(f"<b>{html.escape(tr.name)}</b>: {state}, {tr.updates} updates{loss}{extra}")
        if not parts:
            parts.append("no training run yet")
        return "<div class='tfmagic-header'>" + " &nbsp;|&nbsp; ".join(parts) + "</div>"

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
            self._widget = w.VBox([self._header, self._image, self._table])
            self._widget.add_class("tfmagic-dashboard")
        return self._widget

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
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="tfmagic-dashboard", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        grace = 2  # frames drawn after the last run ended, so the final numbers show
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                self.update()
            except Exception:  # noqa: BLE001 - a failed frame must not kill the refresh
                pass
            if not self.active:
                grace -= 1
                if grace <= 0:
                    break
            self._stop.wait(max(0.0, self.refresh - (time.monotonic() - t0)))
        if self._stop.is_set():  # stopped from outside (the cluster stopped): one last frame
            try:
                self.update()
            except Exception:  # noqa: BLE001 - the last frame is a courtesy
                pass
        self._unsubscribe()
        self._publish_final()

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
