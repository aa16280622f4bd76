"""The dashboard's picture: one matplotlib figure, made once and redrawn in part.

A frame restores the background kept from the last time the axes changed and
draws the lines alone (9 ms here against 60-140 ms for axes with their tick
text).  Axis limits grow in few, large steps (:meth:`Frame.limits`), so a long
run redraws its axes a handful of times; a change redraws only the axes it
touches (:meth:`Frame.redraw_axes`).  What each axes shows is its panel's
business (:mod:`.panels`).
"""

from __future__ import annotations

import math
import threading
import time

from . import panels

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


def each_run(runs) -> list:
    """TrainingRuns, PxRuns and Histories as given; a Comparison as its runs."""
    return [r for run in runs for r in (getattr(run, "runs", None) or [run])]


class Frame:
    """The figure of one dashboard (``view``: its traces, events, throughput series and runs)."""

    def __init__(self, view) -> None:
        self.view = view
        #: the refresh thread and the x selector both draw
        self.lock = threading.RLock()
        self.throughput = panels.Throughput()
        self.losses = panels.Losses()
        self.gantt = panels.Gantt()
        self.staleness = panels.Staleness()
        self.events = panels.Events()
        self.fig = None
        self.ax: dict = {}
        self.axes: tuple = ()
        self.canvas = None
        #: the figure as last drawn with its axes (restored by every frame; None: draw it whole)
        self.background = None
        self.regions: dict = {}
        self.lim: dict = {}
        #: the animated artists by key (``("loss", run)``, ``("gantt", kind)``), drawn every frame
        self.lines: dict = {}
        self.frames = 0
        self.full_draws = 0  # the whole figure drawn (the first frame, a new line or legend)
        # frames that redrew some axes (new limits, marks, rows); the rest draw lines only
        self.axes_draws = 0
        self.last_png: bytes | None = None
        self.last_draw_s: float | None = None

    def figure(self):
        """The figure and its axes, made once; frames only update their data."""
        from matplotlib.figure import Figure

        if self.fig is None:
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
            self.throughput.setup(ax["tp"], self.view)
            self.losses.setup(ax, self.view)
            self.gantt.setup(ax["gantt"], self.view)
            self.staleness.setup(ax["stale"], self.view)
            self.fig, self.ax = fig, ax
            self.axes = tuple(ax.values())
            self.canvas = None
            self.background = None
            self.regions = {}
            self.lim = {}
            self.lines = {}
        return self.fig, self.axes

    def set_x(self, label: str) -> None:
        """The loss curves' x changed: their limits and the background go, their labels change."""
        self.lim.pop("loss_x", None)
        self.background = None
        if self.fig is not None:
            for ax in (self.ax["loss"], self.ax["eval"]):
                ax.set_xlabel(label)

    def line(self, key: tuple, ax, **style):
        """An animated line, made once (a new one redraws the figure: its legend changes)."""
        line = self.lines.get(key)
        if line is None:
            (line,) = ax.plot([], [], animated=True, **style)
            self.lines[key] = line
            self.background = None  # the legend changes: redraw everything once
            if style.get("label") and not style["label"].startswith("_"):
                ax.legend(fontsize=7, loc="upper right" if ax is not self.ax["tp"] else "lower left")
        return line

    def artist(self, key: tuple, make):
        """An animated artist other than a line (bars, text), made once."""
        artist = self.lines.get(key)
        if artist is None:
            artist = self.lines[key] = make()
            artist.set_animated(True)
            self.background = None
        return artist

    def draw(self) -> bytes:
        """Render one frame (PNG) from the view's data; see the module's docstring."""
        import io

        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from PIL import Image

        t0 = time.perf_counter()
        view = self.view
        fig, _ = self.figure()
        ax = self.ax
        at = panels.offset(view)
        self.throughput.draw(self, view, at)
        traces = [t.copy() for t in view.traces]
        self.losses.draw(self, view, traces)
        self.staleness.draw(self, traces)
        gantt_changed = self.gantt.draw(self, view)
        marks_changed = self.events.draw(self, view, traces, at)
        limits = self.limits(traces, at)
        canvas = FigureCanvasAgg(fig) if self.canvas is None else self.canvas
        self.canvas = canvas
        changed = {
            key for name, value in limits if self.lim.get(name) != value for key in _LIMIT_AXES.get(name, ax)
        }
        if marks_changed:
            changed |= {"tp", "loss", "eval"}
        if gantt_changed:
            changed.add("gantt")
        if self.background is None or changed:
            self.lim = dict(limits)
            ax["tp"].set_xlim(self.lim["tp_x0"], self.lim["tp_x"])
            ax["tp"].set_ylim(0, self.lim["tp_y"])
            for key in ("loss", "eval"):
                ax[key].set_xlim(0, self.lim["loss_x"])
                if "loss" in self.lim:
                    ax[key].set_ylim(*self.lim["loss"])
            ax["stale"].set_xlim(-0.5, self.lim["stale_x"])
            ax["gantt"].set_xlim(-self.lim.get("gantt_x", 1.0), 0)
            if self.background is None:
                canvas.draw()
                self.full_draws += 1
                renderer = canvas.get_renderer()  # every axes' area, for the partial redraws that follow
                self.regions = {key: a.get_tightbbox(renderer) for key, a in ax.items()}
            else:
                canvas.restore_region(self.background)
                self.redraw_axes(changed)  # keeps the redrawn axes' areas
            self.background = canvas.copy_from_bbox(fig.bbox)
            self.axes_draws += 1
        else:
            canvas.restore_region(self.background)
        for artist in self.lines.values():
            artist.axes.draw_artist(artist)
        image = Image.frombuffer("RGBA", canvas.get_width_height(), canvas.buffer_rgba(), "raw", "RGBA", 0, 1)
        buf = io.BytesIO()
        image.convert("RGB").save(buf, format="PNG", compress_level=1)
        png = buf.getvalue()
        self.last_png = png
        self.frames += 1
        self.last_draw_s = time.perf_counter() - t0
        return png

    def redraw_axes(self, changed: set[str]) -> None:
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

        renderer = self.canvas.get_renderer()
        regions = {}
        for key in changed:  # the area of an axes that did not change is the one kept from before
            now = self.ax[key].get_tightbbox(renderer)
            before = self.regions.get(key)
            regions[key] = Bbox.union([now, before]) if before is not None else now
            self.regions[key] = now
        grown = True
        while grown:  # neighbours whose drawn area a cleared region touches
            grown = False
            for key, area in self.regions.items():
                if key not in regions and any(area.overlaps(r) for r in regions.values()):
                    regions[key] = area
                    grown = True
        face = self.fig.get_facecolor()
        for area in regions.values():
            x0, y0 = math.floor(area.x0) - 2, math.floor(area.y0) - 2
            x1, y1 = math.ceil(area.x1) + 2, math.ceil(area.y1) + 2
            blank = Rectangle(
                (x0, y0), x1 - x0, y1 - y0, transform=None, facecolor=face, lw=0, antialiased=False
            )
            blank.set_figure(self.fig)
            self.fig.draw_artist(blank)
        for key, a in self.ax.items():  # in the figure's order, as a full draw would
            if key in regions:
                self.fig.draw_artist(a)

    def limits(self, traces: list[dict], at: float) -> tuple:
        """Axis limits that change rarely (grown in steps), so most frames only redraw lines.

        ``at`` is the throughput axis's time 0 (:func:`.panels.offset`), computed once per frame.
        """

        def grow(current, needed, factor=2.0, floor=1.0):
            # doubling: a long run redraws its axes a handful of times, not every few seconds
            return current if current >= needed else max(floor, needed * factor)

        lim = dict(self.lim)
        xs_tp, ys_tp, xs_loss, losses = [0.0], [0.0], [0.0], []
        for key, line in self.lines.items():
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
        xs_tp.extend(m.t - at for m in list(self.view.marks))  # every event's line in view
        # Every change of limits redraws the axes (60-140 ms here, against 9 ms for a usual
        # frame, and it holds the Python lock the training threads need), so limits grow in
        # few, large steps: measured, a 3,000-step run redrew 8 times when they doubled.
        lim["tp_x"] = grow(lim.get("tp_x", 30.0), max(xs_tp))
        lim["tp_x0"] = min([0.0] + [a - at for a, _ in panels.warmups(self.view)])
        lim["tp_y"] = grow(lim.get("tp_y", 5.0), max(ys_tp), 4.0)  # rates ramp up over the window
        if self.view.x == "seconds":
            lim["loss_x"] = grow(lim.get("loss_x", 30.0), max(xs_loss))
        else:
            runs = each_run(self.view.runs)
            # planned updates: a TrainingRun knows them (a History's `steps` is only how many so far)
            planned = max(
                [
                    r.steps
                    for r in runs
                    if hasattr(r, "history") and isinstance(getattr(r, "steps", None), int)
                ]
                + [0]
            )
            if self.view.x == "examples":
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
        if not self.view.active:
            # Nothing trains any more: one last redraw fits the axes to what was measured (a 2 s
            # run is not drawn on a 30 s axis, 120 updates not on 480).
            lim["tp_x"] = max(1.0, max(xs_tp) * 1.05)
            lim["tp_y"] = max(1.0, max(ys_tp) * 1.15)
            lim["loss_x"] = max(1.0, max(xs_loss) * 1.03)
            lim["stale_x"] = top + 1.0
            if decades is not None:
                lim["loss"] = decades
        return tuple(sorted(lim.items()))


__all__ = ["Frame", "each_run"]
