"""The dashboard's five plots, one class each: what each axes shows and how its artists are updated.

Each panel sets its axes up once (:meth:`setup`: title, labels, scales) and
updates its artists every frame through the :class:`~.frame.Frame`'s cache
of animated artists (``frame.line``, ``frame.artist``), so a usual frame
redraws lines alone.  A panel whose axes must be redrawn (new rows, a new
event) says so by returning True from ``draw``.  The data come from the
dashboard (``view``): its traces, events, throughput series and runs.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..dashdata import MAJOR, Mark
from ..plots import COLORS, SEGMENT_COLORS, SEGMENT_LABELS, X_AXES
from ..spec import TaskName

if TYPE_CHECKING:
    from .frame import Frame

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


def style(ax, title: str, xlabel: str, ylabel: str) -> None:
    """The look every panel shares: small text, a light grid, few ticks."""
    from matplotlib.ticker import MaxNLocator

    ax.set_title(title, fontsize=9)
    ax.set_xlabel(xlabel, fontsize=8, labelpad=1)
    ax.set_ylabel(ylabel, fontsize=8, labelpad=1)
    ax.grid(alpha=0.3)
    ax.tick_params(labelsize=8)
    ax.xaxis.set_major_locator(MaxNLocator(5))


def offset(view) -> float:
    """The throughput plot's time 0 (s since ``origin``): the end of the first run's warm-up."""
    anchors = [a for a in (t.anchor() for t in view.traces) if a is not None]
    return min(anchors) if anchors else 0.0


def warmups(view) -> list[tuple[float, float]]:
    """Each run's warm-up, (start, end) in seconds since ``origin``."""
    out = []
    for tr in view.traces:
        h = tr.history
        if getattr(h, "warmup_ended_at", None) is not None:
            out.append((h.started_at - view.origin, h.warmup_ended_at - view.origin))
    return out


#: more workers than this and the throughput plot summarises them (32 lines in ten colours read as none)
MANY = 8
#: the summary's lines: (key, label, colour, width)
SUMMARY = (
    ("fastest", "fastest worker", "#2ca02c", 1.0),
    ("median", "median worker", "#1f77b4", 1.8),
    ("slowest", "slowest worker", "#d62728", 1.0),
)


def spread(series: list, at: float):
    """Per instant, the slowest, median and fastest of the workers' rates: ``(xs, lo, mid, hi)``.

    Each worker's series is read on the longest one's instants (a worker added later has none
    before it began: it counts from there).

    >>> from tfmagic.dashdata import DownsampledSeries
    >>> a, b = DownsampledSeries(), DownsampledSeries()
    >>> for t in range(4):
    ...     a.append(t, 2.0)
    ...     if t >= 2:
    ...         b.append(t, 4.0)
    >>> xs, lo, mid, hi = spread([a, b], at=0.0)
    >>> list(xs), list(lo), list(hi)
    ([0.0, 1.0, 2.0, 3.0], [2.0, 2.0, 2.0, 2.0], [2.0, 2.0, 4.0, 4.0])
    """
    import warnings

    import numpy as np

    grid = np.asarray(max(series, key=len).xs, dtype=float)
    rows = np.array(
        [
            np.interp(grid, s.xs, s.ys, left=np.nan, right=np.nan)
            if len(s.xs)
            else np.full(len(grid), np.nan)
            for s in series
        ]
    )
    with warnings.catch_warnings():  # an instant no worker had reached yet
        warnings.simplefilter("ignore", RuntimeWarning)
        return grid - at, np.nanmin(rows, 0), np.nanmedian(rows, 0), np.nanmax(rows, 0)


class Throughput:
    """Each worker's steps per second over the last ``window`` seconds (warm-up shaded apart).

    Up to :data:`MANY` workers a line each; more, and the plot shows the fastest, the median and
    the slowest worker at each instant, the band between them, and which worker is slowest now.
    """

    key = "tp"

    def setup(self, ax, view) -> None:
        from matplotlib.ticker import MaxNLocator

        style(
            ax, f"worker steps/s (last {view.window:g} s, warm-up apart)", "seconds after warm-up", "steps/s"
        )
        ax.yaxis.set_major_locator(MaxNLocator(5))

    def draw(self, frame: Frame, view, at: float) -> None:
        items = sorted(view.throughput.items())
        many = len(items) > MANY
        # the summary's lines are ("tp", key) as the workers' are (the axis limits read them); its band
        # and text are ("tp+", key)
        summary = {key for key, *_ in SUMMARY}
        stale = [
            k
            for k in frame.lines
            if (k[0] == "tp" and (k[1] in summary) != many) or (k[0] == "tp+" and not many)
        ]
        for key in stale:  # the cluster grew past MANY workers, or shrank back
            frame.lines.pop(key).remove()
            frame.background = None
        if not many:
            for i, (task, series) in enumerate(items):
                frame.line(("tp", task), frame.ax["tp"], color=f"C{i}", label=task, lw=1.5).set_data(
                    [x - at for x in series.xs], series.ys
                )
            return
        self.draw_many(frame, items, at)

    @staticmethod
    def draw_many(frame: Frame, items: list, at: float) -> None:
        from matplotlib.patches import Polygon

        ax = frame.ax["tp"]
        xs, lo, mid, hi = spread([s for _, s in items], at)
        for (key, label, color, width), ys in zip(SUMMARY, (hi, mid, lo), strict=True):
            frame.line(("tp", key), ax, color=color, label=label, lw=width).set_data(xs, ys)
        band = frame.artist(
            ("tp+", "band"),
            lambda: ax.add_patch(Polygon([[0, 0]], closed=True, color="#1f77b4", alpha=0.15, lw=0)),
        )
        keep = [i for i in range(len(xs)) if lo[i] == lo[i]]  # not NaN
        band.set_xy([(xs[i], hi[i]) for i in keep] + [(xs[i], lo[i]) for i in reversed(keep)] or [(0.0, 0.0)])
        who = frame.artist(
            ("tp+", "who"),
            lambda: ax.text(0.99, 0.97, "", transform=ax.transAxes, ha="right", va="top", fontsize=7),
        )
        latest = [(s.ys[-1], task) for task, s in items if len(s.ys)]
        if latest:
            rate, task = min(latest)
            who.set_text(f"{len(items)} workers; slowest now: {task} ({rate:.2g} steps/s)")


class Losses:
    """The training loss of every update and the held-out loss, against updates, examples or seconds."""

    keys = ("loss", "eval")

    def setup(self, ax: dict, view) -> None:
        from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter, NullLocator

        smooth = next((t.smooth for t in view.traces if t.smooth), view.smooth)
        title = (
            f"training loss, moving mean of {smooth} updates" if smooth else "training loss per update (raw)"
        )
        style(ax["loss"], title, X_AXES[view.x], "training loss (log)")
        style(ax["eval"], "held-out loss (same examples, every mode)", X_AXES[view.x], "held-out loss (log)")
        for a in (ax["loss"], ax["eval"]):
            a.set_yscale("log")
            # Tick text is most of a frame's cost: few ticks, plain numbers
            # (the default log labels go through mathtext), no minor ticks.
            a.yaxis.set_major_locator(LogLocator(numticks=4))
            a.yaxis.set_major_formatter(FormatStrFormatter("%g"))
            a.yaxis.set_minor_locator(NullLocator())
            a.yaxis.set_minor_formatter(NullFormatter())

    @staticmethod
    def x_of(x: str, tr: dict) -> tuple[list, list]:
        """A run's training-loss curve against ``x`` (seconds: from the end of its warm-up)."""
        if x == "updates":
            return tr["step"]
        if x == "examples":
            return tr["examples"]
        anchor = tr["anchor"] or 0.0
        pts = [(t - anchor, y) for t, y in zip(*tr["time"]) if t >= anchor]
        return [p[0] for p in pts], [p[1] for p in pts]

    @staticmethod
    def evals_of(x: str, tr: dict) -> tuple[list, list]:
        """A run's held-out probes against ``x``."""
        evals = tr["evals"]
        if x == "seconds":
            anchor = tr["anchor"] or 0.0
            evals = [e for e in evals if e[2] >= anchor]
            return [e[2] - anchor for e in evals], [e[3] for e in evals]
        col = 0 if x == "updates" else 1
        return [e[col] for e in evals], [e[3] for e in evals]

    @staticmethod
    def mark_x(x: str, tr: dict, m: Mark) -> float | None:
        if x == "updates":
            return m.step
        if x == "examples":
            return m.examples
        return m.t - (tr["anchor"] or 0.0)

    def draw(self, frame: Frame, view, traces: list[dict]) -> None:
        ax = frame.ax
        for tr in traces:
            color = MODE_COLORS.get(tr["mode"])
            frame.line(("loss", tr["name"]), ax["loss"], color=color, label=tr["name"], lw=1.0).set_data(
                *self.x_of(view.x, tr)
            )
            frame.line(
                ("eval", tr["name"]), ax["eval"], color=color, label=tr["name"], lw=1.5, marker="o", ms=3
            ).set_data(*self.evals_of(view.x, tr))
            drops = [self.mark_x(view.x, tr, m) for m in tr["marks"] if m.kind == "dropped"]
            drops = [x for x in drops if x is not None]
            if drops:  # one artist for all of them: a long run has many
                frame.line(
                    ("drop", tr["name"]),
                    ax["loss"],
                    ls="",
                    marker="|",
                    color="#7f7f7f",
                    transform=ax["loss"].get_xaxis_transform(),
                    label=f"{tr['name']}: dropped gradient",
                ).set_data(drops, [0.03] * len(drops))


class Gantt:
    """Each worker's last steps: busy, waiting at sync's barrier, dropped (the picture of a straggler)."""

    key = "gantt"

    def __init__(self) -> None:
        self.rows: tuple = ()

    def setup(self, ax, view) -> None:
        from matplotlib.patches import Patch

        style(
            ax,
            f"each worker's last {view.gantt_steps} steps: busy, waiting for the others, dropped",
            "seconds before the latest step",
            "task",
        )
        ax.grid(False)
        ax.legend(
            handles=[Patch(color=SEGMENT_COLORS[k], label=SEGMENT_LABELS[k]) for k in SEGMENT_LABELS],
            fontsize=7,
            loc="upper left",
            ncol=4,
            bbox_to_anchor=(0.0, 1.0),
            framealpha=0.8,
        )

    @staticmethod
    def window(view) -> tuple[str | None, float, float, dict]:
        """The run the strip shows (the latest with steps), and its window: ``(run, t0, t1, rows)``."""
        for trace in reversed(view.traces):
            t0, t1, rows = trace.gantt.window(view.gantt_steps)
            if rows:
                return trace.name, t0, t1, rows
        return None, 0.0, 0.0, {}

    def draw(self, frame: Frame, view) -> bool:
        """Bars per worker of the last steps; True when the axes must be redrawn (new rows or span)."""
        from matplotlib.collections import PolyCollection

        ax = frame.ax["gantt"]
        name, t0, t1, rows = self.window(view)
        tasks = sorted(rows, key=TaskName.parse)  # the cluster's order: worker:2 before worker:10
        verts: dict[str, list] = {k: [] for k in SEGMENT_COLORS}
        for y, task in enumerate(tasks):
            for kind, a, b in rows[task]:
                x0, x1 = a - t1, b - t1
                verts[kind].append([(x0, y - 0.35), (x0, y + 0.35), (x1, y + 0.35), (x1, y - 0.35)])
        for kind, color in SEGMENT_COLORS.items():
            bars = frame.artist(
                ("gantt", kind),
                lambda color=color: ax.add_collection(
                    PolyCollection([], facecolors=color, edgecolors="white", linewidths=0.6)
                ),
            )
            bars.set_verts(verts[kind])
        span = max(t1 - t0, 1e-3)
        nice = 2.0 ** math.ceil(math.log2(span))
        current = frame.lim.get("gantt_x")
        if current is not None and current / 4 <= nice <= current:
            nice = current  # grows at once, shrinks only when 4x too wide: spans that wobble redraw nothing
        changed = False
        if (tasks, name) != self.rows:
            self.rows = (tasks, name)
            # every row drawn, at most MANY named (32 names in the strip's height would overlap)
            every = max(1, math.ceil(len(tasks) / MANY))
            named = [i for i in range(len(tasks)) if i % every == 0 or i == len(tasks) - 1]
            if len(named) > 1 and named[-1] - named[-2] < every:
                named.pop(-2)  # the last row is named; the one just before it then would crowd it
            if len(tasks) > MANY and all(t.startswith("worker:") for t in tasks):
                # "worker:17" nine times over is wider than the strip's margin: the numbers, and the job once
                ax.set_yticks(named, [tasks[i].partition(":")[2] for i in named])
                ax.set_ylabel("worker", fontsize=8, labelpad=1)
            else:
                ax.set_yticks(named, [tasks[i] for i in named])
                ax.set_ylabel("task", fontsize=8, labelpad=1)
            # a band on top for the legend, about a sixth of the strip (the bars are drawn over it)
            ax.set_ylim(len(tasks) - 0.5, -0.5 - max(0.8, 0.2 * len(tasks)))
            ax.set_title(
                (f"{name}: " if name else "")
                + f"each worker's last {view.gantt_steps} steps (busy, waiting for the others, dropped)",
                fontsize=9,
            )
            changed = True
        if frame.lim.get("gantt_x") != nice:
            frame.lim["gantt_x"] = nice
            changed = True
        return changed


class Staleness:
    """For async and SSP runs: the share of applied gradients of each staleness, and the mean."""

    key = "stale"

    def setup(self, ax, view) -> None:
        from matplotlib.ticker import MaxNLocator

        style(
            ax, "staleness (dotted: the mean)", "updates by others between read and apply", "share of steps"
        )
        ax.set_ylim(0, 1.05)
        ax.yaxis.set_major_locator(MaxNLocator(3))

    def draw(self, frame: Frame, traces: list[dict]) -> None:
        ax = frame.ax["stale"]
        for tr in (tr for tr in traces if tr["staleness"] is not None):
            color = MODE_COLORS.get(tr["mode"])
            frac = tr["staleness"]
            xs = list(range(max(frac) + 1)) if frac else []
            frame.line(
                ("stale", tr["name"]), ax, color=color, label=tr["name"], lw=1.5, drawstyle="steps-mid"
            ).set_data(xs, [frac.get(x, 0.0) for x in xs])
            mean = tr["mean_staleness"]
            frame.line(("stale-mean", tr["name"]), ax, color=color, ls=":", lw=1.5).set_data(
                [mean, mean] if mean is not None else [], [0, 1] if mean is not None else []
            )
            # the mean's value is in the header: text drawn every frame cost as much as all the lines


class Events:
    """Vertical lines for the cluster's and the runs' events, and the warm-up spans; redrawn only when they change."""

    def __init__(self) -> None:
        self.artists: list = []
        self.drawn: tuple = ()

    def draw(self, frame: Frame, view, traces: list[dict], at: float = 0.0) -> bool:
        ax = frame.ax
        loss_marks = []
        for tr in traces:
            for m in tr["marks"]:
                x = Losses.mark_x(view.x, tr, m) if m.kind in MAJOR else None
                if x is not None:
                    loss_marks.append((x, m.kind))
        time_marks = [(m.t - at, m.kind, m.label) for m in list(view.marks)]
        warm = [(a - at, b - at) for a, b in warmups(view)]
        # Labels are written upright beside their line; two events closer than this on the time
        # axis would be written over each other, so they share one label.
        gap = 0.035 * (frame.lim.get("tp_x", 30.0) - frame.lim.get("tp_x0", 0.0))
        key = (tuple(loss_marks), tuple(time_marks), tuple(warm), view.x, gap)
        if key == self.drawn:
            return False
        for artist in self.artists:
            artist.remove()
        self.artists = []
        for x, kind in loss_marks:
            for a in (ax["loss"], ax["eval"]):
                self.artists.append(a.axvline(x, color=MARK_COLORS.get(kind, "#7f7f7f"), ls="--", lw=1))
        for a, b in warm:  # shown apart: no throughput is counted there
            self.artists.append(ax["tp"].axvspan(a, b, color="#bbbbbb", alpha=0.35, lw=0))
        labels = grouped_labels(time_marks, gap)
        if warm and all(abs(t - sum(warm[0]) / 2) > gap for t, _ in labels):
            a, b = warm[0]
            self.artists.append(
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
            self.artists.append(ax["tp"].axvline(t, color=MARK_COLORS.get(kind, "#7f7f7f"), ls="--", lw=1))
        for t, label in labels:
            self.artists.append(
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
        self.drawn = key
        return True


def grouped_labels(marks: list[tuple[float, str, str]], gap: float) -> list[tuple[float, str]]:
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
